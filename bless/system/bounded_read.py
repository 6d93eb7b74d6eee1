"""Reading a file that may not be what it claims: never through a link, never blocking, never past a limit.

The one no-follow open of a regular file (:func:`open_regular`) and the one bounded read over it
(:func:`read_bounded`): what bless reads from a store, a trust directory or a user's path goes through them.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO

__all__ = ["NotRegularFileError", "UnreadableFileError", "file_kind", "open_regular", "read_bounded"]


class UnreadableFileError(Exception):
    """A file exists but cannot be read safely; ``str()`` says why."""


class NotRegularFileError(OSError):
    """What :func:`open_regular` opened is not a regular file; ``strerror`` says what it is."""


def open_regular(path: Path, *, follow: bool = False) -> IO[bytes]:
    """The regular file at ``path``, open for reading: never blocking (a FIFO is refused, not waited on)
    and, unless ``follow``, never through a symlink.

    Raises:
        NotRegularFileError: a FIFO, a device such as /dev/zero, a directory (its message says which).
        OSError: as ``open(2)`` (FileNotFoundError, ELOOP for a link).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # checked before fdopen, which refuses a directory in words of its own
            raise NotRegularFileError(errno.EINVAL, f"is {file_kind(mode)}, not a regular file", str(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: Path, limit: int, *, follow: bool = False) -> bytes | None:
    """The bytes of the regular file at ``path``, at most ``limit`` of them; None when it is missing.

    Opened without blocking (a FIFO is refused, not waited on) and, unless ``follow``, without
    following a symlink; checked to be a regular file of at most ``limit`` bytes before a byte is
    read, and read to EOF but never past the limit (the file may grow after the check). The store's
    side files never follow links; ``follow`` is for directories an operator provisions, where links
    are normal (a Kubernetes ConfigMap mount is all symlinks): what they lead to is checked the same.

    Raises:
        UnreadableFileError: unreadable, not a regular file (a FIFO, a device such as /dev/zero), too big.
    """
    try:
        handle = open_regular(path, follow=follow)
    except FileNotFoundError:
        return None
    except NotRegularFileError as exc:
        raise UnreadableFileError(exc.strerror) from exc
    except OSError as exc:
        raise UnreadableFileError(f"cannot be opened ({exc.strerror or exc})") from exc
    with handle:
        fd = handle.fileno()
        try:
            size = os.fstat(fd).st_size
            if size > limit:
                raise UnreadableFileError(f"is {size} bytes, over the {limit} bytes it may be")
            chunks: list[bytes] = []
            size = 0
            while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    raise UnreadableFileError(f"is over the {limit} bytes it may be")
        except OSError as exc:
            raise UnreadableFileError(f"cannot be read ({exc.strerror or exc})") from exc
    return b"".join(chunks)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words: ``a FIFO``, ``a character device``..."""
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISREG, "a regular file"),
    )
    return next((name for test, name in kinds if test(mode)), "not a file")
