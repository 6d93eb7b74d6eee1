"""One start at a time per serve name: the lock around "is the name free?" -> "create the container".

Without it two ``serve-full`` of one profile started at the same moment can both find the name free
and race each other's overlay volume and upper dir. ``locks/serve-<name>.lock`` is an flock (the
kernel drops it when its holder dies, so it is never stale). It is held from before the plan's
checks until the engine is up (or the start failed); from then on the running container holds the
name. A second start, or a ``--dry-run``, while it is held is refused at once (12).

``serve-full stop`` takes it too (:func:`hold_for_stop`), for the whole stop: a start that holds it has
no lease yet to be found by (it is still checking and planning), so stop asks that very process to end
(SIGTERM, as on Ctrl-C: nothing of it is left) and waits for the lock; and no start can begin while a
stop cleans up. ``locks/serve-<name>.holder`` records who holds the lock (pid, start time, role), advisory,
for that signal and for refusals.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from filelock import FileLock, Timeout

from bless.errors import ContainerConflictError, LockHeldError
from bless.store import Store
from bless.system.durable import atomic_write_bytes, ensure_dir
from bless.system.file_locks import lock_refusal, open_file_lock
from bless.system.json_files import read_json_object
from bless.system.procid import process_alive, process_identity

__all__ = ["ROLE_START", "ROLE_STOP", "StartingLock", "hold_for_stop"]

#: The holder's role: a serve-full start (or --dry-run), or a stop.
ROLE_START = "start"
ROLE_STOP = "stop"
_POLL_S = 0.05


class StartingLock:
    """``with StartingLock(store, name):`` holds the per-name start lock; :meth:`release` ends it early."""

    def __init__(self, store: Store, name: str, *, role: str = ROLE_START) -> None:
        self.name = name
        self.role = role
        self.path = store.paths.serve_start_lock(name)
        self.holder_path = self.path.with_suffix(".holder")
        self._lock: FileLock | None = None

    def __enter__(self) -> StartingLock:
        try:
            ensure_dir(self.path.parent)
        except OSError as exc:
            raise lock_refusal(self.path, exc, what="start lock") from exc
        try:
            self._lock = open_file_lock(self.path, timeout=0, what="start lock")
        except Timeout:  # held: another start of this name, a conflict (12), not a store fault
            raise ContainerConflictError(
                f"another serve-full is starting (or stopping) {self.name!r} right now (it holds {self.path})",
                hint="wait for it to finish starting; then use it, or stop its detached serve",
                remedy="wait_for_start",
                details={"name": self.name, "lock": str(self.path)},
            ) from None
        # Advisory (who to signal, whom a refusal names): failing to write it must not fail the start.
        with contextlib.suppress(OSError):
            record = {**process_identity(), "role": self.role}
            atomic_write_bytes(self.holder_path, (json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
        return self

    def release(self) -> None:
        """Let the next start of this name go ahead (the running engine now holds the name)."""
        if self._lock is not None:
            lock, self._lock = self._lock, None
            with contextlib.suppress(OSError):
                record = read_json_object(self.holder_path)
                if record is not None and record.get("pid") == os.getpid():
                    self.holder_path.unlink()
            lock.release()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()


@contextlib.contextmanager
def hold_for_stop(store: Store, name: str, wait_s: float, *, stopped: list[str]) -> Iterator[StartingLock]:
    """``with hold_for_stop(...)``: the start lock of ``name``, held for a stop; a start holding it is asked to
    end first; bounded.

    A holder that is a start (its record says so) and runs on this host is sent SIGTERM, once, the very
    process (pid and start time checked just before), never its group: serve-full unwinds as on Ctrl-C and
    stops whatever it started. Another stop holding it is waited for. ``stopped`` gets ``serve-full pid N
    (starting)`` for each start ended.

    Raises:
        LockHeldError: the lock is still held after ``wait_s`` (nothing was stopped or removed).
        ContainerConflictError: a start on another host holds it (it cannot be signalled from here).
    """
    lock = StartingLock(store, name, role=ROLE_STOP)
    deadline = time.monotonic() + wait_s
    signalled: dict[int, dict[str, Any]] = {}
    while True:
        try:
            lock.__enter__()
        except ContainerConflictError:
            pass
        else:
            stopped.extend(f"serve-full pid {pid} (starting)" for pid in signalled)
            break
        holder = read_json_object(lock.holder_path)
        if holder is not None and holder.get("role") == ROLE_START and holder.get("pid") != os.getpid():
            alive = process_alive(holder)
            if alive is None:
                raise ContainerConflictError(
                    f"a serve-full start of {name!r} on host {holder.get('host')!r} holds {lock.path}; "
                    "nothing was stopped",
                    hint="stop it on that host, or retry once it has started",
                    remedy="stop_on_that_host",
                    details={"name": name, "lock": str(lock.path)},
                )
            pid = holder.get("pid")
            if alive and isinstance(pid, int) and pid not in signalled:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                signalled[pid] = holder
        if time.monotonic() >= deadline:
            raise LockHeldError(
                f"the start lock of {name!r} ({lock.path}) is still held {wait_s:g} s later; "
                "nothing was stopped or removed",
                hint="a start may be copying or verifying a large cache: retry the stop",
                remedy="retry_stop",
                details={"name": name, "lock": str(lock.path), "holder": holder},
            )
        time.sleep(_POLL_S)
    try:
        yield lock
    finally:
        lock.release()
