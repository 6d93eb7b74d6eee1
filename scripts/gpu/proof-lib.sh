# Sourced by the gpu-proof-*.sh scripts (after `set -euo pipefail`): a step whose exit code IS the evidence is run
# as `rc=0; STEP ... || rc=$?` so the proof goes on and records it, then `expect_rc NAME EXPECTED "$rc"` says what
# it had to be. Any step that exited otherwise fails the whole proof at its end (exit 1, each such step named on
# stderr), whatever came after it: a proof whose trials were rejected must not exit 0.
PROOF_FAILED=()

# expect_rc NAME EXPECTED RC: record that step NAME exited RC; unless RC is EXPECTED, the proof fails at its end.
expect_rc() {
  if [ "$3" != "$2" ]; then
    PROOF_FAILED+=("$1 exited $3, expected $2")
  fi
}

# On exit: a proof that would end 0 with a failed step ends 1 instead; one already failing keeps its own code.
_proof_end() {
  local code=$?
  if [ "${#PROOF_FAILED[@]}" -gt 0 ]; then
    printf 'proof FAILED: %s\n' "${PROOF_FAILED[@]}" >&2
    [ "$code" -ne 0 ] || exit 1
  fi
  exit "$code"
}
trap _proof_end EXIT

# for_this_gpu PROFILE OUT: print the profile to prove on this machine. The shipped GPU profiles declare the GPU
# product they were proven on (so gate works on CPU-only CI), and bless run / serve-full refuse another (32); on
# another product (an H200 for an H100 profile, say) this writes a copy declaring this machine's GPU into OUT and
# prints its path, saying so on stderr. A cache is blessed per GPU product: the copy hashes apart, as it should.
for_this_gpu() {
  local profile=$1 out=$2 live declared copy
  live=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
  declared=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb")).get("hardware", {}).get("gpu_name", ""))' "$profile")
  if [ -z "$declared" ] || [ -z "$live" ] || [ "$declared" = "$live" ]; then
    echo "$profile"; return
  fi
  copy="$out/this-gpu-$(basename "$profile")"
  sed "s/^gpu_name = \"$declared\"/gpu_name = \"$live\"/" "$profile" > "$copy"
  echo "profile declares $declared, this machine has $live: proving $copy" >&2
  echo "$copy"
}

# wait_for_verdict STDERR PID [SECONDS]: wait until a background serve-full (pid PID, its stderr in STDERR) says
# whether its canary passed, refuses, or exits; at most SECONDS (default 600). The caller reads the verdict.
wait_for_verdict() {
  local stderr=$1 pid=$2 _
  for _ in $(seq 1 "${3:-600}"); do
    grep -qiE "canary (passed|failed)|refused" "$stderr" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 1
  done
}
