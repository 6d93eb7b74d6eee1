"""``$BLESS_TERMINATION_LOG`` is opened without following a link and without blocking (issue 25, item 4).

The kubelet's ``/dev/termination-log`` is a regular file; anything else there (a FIFO nobody reads, a
symlink to a file bless must not overwrite, a device) is left alone, and the refusal itself still exits
with its own code, at once.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bless.cli import boundary
from bless.errors import ExitCode

REPO = Path(__file__).resolve().parents[2]


def refuse_with_log(log: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """A real ``bless hash`` of a missing profile (exit 3) with ``$BLESS_TERMINATION_LOG`` at ``log``; 30 s at most."""
    env = {**os.environ, "PYTHONPATH": str(REPO), boundary.TERMINATION_LOG_ENV: str(log)}
    env.pop("BLESS_ROOT", None)
    return subprocess.run(
        [sys.executable, "-m", "bless.cli.main", "--root", str(tmp_path / "root"), "hash", "--profile", "nope.toml"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=tmp_path,
    )


def test_a_fifo_there_neither_hangs_the_refusal_nor_is_written(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    os.mkfifo(log)
    proc = refuse_with_log(log, tmp_path)  # a blocking open for writing waited for a reader forever
    assert proc.returncode == ExitCode.INPUT_INVALID, proc.stderr[-2000:]
    assert stat.S_ISFIFO(os.lstat(log).st_mode)


def test_a_symlink_there_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    log = tmp_path / "termination-log"
    log.symlink_to(victim)
    proc = refuse_with_log(log, tmp_path)
    assert proc.returncode == ExitCode.INPUT_INVALID, proc.stderr[-2000:]
    assert victim.read_text() == "precious\n" and log.is_symlink()


def test_a_dangling_symlink_creates_nothing(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    log.symlink_to(tmp_path / "created-through-the-link")
    assert refuse_with_log(log, tmp_path).returncode == ExitCode.INPUT_INVALID
    assert not (tmp_path / "created-through-the-link").exists()


@pytest.mark.parametrize("existing", [None, b"an older, longer message than this one will be\n" * 3])
def test_a_regular_file_is_replaced_whole_or_created(tmp_path: Path, existing: bytes | None) -> None:
    log = tmp_path / "termination-log"
    if existing is not None:
        log.write_bytes(existing)
    assert refuse_with_log(log, tmp_path).returncode == ExitCode.INPUT_INVALID
    text = log.read_text()
    assert text.startswith("bless exit 3 (invalid input): ") and "older" not in text
