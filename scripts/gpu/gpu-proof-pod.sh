#!/usr/bin/env bash
# gpu-proof-pod.sh - serve-full as a Kubernetes pod runs it, on a GPU host without Kubernetes.
#
# A pod has no CAP_SYS_ADMIN, so the local runtime cannot mount: BLESS_LOCAL_MOUNTS=copy gives every engine
# start here the same copy mode (bootstrap and trials on copies, serving from a copy verified before the
# engine starts). Then serve-full listens on 0.0.0.0 as in a pod, the readiness probe (serve-full ready NAME)
# is polled every second from the start, one golden prompt is sent once it passes, and SIGTERM ends it as the
# kubelet would. What is recorded in $OUT: run.json, verify.json, serve.stderr, probe.txt, request.txt,
# serve.rc, termination-log (empty unless something was refused).
#
#   PROFILE=profiles/vllm-0.26-tiny-llama-local.toml OUT=/tmp/pod bash scripts/gpu/gpu-proof-pod.sh
#   PROFILE=profiles/reference-cpu-pod.toml bash scripts/gpu/gpu-proof-pod.sh     # the same on CPU, anywhere
#
# MODEL_KIND builds the profile's model directory first (scripts/gpu/make_vllm_model.py), as gpu-proof-vllm.sh does.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/proof-lib.sh
OUT=${OUT:-$PWD/gpu-proof-pod}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export BLESS_LOCAL_MOUNTS=copy
PROFILE=${PROFILE:-profiles/vllm-0.26-tiny-llama-local.toml}
PROFILE=$(for_this_gpu "$PROFILE" "$OUT")
ROOT=${BLESS_ROOT:-/tmp/bless-pod-root}
PORT=${PORT:-18080}
NAME=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["name"])' "$PROFILE")
bless() { python3 -m bless.cli.main --root "$ROOT" "$@"; }
serve_full() { python3 -m bless.cli.serve "$@"; }

if [ -n "${MODEL_KIND:-}" ]; then
  model_dir=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["model"]["path"])' "$PROFILE")
  [ -d "$model_dir" ] || python3 scripts/gpu/make_vllm_model.py "$MODEL_KIND" "$model_dir" > "$OUT/model.txt"
fi
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv > "$OUT/gpu.csv" 2>&1 || true

rc=0; bless run --profile "$PROFILE" --trials "${TRIALS:-2}" --json > "$OUT/run.json" 2> "$OUT/run.stderr" || rc=$?
echo "run exit $rc" | tee "$OUT/run.rc"
expect_rc "bless run" 0 "$rc"
[ "$rc" -eq 0 ] || { tail -40 "$OUT/run.stderr"; exit 1; }
HASH=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["config_hash"])' "$OUT/run.json")
rc=0; bless verify "$HASH" --json > "$OUT/verify.json" 2> "$OUT/verify.stderr" || rc=$?
echo "verify exit $rc" | tee "$OUT/verify.rc"
expect_rc "bless verify" 0 "$rc"
bless show "$HASH" --json > "$OUT/show-record.json"

: > "$OUT/termination-log"
started=$(date +%s.%N)
# Not through the shell function: $! must be serve-full itself, which SIGTERM is for.
BLESS_TERMINATION_LOG=$OUT/termination-log python3 -m bless.cli.serve --root "$ROOT" --profile "$PROFILE" \
  --host 0.0.0.0 --port "$PORT" > "$OUT/serve.stdout" 2> "$OUT/serve.stderr" &
pid=$!
failed=0; ready=""
for _ in $(seq 1 900); do
  if serve_full ready "$NAME" --root "$ROOT" > /dev/null 2> "$OUT/probe.last"; then
    ready=$(python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" "$started")
    break
  fi
  failed=$((failed + 1))
  kill -0 "$pid" 2>/dev/null || break
  sleep 1
done
echo "readiness probe: $failed failed (exit 46) before it passed; ready ${ready:-never} s after serve-full started" \
  | tee "$OUT/probe.txt"
expect_rc "the readiness probe" passed "${ready:+passed}"
rc=0
python3 - "$OUT/show-record.json" "$PORT" > "$OUT/request.txt" 2>&1 <<'PY' || rc=$?
import json, sys
from bless.replay.engine_client import EngineClient
from bless.engines import get_adapter
manifest = json.load(open(sys.argv[1]))
golden = manifest["golden"][0]
fields = get_adapter(manifest["factors"]["engine"]["name"]).completion_fields  # as the canary asks
client = EngineClient("127.0.0.1", int(sys.argv[2]), timeout_s=120, fields=fields, require_token_ids=True)
served = client.models()
client.model = served[0] if served else None
reply = client.complete(golden["prompt"], golden["max_tokens"])
same = list(reply.token_ids) == golden["token_ids"]
print(f"request on 127.0.0.1:{sys.argv[2]}: token ids {'equal' if same else 'DIFFER from'} the golden ones ({len(reply.token_ids)} tokens, {reply.latency_s:.3f} s)")
sys.exit(0 if same else 1)
PY
expect_rc "the golden request" 0 "$rc"
cat "$OUT/request.txt"
t_stop=$(date +%s.%N)
kill -TERM "$pid" 2>/dev/null || true
rc=0; wait "$pid" || rc=$?
echo "serve-full exit $rc after SIGTERM, $(python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 2))" "$t_stop") s" \
  | tee "$OUT/serve.rc"
expect_rc "serve-full (SIGTERM)" 0 "$rc"
after=0; serve_full ready "$NAME" --root "$ROOT" > /dev/null 2>&1 || after=$?
echo "readiness probe after the stop: exit $after" | tee -a "$OUT/probe.txt"
expect_rc "the readiness probe after the stop" 46 "$after"  # NOT_SERVING: refusing is the evidence
grep -E "presented as|canary passed|verified" "$OUT/serve.stderr" | cut -c1-220 | tee "$OUT/serve.summary" || true
echo "termination-log: $(wc -c < "$OUT/termination-log") bytes"
