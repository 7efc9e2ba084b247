#!/usr/bin/env bash
# What `make test` and `make demo` need beyond the venvs, brought up when missing:
#   docker   a Docker engine answering, Compose v2 and the local stand-in base image
#   browser  Debian's headless Chromium and ChromeDriver (the page tests)
#   prometheus  Debian's Prometheus and promtool (the fleet-observation tests)
#   registry Debian's docker-registry (the released-image tests: a registry on 127.0.0.1)
# As root on Debian (CI, a fresh sandbox) each is installed the way `make docker-engine` and
# `make browser` do; anywhere else a missing one stops here with one line naming the command to
# run, rather than as a test failure or an apt-get error half-way through a run.
# FLOCK_SKIP_DOCKER_TESTS=1 / FLOCK_SKIP_BROWSER_TESTS=1 waive a need (the tests then skip and say
# so); `make demo` has no such waiver.
set -euo pipefail
cd "$(dirname "$0")/.."

can_install() {
    [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ] && command -v apt-get >/dev/null 2>&1
}

stop() {
    echo "$1" >&2
    exit 1
}

engine_ready() {
    docker info >/dev/null 2>&1 && docker compose version >/dev/null 2>&1
}

need_docker() {
    local why=$1 waiver=$2
    if ! engine_ready; then
        if can_install; then
            echo "== $why needs a Docker engine: starting one (scripts/docker-engine.sh)"
            bash scripts/docker-engine.sh
        else
            stop "$why needs a Docker engine with Compose v2: run \`sudo make docker-engine\` (Debian) or start Docker${waiver}"
        fi
    fi
    if ! docker image inspect local/base:bookworm >/dev/null 2>&1; then
        # debootstrap (which the build installs on Debian) needs root.
        if can_install || { [ "$(id -u)" = 0 ] && command -v debootstrap >/dev/null 2>&1; }; then
            bash scripts/local-base-image.sh
        else
            stop "$why needs the stand-in base image local/base:bookworm: run \`sudo make base-image\`${waiver}"
        fi
    fi
}

need_browser() {
    local why=$1
    if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
        return
    fi
    if can_install; then
        echo "== $why needs headless Chromium: installing it (make browser)"
        "${MAKE:-make}" --no-print-directory browser
    else
        stop "$why needs headless Chromium (/usr/bin/chromium, /usr/bin/chromedriver): run \`sudo make browser\` (Debian), or set FLOCK_SKIP_BROWSER_TESTS=1"
    fi
}

need_prometheus() {
    local why=$1
    if [ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ]; then
        return
    fi
    if can_install; then
        echo "== $why needs Prometheus: installing it (make prometheus)"
        "${MAKE:-make}" --no-print-directory prometheus
    else
        stop "$why needs Prometheus and promtool (/usr/bin/prometheus, /usr/bin/promtool): run \`sudo make prometheus\` (Debian's prometheus package)"
    fi
}

need_registry() {
    local why=$1
    if [ -x /usr/bin/docker-registry ]; then
        return
    fi
    if can_install; then
        echo "== $why needs a local container registry: installing it (make registry)"
        "${MAKE:-make}" --no-print-directory registry
    else
        stop "$why needs Debian's docker-registry (/usr/bin/docker-registry) for the released-image tests: run \`sudo make registry\`, or set FLOCK_SKIP_DOCKER_TESTS=1"
    fi
}

for need in "$@"; do
    case $need in
        test-docker)
            [ "${FLOCK_SKIP_DOCKER_TESTS:-}" = 1 ] ||
                need_docker "make test" ", or set FLOCK_SKIP_DOCKER_TESTS=1" ;;
        test-browser)
            [ "${FLOCK_SKIP_BROWSER_TESTS:-}" = 1 ] || need_browser "make test" ;;
        test-prometheus)
            need_prometheus "make test" ;;
        test-registry)
            [ "${FLOCK_SKIP_DOCKER_TESTS:-}" = 1 ] || need_registry "make test" ;;
        demo-docker)
            need_docker "make demo" "" ;;
        *)
            stop "scripts/needs.sh: unknown need '$need' (test-docker, test-browser, test-prometheus, test-registry, demo-docker)" ;;
    esac
done
