"""Subprocess entry point for store tests (real processes: locks, SIGKILL crash points).

Usage (run with PYTHONPATH at the repo root):
    store_child.py hold-lock ROOT HASH SECONDS     take the lock, print "locked", sleep, exit
    store_child.py publish ROOT STAGED MANIFEST [POINT]
                                                   publish STAGED as MANIFEST (a manifest file); with
                                                   POINT, SIGKILL itself at that fault point
    store_child.py make-staging ROOT RUN_ID        create a staging dir owned by this process, exit
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from bless.manifest import load_manifest
from bless.store import FaultHook, Store


def kill_at(point: str | None) -> FaultHook | None:
    """The crash seam: a hook that SIGKILLs this process at fault point ``point``."""
    if point is None:
        return None

    def hook(reached: str) -> None:
        if reached == point:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def main(argv: list[str]) -> int:
    command, root = argv[0], Path(argv[1])
    store = Store(root)
    if command == "hold-lock":
        with store.lock(argv[2]):
            print("locked", flush=True)
            time.sleep(float(argv[3]))
        return 0
    if command == "publish":
        point = argv[4] if len(argv) > 4 else None
        result = store.publish(Path(argv[2]), load_manifest(Path(argv[3])), fault=kill_at(point))
        print(result.manifest_path, flush=True)
        return 0
    if command == "make-staging":
        print(store.new_staging_dir(argv[2]), flush=True)
        return 0
    print(f"unknown command {command!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
