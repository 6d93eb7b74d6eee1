"""File locks (flock) outside the per-config writer locks: taking one, and the refusal when its file is unusable.

The store's short-held locks (lease guard, manifests-dirs record), the trusted metadata's and the signing
repository's, and serve-full's start lock take them; the kernel releases an flock when its holder dies.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from bless.errors import BlessError, StoreUnavailableError
from bless.system.durable import FILE_MODE
from bless.system.os_refusals import full_disk_error

__all__ = ["blocking_file_lock", "lock_refusal", "open_file_lock"]


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
