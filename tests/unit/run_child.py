"""Subprocess entry point: ``bless run`` as a real process, on a runtime that blocks in ``ping()``.

Usage (run with PYTHONPATH at the repo root):
    run_child.py ROOT PROFILE     bless --root ROOT run --profile PROFILE; the runtime's ping prints
                                  "pinging" on stderr, then blocks for 60 s (a signal must end it)

A fake of our own Runtime interface: what is under test is the process's signal handling.
"""

from __future__ import annotations

import sys
import time

import bless.runtime
from bless.cli.main import main


class BlockingRuntime:
    """Only what ``bless run`` reaches before its first engine: a ping that never answers."""

    kind = "docker"

    def ping(self) -> None:
        print("pinging", file=sys.stderr, flush=True)
        time.sleep(60)

    def resolve_image(self, reference: str) -> str:
        return reference


if __name__ == "__main__":
    bless.runtime.get_runtime = lambda kind: BlockingRuntime()  # type: ignore[assignment,return-value]
    root, profile = sys.argv[1:3]
    sys.argv = ["bless", "--root", root, "run", "--profile", profile]
    main()
