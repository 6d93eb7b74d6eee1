"""A walk of a tree that never follows a link: descriptor-relative opens and the classification of every entry.

Every path below the root is opened component by component relative to a directory file descriptor
with ``O_NOFOLLOW``, so a file or directory swapped for a symlink after the scan is caught at open
time instead of being read through. (A plain ``os.open(root / rel, O_NOFOLLOW)`` would only protect
the last component.) The root itself must not be a symlink either; its *ancestors* are resolved by
the OS as usual, so callers that use pointer symlinks must resolve them first.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bless.core.untrusted_text import shown
from bless.core.verify.results import ROOT_PATH, ProblemKind

__all__ = [
    "OPEN_DIR_FLAGS",
    "OPEN_FILE_FLAGS",
    "OpenFailure",
    "Scan",
    "describe_special",
    "join",
    "open_below",
    "open_root",
    "parents",
    "quoted",
    "scan_tree",
]

OPEN_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO read-only would otherwise block until a writer appears.
# O_NOCTTY: never let a swapped-in terminal device become our controlling terminal.
OPEN_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def parents(path: str) -> Iterable[str]:
    """Yield every proper ancestor directory of a relative path ('a/b/c' -> 'a/b', 'a')."""
    idx = path.rfind("/")
    while idx > 0:
        path = path[:idx]
        yield path
        idx = path.rfind("/")


def quoted(name: str) -> str:
    """A name from disk inside a problem's detail: quoted, non-printables escaped (details are shown to humans)."""
    return f"'{shown(name)}'"


def join(parent: str, name: str) -> str:
    """``parent/name``, or ``name`` at the root."""
    return f"{parent}/{name}" if parent else name


class OpenFailure(Exception):
    """Why a path below the root could not be opened, already mapped to a problem kind."""

    def __init__(self, kind: ProblemKind, detail: str) -> None:
        super().__init__(detail)
        self.kind: ProblemKind = kind
        self.detail = detail


def _classify_open_error(exc: OSError, dir_fd: int, name: str, rel: str) -> OpenFailure:
    """Turn an ``os.open`` error on ``name`` (relative to ``dir_fd``) into a problem kind.

    With ``O_NOFOLLOW`` Linux reports a symlink as ELOOP (plain open) or ENOTDIR (with
    ``O_DIRECTORY``); an lstat disambiguates ENOTDIR between "symlink" and "a file".
    """
    code = exc.errno
    if code in (errno.ELOOP, errno.ENOTDIR):
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            st = None
        if code == errno.ELOOP or (st is not None and stat.S_ISLNK(st.st_mode)):
            return OpenFailure("symlink", f"{quoted(rel)} became a symbolic link during verification")
        return OpenFailure("missing", f"{quoted(rel)} is no longer a directory")
    if code == errno.ENOENT:
        return OpenFailure("missing", f"{quoted(rel)} vanished during verification")
    if code == errno.ENXIO:
        return OpenFailure("not_regular", f"{quoted(rel)} is not a regular file (socket or device)")
    return OpenFailure("unreadable", f"cannot open {quoted(rel)}: {exc.strerror or exc}")


