#!/usr/bin/env bash
# GPU proof of serve-full's device binding (docs/concepts/serve-full.md, "Device binding") on a host without Docker:
# one blessing served under each form of CUDA_VISIBLE_DEVICES an operator writes, and refused under the forms that
# name no GPU or one twice. For every accepted form it records what serve-full reported (`serve-full ready NAME
# --json`, its `ranks`) next to what the driver saw (nvidia-smi's compute processes and their GPU UUIDs), so a
# reader can check that rank r ran on the GPU the record names. Works with any GPU count: the forms list this
# host's GPUs in reverse order, so on two GPUs rank 0 lands on GPU 1.
#   PROFILE  the profile (default the reference engine's CUDA profile); blessed first (TRIALS, default 2) unless
#            BLESS_ROOT already holds its blessing.
# Writes into $OUT (default ./gpu-proof-binding): gpu.csv, run.json (or show-record.json), forms.tsv (form, expected and actual exit),
# one folder per form (serve stderr, ready.json, apps.csv) and binding.json (the table the summary is made of).
# -e: a step that fails unexpectedly stops the proof; steps whose exit code IS the evidence capture it.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/proof-lib.sh
OUT=${OUT:-$PWD/gpu-proof-binding}
mkdir -p "$OUT"
source scripts/gpu/gpu-host-env.sh
PROFILE=${PROFILE:-profiles/reference-cuda-local.toml}
PROFILE=$(for_this_gpu "$PROFILE" "$OUT")
# A store of this run alone unless BLESS_ROOT names one: two people proving on one host must not share it.
ROOT=${BLESS_ROOT:-$(mktemp -d /tmp/bless-binding-root.XXXXXX)}
NAME=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["name"])' "$PROFILE")
unset CUDA_VISIBLE_DEVICES
bless() { python3 -m bless.cli.main --root "$ROOT" "$@"; }

HASH=$(bless hash --profile "$PROFILE" --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["config_hash"])')
if bless show "$HASH" --json > "$OUT/show-record.json" 2>/dev/null; then
  echo "$ROOT already holds blessing $HASH: serving it"
else
  rc=0; bless run --profile "$PROFILE" --trials "${TRIALS:-2}" --json > "$OUT/run.json" 2> "$OUT/run.stderr" || rc=$?
  echo "run exit $rc" | tee "$OUT/run.rc"
  expect_rc "bless run" 0 "$rc"
fi

mapfile -t INDICES < <(nvidia-smi --query-gpu=index --format=csv,noheader | tr -d ' ')
mapfile -t UUIDS < <(nvidia-smi --query-gpu=uuid --format=csv,noheader | tr -d ' ')
reversed() { local -a items=("$@") out=(); for ((i=${#items[@]}-1; i>=0; i--)); do out+=("${items[$i]}"); done
  (IFS=,; echo "${out[*]}"); }
prefixes=(); for uuid in "${UUIDS[@]}"; do prefixes+=("${uuid:0:12}"); done
n=${#INDICES[@]}

# form<TAB>expected exit: the accepted forms, then what must be refused (53) before anything starts.
{
  printf 'unset\t0\n'
  printf '%s\t0\n' "$(reversed "${INDICES[@]}")" "$(reversed "${UUIDS[@]}")" "$(reversed "${prefixes[@]}")"
  printf '%s\t53\n' "$(reversed "${INDICES[@]}"),$n" "GPU-00000000-typo" "${INDICES[0]},${INDICES[0]}"
} > "$OUT/forms.wanted"

: > "$OUT/forms.tsv"
k=0
while IFS=$'\t' read -r form expected; do
  k=$((k + 1)); dir="$OUT/form-$k"; mkdir -p "$dir"
  echo "$form" > "$dir/form.txt"
  if [ "$form" = unset ]; then env_args=(env -u CUDA_VISIBLE_DEVICES); else env_args=(env "CUDA_VISIBLE_DEVICES=$form"); fi
  if [ "$expected" != 0 ]; then
    rc=0; "${env_args[@]}" python3 -m bless.cli.serve --root "$ROOT" --profile "$PROFILE" --json \
      > "$dir/serve.json" 2> "$dir/serve.stderr" || rc=$?
    expect_rc "serve-full with CUDA_VISIBLE_DEVICES=$form" "$expected" "$rc"
  else
    # Started directly (not through a function): $! must be serve-full's own pid for the signal to reach it.
    "${env_args[@]}" python3 -m bless.cli.serve --root "$ROOT" --profile "$PROFILE" \
      > "$dir/serve.stdout" 2> "$dir/serve.stderr" &
    pid=$!
    wait_for_verdict "$dir/serve.stderr" "$pid"
    ready=0; python3 -m bless.cli.serve ready "$NAME" --root "$ROOT" --json > "$dir/ready.json" 2> "$dir/ready.stderr" \
      || ready=$?
    expect_rc "serve-full ready under CUDA_VISIBLE_DEVICES=$form" 0 "$ready"
    nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv > "$dir/apps.csv" 2>&1 || true
    kill -TERM "$pid" 2>/dev/null || true
    rc=0; wait "$pid" || rc=$?
    expect_rc "serve-full with CUDA_VISIBLE_DEVICES=$form (stopped by SIGTERM)" "$expected" "$rc"
  fi
  printf '%s\t%s\t%s\n' "$form" "$expected" "$rc" | tee -a "$OUT/forms.tsv"
done < "$OUT/forms.wanted"

# The table: per form, the ranks serve-full recorded and the GPUs nvidia-smi saw its engine processes on.
python3 - "$OUT" > "$OUT/binding.json" <<'EOF'
import csv, json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = []
for line, dir_ in zip((out / "forms.tsv").read_text().splitlines(), sorted(out.glob("form-*"), key=lambda p: int(p.name[5:]))):
    form, expected, actual = line.split("\t")
    row = {"cuda_visible_devices": form, "expected_exit": int(expected), "exit": int(actual)}
    ready = dir_ / "ready.json"
    if ready.is_file() and ready.stat().st_size:
        row["ranks"] = json.loads(ready.read_text()).get("ranks")
        apps = [r for r in csv.reader((dir_ / "apps.csv").read_text().splitlines()[1:]) if len(r) == 3]
        row["engine_gpu_uuids"] = sorted({r[1].strip() for r in apps})
    else:
        err = (dir_ / "serve.stderr").read_text().strip().splitlines()
        row["message"] = next((l for l in err if "CUDA_VISIBLE_DEVICES" in l), err[-1] if err else "")
    rows.append(row)
print(json.dumps(rows, indent=1))
EOF
cat "$OUT/forms.tsv"
