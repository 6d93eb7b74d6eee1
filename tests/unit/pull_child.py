"""Subprocess entry point for the pull crash tests: ``pull_child.py ROOT REF POINT TOTAL_BYTES``.

Pulls REF into the store at ROOT and SIGKILLs itself at fault point POINT: ``pull:<step>`` (see
``bless.flows.pull.PULL_STEPS``), a publish point the store passes to the same hook (``validate``,
``rename-manifest``...), or ``pull:download-half`` (half of TOTAL_BYTES written). Run with PYTHONPATH
at the repository root.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from bless.flows.pull import pull_blessing
from bless.oci.client import parse_reference
from bless.store import Store


def main(argv: list[str]) -> int:
    root, reference, kill_at = Path(argv[0]), argv[1], argv[2]
    received = 0

    def die() -> None:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def fault(point: str) -> None:
        print(point, flush=True)
        if point == kill_at:
            die()

    def progress(size: int) -> None:
        nonlocal received
        received += size
        if kill_at == "pull:download-half" and received >= int(argv[3]) // 2:
            die()

    pull_blessing(Store(root), parse_reference(reference), fault=fault, progress=progress)
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
