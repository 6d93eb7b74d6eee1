#!/usr/bin/env bash
# The test command: set up (venv, Docker Engine, reference image), then lint, type-check and
# run every test for real (unit + integration against a real Docker Engine and real compiles).
# pytest's exit code 5 ("no tests collected") is a failure here: a run that tests nothing is not green.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The Docker runtime tests use a tiny image made from Debian's static busybox (no registry needed).
if ! command -v busybox >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "test: installing busybox-static for the Docker runtime tests" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq busybox-static >/dev/null 2>&1 \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq busybox-static >/dev/null; }
fi
echo "test: ruff" >&2
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# mypy (minutes on a clean clone: no cache yet) runs beside pytest, whose tests mostly wait; its report is
# shown, and its failure fails the command, once pytest has ended.
echo "test: mypy (beside pytest; its report follows pytest's)" >&2
mypy_log=$(mktemp)
trap 'rm -f "$mypy_log"' EXIT
.venv/bin/mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
echo "test: pytest" >&2
# Integration tests fail (not skip) when Docker is unreachable: setup.sh started it.
export BLESS_REQUIRE_DOCKER=1
# Registry tests fail (not skip) when docker-registry is missing: setup.sh installed it.
export BLESS_REQUIRE_REGISTRY=1
# The podman tests fail (not skip) when podman is missing: setup.sh installed it.
export BLESS_REQUIRE_PODMAN=1
# The HSM signing tests fail (not skip) when SoftHSM2, pkcs11-tool or python-pkcs11 is missing: setup.sh installed them.
export BLESS_REQUIRE_HSM=1
# The reference engine's model tests fail (not skip) when torch is missing: setup.sh installed it.
export BLESS_REQUIRE_TORCH=1
# In parallel (pytest-xdist): most tests wait on processes, sockets and Docker rather than the CPU, so more
# workers than cores pay. Tests sharing what the machine has one of run in one worker per group
# (tests/conftest.py SERIAL_GROUPS; CONTRIBUTING.md "Tests"). BLESS_TEST_WORKERS=0: one process.
workers=${BLESS_TEST_WORKERS:-6}
set +e
.venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"
code=$?
wait "$mypy_pid"
mypy_code=$?
set -e
echo "test: mypy" >&2
cat "$mypy_log"
if [ "$mypy_code" -ne 0 ]; then
  echo "test: mypy failed (exit $mypy_code)" >&2
  exit "$mypy_code"
fi
if [ "$code" -eq 5 ]; then
  echo "test: pytest collected no tests: failing" >&2
  exit 1
fi
exit "$code"
