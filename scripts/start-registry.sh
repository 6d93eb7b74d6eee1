#!/usr/bin/env bash
# Start a throw-away OCI registry (Debian's docker-registry, i.e. Docker Distribution) in the background,
# or stop one it started. scripts/setup.sh installs docker-registry.
set -euo pipefail
PROG=start-registry

usage() {
    cat <<'EOF'
usage: bash scripts/start-registry.sh STORAGE_DIR [ADDR]     start one; ADDR defaults to 127.0.0.1:0
       bash scripts/start-registry.sh --stop STORAGE_DIR      stop the one started on STORAGE_DIR
       bash scripts/start-registry.sh --help

Start: stores blobs under STORAGE_DIR/data, listens on ADDR (plain HTTP: keep it on loopback), writes its pid
to STORAGE_DIR/registry.pid and its log to STORAGE_DIR/registry.log, and returns once /v2/ answers. Port 0
(the default) is a free port, so registries of several users or checkouts run side by side: the address it
serves is printed on stdout and written to STORAGE_DIR/registry.addr.
Stop: ends that process (TERM, then KILL after 10 s) and removes registry.pid; the blobs stay in STORAGE_DIR
(remove the directory to delete them). A pid file whose process is gone, or is no longer this registry, is
removed and nothing is killed.
EOF
}

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }

# The registry started on storage dir $1 (absolute) is the process whose command line names its config.yml:
# a pid file can outlive its process, and the pid can be reused by anything.
is_our_registry() {
    local pid=$1 dir=$2
    [[ "$pid" =~ ^[0-9]+$ ]] && [ -r "/proc/$pid/cmdline" ] \
        && tr '\0' '\n' <"/proc/$pid/cmdline" | grep -qxF "$dir/config.yml"
}

stop_registry() {
    local dir pidfile pid
    [ -d "$1" ] || { say "no directory $1: nothing to stop"; return 0; }
    dir=$(cd "$1" && pwd)
    pidfile=$dir/registry.pid
    if [ ! -f "$pidfile" ]; then
        say "no registry.pid in $dir: nothing to stop"
        return 0
    fi
    pid=$(cat "$pidfile")
    if ! is_our_registry "$pid" "$dir"; then
        say "the registry of $dir (pid $pid) is not running; removed its stale registry.pid"
        rm -f "$pidfile"
        return 0
    fi
    kill "$pid"
    for _ in $(seq 1 100); do
        is_our_registry "$pid" "$dir" || break
        sleep 0.1
    done
    if is_our_registry "$pid" "$dir"; then
        say "pid $pid ignored TERM for 10 s: killing it"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
    say "stopped the registry of $dir (pid $pid); its blobs stay in $dir/data (rm -r $dir deletes them)"
}

case "${1:-}" in
    -h|--help) usage; exit 0 ;;
    --stop)
        [ $# -eq 2 ] || { usage >&2; exit 2; }
        stop_registry "$2"
        exit 0
        ;;
    "") usage >&2; exit 2 ;;
    -*) say "unknown option: $1"; usage >&2; exit 2 ;;
esac
[ $# -le 2 ] || { usage >&2; exit 2; }
storage=$1
addr=${2:-127.0.0.1:0}
if [[ "$addr" == *:0 ]]; then
    # A free port now (the registry binds it a moment later; a start that loses it fails and says so).
    addr="${addr%:0}:$(python3 -c 'import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 0))
print(s.getsockname()[1])' "${addr%:0}")"
fi
binary=$(command -v docker-registry || command -v registry || true)
[ -n "$binary" ] || { say "docker-registry not installed (apt-get install docker-registry)"; exit 1; }
mkdir -p "$storage/data"
storage=$(cd "$storage" && pwd)
if [ -f "$storage/registry.pid" ] && is_our_registry "$(cat "$storage/registry.pid")" "$storage"; then
    say "a registry already runs on $storage (pid $(cat "$storage/registry.pid")); stop it first:"
    say "  bash scripts/start-registry.sh --stop $storage"
    exit 1
fi
printf 'version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n' \
  "$storage/data" "$addr" > "$storage/config.yml"
nohup "$binary" serve "$storage/config.yml" >"$storage/registry.log" 2>&1 &
echo $! > "$storage/registry.pid"
for _ in $(seq 1 100); do
  if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://$addr/v2/', timeout=1)" 2>/dev/null; then
    say "serving $addr from $storage/data (pid $(cat "$storage/registry.pid"))"
    say "stop it with: bash scripts/start-registry.sh --stop $storage"
    printf '%s\n' "$addr" > "$storage/registry.addr"
    printf '%s\n' "$addr"
    exit 0
  fi
  kill -0 "$(cat "$storage/registry.pid")" 2>/dev/null || break
  sleep 0.1
done
# Not up within 10 s (e.g. ADDR taken): leave nothing running behind a failed start.
kill "$(cat "$storage/registry.pid")" 2>/dev/null || true
rm -f "$storage/registry.pid"
say "it did not come up; see $storage/registry.log"
exit 1
