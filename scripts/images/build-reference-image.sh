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
# Two paths, chosen automatically (or with --path / $BLESS_IMAGE_PATH), what is on the machine first: offline when
# its torch wheel and base image are both local, else online when python:3.11-slim is local, else (said first) a
# `docker pull` of it, else offline:
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
#
# What the image scripts share (the debootstrap base, pip, the build and its clean-up) is in
# scripts/images/image-lib.sh.
set -euo pipefail

PROG="build-reference-image"
RECIPE_VERSION=1   # bump to force rebuilds when the recipe changes outside the hashed files

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/../.." && pwd)"
ENGINE_DIR="$REPO_ROOT/bless/engines/reference_engine"
DOCKERFILE_DIR="$SCRIPT_DIR/reference-image"

IMAGE_NAME="bless-reference"
TORCH_WHEEL="${BLESS_TORCH_WHEEL:-/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl}"
TORCH_VERSION="${BLESS_TORCH_VERSION:-2.13.0}"
TORCH_INDEX_URL="${BLESS_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
# Installed next to torch (torch warns "Failed to initialize NumPy" on every
# import without it). Keep in sync with the Dockerfiles.
EXTRA_PACKAGES=(numpy)
# Target of the wheelhouse: the image's interpreter (Debian bookworm: CPython 3.11, glibc 2.36).
PIP_TARGET_ARGS=(--only-binary=:all: --platform manylinux_2_28_x86_64
                 --python-version 3.11 --implementation cp --abi cp311)

# Messages, hashing, the debootstrap base, pip and the build: shared with the other image scripts.
# shellcheck source=scripts/images/image-lib.sh
source "$SCRIPT_DIR/image-lib.sh"

usage() {
    cat >&2 <<EOF
usage: scripts/images/build-reference-image.sh [--path auto|online|offline] [--force] [VERSION]
       scripts/images/build-reference-image.sh --cache-dir

Build the CPU image of the reference engine as $IMAGE_NAME:VERSION (default 0.1.0).
Prints the image ID on stdout; progress goes to stderr.

  --path P   online  : FROM $ONLINE_BASE + pip install torch==$TORCH_VERSION from
                       $TORCH_INDEX_URL (needs Docker Hub and internet)
             offline : debootstrap'ed Debian $DEBIAN_SUITE base (docker import, cached)
                       + torch from the local wheel, built with --network none
             auto    : offline if its torch wheel and base image are local, else
                       online if $ONLINE_BASE is local or pullable, else offline (default)
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

trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------
# Docker reachable?
require_docker

ENGINE_HASH="$(engine_hash "$ENGINE_DIR")"
if [[ ! -d "$ENGINE_DIR" ]]; then
    say "WARNING: $ENGINE_DIR does not exist yet; the image gets a PLACEHOLDER bless_reference package (re-run once it exists)"
fi

# ---------------------------------------------------------------------------
# Up to date? (no pulls, no network: must answer fast)
exit_if_up_to_date "$path_choice"

# ---------------------------------------------------------------------------
# Choose the path. auto prefers the offline path when its big inputs are here: the torch wheel and the
# debootstrapped base image (a registry and the PyTorch index are then never tried).
offline_inputs_local() {
    [[ -f "$TORCH_WHEEL" ]] || return 1
    image_id "$(base_tag)" >/dev/null || return 1
    echo "the torch wheel $(basename "$TORCH_WHEEL") and the base image $(base_tag) are local"
}
choose_path "$path_choice"

mkdir -p "$CACHE_DIR"

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
    new_scratch wheelhouse.tmp
    tmp="$SCRATCH_DIR"
    t0=$SECONDS
    run_pip "$(base_tag)" "pip download of torch's dependencies and ${EXTRA_PACKAGES[*]} into $WHEELHOUSE" \
        download --disable-pip-version-check --dest "$tmp" \
        "${PIP_TARGET_ARGS[@]}" "$TORCH_WHEEL" "${EXTRA_PACKAGES[@]}"
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
new_scratch ctx
ctx="$SCRATCH_DIR"
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
    ensure_online_base
    build_args+=(--build-arg "BASE_IMAGE=$base"
                 --build-arg "TORCH_VERSION=$TORCH_VERSION"
                 --build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
fi
base_id="$(image_id "$base")" || die "base image $base is missing"
build_image "$ctx" "$path" "$base" "$(inputs_hash "$path" "$base_id")"
