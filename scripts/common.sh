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
