#!/usr/bin/env bash
# dockerd.sh start|stop|env: a private Docker engine for the container tiers (Debian's docker.io).
# Its data root is kept across runs (images built here are the cache); it is stopped by its pid.
set -euo pipefail
ROOT=${TRACETAP_DOCKER_ROOT:-/var/cache/tracetap/docker}
RUN=${TRACETAP_DOCKER_RUN:-/run/tracetap-docker}
SOCK="$RUN/docker.sock"
PIDFILE="$RUN/dockerd.pid"

ping() { curl -sf --unix-socket "$SOCK" http://localhost/_ping >/dev/null 2>&1; }

install_engine() {
    command -v dockerd >/dev/null && return
    [ "$(id -u)" = 0 ] || { echo "dockerd.sh: dockerd missing and not root to install it" >&2; exit 1; }
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q docker.io >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q docker.io >/dev/null; }
}

start() {
    ping && return
    install_engine
    mkdir -p "$ROOT/data" "$RUN/exec"
    dockerd --data-root "$ROOT/data" --exec-root "$RUN/exec" --pidfile "$PIDFILE" -H "unix://$SOCK" \
        --bridge none --iptables=true >"$RUN/dockerd.log" 2>&1 &
    for _ in $(seq 1 120); do ping && return; sleep 0.25; done
    echo "dockerd.sh: dockerd did not answer on $SOCK; see $RUN/dockerd.log" >&2; tail -20 "$RUN/dockerd.log" >&2; exit 1
}

stop() {
    [ -f "$PIDFILE" ] || return 0
    pid=$(cat "$PIDFILE"); kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 80); do kill -0 "$pid" 2>/dev/null || { rm -f "$PIDFILE"; return; }; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true; rm -f "$PIDFILE"
}

case "${1:-}" in
    start) start; echo "DOCKER_HOST=unix://$SOCK" ;;
    stop) stop ;;
    env) echo "DOCKER_HOST=unix://$SOCK" ;;
    *) echo "usage: dockerd.sh start|stop|env" >&2; exit 2 ;;
esac
