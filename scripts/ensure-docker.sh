#!/usr/bin/env bash
# ensure-docker.sh - make a Docker Engine reachable, idempotently.
#
#   1. `docker info` already works            -> nothing to do, exit 0.
#   2. a dockerd process exists but is not up  -> wait for it.
#   3. `dockerd` is not installed              -> apt-get install docker.io (root only).
#   4. start `dockerd` detached (setsid nohup), log to $BLESS_DOCKERD_LOG, record its pid in
#      $BLESS_DOCKERD_PIDFILE, and wait up to $BLESS_DOCKERD_TIMEOUT seconds for `docker info`.
#
# `ensure-docker.sh --stop` stops the dockerd that step 4 started, and only that one: its pid file records the pid,
# the process's start time (a recycled pid is another process) and the user who ran the setup (SUDO_UID under
# sudo); another user's clean-up leaves it alone. And only while nothing runs on it: engines are shared, and any
# running container, or any container bless made (whoever's store it serves, in any state), keeps it running, and
# the script says why.
#
# Everything this script says goes to stderr, prefixed "ensure-docker:".
#
# Environment:
#   BLESS_DOCKERD_LOG      daemon log file      (default /var/log/bless-dockerd.log)
#   BLESS_DOCKERD_PIDFILE  pid of the dockerd this script started (default /run/bless-dockerd.pid)
#   BLESS_DOCKERD_TIMEOUT  seconds to wait      (default 60)
#   BLESS_DOCKERD_ARGS     extra dockerd flags  (default none; word-split)
set -euo pipefail

PROG="ensure-docker"
LOG="${BLESS_DOCKERD_LOG:-/var/log/bless-dockerd.log}"
PIDFILE="${BLESS_DOCKERD_PIDFILE:-/run/bless-dockerd.pid}"
TIMEOUT="${BLESS_DOCKERD_TIMEOUT:-60}"

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

usage() {
    cat >&2 <<EOF
usage: scripts/ensure-docker.sh [--stop | --help]

Make a Docker Engine reachable. If 'docker info' works, do nothing. Otherwise
install Debian's docker.io when dockerd is missing (needs root), start dockerd
in the background (log: \$BLESS_DOCKERD_LOG, default /var/log/bless-dockerd.log;
pid: \$BLESS_DOCKERD_PIDFILE, default /run/bless-dockerd.pid) and wait up to
\$BLESS_DOCKERD_TIMEOUT (default 60) seconds for it.
Extra daemon flags can be given in \$BLESS_DOCKERD_ARGS.

--stop: stop the dockerd this script started for you (the same user), when
nothing uses it: no container runs on it and no container bless made (any
user's, any state) is on it. One that is in use, whose containers cannot be
listed, or that another user's setup started is left running, and the script
says why. A Docker Engine started any other way (systemd, by hand, by the
docker.io package) is left alone.
EOF
}

mode=ensure
case "${1:-}" in
    -h|--help) usage; exit 0 ;;
    --stop) mode=stop ;;
    "") ;;
    *) usage; exit 2 ;;
esac

