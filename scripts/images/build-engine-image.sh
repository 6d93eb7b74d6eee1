#!/usr/bin/env bash
# build-engine-image.sh - build an engine image plus bless (deploy/images/engine.Dockerfile).
#
#   scripts/images/build-engine-image.sh [--path offline|online] [--force] ENGINE_IMAGE TAG
#
# TAG (name:tag) = ENGINE_IMAGE (local; e.g. vllm/vllm-openai:v0.26.0, or bless-reference:0.1.0) with bless in
# its own venv at /opt/bless, /usr/local/bin/{bless,serve-full} linked to it, ENTRYPOINT ["serve-full"]: the
# serving container of a Kubernetes pod. The engine's Python does not see bless's dependencies.
#
#   offline (default): a wheelhouse made on the host (bless's wheel from this checkout, `pip wheel --no-deps`,
#            and `pip download` of its dependencies for the engine image's CPython, glibc and arch, read from
#            the image), built with `--network none` (BLESS_FROM=wheelhouse).
#   online : the context is a copy of bless's source; pip in the build takes the dependencies from PyPI
#            (BLESS_FROM=source; the build needs PyPI).
#
# Caching: the inputs (the engine image ID, the Dockerfile, bless's source files and pyproject.toml, the
# interpreter) are hashed into the image label org.bless.build-inputs; when TAG already carries the same hash
# the script prints "up to date" and exits at once. A new ENGINE_IMAGE under the same name rebuilds.
#
# stdout: only the image ID (sha256:...). Everything else goes to stderr.
# Shared with the other image scripts: scripts/images/image-lib.sh.
set -euo pipefail

PROG="build-engine-image"
RECIPE_VERSION=1   # bump to force rebuilds when the recipe changes outside the hashed files

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# shellcheck source=scripts/images/image-lib.sh
source "$SCRIPT_DIR/image-lib.sh"
DOCKERFILE="$REPO_ROOT/deploy/images/engine.Dockerfile"
ENGINE_PYTHON="${BLESS_ENGINE_PYTHON:-python3}"

usage() {
    cat >&2 <<EOF
usage: scripts/images/build-engine-image.sh [--path offline|online] [--force] ENGINE_IMAGE TAG

Build TAG (name:tag) from deploy/images/engine.Dockerfile: ENGINE_IMAGE (which must be
in the local image store: docker pull it first) plus bless from this checkout in its own
venv at /opt/bless, bless and serve-full on PATH, ENTRYPOINT ["serve-full"].
Prints the image ID on stdout; progress goes to stderr.

  --path P   offline : a wheelhouse made on the host (pip wheel + pip download for the
                       engine image's Python), built with --network none (default)
             online  : pip in the build installs bless's source, dependencies from PyPI
  --force    rebuild even if the image is up to date
  -h, --help this help

Environment:
  BLESS_ENGINE_PYTHON    the engine image's interpreter the venv is made from (default python3;
                         it needs the venv module: Debian/Ubuntu's python3-venv)
  BLESS_BUILD_CACHE      cache dir for the wheelhouse and scratch (default \$BLESS_ROOT/build
                         when BLESS_ROOT is set, else \${XDG_CACHE_HOME:-\$HOME/.cache}/bless/build)

Example: scripts/images/build-engine-image.sh bless-reference:0.1.0 bless-reference-serve:0.1.0
Needs a reachable Docker Engine (see scripts/ensure-docker.sh) and, offline, a package
index for pip (PyPI or a mirror) on the host, or in the engine image when the host has no pip.
EOF
}

# ---------------------------------------------------------------------------
# Arguments
path_choice=offline
force=0
positional=()
while (( $# > 0 )); do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --path) [[ $# -ge 2 ]] || die "--path needs a value"; path_choice="$2"; shift 2 ;;
        --path=*) path_choice="${1#--path=}"; shift ;;
        --force) force=1; shift ;;
        -*) usage; die "unknown option: $1" ;;
        *) positional+=("$1"); shift ;;
    esac
