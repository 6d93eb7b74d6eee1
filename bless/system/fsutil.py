"""Durable file-system helpers: atomic writes, fsync, read-only marking, tree walks, bounded reads.

Everything here works on paths it is given and knows nothing of the store's layout (the store, the
trust state, serve-full's records and pulls all use it). Modes are always set explicitly
(``fchmod``/``chmod`` after creation), never left to the umask: a store created under ``umask 000``
must not be writable by other users.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bless.errors import BlessError, NoSpaceError, StoreUnavailableError

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "JSON_SIDE_FILE_MAX",
    "NO_SPACE_ERRNOS",
    "READ_ONLY_DIR_MODE",
    "READ_ONLY_FILE_MODE",
    "TMP_MARK",
    "UnreadableFileError",
    "UnreadableJsonError",
    "age_s",
    "atomic_write_bytes",
    "ensure_dir",
    "file_kind",
    "fsync_dir",
    "fsync_tree",
    "full_disk",
    "full_disk_error",
    "holds",
    "listdir",
    "load_json_object",
    "make_owner_writable",
    "os_errors",
    "os_refusal",
    "read_bounded",
    "read_json_object",
    "remove_tree",
    "set_tree_modes",
    "symlink_on_the_way",
    "tree_bytes",
    "unsafe_to_trust",
    "walk",
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


def unsafe_to_trust(path: Path, *, follow: bool = False) -> str | None:
    """Why ``path`` could be replaced by another user (group/other writable, or a symlink), or None.

    ``follow`` stats through a symlink (the store root may be one); otherwise a symlink is unsafe.
    A missing path is not judged here (the caller's lookup reports it).
    """
    try:
        st = path.stat() if follow else os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: cannot stat ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symlink"
    mode = stat.S_IMODE(st.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is mode {mode:04o} (writable by {'others' if mode & stat.S_IWOTH else 'its group'})"
    return None


def fsync_dir(path: Path) -> None:
    """fsync a directory, making the creations, renames and removals of its entries durable."""
    _fsync_path(path, os.O_DIRECTORY)


def write_tmp(directory: Path, stem: str, data: bytes, mode: int) -> Path:
    """Write ``data`` to a new dot-named temp file in ``directory``, fsync it, return its path.

    The name ``.<stem>.bless-tmp-<pid>-<token>`` is a dotfile (manifest listings skip dotfiles) and
    carries the stem so recovery can tell which config hash a leftover belongs to.
    """
    tmp = directory / f".{stem}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.fchmod(fd, mode)  # exact mode, whatever the umask
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
            _fsync_path(path)
    _fsync_path(root)


def _fsync_path(path: Path, flags: int = os.O_NOFOLLOW) -> None:
    fd = os.open(path, os.O_RDONLY | flags | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def holds(path: Path, data: bytes) -> bool:
    """Does the file at ``path`` hold exactly ``data``?"""
    try:
        return path.read_bytes() == data
    except OSError:
        return False


def age_s(path: Path) -> float:
    """Seconds since ``path`` was last modified (0 when it cannot be read)."""
    try:
        return time.time() - os.lstat(path).st_mtime
    except OSError:
        return 0.0


def listdir(path: Path) -> list[os.DirEntry[str]]:
    """Sorted entries of a directory; a missing directory is empty."""
    try:
        with os.scandir(path) as entries:
            return sorted(entries, key=lambda e: e.name)
    except FileNotFoundError:
        return []


#: The largest side file (lease, owner record, claims cache, manifests-dirs record) read. These are a
#: few hundred bytes to a few MiB (a claims cache of a very large manifests dir); anything bigger is
#: not one of ours, and reading it whole could exhaust memory (a symlink to /dev/zero, say).
JSON_SIDE_FILE_MAX = 16 * 1024 * 1024


class UnreadableFileError(Exception):
    """A file exists but cannot be read safely; ``str()`` says why."""


class UnreadableJsonError(UnreadableFileError):
    """A JSON side file exists but cannot be used; ``str()`` says why."""


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
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnreadableFileError(f"cannot be opened ({exc.strerror or exc})") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnreadableFileError(f"is {file_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise UnreadableFileError(f"is {st.st_size} bytes, over the {limit} bytes it may be")
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise UnreadableFileError(f"is over the {limit} bytes it may be")
    except OSError as exc:
        raise UnreadableFileError(f"cannot be read ({exc.strerror or exc})") from exc
    finally:
        os.close(fd)
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


def load_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is missing.

    Read through :func:`read_bounded` (no symlink, no FIFO, a regular file of at most
    :data:`JSON_SIDE_FILE_MAX` bytes). Deeply nested JSON (RecursionError) is invalid like any other
    bad document.

    Raises:
        UnreadableJsonError: anything else (unreadable, not a regular file, too big, not a JSON object).
    """
    try:
        data = read_bounded(path, JSON_SIDE_FILE_MAX)
    except UnreadableFileError as exc:
        raise UnreadableJsonError(str(exc)) from exc
    if data is None:
        return None
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise UnreadableJsonError("is not valid JSON") from exc
    if not isinstance(document, dict):
        raise UnreadableJsonError("is not a JSON object")
    return document


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is missing, unreadable or not an object.

    For hints and records whose absence the caller already handles: see :func:`load_json_object`
    for what is refused (symlinks, FIFOs, huge or deeply nested files).
    """
    try:
        return load_json_object(path)
    except UnreadableJsonError:
        return None
