#!/usr/bin/env bash
# Start a throw-away OCI registry (Debian's docker-registry, i.e. Docker Distribution) in the background:
#   bash scripts/start-registry.sh STORAGE_DIR [ADDR]       ADDR defaults to 127.0.0.1:5000
# It stores blobs under STORAGE_DIR, listens on ADDR (plain HTTP: keep it on loopback), writes its pid to
# STORAGE_DIR/registry.pid and its log to STORAGE_DIR/registry.log, and returns once /v2/ answers.
# Stop it with: kill "$(cat STORAGE_DIR/registry.pid)". scripts/setup.sh installs docker-registry.
set -euo pipefail
storage=${1:?usage: start-registry.sh STORAGE_DIR [ADDR]}
addr=${2:-127.0.0.1:5000}
binary=$(command -v docker-registry || command -v registry || true)
[ -n "$binary" ] || { echo "start-registry: docker-registry not installed (apt-get install docker-registry)" >&2; exit 1; }
mkdir -p "$storage/data"
storage=$(cd "$storage" && pwd)
printf 'version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n' \
  "$storage/data" "$addr" > "$storage/config.yml"
nohup "$binary" serve "$storage/config.yml" >"$storage/registry.log" 2>&1 &
echo $! > "$storage/registry.pid"
for _ in $(seq 1 100); do
  if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://$addr/v2/', timeout=1)" 2>/dev/null; then
    echo "start-registry: serving $addr from $storage/data (pid $(cat "$storage/registry.pid"))" >&2
    exit 0
  fi
  kill -0 "$(cat "$storage/registry.pid")" 2>/dev/null || break
  sleep 0.1
done
echo "start-registry: it did not come up; see $storage/registry.log" >&2
exit 1
