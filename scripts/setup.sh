#!/usr/bin/env bash
# Sets up everything bless needs on this machine, idempotently:
#   1. a virtualenv in .venv with bless and its dev tools (pip install -e .[dev])
#   2. a running Docker Engine (scripts/ensure-docker.sh installs/starts one when needed)
#   3. the reference engine image bless-reference:0.1.0 (cached: a rebuild only when its inputs change)
#   4. the fleet tools of the tests and benchmarks (Debian packages, when root with apt-get):
#      docker-registry (Docker Distribution: a real OCI registry the tests start on 127.0.0.1) and
#      skopeo (the pull benchmark's baseline). Debian's package may also enable its own service on
#      :5000; bless never uses it (the tests start their own registry on a free loopback port).
# Set BLESS_SKIP_DOCKER=1 to do only step 1 (e.g. on a GPU host that uses the local runtime).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'setup: %s\n' "$*" >&2; }

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c 'import bless, typer, rich, docker, jsonschema, filelock, huggingface_hub, pytest, hypothesis, tuf, oras' 2>/dev/null \
   || [ pyproject.toml -nt .venv/.bless-installed ]; then
  say "installing bless and its dev tools into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]'
  touch .venv/.bless-installed
fi

missing=()
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing ${missing[*]} (OCI registry for the tests, skopeo for the pull benchmark)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }
  else
    say "warning: ${missing[*]} missing and cannot be installed here (not root with apt-get): registry tests skip"
  fi
fi

if [ "${BLESS_SKIP_DOCKER:-0}" = "1" ]; then
  say "BLESS_SKIP_DOCKER=1: not touching Docker"
  say "ready: source .venv/bin/activate puts bless and serve-full on PATH"
  exit 0
fi
bash scripts/ensure-docker.sh
bash scripts/build-reference-image.sh >/dev/null
say "ready: source .venv/bin/activate puts bless and serve-full on PATH"
