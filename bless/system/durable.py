"""Durable writes: exact modes, new files never over a name or through a link, atomic replacement, fsync.

Modes are always set explicitly (``fchmod``/``chmod`` after creation), never left to the umask: a
store created under ``umask 000`` must not be writable by other users.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "READ_ONLY_DIR_MODE",
    "READ_ONLY_FILE_MODE",
    "TMP_MARK",
    "atomic_write_bytes",
    "create_new_file",
    "ensure_dir",
    "fsync_dir",
    "fsync_path",
    "write_tmp",
]

#: Marks a temp file of an atomic write: ``.<stem>.bless-tmp-<pid>-<token>``.
TMP_MARK = ".bless-tmp-"

#: Modes of what the store writes: owner-writable, readable by all, writable by nobody else.
DIR_MODE = 0o755
FILE_MODE = 0o644
#: Modes of a published (blessed) tree.
READ_ONLY_FILE_MODE = 0o444
READ_ONLY_DIR_MODE = 0o555


def ensure_dir(path: Path, mode: int = DIR_MODE) -> None:
    """Create ``path`` and its missing parents with exactly ``mode`` (whatever the umask).

    Directories that already exist are left as they are (verify reports unsafe modes).
    """
    missing: list[Path] = []
    current = path
    while not os.path.lexists(current):
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=mode)
        except FileExistsError:
            continue  # created concurrently: keep what is there
        directory.chmod(mode)  # mkdir's mode is masked by the umask


def create_new_file(path: Path, mode: int) -> int:
    """Create ``path`` for writing with exactly ``mode`` and return its descriptor (the caller closes it).

    Never over an existing name (``O_EXCL``: FileExistsError) and never through a symlink
    (``O_NOFOLLOW``); created 0600 and then given ``mode``, so no umask widens or narrows it and no
    other user can open it in between.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def fsync_dir(path: Path) -> None:
    """fsync a directory, making the creations, renames and removals of its entries durable."""
    fsync_path(path, os.O_DIRECTORY)


def fsync_path(path: Path, flags: int = os.O_NOFOLLOW) -> None:
    """fsync one file or directory (``flags`` added to a read-only, no-follow open)."""
    fd = os.open(path, os.O_RDONLY | flags | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_tmp(directory: Path, stem: str, data: bytes, mode: int) -> Path:
    """Write ``data`` to a new dot-named temp file in ``directory``, fsync it, return its path.

    The name ``.<stem>.bless-tmp-<pid>-<token>`` is a dotfile (manifest listings skip dotfiles) and
    carries the stem so recovery can tell which config hash a leftover belongs to.
    """
    tmp = directory / f".{stem}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    fd = create_new_file(tmp, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return tmp


def atomic_write_bytes(path: Path, data: bytes, *, mode: int = FILE_MODE) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    A reader sees the old content or the new, never a mix; after return the new content survives a
    power loss (temp file fsynced, renamed over ``path``, directory fsynced). A crash leaves at most
    a dot temp file beside ``path``.

    Raises:
        OSError: when the directory is missing or not writable, the disk is full, etc.
    """
    path = Path(path)
    tmp = write_tmp(path.parent, path.name, data, mode)
    try:
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
