# A local stand-in for the official flwr/superlink, flwr/supernode and flwr/superexec images,
# built by docker/build-local-base.sh from a debootstrapped Debian root (no Docker Hub needed).
# One image serves all three roles; compose.local.yml picks the entrypoint per service.
ARG ROOT_IMAGE=pfl-flower/debian-root:bookworm
FROM ${ROOT_IMAGE}

ARG FLWR_VERSION=1.41.0
COPY wheels /wheels
COPY constraints.txt /wheels/constraints.txt
ENV PATH=/python/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels PIP_DISABLE_PIP_VERSION_CHECK=1 \
    FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
# user app (uid 49999) owns the virtualenv, as in the official images, so that images built on top
# of this one (superexec.Dockerfile) can pip install as that user
RUN groupadd --gid 49999 app && useradd --uid 49999 --gid 49999 --create-home --home-dir /home/app app \
 && mkdir -p /app /python && chown app:app /app /python
USER app
RUN python3 -m venv /python/venv \
 && pip install --no-cache-dir -c /wheels/constraints.txt "torch==2.13.0" "flwr[simulation]==${FLWR_VERSION}"
WORKDIR /app
ENTRYPOINT ["flower-superexec"]
