#!/usr/bin/env bash
# GPU proof of coverage with real vLLM (local runtime): a model that compiles kernels lazily (MoE) is blessed
# with its coverage warm-up, then served and driven through every token count and varied traffic; every file the
# engine writes while serving is listed (the overlay's upper layer, its private HOME and temp dir).
#   STEP=run    bless run (K=$TRIALS), verify, show              -> $OUT/run.json, show-record.json, verify.json
#   STEP=serve  serve-full, then scripts/bench/drive_traffic.py: --sweep $SWEEP (every token count once, below
#               max_model_len) and
#               $SECONDS_VARIED s of varied traffic at concurrency $CONCURRENCY, a fraction $STRUCTURED of it
#               with structured outputs and $CHAT chat completions and tool calls (0.25 each); new files after ready
#               -> $OUT/serve-*.txt, traffic.json, new-files.txt (compiled ones in new-compiled.txt)
# A blessing made with [coverage] mode = "off" (COVERAGE=off: a copy of the profile) shows the other side.
# Expects vLLM importable by python3 (a site tree on PYTHONPATH) and root (the overlay). Model: MODEL_KIND.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/proof-lib.sh
OUT=${OUT:-$PWD/gpu-proof-coverage}
mkdir -p "$OUT"
source scripts/gpu/gpu-host-env.sh
PROFILE=${PROFILE:-profiles/vllm-0.26-qwen3-30b-a3b-dummy-local.toml}
ROOT=${BLESS_ROOT:-/tmp/bless-coverage-root}
STEP=${STEP:-run}
bless() { python3 -m bless.cli.main --root "$ROOT" "$@"; }
if [ "${COVERAGE:-}" = off ]; then
  sed 's/^mode = "require"/mode = "off"/' "$PROFILE" > "$OUT/profile-coverage-off.toml"
  grep -q '^mode = "off"' "$OUT/profile-coverage-off.toml" \
    || { echo "COVERAGE=off needs a profile with [coverage] mode = \"require\"" >&2; exit 2; }
  PROFILE=$OUT/profile-coverage-off.toml
fi
PROFILE=$(for_this_gpu "$PROFILE" "$OUT")
model_dir=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["model"]["path"])' "$PROFILE")
if [ -n "${MODEL_KIND:-}" ] && [ ! -d "$model_dir" ]; then
  python3 scripts/gpu/make_vllm_model.py "$MODEL_KIND" "$model_dir" > "$OUT/model.txt"
fi

if [ "$STEP" = run ]; then
  rc=0; bless run --profile "$PROFILE" --trials "${TRIALS:-3}" --json > "$OUT/run.json" 2> "$OUT/run.stderr" || rc=$?
  echo "run exit $rc" | tee "$OUT/run.rc"
  expect_rc "bless run" 0 "$rc"
  if [ -d "$ROOT/rejected" ]; then tar -C "$ROOT" -czf "$OUT/rejected.tgz" --exclude='*/tree/*' rejected; fi
  [ "$rc" = 0 ] || { tail -40 "$OUT/run.stderr"; exit "$rc"; }
  HASH=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["config_hash"])' "$OUT/run.json")
  rc=0; bless verify "$HASH" --json > "$OUT/verify.json" 2> "$OUT/verify.stderr" || rc=$?
  echo "verify exit $rc" | tee -a "$OUT/run.rc"
  expect_rc "bless verify" 0 "$rc"
  bless show "$HASH" --json > "$OUT/show-record.json"
  bless show "$HASH" > "$OUT/show.txt" 2>&1 || true
  tail -25 "$OUT/run.stderr"
  exit 0
fi

