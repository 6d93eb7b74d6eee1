#!/usr/bin/env bash
# Sets up everything bless needs on this machine, idempotently:
#   1. a virtualenv in .venv with bless and its dev tools (pip install -e .[dev]), and torch's CPU
#      build (the reference engine's unit tests and mypy need it; not a dev extra, because a plain
#      `pip install torch` from PyPI brings several GB of CUDA packages)
#   2. the fleet tools of the tests and benchmarks (Debian packages, when root with apt-get):
#      docker-registry (Docker Distribution: a real OCI registry the tests start on 127.0.0.1) and
#      skopeo (the pull benchmark's baseline). Debian's package may also enable its own service on
#      :5000; bless never uses it (the tests start their own registry on a free loopback port).
#      softhsm2 and opensc (pkcs11-tool): a PKCS#11 token in a temp dir for the HSM signing tests.
#   3. a running Docker Engine (scripts/ensure-docker.sh installs/starts one when needed)
#   4. the reference engine image bless-reference:0.1.0, the image of bless alone bless:<version> (a pod's init
#      container) and bless-reference-serve:0.1.0, the reference image plus bless (a pod's serving container);
#      each cached: a rebuild only when its inputs change
#   5. podman for `podman kube play` (scripts/ensure-podman.sh; Debian's podman and catatonit, when root with
#      apt-get)
# Set BLESS_SKIP_DOCKER=1 to skip steps 3 to 5 (e.g. on a GPU host that uses the local runtime).
# One line per step on stderr; what pip, apt-get, dockerd's setup and the image build print goes to
# .venv/setup.log (the previous run's moved to .venv/setup.log.1), whose last lines are shown when a step fails.
# What needs the network is said before it is tried, and what is on the machine is used first: a torch CPU wheel
# on disk before the PyTorch CPU index; for the reference image, its offline inputs when they are all here before
# `docker pull python:3.11-slim` (scripts/images/build-reference-image.sh says which path it took and why).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
say() { printf 'setup: %s\n' "$*" >&2; }

STEP_LOG=$PWD/.venv/setup.log
start_step_log
say "the output of each step goes to $STEP_LOG (the previous run's: $STEP_LOG.1)"

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  run_step "creating .venv with $($PYTHON --version 2>&1)" "$PYTHON" -m venv .venv
fi

install_bless() {
  .venv/bin/python -m pip install --upgrade pip \
    && .venv/bin/python -m pip install -e '.[dev]' \
    && touch .venv/.bless-installed
}
if ! .venv/bin/python -c 'import bless, typer, rich, docker, jsonschema, filelock, huggingface_hub, pytest, xdist, hypothesis, tuf, oras' 2>/dev/null \
   || [ pyproject.toml -nt .venv/.bless-installed ]; then
  run_step "installing bless and its dev tools into .venv (pip; a minute or two the first time)" install_bless
else
  say "bless and its dev tools in .venv are up to date"
fi

