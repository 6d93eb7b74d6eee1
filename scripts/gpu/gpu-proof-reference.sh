#!/usr/bin/env bash
# GPU proof of `bless run` with the reference engine (CUDA graphs) on a host without Docker:
# the local runtime, as root, presents the cache at a fixed path in a private mount namespace
# (overlay for trials). Writes the run and verify JSON plus a summary into $OUT (default ./gpu-proof).
# Needs: python3 with torch (CUDA), typer, rich, filelock, huggingface_hub; jsonschema from .whl/ if missing.
# -e: a step that fails unexpectedly stops the proof; steps whose exit code IS the evidence capture it.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/proof-lib.sh
OUT=${OUT:-$PWD/gpu-proof}
mkdir -p "$OUT"
source scripts/gpu/gpu-host-env.sh
PROFILE=${PROFILE:-profiles/reference-cuda-local.toml}
PROFILE=$(for_this_gpu "$PROFILE" "$OUT")
ROOT=${BLESS_ROOT:-/tmp/bless-gpu-root}
python3 -c 'import torch,sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())' > "$OUT/versions.txt" 2>&1
rc=0; python3 -m bless.cli.main --root "$ROOT" run --profile "$PROFILE" --trials "${TRIALS:-3}" --json > "$OUT/run.json" 2> "$OUT/run.stderr" || rc=$?
echo "run exit $rc" | tee "$OUT/run.rc"
expect_rc "bless run" 0 "$rc"
HASH=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("config_hash",""))' "$OUT/run.json" 2>/dev/null || true)
if [ -n "$HASH" ]; then
  rc=0; python3 -m bless.cli.main --root "$ROOT" verify "$HASH" --json > "$OUT/verify.json" 2> "$OUT/verify.stderr" || rc=$?
  echo "verify exit $rc" | tee "$OUT/verify.rc"
  expect_rc "bless verify" 0 "$rc"
  python3 -m bless.cli.main --root "$ROOT" show "$HASH" --json > "$OUT/show-record.json"
fi
if [ -d "$ROOT/rejected" ]; then tar -C "$ROOT" -czf "$OUT/rejected.tgz" rejected; fi
tail -5 "$OUT/run.stderr"
