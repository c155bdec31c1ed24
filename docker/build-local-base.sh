#!/usr/bin/env bash
# Build pfl-flower/local-base:<flwr version>, a stand-in for the official flwr/superlink,
# flwr/supernode and flwr/superexec images where Docker Hub cannot be reached.
#
# 1. `pip download` the project's pinned wheels on the host (torch's CPU wheel, flwr[simulation], the
#    project's dependencies and hatchling to build it), kept in docker/.build/wheels for re-runs;
# 2. a minimal Debian root (bookworm: Python 3.11, as in the official images) from a Debian mirror,
#    with mmdebstrap where installed (debootstrap otherwise);
# 3. in that root (chroot, as user `app`, uid 49999, as in the official images): a virtualenv at
#    /python/venv with every wheel installed offline by uv (parallel), and the bytecode of what the
#    containers import at start written by importing it once (compiling all 16,000 files took 75 s
#    here; most are never imported: ray, sympy, pandas, ...; the rest compiles on first use);
# 4. `docker import` of that root, with PATH, the Flower env vars, USER app, WORKDIR /app.
# Steps 2-3 run in /dev/shm where it has room: on this machine's disk, debootstrap alone took 1m50s
# and a `docker build` of the same install 4 minutes, mostly writing layers twice; in memory and
# imported once, all of it takes about a third of that. The project's dependencies are in the image
# (PFL_DEPS_INSTALLED=1), so docker/superexec.Dockerfile adds only the project itself, offline.
# Needs root, mmdebstrap or debootstrap, and a running docker daemon (DOCKER_HOST).
#
#   sudo docker/build-local-base.sh            # re-runs reuse docker/.build/wheels
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
FLWR_VERSION=${FLWR_VERSION:-1.41.0}
SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PYTHON=${PYTHON:-python3}
BUILD=${BUILD_DIR:-$HERE/.build}
BASE_IMAGE=${BASE_IMAGE:-pfl-flower/local-base:$FLWR_VERSION}
PACKAGES=python3,python3-venv,ca-certificates
APP_UID=49999
# what the SuperLink, SuperNodes, SuperExecs and the apps they start import (flwr, torch, numpy, digits)
WARM_IMPORTS="import torch, numpy, sklearn.datasets, flwr.app, flwr.serverapp, flwr.clientapp, \
flwr.superlink.cli, flwr.supernode.cli, flwr.supercore.cli"

if [ ! -f "$BUILD/wheels/.complete" ]; then
    echo "== pip download (pinned by constraints.txt) into $BUILD/wheels"
    rm -rf "$BUILD/wheels" && mkdir -p "$BUILD/wheels"
    "$PYTHON" -m pip download -q -d "$BUILD/wheels" -c "$ROOT/constraints.txt" \
        "torch==2.13.0" "flwr[simulation]==$FLWR_VERSION" hatchling "$ROOT" 2> >(grep -v "is ignored: it is neither" >&2)
    rm -f "$BUILD/wheels"/pfl_flower-*
    touch "$BUILD/wheels/.complete"
fi

SCRATCH=$BUILD  # the root (about 3.5 GB with the wheels and the virtualenv) in memory where it fits
if [ "$(df --output=avail -k /dev/shm 2>/dev/null | tail -1)" -gt 6000000 ] 2>/dev/null; then
    SCRATCH=/dev/shm
fi
mkdir -p "$BUILD"
ROOTFS=$(mktemp -d "$SCRATCH/pfl-rootfs.XXXXXX")
trap 'rm -rf "$ROOTFS"' EXIT

if command -v mmdebstrap >/dev/null; then
    echo "== mmdebstrap $SUITE from $MIRROR into $ROOTFS"
    TMPDIR=$SCRATCH mmdebstrap --variant=minbase --include=$PACKAGES --dpkgopt=force-unsafe-io \
        "$SUITE" "$ROOTFS" "$MIRROR"
else
    echo "== debootstrap $SUITE from $MIRROR into $ROOTFS"
    debootstrap --variant=minbase --include=$PACKAGES "$SUITE" "$ROOTFS" "$MIRROR"
    rm -rf "$ROOTFS/var/cache/apt/archives/"*.deb "$ROOTFS/var/lib/apt/lists/"*
fi

echo "== virtualenv /python/venv with every wheel, as user app (uv, offline)"
chroot "$ROOTFS" sh -c "groupadd --gid $APP_UID app && useradd --uid $APP_UID --gid $APP_UID --create-home \
    --home-dir /home/app app && mkdir -p /app /python && chown app:app /app /python"
cp -r "$BUILD/wheels" "$ROOTFS/wheels"
# a private mount namespace: /proc and /dev for the chroot vanish with it, whatever happens here
unshare --mount --fork sh -euc '
    mount -t proc proc "$1/proc" && mount --rbind /dev "$1/dev"
    exec chroot --userspec="$2:$2" "$1" env -i HOME=/home/app PATH=/python/venv/bin:/usr/bin:/bin sh -euc "
        python3 -m venv /python/venv
        pip install -q --no-index --no-cache-dir /wheels/uv-*.whl
        uv pip install --python /python/venv/bin/python --no-cache --offline --no-index /wheels/*.whl
        python -c \"$3\""
' install "$ROOTFS" "$APP_UID" "$WARM_IMPORTS"
rm -rf "$ROOTFS/wheels"

echo "== docker import $BASE_IMAGE"
tar -C "$ROOTFS" -c . | docker import \
    --change "ENV PATH=/python/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "ENV FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1" \
    --change "ENV PFL_DEPS_INSTALLED=1 PIP_DISABLE_PIP_VERSION_CHECK=1" \
    --change "USER app" --change "WORKDIR /app" --change 'ENTRYPOINT ["flower-superexec"]' \
    - "$BASE_IMAGE"
echo "built $BASE_IMAGE"
