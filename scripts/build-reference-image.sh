#!/usr/bin/env bash
# build-reference-image.sh - build the CPU image of bless's reference engine.
#
# Tag: bless-reference:<version> (default 0.1.0). Inside the image:
#   - user root, HOME=/root, workdir /
#   - python3 = /opt/venv/bin/python3 (a venv, first on PATH) with torch (CPU)
#   - the engine package bless/engines/reference_engine/ installed as the
#     top-level package `bless_reference` under /opt/bless (on PYTHONPATH),
#     so `python3 -m bless_reference --help` works
#   - gcc, g++ and the Python headers (Inductor's C++ backend needs them)
#
# Two paths, chosen automatically (or with --path / $BLESS_IMAGE_PATH):
#   online : python:3.11-slim is local or `docker pull` works -> build FROM it,
#            apt-get gcc g++, pip install torch from the PyTorch CPU index.
#   offline: no registry -> debootstrap a Debian bookworm rootfs, `docker import`
#            it as bless-base:bookworm-<hash> (cached), then build FROM it with
#            `--network none`, installing torch from the local CPU wheel and a
#            wheelhouse pre-downloaded on the host with `pip download`.
#
# Caching: the inputs (engine files, Dockerfile, torch wheel name / version,
# base image ID) are hashed into the image label org.bless.build-inputs; when
# the tagged image already carries the same hash the script prints "up to date"
# and exits at once.
#
# stdout: only the image ID (sha256:...). Everything else goes to stderr.
set -euo pipefail

PROG="build-reference-image"
RECIPE_VERSION=1   # bump to force rebuilds when the recipe changes outside the hashed files

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
ENGINE_DIR="$REPO_ROOT/bless/engines/reference_engine"
DOCKERFILE_DIR="$SCRIPT_DIR/reference-image"

IMAGE_NAME="bless-reference"
ONLINE_BASE="python:3.11-slim"
TORCH_WHEEL="${BLESS_TORCH_WHEEL:-/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl}"
TORCH_VERSION="${BLESS_TORCH_VERSION:-2.13.0}"
TORCH_INDEX_URL="${BLESS_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
# Under the store root (bless's own default root is ~/.cache/bless), so that a BLESS_ROOT on another disk takes
# the wheelhouse (a ~200 MB torch wheel) and the debootstrap scratch with it, and one rm -r removes both.
CACHE_DIR="${BLESS_BUILD_CACHE:-${BLESS_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/bless}/build}"
PULL_TIMEOUT="${BLESS_PULL_TIMEOUT:-30}"

DEBIAN_SUITE="bookworm"
DEBOOTSTRAP_VARIANT="minbase"
DEBOOTSTRAP_INCLUDE="python3,python3-venv,python3-dev,gcc,g++,libc6-dev"
# Installed next to torch (torch warns "Failed to initialize NumPy" on every
# import without it). Keep in sync with the Dockerfiles.
EXTRA_PACKAGES=(numpy)
# Target of the wheelhouse: the image's interpreter (Debian bookworm: CPython 3.11, glibc 2.36).
PIP_TARGET_ARGS=(--only-binary=:all: --platform manylinux_2_28_x86_64
                 --python-version 3.11 --implementation cp --abi cp311)

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

