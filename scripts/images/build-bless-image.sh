#!/usr/bin/env bash
# build-bless-image.sh - build the image that holds bless and nothing of an engine.
#
# Tag: bless:<version> (default: the version in pyproject.toml). Inside the image:
#   - user root, HOME=/root, workdir /
#   - bless and its Python dependencies (no torch) in a venv at /opt/bless, built from this checkout
#   - `bless` and `serve-full` on PATH: symlinks /usr/local/bin/{bless,serve-full} -> /opt/bless/bin/...
#     (/opt/bless/bin itself is not on PATH)
# Its use: the init container of a Kubernetes pod that runs `bless pull REF@sha256:... --trust DIR --root DIR`.
#
# Two paths, chosen automatically (or with --path / $BLESS_IMAGE_PATH), as for scripts/images/build-reference-image.sh:
#   online : python:3.11-slim is local or `docker pull` works -> build FROM it, pip builds bless from the
#            source in the context and takes its dependencies from PyPI.
#   offline: no registry -> FROM the debootstrap'ed Debian base bless-base:bookworm-<hash> (the one
#            build-reference-image.sh makes; made here when missing), built with `--network none` from a
#            wheelhouse prepared on the host: bless's wheel (`pip wheel --no-deps`) and its dependencies
#            (`pip download` for the base's CPython and glibc).
#
# Caching: the inputs (bless's source files and pyproject.toml, the Dockerfile, the base image ID) are hashed
# into the image label org.bless.build-inputs; when the tagged image already carries the same hash the script
# prints "up to date" and exits at once.
#
# stdout: only the image ID (sha256:...). Everything else goes to stderr.
# Shared with the other image scripts: scripts/images/image-lib.sh.
set -euo pipefail

PROG="build-bless-image"
RECIPE_VERSION=1   # bump to force rebuilds when the recipe changes outside the hashed files

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DOCKERFILE_DIR="$SCRIPT_DIR/bless-image"
IMAGE_NAME="bless"

# shellcheck source=scripts/images/image-lib.sh
source "$SCRIPT_DIR/image-lib.sh"

# The version in pyproject.toml ([project] version = "..."), the default tag.
project_version() {
    awk -F'"' '/^\[/ { in_project = ($0 == "[project]") } in_project && /^version *=/ { print $2; exit }' \
        "$REPO_ROOT/pyproject.toml"
}

usage() {
    cat >&2 <<EOF
usage: scripts/images/build-bless-image.sh [--path auto|online|offline] [--force] [VERSION]

Build the image of bless (no torch, no engine) as $IMAGE_NAME:VERSION (default: the
version in pyproject.toml, $(project_version)): a venv at /opt/bless, bless and serve-full
on PATH. Prints the image ID on stdout; progress goes to stderr.

  --path P   online  : FROM $ONLINE_BASE + pip install of this checkout, dependencies
                       from PyPI (needs Docker Hub and internet)
             offline : debootstrap'ed Debian $DEBIAN_SUITE base (docker import, cached)
                       + a wheelhouse made on the host, built with --network none
             auto    : offline if its base image is local, else online if $ONLINE_BASE is local or pullable, else offline (default)
  --force    rebuild even if the image is up to date
  -h, --help this help

Environment:
  BLESS_IMAGE_PATH       same as --path
  BLESS_BUILD_CACHE      cache dir for the wheelhouse and scratch (default \$BLESS_ROOT/build
                         when BLESS_ROOT is set, else \${XDG_CACHE_HOME:-\$HOME/.cache}/bless/build)
  BLESS_DEBIAN_MIRROR    Debian mirror for debootstrap (default: from /etc/apt sources,
                         else http://deb.debian.org/debian)
  BLESS_PULL_TIMEOUT     seconds allowed for 'docker pull $ONLINE_BASE' (default 30)

Needs a reachable Docker Engine (see scripts/ensure-docker.sh). The offline path
needs root when the base image is missing (debootstrap), and a package index for
pip (PyPI or a mirror) on the host, or in the base image when the host has no pip.
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
        --path) [[ $# -ge 2 ]] || die "--path needs a value"; path_choice="$2"; shift 2 ;;
        --path=*) path_choice="${1#--path=}"; shift ;;
        --force) force=1; shift ;;
        -*) usage; die "unknown option: $1" ;;
        *) [[ -z "$version" ]] || die "only one VERSION argument is accepted"; version="$1"; shift ;;
    esac
done
if [[ -z "$version" ]]; then
    version="$(project_version)"
    [[ -n "$version" ]] || die "no version in $REPO_ROOT/pyproject.toml; give one: scripts/images/build-bless-image.sh VERSION"
fi
valid_tag "$version" || die "invalid image tag '$version'"
case "$path_choice" in auto|online|offline) ;; *) die "--path must be auto, online or offline (got '$path_choice')" ;; esac
[[ "$PULL_TIMEOUT" =~ ^[0-9]+$ ]] || die "BLESS_PULL_TIMEOUT must be a number of seconds"
IMAGE="$IMAGE_NAME:$version"
started=$SECONDS
# Untagged images with this label are the legacy builder's leftover venv stages (the Dockerfiles set it).
STAGE_LABEL="org.bless.build-stage=bless-image"

# ---------------------------------------------------------------------------
# Helpers

# Hash of everything the final image is made of, for path $1 on base image ID $2.
inputs_hash() {
    local path="$1" base_id="$2"
    {
        printf 'recipe=%s\npath=%s\nbase=%s\n' "$RECIPE_VERSION" "$path" "$base_id"
        printf 'dockerfile=%s\n' "$(sha256 <"$DOCKERFILE_DIR/Dockerfile.$path")"
        printf 'bless=%s\n' "$SOURCE_HASH"
    } | sha256
}

trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------
require_docker
SOURCE_HASH="$(bless_source_hash "$REPO_ROOT")"
exit_if_up_to_date "$path_choice" "$STAGE_LABEL"
# What is on this machine first (as the reference image's script): the offline path needs only its base image.
offline_inputs_local() {
    image_id "$(base_tag)" >/dev/null || return 1
    echo "the base image $(base_tag) is local"
}
choose_path "$path_choice"
mkdir -p "$CACHE_DIR"

# ---------------------------------------------------------------------------
# Build context (a temp dir in the cache; the repo is never written to).
new_scratch ctx
ctx="$SCRATCH_DIR"
cp "$DOCKERFILE_DIR/Dockerfile.$path" "$ctx/Dockerfile"
new_scratch bless-src
src="$SCRATCH_DIR"
copy_bless_source "$src"
# Label what is actually built, even if the repo changes meanwhile.
SOURCE_HASH="$(bless_source_hash "$src")"

build_args=()
if [[ "$path" == offline ]]; then
    ensure_base_image
    base="$(base_tag)"
    make_bless_wheelhouse "$src" "$ctx/wheelhouse" "$base"
    build_args+=(--network none --build-arg "BASE_IMAGE=$base")
else
    base="$ONLINE_BASE"
    ensure_online_base
    mv "$src" "$ctx/bless-src"
    build_args+=(--build-arg "BASE_IMAGE=$base")
fi
base_id="$(image_id "$base")" || die "base image $base is missing"
build_image "$ctx" "$path" "$base" "$(inputs_hash "$path" "$base_id")" "$STAGE_LABEL"
