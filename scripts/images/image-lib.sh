# image-lib.sh - what the image build scripts share. Sourced (never run) by
# scripts/images/build-reference-image.sh, scripts/images/build-bless-image.sh and scripts/images/build-engine-image.sh.
#
# The caller sets, before sourcing: PROG (the prefix of its messages) and runs under `set -euo pipefail`.
# Before calling the build helpers it sets: IMAGE (name:tag), version (the tag, for messages), CACHE_DIR exists.
#
# What is here:
#   - messages (say, die), hashing, image_id / image_label, root, apt-get
#   - the Docker check and the online/offline choice (python:3.11-slim pullable or not)
#   - the offline base: a debootstrapped Debian bookworm imported as bless-base:bookworm-<hash> (cached; every
#     script builds FROM the same one)
#   - pip on the host, or in an image when the host has none (wheelhouses for --network none builds); the
#     target of a wheelhouse (CPython version, glibc, arch) read from the image it is for; bless's wheelhouse
#   - the "up to date?" check against the org.bless.build-inputs label, the build itself, and the clean-up of
#     what Docker's legacy builder leaves behind
# Each script keeps what is its own: its inputs hash (inputs_hash PATH BASE_ID), its Dockerfiles and build
# arguments, and, where it builds on another base than the two below, base_id_for_path PATH (defined after
# sourcing this file, it replaces the one here).

# Inputs of the debootstrap base image. BASE_RECIPE_VERSION is hashed into its tag: bump it only to force a new
# base (every image built on it then rebuilds).
BASE_RECIPE_VERSION=1
DEBIAN_SUITE="bookworm"
DEBOOTSTRAP_VARIANT="minbase"
DEBOOTSTRAP_INCLUDE="python3,python3-venv,python3-dev,gcc,g++,libc6-dev"
# The base of the online path (needs Docker Hub).
ONLINE_BASE="python:3.11-slim"
PULL_TIMEOUT="${BLESS_PULL_TIMEOUT:-30}"
# Under the store root (bless's own default root is ~/.cache/bless), so that a BLESS_ROOT on another disk takes
# the wheelhouses (a ~200 MB torch wheel) and the debootstrap scratch with it, and one rm -r removes both.
CACHE_DIR="${BLESS_BUILD_CACHE:-${BLESS_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/bless}/build}"

IMAGE_LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$IMAGE_LIB_DIR/../.." && pwd)"

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

sha256() { sha256sum | cut -c1-64; }

image_id() { docker image inspect --format '{{.Id}}' "$1" 2>/dev/null; }

image_label() {
    docker image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null
}

is_root() { [[ "$(id -u)" -eq 0 ]]; }

# A valid image tag (the part after the colon).
valid_tag() { [[ "$1" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]]; }

