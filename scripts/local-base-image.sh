#!/usr/bin/env bash
# Builds `local/base:bookworm`, the stand-in for the production micromamba CUDA base where no
# container registry can be reached (CI): a minimal Debian with Python, pip and PyYAML, made by
# debootstrap from Debian's package archive. Skipped when the image exists.
set -euo pipefail
image=${1:-local/base:bookworm}
if ! docker info >/dev/null 2>&1; then
    echo "no Docker engine answers: start one (make docker-engine), or set FLOCK_SKIP_DOCKER_TESTS=1" >&2
    exit 1
fi
if docker image inspect "$image" >/dev/null 2>&1; then
    echo "$image exists"
    exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,python3-yaml,ca-certificates \
    bookworm "$rootfs" http://deb.debian.org/debian >/dev/null
tar -C "$rootfs" -c . | docker import - "$image"
echo "built $image"
