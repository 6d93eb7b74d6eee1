"""Per-config-hash writer locks: an flock the kernel releases when its holder dies.

``locks/<config_hash>.lock`` is the flock; ``locks/<config_hash>.holder`` records who holds it
(pid, host, since when) so that a refusal can name the holder. Re-entrant within one thread, so
that publish and reject can take the lock themselves while an orchestrator holds it for the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from bless.errors import BlessError, LockHeldError, StoreUnavailableError
from bless.store.layout import check_hash
from bless.system.durable import FILE_MODE, atomic_write_bytes, ensure_dir
from bless.system.json_files import read_json_object
from bless.system.os_refusals import full_disk_error, os_errors
from bless.system.procid import process_alive, process_identity

__all__ = ["HashLocks", "blocking_file_lock", "lock_refusal", "open_file_lock"]

# Locks this process holds, per thread. A second FileLock on the same file from the same thread
# would otherwise contend with itself.
_HELD: dict[tuple[str, int], int] = {}
_HELD_GUARD = threading.Lock()


def lock_refusal(
    path: Path, exc: OSError, *, what: str = "lock", refusal: type[BlessError] = StoreUnavailableError
) -> BlessError:
    """The refusal when a lock file cannot be opened: not a file of ours, or no write access (store_lock).

    A full disk or a read-only file system is that refusal instead (:class:`NoSpaceError`): what the
    user must do is make room or remount, not fix permissions. ``refusal`` is the class of the others:
    the store's own (17) for the store's locks, the owner's for a lock elsewhere (the signing repository's).
    """
    no_space = full_disk_error(exc, f"cannot create the {what} {path}")
    if no_space is not None:
        return no_space
    # The store is unusable here, not a blessed tree that fails verification: its own code (17).
    store_lock = refusal is StoreUnavailableError
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        mode = stat.S_IFREG  # missing: the directory is what cannot be written
    if not stat.S_ISREG(mode):
        kind = "a symlink" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode) else "not a file"
        message = f"the {what} {path} is {kind}, not a lock file bless made, so it is not used"
        hint = f"remove {path} (bless recreates it), and find out who put it there"
    else:
        message = f"cannot take the {what} {path}: {exc.strerror or exc}"
        hint = f"run as a user who can write {path.parent}"
        if store_lock:
            hint += (
                " (every writer, and gc even with --dry-run, takes the store's locks so that what it reads does "
                "not change under it)"
            )
    details = {"reason": "store_lock", "lock": str(path)} if store_lock else {"lock": str(path)}
    return refusal(message, hint=hint, details=details)


def open_file_lock(
    path: Path, *, timeout: float = -1.0, what: str = "lock", refusal: type[BlessError] = StoreUnavailableError
) -> FileLock:
    """Take the flock at ``path`` (waiting at most ``timeout`` seconds, negative: forever) and return it.

    The caller releases it. A lock held past ``timeout`` is filelock's :class:`Timeout`, left to the
    caller, who knows what a held lock means there.

    Raises:
        StoreUnavailableError: the lock file cannot be opened (:func:`lock_refusal`, naming it ``what``;
            ``refusal`` instead for a lock outside the store), or NoSpaceError.
    """
    flock = FileLock(str(path), mode=FILE_MODE)
    try:
        flock.acquire(timeout=timeout)
    except Timeout:  # a TimeoutError, hence an OSError: handled first
        raise
    except OSError as exc:
        raise lock_refusal(path, exc, what=what, refusal=refusal) from exc
    return flock


@contextmanager
def blocking_file_lock(
    path: Path, *, what: str = "lock", refusal: type[BlessError] = StoreUnavailableError
) -> Iterator[None]:
    """Hold the flock at ``path`` for the ``with`` body, waiting for it; an unusable lock file is a refusal.

    For short-held locks: the store's (lease guard, manifests-dirs record, trusted metadata) and the
    signing repository's.

    Raises:
        StoreUnavailableError: the lock file cannot be opened (:func:`lock_refusal`), or ``refusal``.
    """
    flock = open_file_lock(path, what=what, refusal=refusal)  # waits forever: never a Timeout
    try:
        yield
    finally:
        flock.release()


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
                "wait for that run to finish, or rerun with --wait (bless run --wait) to queue behind it; "
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
