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