[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "BLESS_DOCKERD_TIMEOUT must be a number of seconds, got '$TIMEOUT'"

docker_ok() {
    command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1
}

server_version() {
    docker version --format '{{.Server.Version}}' 2>/dev/null || echo unknown
}

dockerd_pids() {
    # Processes named exactly "dockerd" (no procps needed: read /proc/*/comm).
    local f comm
    for f in /proc/[0-9]*/comm; do
        comm="$(cat "$f" 2>/dev/null)" || continue
        if [[ "$comm" == dockerd ]]; then
            f="${f#/proc/}"
            printf '%s\n' "${f%/comm}"
        fi
    done
}

is_root() { [[ "$(id -u)" -eq 0 ]]; }

# Wait until `docker info` works, the given daemon pid dies, or the timeout.
# $1: pid to watch ("" = don't watch a pid).
wait_for_docker() {
    local pid="$1" waited=0
    while (( waited < TIMEOUT )); do
        if docker_ok; then
            return 0
        fi
        if [[ -n "$pid" && ! -d "/proc/$pid" ]]; then
            say "dockerd (pid $pid) exited during start-up"
            return 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    docker_ok
}

show_log_tail() {
    if [[ -r "$LOG" ]]; then
        say "last lines of $LOG:"
        tail -n 15 "$LOG" | sed "s/^/$PROG:   /" >&2
    else
        say "(no daemon log at $LOG)"
    fi
}

# Whether pid $1 is a live process named dockerd: a pid file can outlive its daemon, and the pid be reused; a zombie
# (exited, not yet reaped by its parent) runs no more.
is_dockerd() {
    [[ "$1" =~ ^[0-9]+$ ]] && [[ "$(cat "/proc/$1/comm" 2>/dev/null)" == dockerd ]] \
        && [[ "$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" != Z ]]
}

# The owner label bless puts on every container it creates (bless/container_labels.py OWNER and OWNER_VALUE; a unit
# test holds the two equal).
BLESS_OWNER_LABEL="org.bless.owner"
BLESS_OWNER_VALUE="bless"

# The user a setup runs for: the one who ran sudo, else this one. The pid file records it; --stop compares.
setup_user() { printf '%s' "${SUDO_UID:-$(id -u)}"; }

# The start time of pid $1 (clock ticks since boot, /proc/PID/stat field 22): with the pid, one process ever.
proc_start() { awk '{ print $22 }' "/proc/$1/stat" 2>/dev/null; }

# The containers that use the daemon, one "name (image)" a line, read from `docker ps -a` lines
# "name<TAB>image<TAB>state<TAB>owner label" on stdin: every running one, and every one bless made (any user's
# store, any state: a stopped serve is still that user's to stop and clean up). Empty: nothing uses it.
containers_in_use() {
    local name image state owner
    while IFS=$'\t' read -r name image state owner; do
        [[ -n "$name" ]] || continue
        if [[ "$state" == running || "$owner" == "$BLESS_OWNER_VALUE" ]]; then
            printf '%s (%s)\n' "$name" "$image"
        fi
    done
}

# Why the dockerd this script started must keep running (empty: it may be stopped): a container uses it, or its
# containers cannot be listed, so nobody can say that nothing uses it.
reason_to_keep_running() {
    local listing used
    if ! listing="$(docker ps -a --format "{{.Names}}\t{{.Image}}\t{{.State}}\t{{.Label \"$BLESS_OWNER_LABEL\"}}" 2>&1)"; then
        printf "its containers cannot be listed ('docker ps' failed: %s), so it may serve someone else" \
            "$(printf '%s' "$listing" | head -n 1)"
        return 0
    fi
    used="$(printf '%s\n' "$listing" | containers_in_use)"
    if [[ -n "$used" ]]; then
        printf 'containers use it (running, or made by bless for some store): %s' \
            "$(printf '%s' "$used" | paste -sd, - | sed 's/,/, /g')"
    fi
}

# --stop: only the daemon whose pid step 4 recorded, and only while nothing but bless uses it; anything else running
# Docker is not ours to stop.
stop_dockerd() {
    local pid reason waited=0
    if [[ ! -f "$PIDFILE" ]]; then
        say "no $PIDFILE: this script started no dockerd; a Docker Engine started otherwise is left alone"
        return 0
    fi
    local recorded_start recorded_user
    read -r pid recorded_user recorded_start _ <"$PIDFILE" || true
    if ! is_dockerd "$pid" || [[ -n "${recorded_start:-}" && "$(proc_start "$pid")" != "$recorded_start" ]]; then
        rm -f "$PIDFILE"
        say "the dockerd this script started (pid $pid) is not running; removed $PIDFILE"
        return 0
    fi
    if [[ -z "${recorded_user:-}" || -z "${recorded_start:-}" ]]; then
        say "left running: dockerd (pid $pid); $PIDFILE does not say who started it (an older setup's record)"
        say "once nobody needs it: sudo kill $pid"
        return 0
    fi
    if [[ "$recorded_user" != "$(setup_user)" ]]; then
        say "left running: dockerd (pid $pid) was started by the setup of user $recorded_user, not yours ($(setup_user))"
        return 0
    fi
    reason="$(reason_to_keep_running)"
    if [[ -n "$reason" ]]; then
        say "left running: the dockerd this script started (pid $pid), because $reason."
        say "once they are stopped and removed (docker ps -a lists them), run this again; or leave it to its users"
        return 0
    fi
    is_root || die "stopping dockerd (pid $pid) needs root; run: sudo $0 --stop"
    say "stopping dockerd (pid $pid, started by this script for you; no container uses it)"
    kill -TERM "$pid"
    while is_dockerd "$pid" && (( waited < TIMEOUT )); do
        sleep 1
        waited=$((waited + 1))
    done
    if is_dockerd "$pid"; then
        show_log_tail
        die "dockerd (pid $pid) still runs after ${TIMEOUT}s; see $LOG"
    fi
    rm -f "$PIDFILE"
    say "stopped dockerd (pid $pid)"
}

if [[ "$mode" == stop ]]; then
    stop_dockerd
    exit 0
fi

# ---------------------------------------------------------------------------
# 1. Already reachable?
if docker_ok; then
    say "Docker Engine is reachable (server $(server_version)); nothing to do"
    exit 0
fi

if [[ -n "${DOCKER_HOST:-}" && "${DOCKER_HOST}" != "unix:///var/run/docker.sock" ]]; then
    die "DOCKER_HOST=$DOCKER_HOST is set but not reachable; this script can only start a local daemon (unset DOCKER_HOST to use it)"
fi

# A daemon that runs but refuses us is a permission problem, not a missing engine.
if command -v docker >/dev/null 2>&1 && [[ -S /var/run/docker.sock ]] && ! is_root; then
    info_out="$(docker info 2>&1 || true)"
    if [[ "${info_out,,}" == *"permission denied"* ]]; then
        die "a Docker daemon runs but $(id -un) may not use /var/run/docker.sock; add yourself to the 'docker' group (sudo usermod -aG docker $(id -un), then log in again) or run as root"
    fi
fi

# 2. A daemon is starting (or hung): wait for it instead of starting a second one.
existing="$(dockerd_pids | head -n 1)"
if [[ -n "$existing" ]]; then
    say "dockerd already runs (pid $existing) but does not answer yet; waiting up to ${TIMEOUT}s"
    if wait_for_docker "$existing"; then
        say "Docker Engine is reachable (server $(server_version))"
        exit 0
    fi
    show_log_tail
    die "dockerd (pid $existing) did not become reachable within ${TIMEOUT}s; stop it (kill $existing) and re-run this script"
fi

# 3. Install the engine if missing.
if ! command -v dockerd >/dev/null 2>&1; then
    if ! is_root; then
        die "dockerd is not installed; as root run: apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y docker.io  (or: sudo $0)"
    fi
    command -v apt-get >/dev/null 2>&1 || die "dockerd is not installed and apt-get is not available; install a Docker Engine by hand"
    say "dockerd not found; installing Debian's docker.io (apt-get update, apt-get install -y docker.io)"
    apt-get update >&2 || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y docker.io >&2 \
        || die "apt-get install docker.io failed"
    command -v dockerd >/dev/null 2>&1 || die "docker.io installed but dockerd is still not on PATH"
    say "installed docker.io ($(dockerd --version 2>/dev/null || echo 'version unknown'))"
    # The package's maintainer scripts may have started the daemon themselves.
    if docker_ok; then
        say "Docker Engine is reachable (server $(server_version)), started by the package"
        exit 0
    fi
    existing="$(dockerd_pids | head -n 1)"
    if [[ -n "$existing" ]]; then
        say "the package started dockerd (pid $existing); waiting up to ${TIMEOUT}s"
        if wait_for_docker "$existing"; then
            say "Docker Engine is reachable (server $(server_version))"
            exit 0
        fi
        show_log_tail
        die "dockerd (pid $existing) did not become reachable within ${TIMEOUT}s"
    fi
fi

command -v docker >/dev/null 2>&1 || die "dockerd is installed but the docker CLI is not; install docker.io (or docker-ce-cli)"

# 4. Start the daemon, detached so it outlives this script.
if ! is_root; then
    die "dockerd is installed but not running, and starting it needs root; run: sudo $0"
fi

mkdir -p "$(dirname "$LOG")"
extra_args=()
if [[ -n "${BLESS_DOCKERD_ARGS:-}" ]]; then
    read -r -a extra_args <<<"$BLESS_DOCKERD_ARGS"
fi
say "starting dockerd${extra_args[*]:+ ${extra_args[*]}} (log: $LOG)"
{
    printf '\n===== %s: started by scripts/ensure-docker.sh =====\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >>"$LOG"
# setsid: own session, so the daemon is not killed with our process group or
# terminal; nohup: ignore SIGHUP; stdin from /dev/null; output to the log.
setsid nohup dockerd "${extra_args[@]}" </dev/null >>"$LOG" 2>&1 &
pid=$!
disown "$pid" 2>/dev/null || true
# Recorded so that --stop (docs/getting-started.md, "Clean up") stops this daemon and never one started some other way.
mkdir -p "$(dirname "$PIDFILE")"
echo "$pid $(setup_user) $(proc_start "$pid")" >"$PIDFILE"
say "dockerd started (pid $pid); waiting up to ${TIMEOUT}s for 'docker info'"

start=$SECONDS
if wait_for_docker "$pid"; then
    say "Docker Engine is reachable after $((SECONDS - start))s (server $(server_version))"
    exit 0
fi
show_log_tail
if [[ ! -d "/proc/$pid" ]]; then
    die "dockerd failed to start; see $LOG (extra flags from BLESS_DOCKERD_ARGS: '${BLESS_DOCKERD_ARGS:-}')"
fi
die "Docker Engine not reachable within ${TIMEOUT}s; see $LOG (dockerd pid $pid is left running)"