# The legacy builder keeps the last image of each earlier stage of a multi-stage build as an untagged <none>
# image. Every untagged image that carries label $1 (default org.bless.base-suite: everything that descends
# from our debootstrap base inherits it; the base itself and the final images are tagged) is such a leftover of
# these scripts: remove them. Images still used by a container are kept (docker refuses).
drop_stage_leftovers() {
    local label="${1:-org.bless.base-suite}" stage
    for stage in $(docker images --quiet --no-trunc --filter dangling=true --filter "label=$label"); do
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

# Tag of the debootstrap base: a hash of its inputs (the mirror is left out on purpose: any mirror serves the
# same suite; the arch is in).
base_tag() {
    local arch h
    arch="$(dpkg --print-architecture 2>/dev/null || uname -m)"
    h="$(printf 'recipe=%s\nsuite=%s\nvariant=%s\ninclude=%s\narch=%s\n' \
        "$BASE_RECIPE_VERSION" "$DEBIAN_SUITE" "$DEBOOTSTRAP_VARIANT" "$DEBOOTSTRAP_INCLUDE" "$arch" | sha256)"
    echo "bless-base:$DEBIAN_SUITE-${h:0:12}"
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
# debootstrap may have left mounted inside a rootfs). The caller sets the traps:
#   trap cleanup EXIT; trap 'exit 130' INT TERM
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

# A new scratch dir under $CACHE_DIR named $1.XXXXXX, removed on exit; its path in SCRATCH_DIR (not on stdout:
# a command substitution would run in a subshell and lose the SCRATCH entry).
new_scratch() {
    SCRATCH_DIR="$(mktemp -d "$CACHE_DIR/$1.XXXXXX")"
    SCRATCH+=("$SCRATCH_DIR")
}

# The Docker CLI is installed and the Engine answers; says which, and the target $IMAGE.
require_docker() {
    local server_version
    if ! command -v docker >/dev/null 2>&1; then
        die "the docker CLI is not installed; run scripts/ensure-docker.sh (as root) first"
    fi
    if ! server_version="$(docker version --format '{{.Server.Version}}' 2>/dev/null)"; then
        die "the Docker Engine is not reachable ('docker version' failed); run scripts/ensure-docker.sh (as root) first"
    fi
    say "Docker Engine $server_version; target $IMAGE"
}

# The ID of the base image of path $1: the debootstrapped Debian base offline, $ONLINE_BASE online.
base_id_for_path() {
    if [[ "$1" == offline ]]; then image_id "$(base_tag)"; else image_id "$ONLINE_BASE"; fi
}

# Exit 0 printing the image ID when $IMAGE carries the inputs hash it would be built with now (no pulls, no
# network: must answer fast). $1: the path asked for (auto, online, offline). Uses the caller's
# base_id_for_path PATH and inputs_hash PATH BASE_ID, and sets existing_id (the image's ID, or "").
# $2: the label whose untagged images are leftover build stages (see drop_stage_leftovers).
exit_if_up_to_date() {
    local path_choice="$1" stage_label="${2:-}" old_path old_hash old_base_id
    existing_id="$(image_id "$IMAGE" || true)"
    if (( force == 0 )) && [[ -n "$existing_id" ]]; then
        old_path="$(image_label "$IMAGE" org.bless.build-path || true)"
        old_hash="$(image_label "$IMAGE" org.bless.build-inputs || true)"
        if [[ "$old_path" == online || "$old_path" == offline ]]; then
            if [[ "$path_choice" == auto || "$path_choice" == "$old_path" ]] \
               && old_base_id="$(base_id_for_path "$old_path")" \
               && [[ "$(inputs_hash "$old_path" "$old_base_id")" == "$old_hash" ]]; then
                say "$IMAGE is up to date (path $old_path, inputs ${old_hash:0:12})"
                drop_stage_leftovers ${stage_label:+"$stage_label"}
                echo "$existing_id"
                exit 0
            fi
        fi
        say "$IMAGE exists but its inputs changed (or it was not built by this script); rebuilding"
    fi
}

# Choose the path for $1 (auto, online, offline): sets path; says why. auto prefers what is on this machine:
# offline when the calling script defines offline_inputs_local and it succeeds (it prints why: every big input of
# the offline path is here, so no registry is tried), online when $ONLINE_BASE is local; then it says it tries
# `docker pull` (online when that gets it within $PULL_TIMEOUT seconds), else offline.
choose_path() {
    local path_choice="$1" reason pull_out rc last local_inputs
    if [[ "$path_choice" != auto ]]; then
        path="$path_choice"
        reason="it was requested (--path / BLESS_IMAGE_PATH)"
    elif declare -F offline_inputs_local >/dev/null && local_inputs="$(offline_inputs_local)"; then
        path=offline
        reason="$local_inputs: the offline path's inputs are on this machine (no registry tried)"
    elif image_id "$ONLINE_BASE" >/dev/null; then
        path=online
        reason="$ONLINE_BASE is present locally"
    else
        say "trying 'docker pull $ONLINE_BASE' (timeout ${PULL_TIMEOUT}s; the offline path if that fails)"
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
}

# The online base, pulled when it is not local.
ensure_online_base() {
    if ! image_id "$ONLINE_BASE" >/dev/null; then
        say "docker pull $ONLINE_BASE"
        docker pull "$ONLINE_BASE" >&2 || die "docker pull $ONLINE_BASE failed; use --path offline where there is no registry"
    fi
}

# Offline: the base image from debootstrap (cached by the hash of its inputs).
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
    new_scratch rootfs
    rootfs="$SCRATCH_DIR"
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

# run_pip IMAGE WHAT PIP_ARGS...: run `pip PIP_ARGS...` (WHAT says what it does, in messages). On the host when
# python3 there has pip; else in a throw-away venv inside IMAGE (which must have python3 with venv), with host
# network, the host's CA bundle (TLS-intercepting proxies) and its proxy / index settings, so pip sees what the
# host would see. Every argument that is an absolute path that exists is mounted into the container and
# rewritten to its path there (a directory read-write at /host/N, a file's directory read-only at /host/N).
run_pip() {
    local image="$1" what="$2"
    shift 2
    if python3 -m pip --version >/dev/null 2>&1; then
        say "$what on the host"
        python3 -m pip "$@" >&2 || die "$what failed"
        return
    fi
    say "no pip on the host; $what inside $image instead"
    local run_args=(--rm --network host --entrypoint sh) args=() a n=0
    for a in "$@"; do
        if [[ "$a" == /* && -d "$a" ]]; then
            run_args+=(-v "$a:/host/$n")
            args+=("/host/$n")
            n=$((n + 1))
        elif [[ "$a" == /* && -f "$a" ]]; then
            run_args+=(-v "$(dirname "$a"):/host/$n:ro")
            args+=("/host/$n/$(basename "$a")")
            n=$((n + 1))
        else
            args+=("$a")
        fi
    done
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
    docker run "${run_args[@]}" "$image" -ec \
        'python3 -m venv /tmp/v && exec /tmp/v/bin/pip "$@"' sh "${args[@]}" >&2 \
        || die "$what (in $image) failed"
}

# pip_target_args IMAGE [PYTHON]: the pip download options for a wheelhouse that PYTHON (default python3) of
# IMAGE can install from: binary wheels only, its CPython version and ABI, and every manylinux tag its glibc
# and arch accept (pip takes --platform literally: manylinux_2_28 alone misses wheels tagged only
# manylinux_2_17). Read from the image itself (a --network none run), into the array PIP_TARGET.
pip_target_args() {
    local image="$1" python="${2:-python3}" probe impl pyver glibc arch minor
    probe="$(docker run --rm --network none --entrypoint "$python" "$image" -c \
        'import platform, sys; print(sys.implementation.name, "%d.%d" % sys.version_info[:2], platform.libc_ver()[1] or "none", platform.machine())' \
        2>&1)" || die "cannot run $python in $image to read its Python version and glibc: $probe"
    read -r impl pyver glibc arch <<<"$probe"
    [[ "$impl" == cpython ]] || die "$python in $image is $impl; the wheelhouse is made for CPython"
    [[ "$glibc" =~ ^2\.([0-9]+)$ ]] || die "$python in $image reports no glibc ('$glibc'): musl images are not supported"
    minor="${BASH_REMATCH[1]}"
    (( minor >= 17 )) || die "$image has glibc $glibc; the wheelhouse needs manylinux_2_17 (glibc 2.17) or newer"
    PIP_TARGET=(--only-binary=:all: --implementation cp
                --python-version "$pyver" --abi "cp${pyver/./}")
    while (( minor >= 17 )); do
        PIP_TARGET+=(--platform "manylinux_2_${minor}_${arch}")
        minor=$((minor - 1))
    done
    PIP_TARGET+=(--platform "manylinux2014_${arch}")
    say "wheelhouse target: CPython $pyver, glibc $glibc, $arch (read from $image)"
}

# --- bless's own package -------------------------------------------------------------------------------------

# What pip needs to build bless's wheel, relative to the repo root: the package (bless/cli and bless/schema are
# symlinks to cli/ and manifests/schema/), its metadata and the readme the metadata names.
BLESS_SOURCES=(pyproject.toml README.md bless cli manifests/schema)

# copy_bless_source DEST: those files (no bytecode) into the new dir DEST, symlinks kept.
copy_bless_source() {
    mkdir -p "$1"
    ( cd "$REPO_ROOT" && tar -c --exclude=__pycache__ --exclude='*.pyc' "${BLESS_SOURCES[@]}" ) | tar -x -C "$1"
}

# bless_source_hash DIR: hash of what the wheel is built from in DIR (a checkout or a copy): relative paths and
# contents, symlinks followed (as setuptools follows bless/cli), no bytecode.
bless_source_hash() {
    ( cd "$1" \
      && find -L pyproject.toml README.md bless -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 \
         | LC_ALL=C sort -z | xargs -0 -r sha256sum ) | sha256
}

# make_bless_wheelhouse SRC DEST IMAGE [PYTHON]: DEST (a new dir) gets bless's wheel built from SRC (a copy
# made by copy_bless_source) and every dependency as a wheel for PYTHON of IMAGE (pip_target_args), so that
# `pip install --no-index --find-links DEST bless-cache` works in IMAGE without a network. The dependencies are
# cached in $CACHE_DIR/bless-deps-<target>-<pyproject> (they change only with pyproject.toml); older ones of
# the same target are dropped.
make_bless_wheelhouse() {
    local src="$1" dest="$2" image="$3" python="${4:-python3}" target_key deps_key deps tmp wheel t0
    pip_target_args "$image" "$python"
    t0=$SECONDS
    new_scratch bless-wheel
    run_pip "$image" "pip wheel --no-deps (bless's wheel)" \
        wheel --disable-pip-version-check --no-deps --wheel-dir "$SCRATCH_DIR" "$src"
    wheel="$(find "$SCRATCH_DIR" -maxdepth 1 -name 'bless_cache-*.whl' -print -quit)"
    [[ -n "$wheel" ]] || die "pip wheel made no bless_cache-*.whl in $SCRATCH_DIR"
    target_key="$(printf '%s\n' "${PIP_TARGET[*]}" | sha256)"
    deps_key="$(sha256 <"$src/pyproject.toml")"
    deps="$CACHE_DIR/bless-deps-${target_key:0:12}-${deps_key:0:12}"
    if [[ -f "$deps/.complete" ]]; then
        say "bless's dependencies: $deps exists (cached)"
    else
        new_scratch bless-deps.tmp
        tmp="$SCRATCH_DIR"
        run_pip "$image" "pip download of bless's dependencies into $deps" \
            download --disable-pip-version-check --dest "$tmp" "${PIP_TARGET[@]}" "$wheel"
        rm -f "$tmp"/bless_cache-*.whl
        touch "$tmp/.complete"
        rm -rf "$deps"
        mv "$tmp" "$deps"
        find "$CACHE_DIR" -mindepth 1 -maxdepth 1 -type d -name "bless-deps-${target_key:0:12}-*" \
            ! -path "$deps" -exec rm -rf {} + 2>/dev/null || true
    fi
    # Hard links where possible (same file system), copies otherwise.
    cp -al "$deps" "$dest" 2>/dev/null || { rm -rf "$dest"; cp -a "$deps" "$dest"; }
    rm -f "$dest/.complete"
    cp "$wheel" "$dest/"
    say "wheelhouse ready in $((SECONDS - t0))s: $(find "$dest" -maxdepth 1 -name '*.whl' | wc -l) wheels, $(basename "$wheel")"
}

# --- the build -----------------------------------------------------------------------------------------------

# build_image CTX PATH BASE HASH [STAGE_LABEL]: docker build CTX (its Dockerfile) as $IMAGE with the caller's
# build_args, labelled with the inputs hash, the path, the base and $version; then drop the image it replaced
# (when it was ours and nothing uses it) and the leftover build stages; print the size; the image ID on stdout.
build_image() {
    local ctx="$1" path="$2" base="$3" hash="$4" stage_label="${5:-}" t0 id size
    # Legacy builder (no buildx, or DOCKER_BUILDKIT=0): remove the containers of
    # failed steps too. BuildKit has no such leftovers.
    if [[ "${DOCKER_BUILDKIT:-}" == 0 ]] || ! docker buildx version >/dev/null 2>&1; then
        build_args+=(--force-rm)
    fi
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
        || { drop_stage_leftovers ${stage_label:+"$stage_label"}; die "docker build failed (path $path)"; }
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
    drop_stage_leftovers ${stage_label:+"$stage_label"}
    size="$(docker image inspect --format '{{.Size}}' "$IMAGE" 2>/dev/null || echo 0)"
    say "built $IMAGE in $((SECONDS - t0))s (total $((SECONDS - started))s), $((size / 1000000)) MB, id $id"
    echo "$id"
}