done
(( ${#positional[@]} == 2 )) || { usage; die "need ENGINE_IMAGE and TAG (got ${#positional[@]} arguments)"; }
ENGINE_IMAGE="${positional[0]}"
IMAGE="${positional[1]}"
case "$path_choice" in online|offline) ;; *) die "--path must be offline or online (got '$path_choice')" ;; esac
[[ "$IMAGE" =~ ^[a-z0-9][a-z0-9._/:-]*$ && "${IMAGE##*/}" == *:* ]] \
    || die "TAG must be a lowercase image name with a tag, e.g. my-vllm-bless:0.26.0 (got '$IMAGE')"
valid_tag "${IMAGE##*:}" || die "invalid image tag '${IMAGE##*:}'"
[[ "$IMAGE" != "$ENGINE_IMAGE" ]] || die "TAG must differ from ENGINE_IMAGE: the engine image's own tag is never replaced"
[[ "$ENGINE_PYTHON" =~ ^[A-Za-z0-9_./+-]+$ ]] || die "BLESS_ENGINE_PYTHON must be a command name or path (got '$ENGINE_PYTHON')"
# The labels' version: bless's (the engine's is in its own image).
version="$(awk -F'"' '/^\[/ { p = ($0 == "[project]") } p && /^version *=/ { print $2; exit }' "$REPO_ROOT/pyproject.toml")"
started=$SECONDS
# Untagged images with this label are the legacy builder's leftover venv stages (engine.Dockerfile sets it).
STAGE_LABEL="org.bless.build-stage=engine-image"

# ---------------------------------------------------------------------------
# Helpers

# Hash of everything the final image is made of, for path $1 on engine image ID $2.
inputs_hash() {
    local path="$1" base_id="$2"
    {
        printf 'recipe=%s\npath=%s\nbase=%s\npython=%s\n' "$RECIPE_VERSION" "$path" "$base_id" "$ENGINE_PYTHON"
        printf 'dockerfile=%s\n' "$(sha256 <"$DOCKERFILE")"
        printf 'bless=%s\n' "$SOURCE_HASH"
    } | sha256
}

# Both paths build on the engine image (replaces image-lib.sh's base_id_for_path).
base_id_for_path() { image_id "$ENGINE_IMAGE"; }

trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------
require_docker
engine_id="$(image_id "$ENGINE_IMAGE")" \
    || die "the engine image $ENGINE_IMAGE is not in the local image store; docker pull it (or build it) first"
if [[ "$(image_id "$IMAGE" || true)" == "$engine_id" ]]; then
    die "$IMAGE is the engine image $ENGINE_IMAGE itself (same ID); pick another TAG"
fi
SOURCE_HASH="$(bless_source_hash "$REPO_ROOT")"
exit_if_up_to_date "$path_choice" "$STAGE_LABEL"
say "using path $path_choice"
mkdir -p "$CACHE_DIR"

# ---------------------------------------------------------------------------
# Build context (a temp dir in the cache; the repo is never written to).
new_scratch ctx
ctx="$SCRATCH_DIR"
new_scratch bless-src
src="$SCRATCH_DIR"
copy_bless_source "$src"
# Label what is actually built, even if the repo changes meanwhile.
SOURCE_HASH="$(bless_source_hash "$src")"

build_args=(--file "$ctx/engine.Dockerfile"
            --build-arg "ENGINE_IMAGE=$ENGINE_IMAGE"
            --build-arg "PYTHON=$ENGINE_PYTHON")
if [[ "$path_choice" == offline ]]; then
    make_bless_wheelhouse "$src" "$ctx/wheelhouse" "$ENGINE_IMAGE" "$ENGINE_PYTHON"
    build_args+=(--network none --build-arg "BLESS_FROM=wheelhouse")
else
    # The context is the source itself, as when the repository is the context.
    rmdir "$ctx"
    mv "$src" "$ctx"
    build_args+=(--build-arg "BLESS_FROM=source")
fi
cp "$DOCKERFILE" "$ctx/engine.Dockerfile"
build_image "$ctx" "$path_choice" "$ENGINE_IMAGE" "$(inputs_hash "$path_choice" "$engine_id")" "$STAGE_LABEL"
