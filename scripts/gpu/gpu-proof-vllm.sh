#!/usr/bin/env bash
# GPU proof of bless with real vLLM (local runtime, no Docker), end to end:
#   bless engines -> bless run (K trials) -> bless verify -> serve-full (canary, then a graceful stop by $STOP_SIGNAL,
#   default TERM) -> serve-full on a tampered copy (refused).
# Expects vLLM importable by python3 (e.g. a site tree at /tmp/site on PYTHONPATH, see docs/evidence/vllm-h100*/)
# and the profile's model directory (the tiny model at /tmp/tiny-llama by default; MODEL_KIND=KIND builds the
# profile's model.path with scripts/gpu/make_vllm_model.py KIND when it is missing). Writes everything into $OUT
# (default ./gpu-proof-vllm).
# -e: a step that fails unexpectedly stops the proof; steps whose exit code IS the evidence capture it.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/proof-lib.sh
OUT=${OUT:-$PWD/gpu-proof-vllm}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PROFILE=${PROFILE:-profiles/vllm-tiny-llama-local.toml}
PROFILE=$(for_this_gpu "$PROFILE" "$OUT")
ROOT=${BLESS_ROOT:-/tmp/bless-vllm-root}
bless() { python3 -m bless.cli.main --root "$1" "${@:2}"; }
serve_full() { python3 -m bless.cli.serve --root "$1" "${@:2}"; }

if [ -n "${MODEL_KIND:-}" ]; then
  model_dir=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["model"]["path"])' "$PROFILE")
  [ -d "$model_dir" ] || python3 scripts/gpu/make_vllm_model.py "$MODEL_KIND" "$model_dir" > "$OUT/model.txt"
fi
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv > "$OUT/gpu.csv" 2>&1
rc=0; bless "$ROOT" engines --json > "$OUT/engines.json" 2> "$OUT/engines.stderr" || rc=$?
echo "engines exit $rc" | tee "$OUT/engines.rc"
expect_rc "bless engines" 0 "$rc"
rc=0; bless "$ROOT" run --profile "$PROFILE" --trials "${TRIALS:-3}" --json > "$OUT/run.json" 2> "$OUT/run.stderr" || rc=$?
echo "run exit $rc" | tee "$OUT/run.rc"
expect_rc "bless run" 0 "$rc"
HASH=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("config_hash",""))' "$OUT/run.json" 2>/dev/null || true)
# tar options before the member names: GNU tar applies --exclude only to names that follow it.
if [ -d "$ROOT/runs" ]; then tar -C "$ROOT" -czf "$OUT/run-logs.tgz" runs; fi
if [ -d "$ROOT/rejected" ]; then tar -C "$ROOT" -czf "$OUT/rejected.tgz" --exclude='*/tree/*' rejected; fi
[ -n "$HASH" ] || { tail -30 "$OUT/run.stderr"; exit 1; }
rc=0; bless "$ROOT" verify "$HASH" --json > "$OUT/verify.json" 2> "$OUT/verify.stderr" || rc=$?
echo "verify exit $rc" | tee "$OUT/verify.rc"
expect_rc "bless verify" 0 "$rc"
bless "$ROOT" show "$HASH" --json > "$OUT/show-record.json"

# serve-full in the foreground: wait for the canary verdict, then stop it like an operator (SIGINT).
# Started directly (not through the shell function): $! must be serve-full's own pid for the signal to reach it.
python3 -m bless.cli.serve --root "$ROOT" --profile "$PROFILE" > "$OUT/serve.stdout" 2> "$OUT/serve.stderr" &
pid=$!
wait_for_verdict "$OUT/serve.stderr" "$pid"
sleep 2
t_stop=$(date +%s.%N)
kill -"${STOP_SIGNAL:-TERM}" "$pid" 2>/dev/null || true
rc=0; wait "$pid" || rc=$?
echo "serve-full exit $rc after SIG${STOP_SIGNAL:-TERM}" | tee "$OUT/serve.rc"
expect_rc "serve-full (stopped by a signal)" 0 "$rc"
echo "stop took $(python3 -c "import sys,time; print(round(time.time()-float(sys.argv[1]),2))" "$t_stop") s" | tee -a "$OUT/serve.rc"
# After the stop: no engine process left, and the serve dir (the overlay's upper layer) discarded.
{ echo "engine processes left: $(pgrep -fc 'vllm.entrypoints' || true)"
  echo "serve dirs left: $(ls -A "$ROOT/serve" 2>/dev/null | wc -l)"; } | tee "$OUT/after-stop.txt"

# a tampered copy of the store: one byte of the AOT model flipped -> refused before any start
cp -a "$ROOT" /tmp/bless-vllm-tampered
target=$(find /tmp/bless-vllm-tampered/blessed -path '*torch_aot_compile*' -name model -print -quit)
chmod u+w "$target"
python3 -c 'import sys; p=sys.argv[1]; b=bytearray(open(p,"rb").read()); b[len(b)//2]^=1; open(p,"wb").write(b)' "$target"
rc=0; serve_full /tmp/bless-vllm-tampered --profile "$PROFILE" --json > "$OUT/tampered.json" 2> "$OUT/tampered.stderr" || rc=$?
echo "tampered serve-full exit $rc" | tee "$OUT/tampered.rc"
expect_rc "serve-full of a tampered store" 21 "$rc"  # VERIFY_FAILED: the refusal is the evidence
tail -3 "$OUT/serve.stderr"
