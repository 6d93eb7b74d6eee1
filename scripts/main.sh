#!/usr/bin/env bash
# The main job on the embedded default, from a fresh machine: set up, bless the reference
# profile for real (Docker, torch.compile), then verify the blessing byte for byte.
# Extra arguments go to `bless run` (e.g. --trials 5, --rebless, --json).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
bash scripts/setup.sh
PROFILE=${BLESS_PROFILE:-profiles/reference-cpu.toml}
HASH=$(.venv/bin/bless hash --profile "$PROFILE" --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["config_hash"])')
if .venv/bin/bless show "$HASH" --json >/dev/null 2>&1 && [[ " $* " != *" --rebless "* ]]; then
  printf 'main: %s is already blessed; verifying it (pass --rebless to bless again)\n' "$HASH" >&2
else
  .venv/bin/bless run --profile "$PROFILE" "$@"
fi
.venv/bin/bless verify "$HASH"
activation_hint "$PWD/.venv"