usage() {
    cat >&2 <<EOF
usage: scripts/build-reference-image.sh [--path auto|online|offline] [--force] [VERSION]
       scripts/build-reference-image.sh --cache-dir

Build the CPU image of the reference engine as $IMAGE_NAME:VERSION (default 0.1.0).
Prints the image ID on stdout; progress goes to stderr.

  --path P   online  : FROM $ONLINE_BASE + pip install torch==$TORCH_VERSION from
                       $TORCH_INDEX_URL (needs Docker Hub and internet)
             offline : debootstrap'ed Debian $DEBIAN_SUITE base (docker import, cached)
                       + torch from the local wheel, built with --network none
             auto    : online if $ONLINE_BASE is local or pullable, else offline (default)
  --force    rebuild even if the image is up to date
  --cache-dir  print the build cache dir (see BLESS_BUILD_CACHE) and exit: no Docker needed
  -h, --help this help

Environment:
  BLESS_IMAGE_PATH       same as --path
  BLESS_TORCH_WHEEL      torch CPU wheel for the offline path
                         (default /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl)
  BLESS_TORCH_VERSION    torch version for the online path (default 2.13.0)
  BLESS_TORCH_INDEX_URL  pip index for the online path (default https://download.pytorch.org/whl/cpu)
  BLESS_BUILD_CACHE      cache dir for the wheelhouse and scratch (default \$BLESS_ROOT/build
                         when BLESS_ROOT is set, else \${XDG_CACHE_HOME:-\$HOME/.cache}/bless/build)
  BLESS_DEBIAN_MIRROR    Debian mirror for debootstrap (default: from /etc/apt sources,
                         else http://deb.debian.org/debian)
  BLESS_PULL_TIMEOUT     seconds allowed for 'docker pull $ONLINE_BASE' (default 30)

Needs a reachable Docker Engine (see scripts/ensure-docker.sh). The offline path
needs root the first time (debootstrap) and pip on the host (else the wheelhouse
is downloaded from inside the base image).
EOF
}

# ---------------------------------------------------------------------------
# Arguments
path_choice="${BLESS_IMAGE_PATH:-auto}"
force=0
version=""
while (( $# > 0 )); do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --cache-dir) echo "$CACHE_DIR"; exit 0 ;;
        --path) [[ $# -ge 2 ]] || die "--path needs a value"; path_choice="$2"; shift 2 ;;
        --path=*) path_choice="${1#--path=}"; shift ;;
        --force) force=1; shift ;;
        -*) usage; die "unknown option: $1" ;;
        *) [[ -z "$version" ]] || die "only one VERSION argument is accepted"; version="$1"; shift ;;
    esac
done
version="${version:-0.1.0}"
[[ "$version" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "invalid image tag '$version'"
case "$path_choice" in auto|online|offline) ;; *) die "--path must be auto, online or offline (got '$path_choice')" ;; esac
[[ "$PULL_TIMEOUT" =~ ^[0-9]+$ ]] || die "BLESS_PULL_TIMEOUT must be a number of seconds"
IMAGE="$IMAGE_NAME:$version"
started=$SECONDS

# ---------------------------------------------------------------------------
# Helpers
sha256() { sha256sum | cut -c1-64; }

image_id() { docker image inspect --format '{{.Id}}' "$1" 2>/dev/null; }

image_label() {
    docker image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null
}

is_root() { [[ "$(id -u)" -eq 0 ]]; }

# The legacy builder keeps each earlier stage of a multi-stage build (the offline path's torch venv)
# as an untagged <none> image. Every untagged image that descends from our debootstrap base (it
# inherits the org.bless.base-suite label; the base itself and the final image are tagged) is such
# a leftover of this script: remove them. Images still used by a container are kept (docker refuses).
drop_stage_leftovers() {
    local stage
    for stage in $(docker images --quiet --no-trunc --filter dangling=true --filter label=org.bless.base-suite); do
        if docker image rm "$stage" >/dev/null 2>&1; then
            say "removed the leftover build stage ${stage:7:12}"
        fi
    done
}

apt_updated=0
apt_install() {
    is_root || die "need to install $* with apt-get; run as root or: sudo apt-get install -y $*"
    command -v apt-get >/dev/null 2>&1 || die "need $* and apt-get is not available; install it by hand"
    if (( apt_updated == 0 )); then
        say "apt-get update"
        apt-get update >&2 || die "apt-get update failed"
        apt_updated=1
    fi
    say "apt-get install -y $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y "$@" >&2 || die "apt-get install $* failed"
}

# Hash of the engine package in dir $1 (relative paths + contents, no bytecode).
engine_hash() {
    if [[ -d "$ENGINE_DIR" ]]; then
        ( cd "$1" \
          && find . -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 \
             | LC_ALL=C sort -z | xargs -0 -r sha256sum ) | sha256
    else
        echo "placeholder-$RECIPE_VERSION"
    fi
}

# Inputs of the debootstrap base (the mirror is left out on purpose: any
# mirror serves the same suite; the arch is in).
base_tag() {
    local arch h
    arch="$(dpkg --print-architecture 2>/dev/null || uname -m)"
    h="$(printf 'recipe=%s\nsuite=%s\nvariant=%s\ninclude=%s\narch=%s\n' \
        "$RECIPE_VERSION" "$DEBIAN_SUITE" "$DEBOOTSTRAP_VARIANT" "$DEBOOTSTRAP_INCLUDE" "$arch" | sha256)"
    echo "bless-base:$DEBIAN_SUITE-${h:0:12}"
}

# Hash of everything the final image is made of, for path $1 on base image ID $2.
inputs_hash() {
    local path="$1" base_id="$2"
    {
        printf 'recipe=%s\npath=%s\nbase=%s\n' "$RECIPE_VERSION" "$path" "$base_id"
        printf 'dockerfile=%s\n' "$(sha256 <"$DOCKERFILE_DIR/Dockerfile.$path")"
        printf 'engine=%s\n' "$ENGINE_HASH"
        if [[ "$path" == offline ]]; then
            printf 'torch_wheel=%s\nextra=%s\n' "$(basename "$TORCH_WHEEL")" "${EXTRA_PACKAGES[*]}"
        else
            printf 'torch=%s\nindex=%s\nextra=%s\n' "$TORCH_VERSION" "$TORCH_INDEX_URL" "${EXTRA_PACKAGES[*]}"
        fi
    } | sha256
}

base_id_for_path() {
    if [[ "$1" == offline ]]; then image_id "$(base_tag)"; else image_id "$ONLINE_BASE"; fi
}

# Debian mirror for debootstrap: $BLESS_DEBIAN_MIRROR, else the first apt
# source (one-line or deb822 format) that serves $DEBIAN_SUITE, else deb.debian.org.
find_mirror() {
    if [[ -n "${BLESS_DEBIAN_MIRROR:-}" ]]; then echo "$BLESS_DEBIAN_MIRROR"; return; fi
    local m="" f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -r "$f" ]] || continue
        m="$(awk -v suite="$DEBIAN_SUITE" '
            /^[[:space:]]*deb[[:space:]]/ {
                sub(/^[[:space:]]*deb[[:space:]]+/, "")
                if ($0 ~ /^\[/) sub(/^\[[^]]*\][[:space:]]*/, "")
                if ($2 == suite) { print $1; exit }
            }' "$f")"
        [[ -n "$m" ]] && break
    done
    if [[ -z "$m" ]]; then
        for f in /etc/apt/sources.list.d/*.sources; do
            [[ -r "$f" ]] || continue
            m="$(awk -v suite="$DEBIAN_SUITE" '
                function flush() {
                    if (types ~ /(^|[[:space:]])deb([[:space:]]|$)/ && enabled != "no" &&
                        (" " suites " ") ~ (" " suite " ") && uris != "") {
                        split(uris, u, /[[:space:]]+/); print u[1]; found = 1; exit
                    }
                    types = suites = uris = ""; enabled = "yes"
                }
                BEGIN { enabled = "yes" }
                /^[[:space:]]*#/ { next }
                /^[[:space:]]*$/ { flush(); next }
                tolower($1) == "types:"   { $1 = ""; types = $0 }
                tolower($1) == "suites:"  { $1 = ""; suites = $0; gsub(/^[[:space:]]+|[[:space:]]+$/, "", suites) }
                tolower($1) == "uris:"    { $1 = ""; uris = $0; gsub(/^[[:space:]]+|[[:space:]]+$/, "", uris) }
                tolower($1) == "enabled:" { enabled = tolower($2) }
                END { if (!found) flush() }' "$f")"
            [[ -n "$m" ]] && break
        done
    fi
    echo "${m:-http://deb.debian.org/debian}"
}

# Scratch dirs made by this run; removed on exit (after unmounting anything
# debootstrap may have left mounted inside a rootfs).
SCRATCH=()
cleanup() {
    local d mp
    for d in "${SCRATCH[@]:-}"; do
        [[ -n "$d" && -e "$d" ]] || continue
        if [[ -r /proc/mounts ]]; then
            awk '{print $2}' /proc/mounts | { grep -F "$d/" || true; } | sort -r \
                | while read -r mp; do umount -l "$mp" 2>/dev/null || true; done
        fi
        rm -rf --one-file-system "$d" 2>/dev/null || rm -rf "$d" 2>/dev/null || true
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------
# Docker reachable?
if ! command -v docker >/dev/null 2>&1; then
    die "the docker CLI is not installed; run scripts/ensure-docker.sh (as root) first"
fi
if ! server_version="$(docker version --format '{{.Server.Version}}' 2>/dev/null)"; then
    die "the Docker Engine is not reachable ('docker version' failed); run scripts/ensure-docker.sh (as root) first"
fi
say "Docker Engine $server_version; target $IMAGE"

ENGINE_HASH="$(engine_hash "$ENGINE_DIR")"
if [[ ! -d "$ENGINE_DIR" ]]; then
    say "WARNING: $ENGINE_DIR does not exist yet; the image gets a PLACEHOLDER bless_reference package (re-run once it exists)"
fi

# ---------------------------------------------------------------------------
# Up to date? (no pulls, no network: must answer fast)
existing_id="$(image_id "$IMAGE" || true)"
if (( force == 0 )) && [[ -n "$existing_id" ]]; then
    old_path="$(image_label "$IMAGE" org.bless.build-path || true)"
    old_hash="$(image_label "$IMAGE" org.bless.build-inputs || true)"
    if [[ "$old_path" == online || "$old_path" == offline ]]; then
        if [[ "$path_choice" == auto || "$path_choice" == "$old_path" ]] \
           && old_base_id="$(base_id_for_path "$old_path")" \
           && [[ "$(inputs_hash "$old_path" "$old_base_id")" == "$old_hash" ]]; then
            say "$IMAGE is up to date (path $old_path, inputs ${old_hash:0:12})"
            drop_stage_leftovers
            echo "$existing_id"
            exit 0
        fi
    fi
    say "$IMAGE exists but its inputs changed (or it was not built by this script); rebuilding"
fi

# ---------------------------------------------------------------------------
# Choose the path.
if [[ "$path_choice" != auto ]]; then
    path="$path_choice"
    reason="it was requested (--path / BLESS_IMAGE_PATH)"
elif image_id "$ONLINE_BASE" >/dev/null; then
    path=online
    reason="$ONLINE_BASE is present locally"
else
    say "trying 'docker pull $ONLINE_BASE' (timeout ${PULL_TIMEOUT}s)"
    if pull_out="$(timeout "$PULL_TIMEOUT" docker pull "$ONLINE_BASE" 2>&1)"; then
        path=online
        reason="docker pull $ONLINE_BASE succeeded"
    else
        rc=$?
        last="$(printf '%s\n' "$pull_out" | tail -n 1)"
        if (( rc == 124 )); then last="timed out after ${PULL_TIMEOUT}s"; fi
        path=offline
        reason="docker pull $ONLINE_BASE failed (${last:-exit $rc})"
    fi
fi
say "using path $path because $reason"

mkdir -p "$CACHE_DIR"

# ---------------------------------------------------------------------------
# Offline: base image from debootstrap (cached by the hash of its inputs).
ensure_base_image() {
    local tag rootfs mirror log t0
    tag="$(base_tag)"
    if image_id "$tag" >/dev/null; then
        say "base image $tag exists (cached)"
        return
    fi
    is_root || die "building the base image $tag needs root (debootstrap); run: sudo $0 ${version}"
    command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap
    # Non-Debian hosts (e.g. Ubuntu) need Debian's archive keys to verify bookworm.
    local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    [[ -f "$keyring" ]] || apt_install debian-archive-keyring
    mirror="$(find_mirror)"
    rootfs="$(mktemp -d "$CACHE_DIR/rootfs.XXXXXX")"
    SCRATCH+=("$rootfs")
    log="$CACHE_DIR/debootstrap.log"
    say "debootstrap --variant=$DEBOOTSTRAP_VARIANT --include=$DEBOOTSTRAP_INCLUDE $DEBIAN_SUITE $rootfs $mirror (log: $log; about a minute)"
    t0=$SECONDS
    if ! debootstrap --keyring="$keyring" --variant="$DEBOOTSTRAP_VARIANT" --include="$DEBOOTSTRAP_INCLUDE" \
            "$DEBIAN_SUITE" "$rootfs" "$mirror" >"$log" 2>&1; then
        say "last lines of $log:"
        tail -n 20 "$log" | sed "s/^/$PROG:   /" >&2
        die "debootstrap failed (mirror $mirror; set BLESS_DEBIAN_MIRROR to use another)"
    fi
    # Slim it: downloaded .debs and apt lists are not needed in the image.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/tmp/* 2>/dev/null || true
    say "debootstrap done in $((SECONDS - t0))s; docker import as $tag"
    tar --numeric-owner -C "$rootfs" -c . \
        | docker import \
            --change 'ENV LANG=C.UTF-8' \
            --change 'CMD ["/bin/bash"]' \
            --change "LABEL org.bless.base-suite=$DEBIAN_SUITE org.bless.base-include=$DEBOOTSTRAP_INCLUDE" \
            -m "debootstrap --variant=$DEBOOTSTRAP_VARIANT $DEBIAN_SUITE + $DEBOOTSTRAP_INCLUDE" \
            - "$tag" >/dev/null \
        || die "docker import failed"
    say "base image $tag imported ($(image_id "$tag"))"
}

# Offline: wheelhouse with the torch wheel and its dependencies (cached).
ensure_wheelhouse() {
    local wh_key tmp t0
    [[ -f "$TORCH_WHEEL" ]] || die "torch wheel not found: $TORCH_WHEEL (set BLESS_TORCH_WHEEL)"
    wh_key="$(printf '%s\n%s\n%s\n' "$(basename "$TORCH_WHEEL")" "${EXTRA_PACKAGES[*]}" "${PIP_TARGET_ARGS[*]}" | sha256)"
    WHEELHOUSE="$CACHE_DIR/wheelhouse-${wh_key:0:12}"
    if [[ -f "$WHEELHOUSE/.complete" ]]; then
        say "wheelhouse $WHEELHOUSE exists (cached)"
        return
    fi
    tmp="$(mktemp -d "$CACHE_DIR/wheelhouse.tmp.XXXXXX")"
    SCRATCH+=("$tmp")
    t0=$SECONDS
    if python3 -m pip --version >/dev/null 2>&1; then
        say "pip download torch's dependencies and ${EXTRA_PACKAGES[*]} on the host into $WHEELHOUSE"
        python3 -m pip download --disable-pip-version-check --dest "$tmp" \
            "${PIP_TARGET_ARGS[@]}" "$TORCH_WHEEL" "${EXTRA_PACKAGES[@]}" >&2 \
            || die "pip download of torch's dependencies failed"
    else
        # No pip on the host: let the base image's pip (in a throw-away venv) do it.
        # Host network, the host's CA bundle (TLS-intercepting proxies) and its
        # proxy / index settings, so pip sees what the host would see.
        say "no pip on the host; pip download inside $(base_tag) instead"
        local run_args=(--rm --network host
                        -v "$tmp:/wheelhouse"
                        -v "$(dirname "$TORCH_WHEEL"):/torchwheel:ro")
        local ca="${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}"
        if [[ -f "$ca" ]]; then
            run_args+=(-v "$ca:/host-ca.crt:ro" -e PIP_CERT=/host-ca.crt)
        fi
        if ! is_root; then
            run_args+=(--user "$(id -u):$(id -g)" -e HOME=/tmp)
        fi
        local v
        for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY PIP_INDEX_URL; do
            if [[ -n "${!v:-}" ]]; then run_args+=(-e "$v=${!v}"); fi
        done
        docker run "${run_args[@]}" \
            "$(base_tag)" sh -ec "python3 -m venv /tmp/v && /tmp/v/bin/pip download \
                --disable-pip-version-check --dest /wheelhouse ${PIP_TARGET_ARGS[*]} \
                /torchwheel/$(basename "$TORCH_WHEEL") ${EXTRA_PACKAGES[*]}" >&2 \
            || die "pip download of torch's dependencies (in the base image) failed"
    fi
    [[ -f "$tmp/$(basename "$TORCH_WHEEL")" ]] || cp "$TORCH_WHEEL" "$tmp/"
    touch "$tmp/.complete"
    rm -rf "$WHEELHOUSE"
    mv "$tmp" "$WHEELHOUSE"
    # Drop wheelhouses of other inputs (each holds a ~200 MB torch wheel).
    find "$CACHE_DIR" -mindepth 1 -maxdepth 1 -type d -name 'wheelhouse-*' \
        ! -path "$WHEELHOUSE" -exec rm -rf {} + 2>/dev/null || true
    say "wheelhouse ready in $((SECONDS - t0))s: $(find "$WHEELHOUSE" -maxdepth 1 -name '*.whl' -printf '%f ')"
}

# ---------------------------------------------------------------------------
# Build context (a temp dir in the cache; the repo is never written to).
ctx="$(mktemp -d "$CACHE_DIR/ctx.XXXXXX")"
SCRATCH+=("$ctx")
cp "$DOCKERFILE_DIR/Dockerfile.$path" "$ctx/Dockerfile"
mkdir -p "$ctx/bless_reference"
if [[ -d "$ENGINE_DIR" ]]; then
    ( cd "$ENGINE_DIR" && tar -c --exclude=__pycache__ --exclude='*.pyc' . ) | tar -x -C "$ctx/bless_reference"
    # Label what is actually built, even if the repo changes meanwhile.
    ENGINE_HASH="$(engine_hash "$ctx/bless_reference")"
else
    cat >"$ctx/bless_reference/__init__.py" <<'EOF'
"""PLACEHOLDER bless_reference package (the real engine was missing at build time)."""
EOF
    cat >"$ctx/bless_reference/__main__.py" <<'EOF'
import argparse
argparse.ArgumentParser(prog="bless_reference",
                        description="PLACEHOLDER: rebuild the image once "
                                    "bless/engines/reference_engine exists").parse_args()
EOF
fi

build_args=()
if [[ "$path" == offline ]]; then
    ensure_base_image
    ensure_wheelhouse
    base="$(base_tag)"
    # Hard links where possible (same file system), copies otherwise.
    cp -al "$WHEELHOUSE" "$ctx/wheelhouse" 2>/dev/null || { rm -rf "$ctx/wheelhouse"; cp -a "$WHEELHOUSE" "$ctx/wheelhouse"; }
    rm -f "$ctx/wheelhouse/.complete"
    build_args+=(--network none
                 --build-arg "BASE_IMAGE=$base"
                 --build-arg "TORCH_WHEEL=$(basename "$TORCH_WHEEL")")
else
    base="$ONLINE_BASE"
    if ! image_id "$base" >/dev/null; then
        say "docker pull $base"
        docker pull "$base" >&2 || die "docker pull $base failed; use --path offline where there is no registry"
    fi
    build_args+=(--build-arg "BASE_IMAGE=$base"
                 --build-arg "TORCH_VERSION=$TORCH_VERSION"
                 --build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
fi
# Legacy builder (no buildx, or DOCKER_BUILDKIT=0): remove the containers of
# failed steps too. BuildKit has no such leftovers.
if [[ "${DOCKER_BUILDKIT:-}" == 0 ]] || ! docker buildx version >/dev/null 2>&1; then
    build_args+=(--force-rm)
fi
base_id="$(image_id "$base")" || die "base image $base is missing"
hash="$(inputs_hash "$path" "$base_id")"

say "docker build -t $IMAGE (path $path, base $base, inputs ${hash:0:12})"
t0=$SECONDS
docker build \
    "${build_args[@]}" \
    --label "org.bless.build-inputs=$hash" \
    --label "org.bless.build-path=$path" \
    --label "org.bless.base-image=$base" \
    --label "org.bless.version=$version" \
    --iidfile "$ctx/iid" \
    -t "$IMAGE" \
    "$ctx" >&2 \
    || die "docker build failed (path $path)"
id="$(image_id "$IMAGE")" || die "built, but $IMAGE is not in the image store"
# Drop the image this build replaced, if it was ours and nothing else uses it
# (no tags left, no containers: docker refuses otherwise, which is fine).
if [[ -n "$existing_id" && "$existing_id" != "$id" ]] \
   && [[ -n "$(image_label "$existing_id" org.bless.build-path || true)" ]] \
   && [[ "$(docker image inspect --format '{{len .RepoTags}}' "$existing_id" 2>/dev/null || echo 1)" == 0 ]]; then
    if docker image rm "$existing_id" >/dev/null 2>&1; then
        say "removed the replaced image ${existing_id:7:12}"
    fi
fi
drop_stage_leftovers
size="$(docker image inspect --format '{{.Size}}' "$IMAGE" 2>/dev/null || echo 0)"
say "built $IMAGE in $((SECONDS - t0))s (total $((SECONDS - started))s), $((size / 1000000)) MB, id $id"
echo "$id"
