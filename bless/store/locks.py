"""Per-config-hash writer locks: an flock the kernel releases when its holder dies.

``locks/<config_hash>.lock`` is the flock; ``locks/<config_hash>.holder`` records who holds it
(pid, host, since when) so that a refusal can name the holder. Re-entrant within one thread, so
that publish and reject can take the lock themselves while an orchestrator holds it for the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import Timeout

from bless.errors import LockHeldError
from bless.store.layout import check_hash
from bless.system.durable import atomic_write_bytes, ensure_dir
from bless.system.file_locks import open_file_lock
from bless.system.json_files import read_json_object
from bless.system.os_refusals import os_errors
from bless.system.procid import process_alive, process_identity

__all__ = ["HashLocks"]

# Locks this process holds, per thread. A second FileLock on the same file from the same thread
# would otherwise contend with itself.
_HELD: dict[tuple[str, int], int] = {}
_HELD_GUARD = threading.Lock()


class HashLocks:
    """The locks of one store's ``locks/`` directory."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory

    def lock_path(self, config_hash: str) -> Path:
        """``locks/<config_hash>.lock``."""
        return self._dir / f"{config_hash}.lock"

    def holder_path(self, config_hash: str) -> Path:
        """``locks/<config_hash>.holder``: who holds the lock (advisory)."""
        return self._dir / f"{config_hash}.holder"

    @contextmanager
    def lock(self, config_hash: str, *, wait: bool = False, timeout: float | None = None) -> Iterator[None]:
        """Hold the per-hash lock for the ``with`` body.

        Not waiting, a held lock is a :class:`LockHeldError` at once, naming the holder (pid, host,
        since when). With ``wait=True`` it blocks until the lock is free, at most ``timeout``
        seconds (``None``: forever), then raises the same error. Re-entrant within one thread. The
        lock is an flock: the kernel releases it when the holder dies, so there are no stale locks.
        """
        check_hash(config_hash)
        path = self.lock_path(config_hash)
        with os_errors(f"preparing the lock {path}"):
            ensure_dir(self._dir)
            key = (str(path.resolve()), threading.get_ident())
        with _HELD_GUARD:
            depth = _HELD.get(key, 0)
            if depth:
                _HELD[key] = depth + 1
        if depth:
            try:
                yield
            finally:
                with _HELD_GUARD:
                    _HELD[key] -= 1
            return

        if not wait:
            limit = 0.0
        elif timeout is None:
            limit = -1.0  # filelock: negative = wait forever
        else:
            limit = max(0.0, float(timeout))
        try:
            flock = open_file_lock(path, timeout=limit)
        except Timeout:
            raise self._held_error(config_hash, waited=limit if wait else None) from None
        holder = self.holder_path(config_hash)
        try:
            with _HELD_GUARD:
                _HELD[key] = 1
            # The holder record is advisory (for the refusal message); failing to write it must not
            # fail the operation.
            with contextlib.suppress(OSError):
                atomic_write_bytes(holder, (json.dumps(process_identity(), sort_keys=True) + "\n").encode("utf-8"))
            try:
                yield
            finally:
                record = read_json_object(holder)
                if record is not None and record.get("pid") == os.getpid():
                    with contextlib.suppress(OSError):
                        holder.unlink()
                with _HELD_GUARD:
                    _HELD.pop(key, None)
        finally:
            flock.release()

    def _held_error(self, config_hash: str, *, waited: float | None) -> LockHeldError:
        holder = read_json_object(self.holder_path(config_hash))
        if holder is not None and process_alive(holder) is not False:
            who = (
                f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
                f"holding it since {holder.get('started', '?')}"
            )
        else:
            # Just taken: the new holder has not recorded itself (what is there names a dead one).
            who = "the holder has not recorded itself yet"
        waited_text = f" (waited {waited:g} s)" if waited is not None and waited >= 0 else ""
        return LockHeldError(
            f"another bless holds the lock for config hash {config_hash[:16]}...: {who}{waited_text}",
            hint=(
                "wait for that run to finish, or run again waiting for the lock (wait) to queue behind it; "
                "the lock is released as soon as that process exits"
                if waited is None
                else "that run is still going: wait longer, or stop it; the lock is released as soon as "
                "that process exits"
            ),
            details={
                "config_hash": config_hash,
                "holder": holder,
                "lock": str(self.lock_path(config_hash)),
            },
            remedy="wait_for_lock" if waited is None else None,
        )

    @contextmanager
    def try_lock(self, config_hash: str) -> Iterator[bool]:
        """Like :meth:`lock` without waiting, but yields False instead of raising when held."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self.lock(config_hash))
            except LockHeldError:
                yield False
                return
            yield True
