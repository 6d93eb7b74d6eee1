"""Subprocess entry point for store tests (real processes: locks, SIGKILL crash points).

Usage (run with PYTHONPATH at the repo root):
    store_child.py hold-lock ROOT HASH SECONDS     take the lock, print "locked", sleep, exit
    store_child.py publish ROOT STAGED MANIFEST    publish STAGED as MANIFEST (a manifest file)
    store_child.py reject ROOT STAGED HASH RUN_ID  keep STAGED as rejected evidence of HASH
    store_child.py keep-interrupted ROOT STAGED HASH RUN_ID
                                                   keep STAGED as the evidence of an interrupted run of HASH
    store_child.py gc ROOT                         gc with keep=0
    store_child.py make-staging ROOT RUN_ID        create a staging dir owned by this process, exit
    store_child.py hold-lease ROOT HASH SERVE_DIR SECONDS
                                                   hold a serving lease on HASH's blessing, print "leased", sleep

Crash options (publish, reject, keep-interrupted, gc), through the store's fault seam (bless.store.faults):
    --kill-at POINT     SIGKILL this process at the first fault point named POINT
    --kill-after N      SIGKILL this process at the N-th fault point reached (1-based)
    --raise-at POINT    raise OSError at POINT (drives the undo path), then keep counting
    --trace             print the fault points reached, one per line, then "done"
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import time
from pathlib import Path

from bless.core.manifest import load_manifest
from bless.store import Store
from tests.unit.store_helpers import held_lease


class Crash:
    """A fault hook that kills (or fails) this process where the options say."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.kill_at: str | None = args.kill_at
        self.kill_after: int | None = args.kill_after
        self.raise_at: str | None = args.raise_at
        self.trace: bool = args.trace
        self.reached = 0

    def __call__(self, point: str) -> None:
        self.reached += 1
        if self.trace:
            print(point, flush=True)
        if point == self.kill_at or self.reached == self.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if point == self.raise_at:
            self.raise_at = None
            raise OSError(errno.EIO, f"injected failure at {point}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command")
    parser.add_argument("root", type=Path)
    parser.add_argument("rest", nargs="*")
    parser.add_argument("--kill-at")
    parser.add_argument("--kill-after", type=int)
    parser.add_argument("--raise-at")
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args(argv)
    store, rest, crash = Store(args.root), args.rest, Crash(args)
    if args.command == "hold-lock":
        with store.lock(rest[0]):
            print("locked", flush=True)
            time.sleep(float(rest[1]))
        return 0
    if args.command == "hold-lease":
        manifest = store.find(rest[0])
        assert manifest is not None
        with held_lease(store, manifest, name="child", serve_dir=Path(rest[1])):
            print("leased", flush=True)
            time.sleep(float(rest[2]))
        return 0
    if args.command == "publish":
        try:
            result = store.publish(Path(rest[0]), load_manifest(Path(rest[1])), fault=crash)
            print(result.manifest_path, flush=True)
        except Exception as exc:  # the undo-path cases fail on purpose
            print(f"failed: {exc}", flush=True)
    elif args.command in ("reject", "keep-interrupted"):
        store.reject(
            Path(rest[0]),
            config_hash=rest[1],
            run_id=rest[2],
            candidate=1,
            summary_md="no",
            evidence={},
            fault=crash,
            interrupted=args.command == "keep-interrupted",
        )
    elif args.command == "gc":
        store.gc(keep=0, fault=crash)
    elif args.command == "make-staging":
        print(store.new_staging_dir(rest[0]), flush=True)
        return 0
    else:
        print(f"unknown command {args.command!r}", file=sys.stderr)
        return 2
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
