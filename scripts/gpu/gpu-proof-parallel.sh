#!/usr/bin/env bash
# GPU proof of `bless run --parallel` (issue 12) and the reference engine's like-for-like start benchmark,
# on a host without Docker (local runtime, root, private mount namespace). Writes into $OUT (default
# ./gpu-proof-parallel): gpu.csv, versions.txt, bench-parallel.json (K trials, --parallel 1 vs N, side by side,
# plus the parallel run's result and manifest), bench-start.json (cold vs blessed starts, alternating pairs,
# and the step-by-step breakdown).
# Needs: python3 with torch (CUDA), typer, rich, filelock, huggingface_hub; jsonschema from .whl/ if missing.
# -e: a step that fails unexpectedly stops the proof; steps whose exit code IS the evidence capture it.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/proof-lib.sh
OUT=${OUT:-$PWD/gpu-proof-parallel}
mkdir -p "$OUT"
source scripts/gpu/gpu-host-env.sh
PROFILE=${PROFILE:-profiles/reference-cuda-local.toml}
PROFILE=$(for_this_gpu "$PROFILE" "$OUT")
python3 -c 'import torch,sys; print(sys.version.split()[0], torch.__version__, torch.cuda.device_count(), torch.cuda.get_device_name())' > "$OUT/versions.txt" 2>&1
nproc >> "$OUT/versions.txt"
rc=0
python3 scripts/bench/bench_parallel.py --profile "$PROFILE" --trials "${TRIALS:-4}" --parallel "${PARALLEL:-2}" \
  --pairs "${PAIRS:-1}" --evidence "$OUT/parallel" --json > "$OUT/bench-parallel.json" 2> "$OUT/bench-parallel.stderr" || rc=$?
echo "bench_parallel exit $rc" | tee "$OUT/bench-parallel.rc"
expect_rc bench_parallel 0 "$rc"
if [ "${START_BENCH:-1}" = 1 ]; then
  rc=0
  # BREAKDOWN=1 adds the per-step boot breakdown; START_ENGINE=0 skips the engine start pairs.
  python3 scripts/bench/bench_reference_start.py --pairs "${START_PAIRS:-3}" ${BREAKDOWN:+--breakdown} \
    $([ "${START_ENGINE:-1}" = 0 ] && echo --no-engine) --json \
    > "$OUT/bench-start.json" 2> "$OUT/bench-start.stderr" || rc=$?
  echo "bench_reference_start exit $rc" | tee "$OUT/bench-start.rc"
  expect_rc bench_reference_start 0 "$rc"
fi
tail -3 "$OUT/bench-parallel.stderr"
