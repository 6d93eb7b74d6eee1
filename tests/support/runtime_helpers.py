"""Helpers of the runtime tests (the contract suite and each runtime's own): waiting on engines, small trees."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from bless.runtime.base import Runtime, Started


def wait_exit(runtime: Runtime, started: Started, timeout: float = 30.0) -> int:
    """The engine's exit code, once it exited; fails the test with its logs after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = runtime.exit_code(started)
        if code is not None:
            return code
        time.sleep(0.02)
    raise AssertionError(f"{started.name} did not exit in {timeout}s; logs:\n{runtime.logs(started)}")


def wait_log(runtime: Runtime, started: Started, text: str, timeout: float = 30.0) -> None:
    """Until ``text`` is in the engine's logs (e.g. "ready": its signal handler is installed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in runtime.logs(started):
            return
        if runtime.exit_code(started) is not None and text not in runtime.logs(started):
            raise AssertionError(f"{started.name} exited before printing {text!r}; logs:\n{runtime.logs(started)}")
        time.sleep(0.02)
    raise AssertionError(f"{text!r} not in the logs of {started.name} after {timeout}s:\n{runtime.logs(started)}")


def tree_digest(root: Path) -> dict[str, str]:
    """Path -> sha256 (or 'dir'), to prove a tree is byte-identical afterwards."""
    return {
        p.relative_to(root).as_posix(): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


def make_lower(root: Path) -> Path:
    """A small cache tree under ``root/lower``: files to rewrite, delete, leave alone, and a dir to remove."""
    lower = root / "lower"
    (lower / "sub").mkdir(parents=True)
    (lower / "gone").mkdir()
    (lower / "a.txt").write_text("original a")
    (lower / "b.txt").write_text("original b")
    (lower / "sub" / "c.txt").write_text("untouched c")
    (lower / "gone" / "x.bin").write_bytes(b"\x00" * 10)
    return lower
