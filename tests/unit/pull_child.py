"""Subprocess entry point for the pull crash tests: ``pull_child.py ROOT REF STEP``.

Pulls REF into the store at ROOT and SIGKILLs itself when the pull announces STEP (one of
``bless.flows.pull.PULL_STEPS``; ``download`` also has ``download-half``: half of the bytes written).
Run with PYTHONPATH at the repository root.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from bless.flows.pull import pull_blessing
from bless.registry import parse_reference
from bless.store import Store


def main(argv: list[str]) -> int:
    root, reference, kill_at = Path(argv[0]), argv[1], argv[2]
    received = 0

    def die() -> None:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def on_step(step: str) -> None:
        print(step, flush=True)
        if step == kill_at:
            die()

    def progress(size: int) -> None:
        nonlocal received
        received += size
        if kill_at == "download-half" and received >= int(argv[3]) // 2:
            die()

    pull_blessing(Store(root), parse_reference(reference), on_step=on_step, progress=progress)
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
