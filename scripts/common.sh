# Sourced (not run) by scripts/setup.sh and scripts/main.sh: what they say to the user, said one way.
# Everything goes to stderr, so a command's stdout (e.g. bless run --json through main.sh) stays clean.

# activation_hint VENV: how to get bless and serve-full on PATH, set apart so it is seen at the end of a long run.
# The README's commands call bless by name; without this, the next one a user types is "command not found".
activation_hint() {
    local venv=$1
    if [ "${VIRTUAL_ENV:-}" = "$venv" ]; then
        printf '\n%s is active in this shell: bless and serve-full are on PATH.\n' "$venv" >&2
        return
    fi
    printf '\nbless and serve-full are installed in %s. To run them by name (as the README does), first:\n\n' \
        "$venv" >&2
    printf '    source %s/bin/activate\n\n' "$venv" >&2
    printf '(or call %s/bin/bless directly).\n' "$venv" >&2
}

# Steps whose tools are noisy (apt-get, pip, debootstrap, docker build): one progress line each on stderr, their
# output appended to $STEP_LOG, and only on failure the log's last lines, so an error is seen without scrolling.
# The caller sets STEP_LOG (a file) and STEP_PROG (the prefix of its lines).
STEP_PROG=${STEP_PROG:-setup}

# start_step_log: a new, empty $STEP_LOG for this run, the previous run's kept beside it as $STEP_LOG.1 (one run
# back: a failed run's log survives the re-run that follows it).
start_step_log() {
    mkdir -p "$(dirname "$STEP_LOG")"
    if [ -s "$STEP_LOG" ]; then
        mv -f "$STEP_LOG" "$STEP_LOG.1"
    fi
    : >"$STEP_LOG"
}

# run_step WHAT COMMAND...: say WHAT, run COMMAND with its output in $STEP_LOG; on failure show the log's tail and
# exit with COMMAND's status. COMMAND may be a shell function: chain its commands with && (under `||`, which
# this needs to catch the status, bash ignores set -e inside it).
run_step() {
    local what=$1 status=0
    shift
    printf '%s: %s\n' "$STEP_PROG" "$what" >&2
    STEP_START=$(($(wc -c <"$STEP_LOG") + 1))
    printf '\n===== %s %s\n' "$(date -u +%H:%M:%S)" "$what" >>"$STEP_LOG"
    "$@" >>"$STEP_LOG" 2>&1 || status=$?
    if [ "$status" -ne 0 ]; then
        printf '%s: FAILED (exit %s): %s. The last lines of %s:\n' "$STEP_PROG" "$status" "$what" "$STEP_LOG" >&2
        tail -n 40 "$STEP_LOG" | sed 's/^/  | /' >&2
        printf '%s: the whole log: %s\n' "$STEP_PROG" "$STEP_LOG" >&2
        exit "$status"
    fi
}

# step_said PATTERN: the last step's lines that match PATTERN (grep -E), e.g. a sub-script's own summary.
step_said() {
    tail -c "+$STEP_START" "$STEP_LOG" | grep -E "$1" || true
}
