"""The cheap identity re-check: ``lstat`` stamps of the blessed tree taken before hashing.

serve-full stamps every blessed entry before it hashes them, compares the stamps right after
verification and again once the engine is ready; any difference fails closed (43).

The tree's ancestors are stamped too, so the path handed to the runtime cannot be re-pointed
between the hash and the mount: ``blessed/<hash>/`` in full (renaming it away and back moves its
ctime, which user space cannot set back; it changes otherwise only when this hash is reblessed),
``blessed/`` and the store root by identity only (device, inode, type, mode, owner), since every
publish of another hash and every new serve dir moves their times. Swapping those two in place and
back needs write access to the store root or its parent, which serve-full refuses for anyone but
the store's owner (``Store.check_permissions``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bless.core.json_form import JsonForm
from bless.core.verify import ROOT_PATH
from bless.errors import CacheChangedError

_MAX_PROBLEMS_IN_MESSAGE = 8


@dataclass(frozen=True)
class Stamp:
    """``lstat`` facts of one blessed entry; ``None`` fields mean it did not exist."""

    path: str
    dev: int | None
    ino: int | None
    size: int | None
    mtime_ns: int | None
    ctime_ns: int | None
    mode: int | None
    uid: int | None

    @classmethod
    def of(cls, root: Path, path: str, lstat: Callable[[Path], os.stat_result] = os.lstat) -> Stamp:
        """Stamp ``root/path`` (``path`` ``"."`` is the root itself) without following links."""
        target = root if path == ROOT_PATH else root / path
        try:
            st = lstat(target)
        except OSError:
            # Gone, a parent became a file, a link loop, a directory we may not search (EACCES): no entry
            # we could serve. The verification that follows the snapshot names the problem (exit 21); an
            # entry that becomes readable later reads as "appeared after the snapshot" (exit 43).
            return cls(path, None, None, None, None, None, None, None)
        return cls(path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid)


def identity(stamp: Stamp) -> Stamp:
    """``stamp`` without its times and size: what identifies a directory whose contents may change."""
    return replace(stamp, size=None, mtime_ns=None, ctime_ns=None)


@dataclass(frozen=True)
class StampChange(JsonForm):
    """One blessed entry that differs from its snapshot, and how."""

    path: str
    detail: str


def describe_change(before: Stamp, after: Stamp) -> str | None:
    """How ``after`` differs from ``before`` in words, or None when they are the same."""
    if before == after:
        return None
    if before.ino is None:
        return "appeared after the snapshot"
    if after.ino is None or after.mode is None:
        return "vanished"
    assert before.mode is not None
    if stat.S_IFMT(before.mode) != stat.S_IFMT(after.mode):
        kind = "a symbolic link" if stat.S_ISLNK(after.mode) else stat.filemode(after.mode)[0] + "-type entry"
        return f"is now {kind}"
    reasons: list[str] = []
    if (before.dev, before.ino) != (after.dev, after.ino):
        reasons.append("replaced (device/inode changed)")
    if before.size != after.size:
        reasons.append(f"size {before.size} -> {after.size}")
    if before.mtime_ns != after.mtime_ns:
        reasons.append("modified (mtime changed)")
    if before.mode != after.mode:
        reasons.append(f"mode {stat.filemode(before.mode)} -> {stat.filemode(after.mode)}")
    if before.uid != after.uid:
        reasons.append(f"owner uid {before.uid} -> {after.uid}")
    if before.ctime_ns != after.ctime_ns and not reasons:
        # ctime moves on any content or metadata change and cannot be set back from user space.
        reasons.append("changed (ctime moved: rewritten, re-linked or metadata changed)")
    return ", ".join(reasons)


@dataclass(frozen=True)
class Snapshot:
    """Stamps of the blessed root, every listed directory and every listed file, and of its ancestors.

    ``ancestors`` are absolute paths from the tree's parent up to the store root; those in
    ``identity_only`` are compared by :func:`identity` (see the module docstring).
    """

    root: Path
    stamps: tuple[Stamp, ...]
    ancestors: tuple[Stamp, ...] = ()
    identity_only: frozenset[str] = frozenset()

    @classmethod
    def take(
        cls,
        root: Path,
        files: Sequence[str],
        dirs: Sequence[str],
        lstat: Callable[[Path], os.stat_result] = os.lstat,
        *,
        ancestors: Sequence[Path] = (),
        identity_only: Sequence[Path] = (),
    ) -> Snapshot:
        """Stamp ``root``, its ``dirs`` (entries added or removed move a directory's mtime) and ``files``.

        ``ancestors`` (absolute) are stamped in full, ``identity_only`` ones by identity.
        """
        paths = [ROOT_PATH, *dirs, *files]
        above = [str(path) for path in (*ancestors, *identity_only)]
        return cls(
            root,
            tuple(Stamp.of(root, path, lstat) for path in paths),
            tuple(Stamp.of(root, path, lstat) for path in above),
            frozenset(str(path) for path in identity_only),
        )

    def changes(self, lstat: Callable[[Path], os.stat_result] = os.lstat) -> list[StampChange]:
        """Every entry (or ancestor) whose stamp differs now (empty: nothing changed)."""
        found: list[StampChange] = []
        for before in (*self.ancestors, *self.stamps):
            after = Stamp.of(self.root, before.path, lstat)
            if before.path in self.identity_only:
                before, after = identity(before), identity(after)
            detail = describe_change(before, after)
            if detail is not None:
                found.append(StampChange(before.path, detail))
        return found

    def to_dict(self) -> dict[str, Any]:
        # By hand (not JsonForm): a summary: the stamps counted, not listed.
        return {"root": str(self.root), "entries": len(self.stamps), "ancestors": len(self.ancestors)}


def cache_changed_error(changes: Sequence[StampChange], *, when: str, blessed_dir: Path) -> CacheChangedError:
    """The refusal for blessed files that changed after they were hashed."""
    shown = "; ".join(f"{change.path}: {change.detail}" for change in changes[:_MAX_PROBLEMS_IN_MESSAGE])
    more = f" and {len(changes) - _MAX_PROBLEMS_IN_MESSAGE} more" if len(changes) > _MAX_PROBLEMS_IN_MESSAGE else ""
    return CacheChangedError(
        f"{len(changes)} blessed entr{'y' if len(changes) == 1 else 'ies'} in {blessed_dir} changed {when}: "
        f"{shown}{more}",
        hint="something writes to the read-only blessed dir: find it and stop it, then verify the blessing; "
        "do not serve this cache until it verifies",
        remedy="stop_writer_then_verify",
        details={"blessed_dir": str(blessed_dir), "changes": [change.to_dict() for change in changes]},
    )
