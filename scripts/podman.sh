#!/usr/bin/env bash
# podman.sh start|stop|env|user: rootless podman's Docker-compatible API service, run by an unprivileged user.
# As root, `start` installs Debian's podman (with uidmap, slirp4netns, fuse-overlayfs, catatonit), creates
# the user with its subordinate uid/gid range (both idempotent), and starts `podman system service` as that
# user on a private socket. The user's image store persists across runs; the service is stopped by its process group.
set -euo pipefail
USER_NAME=${TRACETAP_PODMAN_USER:-tracetap-rootless}
RUN=${TRACETAP_PODMAN_RUN:-/run/tracetap-podman}
SOCK="$RUN/podman.sock"
PIDFILE="$RUN/service.pid"
SUBIDS=${TRACETAP_PODMAN_SUBIDS:-200000-265535}  # 65536 ids: uid 0 in a container is the user, 1.. come from here

ping() { curl -sf --max-time 5 --unix-socket "$SOCK" http://localhost/_ping >/dev/null 2>&1; }

need_root() { [ "$(id -u)" = 0 ] || { echo "podman.sh: $1 needs root" >&2; exit 1; }; }

install_podman() {
    command -v podman >/dev/null && command -v newuidmap >/dev/null && [ -x /usr/libexec/podman/catatonit ] && return
    need_root "installing podman"
    export DEBIAN_FRONTEND=noninteractive
    local packages=(podman uidmap slirp4netns fuse-overlayfs catatonit)
    apt-get install -y -q "${packages[@]}" >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q "${packages[@]}" >/dev/null; }
}

create_user() {
    id "$USER_NAME" >/dev/null 2>&1 || { need_root "creating $USER_NAME"; useradd --create-home --shell /bin/bash "$USER_NAME"; }
    grep -q "^$USER_NAME:" /etc/subuid 2>/dev/null || usermod --add-subuids "$SUBIDS" "$USER_NAME"
    grep -q "^$USER_NAME:" /etc/subgid 2>/dev/null || usermod --add-subgids "$SUBIDS" "$USER_NAME"
    # Without this podman 4.3 may settle on `vfs`, which copies the whole image for every container (12-14 s).
    local home; home=$(getent passwd "$USER_NAME" | cut -d: -f6)
    user_conf "$home" storage.conf '[storage]\ndriver = "overlay"\n'
    # Each exec's conmon otherwise lingers 5 minutes after the command ended (for `exec inspect`).
    user_conf "$home" containers.conf '[engine]\nexit_command_delay = 10\n'
}

user_conf() {  # $1: home, $2: file under ~/.config/containers, $3: printf format of its content; kept if present
    [ -f "$1/.config/containers/$2" ] && return
    install -d -o "$USER_NAME" -g "$USER_NAME" "$1/.config" "$1/.config/containers"
    printf "$3" >"$1/.config/containers/$2"
    chown "$USER_NAME:" "$1/.config/containers/$2"
}

# Everything podman runs as the user: no login session, so XDG_RUNTIME_DIR is our private run dir. It runs
# in the user's home: the caller's folder may be one the user cannot enter (a 0700 `mktemp -d` checkout), and
# podman then fails to set up its user namespace. `exec`: in a background subshell the service's pid is $!.
as_user() {
    local home; home=$(getent passwd "$USER_NAME" | cut -d: -f6)
    cd "$home"
    exec setpriv --reuid="$USER_NAME" --regid="$USER_NAME" --init-groups \
        env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" USER="$USER_NAME" XDG_RUNTIME_DIR="$RUN/xdg" "$@"
}

start() {
    ping && return
    install_podman
    create_user
    mkdir -p "$RUN/xdg"
    chown "$USER_NAME:" "$RUN" "$RUN/xdg"
    chmod 0700 "$RUN"  # the socket is the user's (and root's): driving it runs containers as the user
    chmod 0700 "$RUN/xdg"
    (as_user podman system migrate >/dev/null 2>&1) || true  # picks up a changed subuid range
    # its own session (so process group): podman re-executes itself in the user namespace as a child
    (as_user setsid podman system service --time=0 "unix://$SOCK" >"$RUN/service.log" 2>&1) &
    echo $! >"$PIDFILE"
    for _ in $(seq 1 120); do ping && return; sleep 0.25; done
    echo "podman.sh: the podman service did not answer on $SOCK; see $RUN/service.log" >&2; tail -20 "$RUN/service.log" >&2; exit 1
}

stop_pid() {  # $1: pid, $2: its process group too
    local pid=$1 target=$1; [ -n "${2:-}" ] && target=-$1
    kill -- "$target" 2>/dev/null || true
    for _ in $(seq 1 80); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.25; done
    kill -9 -- "$target" 2>/dev/null || true
}

# The service and its re-executed child (one process group), then the user namespace's pause process.
stop() {
    [ -f "$PIDFILE" ] && { stop_pid "$(cat "$PIDFILE")" group; rm -f "$PIDFILE"; }
    local pause="$RUN/xdg/libpod/tmp/pause.pid"
    [ -f "$pause" ] && { stop_pid "$(cat "$pause")"; rm -f "$pause"; }
    return 0
}

case "${1:-}" in
    start) start; echo "TRACETAP_PODMAN_HOST=unix://$SOCK" ;;
    stop) stop ;;
    env) echo "TRACETAP_PODMAN_HOST=unix://$SOCK" ;;
    user) echo "$USER_NAME" ;;
    *) echo "usage: podman.sh start|stop|env|user" >&2; exit 2 ;;
esac
