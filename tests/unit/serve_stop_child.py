"""A serve-full as ``serve-full stop`` meets it, for tests/unit/test_serve_stop_race.py (a real process).

``python serve_stop_child.py ROOT NAME CONFIG_HASH DIR_ID MODE DELAY``: holds the serving lease as serve-full
does (``serve_full_holder``; ``MODE=legacy``: a lease without a role, as before roles were recorded), with
an engine in its own session (``sleep``), and on SIGTERM unwinds as serve-full's start does: the engine
stopped, the lease released (exit 130). ``MODE=detach`` (and ``legacy``): after DELAY s hands the lease to
the engine, writes the readiness record naming it, and exits 0 (serve-full --detach). ``MODE=foreground``:
writes the record naming itself and serves until SIGTERM. ``MODE=stubborn``: ignores SIGTERM. Prints
``up ENGINE_PID`` once it holds the lease. ``MODE=plan``: as a start still checking and planning, holds the
per-name start lock and no lease (prints ``planning``) for DELAY s, then starts the engine (prints ``engine PID``),
takes the lease for it, writes the readiness record and exits 0; SIGTERM before then exits 130 with nothing started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from bless.flows.serve.ready import clear_ready, mark_ready
from bless.store import Store
from bless.system.procid import process_identity


def _serve_full_holder() -> dict[str, Any]:
    from bless.flows.serve.lease import serve_full_holder  # the legacy mode runs without it

    return serve_full_holder()


def interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def ready(store: Store, name: str, config_hash: str, holder: dict[str, Any]) -> None:
    mark_ready(store, name=name, config_hash=config_hash, host="127.0.0.1", port=9, canary="passed", holder=holder)


def plan_then_serve(store: Store, name: str, config_hash: str, dir_id: str, delay: float) -> int:
    """``MODE=plan`` (the module docstring)."""
    from bless.flows.serve.start_lock import StartingLock

    signal.signal(signal.SIGTERM, interrupted)
    try:
        with StartingLock(store, name):
            print("planning", flush=True)
            time.sleep(delay)  # the checks and the plan: no lease yet
            engine = subprocess.Popen(["sleep", "600"], start_new_session=True)
            print(f"engine {engine.pid}", flush=True)
            holder = process_identity(engine.pid)
            store.leases.acquire(config_hash, dir_id, name=f"bless-serve-{name}", holder=holder)
            ready(store, name, config_hash, holder)
        return 0
    except KeyboardInterrupt:
        return 130


def main() -> int:
    root, name, config_hash, dir_id, mode, delay = sys.argv[1:7]
    store = Store(Path(root))
    if mode == "plan":
        return plan_then_serve(store, name, config_hash, dir_id, float(delay))
    engine = subprocess.Popen(["sleep", "600"], start_new_session=True)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "stubborn" else interrupted)
    holder = process_identity() if mode == "legacy" else _serve_full_holder()
    lease = store.leases.acquire(config_hash, dir_id, name=f"bless-serve-{name}", holder=holder)
    print(f"up {engine.pid}", flush=True)
    try:
        if mode == "foreground":
            mark_ready(
                store, name=name, config_hash=config_hash, host="127.0.0.1", port=9, canary="passed", holder=holder
            )
        time.sleep(float(delay) if mode in ("detach", "legacy") else 600)
        store.leases.hand_over(lease, process_identity(engine.pid))
        ready_holder = process_identity(engine.pid)
        mark_ready(
            store, name=name, config_hash=config_hash, host="127.0.0.1", port=9, canary="passed", holder=ready_holder
        )
        return 0
    except KeyboardInterrupt:
        os.killpg(engine.pid, signal.SIGTERM)
        engine.wait()
        clear_ready(store, name)
        store.leases.release(lease)
        return 130


if __name__ == "__main__":
    sys.exit(main())
