"""``bless run`` as a real process: signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bless.errors import ExitCode

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("run_child.py")
IMAGE_ID = "sha256:" + "cd" * 32

PROFILE = f"""
profile_version = 1
name = "signal-test"

[engine]
name = "reference"

[runtime]
kind = "docker"
image = "{IMAGE_ID}"

[model]
source = "builtin"
id = "reference-tiny"

[hardware]
accelerator = "cpu"
"""


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_run_stops_on_a_signal_even_when_started_with_sigint_ignored(tmp_path: Path, signum: int) -> None:
    """``bless run ... &`` from a script starts with SIGINT ignored; Ctrl-C / kill -INT must still stop it."""
    profile = tmp_path / "profile.toml"
    profile.write_text(PROFILE, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO), "BLESS_ROOT": "", "BLESS_MANIFESTS_DIR": ""}
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(tmp_path / "root"), str(profile)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_sigint,  # what a non-interactive shell does to a background job
    )
    try:
        assert child.stderr is not None
        for line in child.stderr:
            if "pinging" in line:
                break
        else:
            pytest.fail(f"the child ended before reaching the runtime: {child.wait()}")
        child.send_signal(signum)
        try:
            code = child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"bless run ignored {signal.Signals(signum).name}")
        rest = child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert code == ExitCode.INTERRUPTED and ExitCode.INTERRUPTED.value == 130, rest
    assert "interrupted" in rest and "Traceback" not in rest


def test_summary_of_a_run_interrupted_before_staging_names_no_tree(tmp_path: Path) -> None:
    """summary.md lists only the files the evidence dir has: no tree/ when nothing was staged."""
    from bless.core.profile import load_profile
    from bless.flows.resolve import resolve_profile
    from bless.flows.run.results import RunOptions
    from bless.flows.run.summary import render_summary
    from tests.unit.test_cli import write_profile

    resolved = resolve_profile(load_profile(write_profile(tmp_path)), image_resolver=None)
    options = RunOptions(trials=3)
    early = render_summary(
        resolved, "run-1", 1, {}, [], ("interrupted",), options, interrupted="the bootstrap", has_tree=False, logs=[]
    )
    files = next(line for line in early.splitlines() if line.startswith("Files here:"))
    assert "`tree/` (the rejected cache)" not in files and "nothing was staged" in files
    assert "evidence.json" in files and "trial-N.log" not in files
    full = render_summary(resolved, "run-1", 1, {}, [], ("bad",), options, logs=["bootstrap.log", "trial-1.log"])
    files = next(line for line in full.splitlines() if line.startswith("Files here:"))
    assert "`tree/`" in files and "`bootstrap.log`, `trial-1.log` (engine logs)" in files
