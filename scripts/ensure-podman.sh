#!/usr/bin/env bash
# ensure-podman.sh - make podman usable for the Kubernetes tests (`podman kube play`), idempotently.
#
#   1. `podman` or `catatonit` missing -> apt-get install -y podman catatonit (root only). catatonit is the
#      init of podman's pod infra ("pause") container, which podman builds locally on first use: no registry.
#   2. /etc/containers/containers.conf absent, or written by this script -> (re)write it with
#        [containers]
#        default_ulimits = ["nofile=16384:16384", "nproc=4096:4096"]
#      podman's defaults raise nofile/nproc above the hard limits a container host may impose, and every
#      container start then fails with "error setting rlimit type 7: operation not permitted". A file written
#      by anyone else is left alone (a warning when it sets no default_ulimits).
#   3. `podman info` must work.
#
# Everything this script says goes to stderr, prefixed "ensure-podman:".
# Environment:
#   BLESS_CONTAINERS_CONF  the file of step 2 (default /etc/containers/containers.conf)
set -euo pipefail

PROG="ensure-podman"
CONF="${BLESS_CONTAINERS_CONF:-/etc/containers/containers.conf}"
MARKER="# Written by bless's scripts/ensure-podman.sh; it rewrites this file (delete this line to keep your edits)."
CONF_BODY="$MARKER
[containers]
# As root, podman raises nofile (to 1048576) and nproc in every container; above this host's hard limits
# every container start fails with \"error setting rlimit ... operation not permitted\".
default_ulimits = [\"nofile=16384:16384\", \"nproc=4096:4096\"]"

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

usage() {
    cat >&2 <<EOF
usage: scripts/ensure-podman.sh [--help]

Make podman usable for 'podman kube play' on this host, idempotently: install
Debian's podman and catatonit when missing (needs root and apt-get), write
$CONF with default_ulimits that this host allows (only
when the file is absent or was written by this script), and check 'podman info'.
EOF
}

case "${1:-}" in
    -h|--help) usage; exit 0 ;;
    "") ;;
    *) usage; exit 2 ;;
esac

is_root() { [[ "$(id -u)" -eq 0 ]]; }

# 1. Packages.
missing=()
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v catatonit >/dev/null 2>&1 || [[ -x /usr/libexec/podman/catatonit ]] || missing+=(catatonit)
if (( ${#missing[@]} > 0 )); then
    is_root || die "${missing[*]} not installed; as root run: apt-get install -y podman catatonit  (or: sudo $0)"
    command -v apt-get >/dev/null 2>&1 || die "${missing[*]} not installed and apt-get is not available; install podman by hand"
    say "installing ${missing[*]} (apt-get install -y podman catatonit)"
    # apt-get update only when the package lists cannot serve the install (a fresh image has none).
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y podman catatonit >&2; then
        say "the package lists do not serve it: apt-get update, then install again"
        apt-get update >&2 || die "apt-get update failed"
        DEBIAN_FRONTEND=noninteractive apt-get install -y podman catatonit >&2 || die "apt-get install podman catatonit failed"
    fi
    command -v podman >/dev/null 2>&1 || die "podman installed but not on PATH"
    say "installed $(podman --version 2>/dev/null || echo podman)"
fi

# 2. containers.conf.
if [[ -f "$CONF" ]] && ! grep -qxF "$MARKER" "$CONF"; then
    if ! grep -Eq '^[[:space:]]*default_ulimits[[:space:]]*=' "$CONF"; then
        say "warning: $CONF is not ours and sets no default_ulimits; if containers fail with 'error setting rlimit', add under [containers]: default_ulimits = [\"nofile=16384:16384\", \"nproc=4096:4096\"]"
    else
        say "$CONF is not ours; left alone"
    fi
elif [[ -f "$CONF" && "$(cat "$CONF")" == "$CONF_BODY" ]]; then
    say "$CONF is up to date"
else
    is_root || die "writing $CONF needs root; run: sudo $0"
    mkdir -p "$(dirname "$CONF")"
    tmp="$(mktemp "$CONF.XXXXXX")"
    printf '%s\n' "$CONF_BODY" >"$tmp"
    chmod 0644 "$tmp"
    mv "$tmp" "$CONF"
    say "wrote $CONF (default_ulimits nofile=16384:16384, nproc=4096:4096)"
fi

# 3. Works?
if ! info="$(podman info --format '{{.Version.Version}} {{.Host.OCIRuntime.Name}} {{.Store.GraphDriverName}}' 2>&1)"; then
    printf '%s\n' "$info" | tail -n 15 | sed "s/^/$PROG:   /" >&2
    die "'podman info' failed"
fi
read -r version runtime driver <<<"$info"
say "podman $version works (runtime $runtime, storage $driver)"
