"""Single entries: whether another user could replace one, what a file holds, its age, a directory's entries."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

__all__ = ["age_s", "holds", "listdir", "unsafe_to_trust"]


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
