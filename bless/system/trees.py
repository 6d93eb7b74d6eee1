"""Whole trees: a walk that never follows links, fsync, exact modes, removal (read-only dirs included), size."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from bless.system.durable import fsync_path

__all__ = [
    "fsync_tree",
    "make_owner_writable",
    "remove_tree",
    "set_tree_modes",
    "symlink_on_the_way",
    "tree_bytes",
    "walk",
]


def walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Yield every entry below ``root`` (not ``root``) with its lstat, children before parents.

    Never follows symlinks. Children come first so a caller may chmod a directory read-only only
    after everything inside it is done.
    """
    pending: list[tuple[Path, bool]] = [(root, False)]
    while pending:
        path, expanded = pending.pop()
        if expanded:
            if path != root:
                yield path, os.lstat(path)
            continue
        pending.append((path, True))
        with os.scandir(path) as entries:
            for entry in entries:
                child = Path(entry.path)
                if entry.is_dir(follow_symlinks=False):
                    pending.append((child, False))
                else:
                    yield child, entry.stat(follow_symlinks=False)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory of a tree, and the tree's root."""
    for path, st in walk(root):
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            fsync_path(path)
    fsync_path(root)


def set_tree_modes(root: Path, file_mode: int, dir_mode: int, *, durable: bool, leave_linked: bool = False) -> None:
    """chmod every regular file to ``file_mode`` and every directory (root last) to ``dir_mode``.

    Works on descriptors (fchmod + fsync) so the new modes are durable before the manifest commit
    when ``durable`` is set. Symlinks and special files are left alone (verification reports them).
    ``leave_linked`` leaves files with other hard links alone too: a pulled file linked from the live
    blessing shares its inode, and making it writable would make the live blessing's file writable.
    """
    for path, st in [*walk(root), (root, os.lstat(root))]:
        if stat.S_ISREG(st.st_mode) and leave_linked and st.st_nlink > 1:
            continue
        if stat.S_ISREG(st.st_mode):
            mode = file_mode
        elif stat.S_ISDIR(st.st_mode):
            mode = dir_mode
        else:
            continue
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)


def make_owner_writable(root: Path) -> None:
    """Give the owner rwx on every directory of a tree (root included).

    Blessed trees are 0555: a non-root process can neither remove entries from them nor move them
    to another parent (that rewrites their ``..``) until the directories are writable again.
    """
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        return
    pending = [root]
    while pending:
        directory = pending.pop()
        mode = stat.S_IMODE(os.lstat(directory).st_mode)
        if mode & 0o700 != 0o700:
            directory.chmod(mode | 0o700)
        with os.scandir(directory) as entries:
            pending.extend(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False))


def symlink_on_the_way(path: Path, base: Path) -> str | None:
    """Why removing ``path`` would go through (or remove) something other than ``base``'s own entries.

    Every component of ``path`` below ``base`` (``path`` itself included) must not be a symlink, and
    each but the last must be a directory; ``path`` must be below ``base``. ``base`` itself may be a
    symlink (a store root may be one). None when removing ``path`` is safe on these counts.
    """
    try:
        parts = path.relative_to(base).parts
    except ValueError:
        return f"{path} is not below {base}"
    current = base
    for index, part in enumerate(parts):
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            return None  # nothing there to remove (or to go through)
        except OSError as exc:
            return f"{current}: cannot stat ({exc.strerror or exc})"
        if stat.S_ISLNK(st.st_mode):
            return f"{current} is a symlink"
        if index < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            return f"{current} is not a directory"
    return None


def remove_tree(path: Path, *, within: Path | None = None) -> None:
    """Remove a file, a symlink or a whole tree (read-only directories included).

    With ``within``, refuses (OSError ELOOP) unless :func:`symlink_on_the_way` finds ``path`` a real
    entry below it: a symlink planted in the store must never lead a removal outside it.
    """
    if within is not None and (why := symlink_on_the_way(path, within)) is not None:
        raise OSError(errno.ELOOP, f"not removed, symlinks are never followed or removed here: {why}", str(path))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        path.unlink()
        return
    make_owner_writable(path)
    shutil.rmtree(path)


def tree_bytes(path: Path) -> int:
    """Bytes of the regular files below ``path`` (or of ``path`` itself); unreadable parts count 0."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size if stat.S_ISREG(st.st_mode) else 0
    total = 0
    with contextlib.suppress(OSError):
        for _, entry_st in walk(path):
            if stat.S_ISREG(entry_st.st_mode):
                total += entry_st.st_size
    return total
