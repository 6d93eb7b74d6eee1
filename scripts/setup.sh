#!/usr/bin/env bash
# Sets up everything bless needs on this machine, idempotently:
#   1. a virtualenv in .venv with bless and its dev tools (pip install -e .[dev])
#   2. a running Docker Engine (scripts/ensure-docker.sh installs/starts one when needed)
#   3. the reference engine image bless-reference:0.1.0 (cached: a rebuild only when its inputs change)
# Set BLESS_SKIP_DOCKER=1 to do only step 1 (e.g. on a GPU host that uses the local runtime).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'setup: %s\n' "$*" >&2; }

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c 'import bless, typer, rich, docker, jsonschema, filelock, huggingface_hub, pytest, hypothesis' 2>/dev/null \
   || [ pyproject.toml -nt .venv/.bless-installed ]; then
  say "installing bless and its dev tools into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]'
  touch .venv/.bless-installed
fi

if [ "${BLESS_SKIP_DOCKER:-0}" = "1" ]; then
  say "BLESS_SKIP_DOCKER=1: not touching Docker"
  exit 0
fi
bash scripts/ensure-docker.sh
bash scripts/build-reference-image.sh >/dev/null
say "ready: .venv/bin/bless --help"