# STEP=serve: foreground serve-full (sealed: a compile the blessing does not hold is an event at once) in the background of this script, its upper layer and private dirs watched.
python3 -m bless.cli.serve --root "$ROOT" --profile "$PROFILE" ${SERVE_ARGS:-} > "$OUT/serve.stdout" 2> "$OUT/serve.stderr" &
pid=$!
wait_for_verdict "$OUT/serve.stderr" "$pid" 900
grep -qi "canary passed" "$OUT/serve.stderr" || { tail -40 "$OUT/serve.stderr"; kill -TERM "$pid" 2>/dev/null; exit 1; }
serve_dir=$(ls -dt "$ROOT"/serve/*/ | head -1)
listing() { (cd "$serve_dir" && find . -type f -o -type l | sort); }
listing > "$OUT/files-at-ready.txt"
# When the first new file appears after ready (a compile while serving), to the half second.
(
  t0=$(date +%s.%N)
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$(listing | comm -13 "$OUT/files-at-ready.txt" - | grep -c . || true)" != 0 ]; then
      echo "first new file $(python3 -c "import sys,time; print(round(time.time()-float(sys.argv[1]),1))" "$t0") s after ready" \
        > "$OUT/first-new-file.txt"; listing | comm -13 "$OUT/files-at-ready.txt" - | head -20 >> "$OUT/first-new-file.txt"; break
    fi
    sleep 0.5
  done
) &
watcher=$!
# serve-full's readiness probe every half second: when it first refuses (46), with the reason.
name=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["name"])' "$PROFILE")
(
  while kill -0 "$pid" 2>/dev/null; do
    if ! python3 -m bless.cli.serve ready "$name" --root "$ROOT" --json > "$OUT/ready-probe.json" 2> "$OUT/ready-probe.stderr"; then
      echo "readiness refused at $(date +%s.%N)" > "$OUT/ready-refused.txt"; cat "$OUT/ready-probe.stderr" >> "$OUT/ready-refused.txt"; break
    fi
    sleep 0.5
  done
) &
prober=$!
port=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb")).get("serving", {}).get("port", 8000))' "$PROFILE")
vocab=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$model_dir/config.json")
# A prompt of M tokens plus its one output token must fit the context: vLLM refuses M = max_model_len (HTTP 400).
context=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["serve"].get("max_model_len", 0))' "$PROFILE")
sweep=${SWEEP:-2048}
if [ "$context" -gt 0 ] && [ "$sweep" -ge "$context" ]; then sweep=$((context - 1)); fi
rc=0
model=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["serve"].get("served_model_name", "m"))' "$PROFILE")
python3 scripts/bench/drive_traffic.py --port "$port" --model "$model" --vocab "$vocab" --sweep "$sweep" \
  --seconds "${SECONDS_VARIED:-120}" --concurrency "${CONCURRENCY:-16}" --max-prompt "${MAX_PROMPT:-3900}" \
  --structured "${STRUCTURED:-0.25}" --chat "${CHAT:-0.25}" \
  > "$OUT/traffic.json" 2> "$OUT/traffic.stderr" || rc=$?
echo "traffic exit $rc" | tee "$OUT/traffic.rc"
expect_rc drive_traffic 0 "$rc"
sleep 2
listing > "$OUT/files-after-traffic.txt"
comm -13 "$OUT/files-at-ready.txt" "$OUT/files-after-traffic.txt" > "$OUT/new-files.txt" || true
grep -E '\.(so|cubin|ptx|hsaco|llir|ttir|ttgir|json)$' "$OUT/new-files.txt" | grep -v '__grp__' > "$OUT/new-compiled.txt" || true
kill "$watcher" "$prober" 2>/dev/null || true
rc=0; python3 -m bless.cli.serve ready "$name" --root "$ROOT" --json > "$OUT/ready-after.json" 2> "$OUT/ready-after.stderr" || rc=$?
echo "serve-full ready exit $rc after the traffic" | tee "$OUT/ready.rc"
# Every compile proven (coverage on): still ready (0); COVERAGE=off: the unproven compile refuses readiness (46).
expect_rc "serve-full ready after the traffic" "${EXPECT_READY:-$([ "${COVERAGE:-}" = off ] && echo 46 || echo 0)}" "$rc"
cp "$serve_dir"/unproven-compiles.jsonl "$OUT/" 2>/dev/null || echo "no unproven-compiles.jsonl" > "$OUT/unproven-compiles.none"
kill -TERM "$pid" 2>/dev/null || true
rc=0; wait "$pid" || rc=$?
echo "serve-full exit $rc after SIGTERM" | tee "$OUT/serve.rc"
expect_rc "serve-full (SIGTERM)" 0 "$rc"
{ echo "files at ready: $(wc -l < "$OUT/files-at-ready.txt")"
  echo "new files after traffic: $(wc -l < "$OUT/new-files.txt")"
  echo "new compiled files (.so .cubin .ptx .json .llir .ttir .ttgir): $(wc -l < "$OUT/new-compiled.txt")"
  echo "new fused_moe_kernel cubins: $(grep -c 'fused_moe_kernel.cubin' "$OUT/new-files.txt" || true)"
  cat "$OUT/first-new-file.txt" 2>/dev/null || echo "no new file after ready"
  cat "$OUT/ready.rc"; cat "$OUT/ready-refused.txt" 2>/dev/null || echo "readiness never refused"
  echo "unproven-compile events: $(cat "$OUT/unproven-compiles.jsonl" 2>/dev/null | wc -l)"
  head -c 600 "$OUT/unproven-compiles.jsonl" 2>/dev/null || true
  cat "$OUT/traffic.json"; } | tee "$OUT/summary.txt"