def open_below(root_fd: int, rel: str, final_flags: int) -> int:
    """Open ``rel`` below ``root_fd`` one component at a time, never following a symlink.

    Raises:
        OpenFailure: mapped from the OS error.
    """
    parts = rel.split("/")
    fd = root_fd
    done = ""
    try:
        for part in parts[:-1]:
            done = join(done, part)
            try:
                next_fd = os.open(part, OPEN_DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _classify_open_error(exc, fd, part, done) from None
            if fd != root_fd:
                os.close(fd)
            fd = next_fd
        try:
            return os.open(parts[-1], final_flags, dir_fd=fd)
        except OSError as exc:
            raise _classify_open_error(exc, fd, parts[-1], rel) from None
    finally:
        if fd != root_fd:
            os.close(fd)


def open_root(root: Path) -> int:
    """Open the root directory without following a symlink in its last component.

    Raises:
        OpenFailure: kind ``root_missing``, ``symlink`` or ``unreadable``.
    """
    try:
        return os.open(root, OPEN_DIR_FLAGS)
    except FileNotFoundError:
        raise OpenFailure("root_missing", f"cache root {str(root)!r} does not exist") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                st = os.lstat(root)
            except OSError:
                st = None
            if exc.errno == errno.ELOOP or (st is not None and stat.S_ISLNK(st.st_mode)):
                raise OpenFailure(
                    "symlink", f"cache root {str(root)!r} is a symbolic link (resolve it first)"
                ) from None
            raise OpenFailure("root_missing", f"cache root {str(root)!r} is not a directory") from None
        raise OpenFailure("unreadable", f"cannot open cache root {str(root)!r}: {exc.strerror or exc}") from None


def describe_special(mode: int) -> str:
    """What a special file is, for a problem's detail."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return f"a special file (mode {stat.filemode(mode)})"


@dataclass
class Scan:
    """What a walk of the tree found, keyed by relative POSIX path."""

    root_mode: int = 0
    files: dict[str, os.stat_result] = field(default_factory=dict)
    dirs: dict[str, os.stat_result] = field(default_factory=dict)
    symlinks: dict[str, str] = field(default_factory=dict)  # path -> link target (for humans)
    specials: dict[str, str] = field(default_factory=dict)  # path -> description
    unreadable: dict[str, str] = field(default_factory=dict)  # path -> reason
    # Directories we could not descend into; listed paths below them are reported as such.
    blocked: dict[str, str] = field(default_factory=dict)  # path -> why (short phrase)


def scan_tree(root_fd: int) -> Scan:
    """Walk the tree below ``root_fd`` without following symlinks, classifying every entry.

    Directories are reopened from the root one component at a time (``open_below``) rather than
    keeping a descriptor per pending directory: a wide tree would otherwise exhaust descriptors,
    and the extra opens cost nothing next to hashing.
    """
    scan = Scan(root_mode=os.fstat(root_fd).st_mode)
    pending: list[str] = [""]
    while pending:
        rel = pending.pop()
        if rel:
            try:
                dir_fd = open_below(root_fd, rel, OPEN_DIR_FLAGS)
            except OpenFailure as failure:
                # The directory changed between being listed and being opened.
                scan.dirs.pop(rel, None)
                if failure.kind == "symlink":
                    scan.symlinks[rel] = "?"
                    scan.blocked[rel] = "is a symbolic link"
                elif failure.kind == "missing":
                    scan.blocked[rel] = "vanished during verification"
                else:
                    scan.unreadable[rel] = failure.detail
                    scan.blocked[rel] = "could not be opened"
                continue
        else:
            dir_fd = root_fd
        try:
            try:
                with os.scandir(dir_fd) as entries:
                    listed = list(entries)
            except OSError as exc:
                where = rel or ROOT_PATH
                scan.unreadable[where] = f"cannot list directory {quoted(where)}: {exc.strerror or exc}"
                scan.blocked[where] = "could not be listed"
                continue
            for entry in listed:
                child = join(rel, entry.name)
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # vanished between listing and stat: it is simply not there
                except OSError as exc:
                    scan.unreadable[child] = f"cannot stat {quoted(child)}: {exc.strerror or exc}"
                    continue
                mode = st.st_mode
                if stat.S_ISREG(mode):
                    scan.files[child] = st
                elif stat.S_ISDIR(mode):
                    scan.dirs[child] = st
                    pending.append(child)
                elif stat.S_ISLNK(mode):
                    try:
                        target = os.readlink(entry.name, dir_fd=dir_fd)
                    except OSError:
                        target = "?"
                    scan.symlinks[child] = target
                    scan.blocked[child] = "is a symbolic link"
                else:
                    scan.specials[child] = describe_special(mode)
        finally:
            if dir_fd != root_fd:
                os.close(dir_fd)
    return scan