# torch: any build already there is left alone (a GPU host's venv may hold its CUDA build). Else the
# CPU build, from what is on the machine first: the wheel file the reference image's offline path uses
# ($BLESS_TORCH_WHEEL), then a wheel in pip's find-links (`+cpu` matches nothing on PyPI, so this can never
# fetch the CUDA build), and only then the PyTorch CPU index (the network). numpy beside it, as in the
# reference image: torch warns on every import without it. Each attempt says what it tries ("torch: ...").
TORCH_VERSION=${BLESS_TORCH_VERSION:-2.13.0}
TORCH_INDEX_URL=${BLESS_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
TORCH_WHEEL=${BLESS_TORCH_WHEEL:-/opt/wheels/torch-$TORCH_VERSION+cpu-cp311-cp311-manylinux_2_28_x86_64.whl}
install_torch() {
  if [ -f "$TORCH_WHEEL" ]; then
    echo "torch: installing the local wheel $TORCH_WHEEL"
    .venv/bin/python -m pip install "$TORCH_WHEEL" numpy && return 0
    echo "torch: the local wheel $TORCH_WHEEL did not install (see above)"
  fi
  echo "torch: looking for a CPU wheel of torch $TORCH_VERSION in pip's find-links (its dependencies: pip's indexes)"
  if .venv/bin/python -m pip install "torch==$TORCH_VERSION+cpu" numpy; then
    echo "torch: installed from a local wheel (pip's find-links)"
    return 0
  fi
  echo "torch: no local CPU wheel of torch $TORCH_VERSION: trying the PyTorch CPU index $TORCH_INDEX_URL (network)"
  .venv/bin/python -m pip install "torch==$TORCH_VERSION" --index-url "$TORCH_INDEX_URL" \
    && .venv/bin/python -m pip install numpy \
    && echo "torch: installed from $TORCH_INDEX_URL"
}
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  run_step "installing torch $TORCH_VERSION (CPU build) into .venv: a wheel on this machine first, the PyTorch CPU index ($TORCH_INDEX_URL) only without one" install_torch
  step_said '^torch: ' | sed 's/^/setup:   /' >&2
fi

# apt-get update only when the package lists cannot serve the install (a fresh image has none).
apt_install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y "$@" \
    || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "$@"; }
}
missing=()
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
command -v softhsm2-util >/dev/null 2>&1 || missing+=(softhsm2)
command -v pkcs11-tool >/dev/null 2>&1 || missing+=(opensc)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    run_step "installing ${missing[*]} with apt-get (OCI registry and SoftHSM2 for the tests, skopeo for the pull benchmark)" \
      apt_install "${missing[@]}"
  else
    say "warning: ${missing[*]} missing and cannot be installed here (not root with apt-get): registry and HSM tests skip"
  fi
fi

if [ "${BLESS_SKIP_DOCKER:-0}" = "1" ]; then
  say "BLESS_SKIP_DOCKER=1: not touching Docker"
  say "ready: source .venv/bin/activate puts bless and serve-full on PATH"
  exit 0
fi
run_step "making a Docker Engine reachable (scripts/ensure-docker.sh)" bash scripts/ensure-docker.sh
# What ensure-docker did, when it did something the user may want to undo (docs/getting-started.md, "Clean up").
step_said '^ensure-docker: (installed docker.io|dockerd started|Docker Engine is reachable)' | sed 's/^ensure-docker: /setup:   /' >&2
run_step "building the reference image bless-reference:0.1.0 unless it is up to date (the first time: several minutes; its offline inputs when they are on this machine, else python:3.11-slim, local or by docker pull, with torch from the PyTorch CPU index, else offline)" \
  bash scripts/images/build-reference-image.sh
step_said '^build-reference-image: (.* is up to date|trying |using path|built )' | sed 's/^build-reference-image: /setup:   /' >&2
run_step "building the bless image (bless alone, no torch: a pod's init container) unless it is up to date" \
  bash scripts/images/build-bless-image.sh
step_said '^build-bless-image: (.* is up to date|using path|built )' | sed 's/^build-bless-image: /setup:   /' >&2
run_step "building bless-reference-serve:0.1.0 (the reference image plus bless: a pod's serving container) unless it is up to date" \
  bash scripts/images/build-engine-image.sh bless-reference:0.1.0 bless-reference-serve:0.1.0
step_said '^build-engine-image: (.* is up to date|built )' | sed 's/^build-engine-image: /setup:   /' >&2
if [ "$(id -u)" = 0 ] || command -v podman >/dev/null 2>&1; then
  run_step "making podman usable for the pod tests (scripts/ensure-podman.sh)" bash scripts/ensure-podman.sh
  step_said '^ensure-podman: (installed|wrote|podman .* works)' | sed 's/^ensure-podman: /setup:   /' >&2
else
  say "warning: podman missing and cannot be installed here (not root): the pod tests skip"
fi
say "ready: source .venv/bin/activate puts bless and serve-full on PATH"
