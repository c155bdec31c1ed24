#!/usr/bin/env bash
# Build pfl-flower/local-base:<flwr version>, a stand-in for the official flwr/superlink,
# flwr/supernode and flwr/superexec images where Docker Hub cannot be reached.
#
# 1. debootstrap a minimal Debian (bookworm: Python 3.11, as in the official images) from a Debian mirror;
# 2. `docker import` that root filesystem;
# 3. `pip download` the project's pinned wheels on the host (torch's CPU wheel included) and install
#    them offline into a virtualenv in the image (docker/local-base.Dockerfile), with a user `app`
#    (uid 49999) and WORKDIR /app like the official images.
# The wheels stay in the image (/wheels, PIP_NO_INDEX=1) so that docker/superexec.Dockerfile installs
# the project offline on top of it. Needs root, debootstrap and a running docker daemon (DOCKER_HOST).
#
#   sudo docker/build-local-base.sh            # re-runs reuse docker/.build/ (root fs and wheels)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
FLWR_VERSION=${FLWR_VERSION:-1.41.0}
SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PYTHON=${PYTHON:-python3}
BUILD=${BUILD_DIR:-$HERE/.build}
ROOT_IMAGE=pfl-flower/debian-root:$SUITE
BASE_IMAGE=${BASE_IMAGE:-pfl-flower/local-base:$FLWR_VERSION}

mkdir -p "$BUILD"
if ! docker image inspect "$ROOT_IMAGE" >/dev/null 2>&1; then
    if [ ! -f "$BUILD/rootfs.tar" ]; then
        rm -rf "$BUILD/rootfs"
        echo "== debootstrap $SUITE from $MIRROR"
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            "$SUITE" "$BUILD/rootfs" "$MIRROR"
        rm -rf "$BUILD/rootfs/var/cache/apt/archives/"*.deb "$BUILD/rootfs/var/lib/apt/lists/"*
        tar -C "$BUILD/rootfs" -cf "$BUILD/rootfs.tar.tmp" . && mv "$BUILD/rootfs.tar.tmp" "$BUILD/rootfs.tar"
        rm -rf "$BUILD/rootfs"
    fi
    echo "== docker import $ROOT_IMAGE"
    docker import "$BUILD/rootfs.tar" "$ROOT_IMAGE"
fi

if [ ! -f "$BUILD/wheels/.complete" ]; then
    echo "== pip download (pinned by constraints.txt) into $BUILD/wheels"
    rm -rf "$BUILD/wheels" && mkdir -p "$BUILD/wheels"
    # the project's dependencies and hatchling (to build the project offline in superexec.Dockerfile)
    "$PYTHON" -m pip download -q -d "$BUILD/wheels" -c "$ROOT/constraints.txt" \
        "torch==2.13.0" "flwr[simulation]==$FLWR_VERSION" hatchling "$ROOT"
    rm -f "$BUILD/wheels"/pfl_flower-*
    touch "$BUILD/wheels/.complete"
fi

echo "== docker build $BASE_IMAGE"
cp "$ROOT/constraints.txt" "$BUILD/constraints.txt"
printf "rootfs\nrootfs.tar\nrootfs.tar.tmp\n" > "$BUILD/.dockerignore"
docker build -f "$HERE/local-base.Dockerfile" -t "$BASE_IMAGE" \
    --build-arg ROOT_IMAGE="$ROOT_IMAGE" --build-arg FLWR_VERSION="$FLWR_VERSION" "$BUILD"
echo "built $BASE_IMAGE"
