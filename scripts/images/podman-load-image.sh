#!/usr/bin/env bash
# podman-load-image.sh - copy images from the Docker Engine into podman's store (for `podman kube play`).
#
#   scripts/images/podman-load-image.sh IMAGE...
#
# For each IMAGE (a name:tag the Docker Engine has): `docker save IMAGE | podman load`, unless podman already
# has that image ID under that name. podman names what it loads fully: a name without a registry gets
# localhost/ (bless:0.1.0 -> localhost/bless:0.1.0), a Docker Hub one docker.io/ (vllm/vllm-openai:v0.26.0 ->
# docker.io/vllm/vllm-openai:v0.26.0). A pod YAML may use either spelling: podman finds local images by the
# short name too. When a load moves the name off an older image that nothing else names or uses, that older
# image is removed from podman's store.
#
# stdout: podman's name of each IMAGE, one per line, in order. Everything else goes to stderr.
# Needs the Docker Engine (scripts/ensure-docker.sh) and podman (scripts/ensure-podman.sh).
set -euo pipefail

PROG="podman-load-image"
say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

usage() {
    cat >&2 <<EOF
usage: scripts/images/podman-load-image.sh IMAGE...

Copy each IMAGE from the Docker Engine into podman's store (docker save | podman load),
skipping one podman already has (same image ID under the same name). Prints podman's
name of each image on stdout (localhost/NAME:TAG for a name without a registry).
EOF
}

case "${1:-}" in
    -h|--help) usage; exit 0 ;;
    "") usage; exit 2 ;;
    -*) usage; die "unknown option: $1" ;;
esac

command -v docker >/dev/null 2>&1 || die "the docker CLI is not installed; run scripts/ensure-docker.sh (as root) first"
command -v podman >/dev/null 2>&1 || die "podman is not installed; run scripts/ensure-podman.sh (as root) first"
docker version --format '{{.Server.Version}}' >/dev/null 2>&1 \
    || die "the Docker Engine is not reachable; run scripts/ensure-docker.sh (as root) first"

# podman's full name for a Docker image name: what `podman load` calls it.
podman_name() {
    local name="$1" first="${1%%/*}"
    [[ "$name" == *:* || "$name" == *@* ]] || name="$name:latest"
    if [[ "$name" != */* ]]; then
        echo "localhost/$name"
    elif [[ "$first" == *.* || "$first" == *:* || "$first" == localhost ]]; then
        echo "$name"              # has a registry (a dot, a port or localhost)
    else
        echo "docker.io/$name"
    fi
}

podman_id() { podman image inspect --format '{{.Id}}' "$1" 2>/dev/null; }

for image in "$@"; do
    docker_id="$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null)" \
        || die "the Docker Engine has no image $image"
    docker_id="${docker_id#sha256:}"
    name="$(podman_name "$image")"
    old_id="$(podman_id "$name" || true)"
    if [[ "$old_id" == "$docker_id" ]]; then
        say "$image is in podman already as $name (id ${docker_id:0:12})"
        echo "$name"
        continue
    fi
    t0=$SECONDS
    if podman image exists "$docker_id" 2>/dev/null; then
        # The same image under another name (loaded before under another tag): a name is all it needs.
        podman tag "$docker_id" "$name" || die "podman tag ${docker_id:0:12} $name failed"
        say "tagged ${docker_id:0:12}, already in podman, as $name"
    else
        size="$(docker image inspect --format '{{.Size}}' "$image")"
        say "docker save $image | podman load ($((size / 1000000)) MB)"
        # pipefail: a failed docker save fails the pipeline even when podman load copes with a short stream.
        docker save "$image" | podman load >&2 || die "docker save $image | podman load failed"
    fi
    new_id="$(podman_id "$name")" || die "podman load finished but podman has no image named $name"
    [[ "$new_id" == "$docker_id" ]] \
        || die "podman's $name is ${new_id:0:12}, not the Docker image ${docker_id:0:12}"
    if [[ -n "$old_id" ]] \
       && [[ "$(podman image inspect --format '{{len .RepoTags}}' "$old_id" 2>/dev/null || echo 1)" == 0 ]]; then
        if podman image rm "$old_id" >/dev/null 2>&1; then
            say "removed the older ${old_id:0:12} that $name named before"
        fi
    fi
    say "$image is in podman as $name (id ${docker_id:0:12}, $((SECONDS - t0))s)"
    echo "$name"
done
