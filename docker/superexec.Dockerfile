# SuperExec image: runs this project's ServerApp or ClientApps (process isolation).
# BASE_IMAGE: the official flwr/superexec of the pinned version, or the local stand-in built by
# docker/build-local-base.sh (pfl-flower/local-base:1.41.0: flwr, torch and every dependency of the
# project already installed, PFL_DEPS_INSTALLED=1).
ARG BASE_IMAGE=flwr/superexec:1.41.0
FROM ${BASE_IMAGE}

WORKDIR /app
COPY --chown=app:app constraints.txt pyproject.toml README.md ./
COPY --chown=app:app fedcore fedcore
COPY --chown=app:app fedstrategies fedstrategies
COPY --chown=app:app clients clients
COPY --chown=app:app server_app server_app
COPY --chown=app:app runner runner
COPY --chown=app:app partitions partitions
# On the local base only the package itself, offline. On an official image: CPU torch from the PyTorch
# index unless the base has it (PyPI's default Linux wheel pulls the CUDA stack), then the package.
# flwr is already in the base image, so it is left out of the constraints.
RUN if [ -n "${PFL_DEPS_INSTALLED:-}" ]; then \
        python -m pip install --no-cache-dir --no-deps --no-build-isolation . ; \
    else \
        grep -v '^flwr==' constraints.txt > /tmp/constraints.txt \
        && (python -c "import torch" 2>/dev/null \
            || python -m pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0) \
        && python -m pip install --no-cache-dir -c /tmp/constraints.txt . ; \
    fi

ENV FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
ENTRYPOINT ["flower-superexec"]
