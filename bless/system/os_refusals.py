"""OS errors as refusals: a full or read-only disk (15), or a place this user cannot write (17, or its owner's code)."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

from bless.errors import BlessError, NoSpaceError, StoreUnavailableError

__all__ = ["NO_SPACE_ERRNOS", "full_disk", "full_disk_error", "os_errors", "os_refusal"]

#: The errors of a write that more space (or a writable mount) would have let through.
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def full_disk_error(exc: BaseException, what: str) -> NoSpaceError | None:
    """The refusal for a write that failed for want of space or a writable file system; None for other errors."""
    if not isinstance(exc, OSError) or exc.errno not in NO_SPACE_ERRNOS:
        return None
    where = f" ({exc.filename})" if exc.filename else ""
    if exc.errno == errno.EROFS:
        hint = "the file system is mounted read-only: remount it read-write or use another store root"
        remedy = "read_only_file_system"
    else:
        hint = "free space on that file system (gc removes what no blessing needs) or raise the quota, then retry"
        remedy = "free_space"
    return NoSpaceError(
        f"{what}: {exc.strerror or exc}{where}",
        hint=f"{hint}; nothing was committed",
        remedy=remedy,
        details={"errno": errno.errorcode.get(exc.errno or 0, str(exc.errno)), "path": exc.filename},
    )


@contextmanager
def full_disk(what: str) -> Iterator[None]:
    """Turn a write failing for want of space (ENOSPC, EDQUOT, EROFS) into :class:`NoSpaceError`."""
    try:
        yield
    except OSError as exc:
        refusal = full_disk_error(exc, what)
        if refusal is None:
            raise
        raise refusal from exc


_STORE_DIRS_HINT = "check that the store root and its dirs are directories (not files) that this user can write"


def os_refusal(
    exc: OSError,
    what: str,
    *,
    refusal: type[BlessError] = StoreUnavailableError,
    hint: str = _STORE_DIRS_HINT,
    remedy: str | None = None,
) -> BlessError:
    """The refusal for ``exc``, met while ``what``: a full or read-only disk is NoSpaceError, anything
    else (permissions, a file where a dir belongs) is ``refusal`` with ``hint``: the environment, not a bug.

    The default is the store's (StoreUnavailableError); a directory of another owner names its own
    (the signing repository's is TrustInvalidError).
    """
    no_space = full_disk_error(exc, f"{what} failed")
    if no_space is not None:
        return no_space
    where = f" ({exc.filename})" if exc.filename else ""
    return refusal(
        f"{what} failed: {exc.strerror or exc}{where}",
        hint=hint,
        details={"errno": errno.errorcode.get(exc.errno or 0, str(exc.errno)), "path": exc.filename},
        remedy=remedy,
    )


@contextmanager
def os_errors(
    what: str,
    *,
    refusal: type[BlessError] = StoreUnavailableError,
    hint: str = _STORE_DIRS_HINT,
    remedy: str | None = None,
) -> Iterator[None]:
    """Turn an OSError in the ``with`` body into :func:`os_refusal`'s refusal."""
    try:
        yield
    except OSError as exc:
        raise os_refusal(exc, what, refusal=refusal, hint=hint, remedy=remedy) from exc
