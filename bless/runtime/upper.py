"""Reading what an engine wrote over a read-only layer, shared by both runtimes.

Two ways to find the writes:

* :func:`scan_upper` reads an overlayfs upper directory (Docker's overlay volume, or the
  local runtime's ``mount -t overlay``): every non-directory there is a write, a
  character device with device number 0/0 is a *whiteout* (the path was deleted).
* :func:`diff_trees` compares a writable copy with its original by content, for the
  local runtime without root, where no overlay can be mounted and the engine runs on
  a copy instead.

Both return :class:`~bless.evidence_types.UpperEntry` items with POSIX paths relative to
the layer root, sorted, so adapters classify them the same way whatever produced them.
Only files are reported (regular files, symlinks, deletions): an empty new directory
is not an artifact, and a directory holding new files shows up through those files.

:func:`normalize_modes` (``chmod -R u+rwX,go+rX``) lives here too because both runtimes
need it after an engine wrote a tree.
"""

from __future__ import annotations

import filecmp
import os
import stat
from pathlib import Path

from bless.errors import InputInvalidError, RuntimeUnavailableError
from bless.evidence_types import UpperEntry, UpperKind

# overlayfs marks a directory that replaced (rather than merged with) a lower directory
# with this xattr; "trusted." needs CAP_SYS_ADMIN to read, "user." is used with userxattr.
_OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")


def _is_whiteout(st: os.stat_result) -> bool:
    """overlayfs records a deletion as a character device with device number 0/0."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _is_opaque(directory: Path) -> bool:
    """True when overlayfs hides the whole lower directory under this upper directory."""
    for name in _OPAQUE_XATTRS:
        try:
            if os.getxattr(directory, name, follow_symlinks=False) == b"y":
                return True
        except OSError:
            # No such xattr, xattrs unsupported, or not allowed to read trusted.*: not opaque
            # as far as we can tell (a deleted-then-recreated directory is rare in caches).
            continue
    return False


def _lower_files(root: Path) -> list[Path]:
    """Every non-directory below ``root`` (which may itself be a file), without following links."""
    if not root.is_dir() or root.is_symlink():
        return [root] if os.path.lexists(root) else []
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        found.extend(here / name for name in filenames)
        # os.walk lists symlinks to directories as directories; they are files to us.
        found.extend(here / name for name in dirnames if (here / name).is_symlink())
    return found


def scan_upper(upper: Path, lower: Path) -> list[UpperEntry]:
    """Classify every write recorded in an overlayfs upper directory.

    * whiteout (char device 0/0) -> ``deleted``; when it hides a lower *directory*, every
      file below that directory is reported as deleted instead (only files are reported);
    * any other non-directory whose path exists in ``lower`` -> ``rewritten``;
    * otherwise -> ``new``.

    Files of a lower directory hidden by an *opaque* upper directory (deleted, then
    recreated) and not written again are reported as ``deleted``. ``size`` is the
    upper entry's ``lstat`` size (0 for deletions). A missing upper directory means
    nothing was written.
    """
    entries: dict[str, UpperEntry] = {}
    if not upper.is_dir():
        return []

    def add(path: str, kind: UpperKind, size: int) -> None:
        entries[path] = UpperEntry(path=path, kind=kind, size=size)

    for dirpath, dirnames, filenames in os.walk(upper, followlinks=False):
        here = Path(dirpath)
        rel_dir = here.relative_to(upper)
        if here != upper and _is_opaque(here):
            for hidden in _lower_files(lower / rel_dir):
                rel = hidden.relative_to(lower).as_posix()
                if not os.path.lexists(upper / rel):
                    add(rel, "deleted", 0)
        names = list(filenames) + [name for name in dirnames if (here / name).is_symlink()]
        for name in names:
            path = here / name
            rel_path = rel_dir / name
            st = path.lstat()
            lower_path = lower / rel_path
            if _is_whiteout(st):
                if lower_path.is_dir() and not lower_path.is_symlink():
                    for hidden in _lower_files(lower_path):
                        add(hidden.relative_to(lower).as_posix(), "deleted", 0)
                else:
                    add(rel_path.as_posix(), "deleted", 0)
            elif os.path.lexists(lower_path):
                add(rel_path.as_posix(), "rewritten", st.st_size)
            else:
                add(rel_path.as_posix(), "new", st.st_size)
    return [entries[key] for key in sorted(entries)]


def _same_file(a: Path, b: Path) -> bool:
    """Equal type and content (symlinks compare by target); no link is followed."""
    sa, sb = a.lstat(), b.lstat()
    if stat.S_IFMT(sa.st_mode) != stat.S_IFMT(sb.st_mode):
        return False
    if stat.S_ISLNK(sa.st_mode):
        return a.readlink() == b.readlink()
    if stat.S_ISREG(sa.st_mode):
        return sa.st_size == sb.st_size and filecmp.cmp(a, b, shallow=False)
    # Devices, fifos, sockets: nothing to compare but the type.
    return True


def _files_under(root: Path) -> dict[str, Path]:
    if not root.is_dir():
        return {}
    return {path.relative_to(root).as_posix(): path for path in _lower_files(root)}


def diff_trees(merged: Path, lower: Path) -> list[UpperEntry]:
    """What an engine changed in ``merged``, a writable copy of ``lower``, by content.

    ``new``: only in the copy; ``rewritten``: in both with different bytes (or type);
    ``deleted``: only in ``lower``. Unlike an overlay this cannot see a file rewritten
    with identical bytes, which is harmless: identical bytes are not a new artifact.
    """
    copy_files = _files_under(merged)
    lower_files = _files_under(lower)
    entries: list[UpperEntry] = []
    for rel in sorted(copy_files.keys() | lower_files.keys()):
        in_copy, in_lower = copy_files.get(rel), lower_files.get(rel)
        if in_copy is not None and in_lower is None:
            entries.append(UpperEntry(path=rel, kind="new", size=in_copy.lstat().st_size))
        elif in_copy is None:
            entries.append(UpperEntry(path=rel, kind="deleted", size=0))
        elif in_lower is not None and not _same_file(in_copy, in_lower):
            entries.append(UpperEntry(path=rel, kind="rewritten", size=in_copy.lstat().st_size))
    return entries


def normalize_modes(root: Path) -> None:
    """``chmod -R u+rwX,go+rX`` without following symlinks.

    ``X`` follows chmod: execute is added for directories and for files that are
    already executable by someone. Raises OSError on failure; callers translate it.
    """
    exec_bits = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
    read_write = stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH

    def fix(path: Path) -> None:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            # A symlink's own mode means nothing on Linux, and chmod would follow it.
            return
        mode = stat.S_IMODE(st.st_mode) | read_write
        if stat.S_ISDIR(st.st_mode) or st.st_mode & exec_bits:
            mode |= exec_bits
        if mode != stat.S_IMODE(st.st_mode):
            path.chmod(mode)

    if not os.path.lexists(root):
        return
    fix(root)
    if not root.is_dir() or root.is_symlink():
        return
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        # Fix directories before os.walk descends, so an unreadable one becomes readable.
        for name in dirnames:
            fix(here / name)
        for name in filenames:
            fix(here / name)


def normalize_own_tree(root: Path) -> None:
    """:func:`normalize_modes` on a tree that is ours already; failing is :class:`RuntimeUnavailableError`.

    How both runtimes normalize a tree whose files this process owns (a local engine's, or any as root).
    """
    try:
        normalize_modes(root)
    except OSError as exc:
        raise RuntimeUnavailableError(
            f"cannot normalize permissions under {root}: {exc}", hint="check the filesystem"
        ) from exc


def combine(per_mount: list[tuple[str, list[UpperEntry]]]) -> list[UpperEntry]:
    """Merge the entries of several mounts given as ``(target, entries)`` pairs.

    With one mount (the usual case) paths stay relative to its root, as adapters expect;
    with several, each path is prefixed with its mount target so they cannot collide.
    """
    if len(per_mount) == 1:
        return sorted(per_mount[0][1], key=lambda e: e.path)
    merged: list[UpperEntry] = []
    for target, entries in per_mount:
        prefix = target.strip("/") + "/"
        merged.extend(UpperEntry(path=prefix + e.path, kind=e.kind, size=e.size) for e in entries)
    return sorted(merged, key=lambda e: e.path)


#: Characters that would break an overlay mount's comma/colon separated option string (lowerdir=...,upperdir=...).
OVERLAY_UNSAFE = frozenset(",:\n")


def check_overlay_path(
    path: Path,
    role: str,
    *,
    absolute: bool = False,
    hint: str = "move the directory to a plain path",
    remedy: str | None = None,
) -> None:
    """Refuse (3) a directory an overlay mount names that its option string cannot carry.

    A ``,`` ``:`` or newline in the path would split the options; with ``absolute`` (Docker's
    volume options take no relative path) a relative path is refused too. ``role`` names the
    directory in the message (``lower dir``, ``scratch dir``); ``hint`` and ``remedy`` what to do (see
    :class:`~bless.errors.BlessError`).
    """
    if (absolute and not path.is_absolute()) or OVERLAY_UNSAFE & set(str(path)):
        required = "an absolute path" if absolute else "a path"
        raise InputInvalidError(
            f"overlay {role} {str(path)!r} must be {required} without ',' ':' or newlines "
            "(they would break the overlay mount options)",
            hint=hint,
            remedy=remedy,
        )


def make_overlay_dirs(scratch: Path) -> tuple[Path, Path]:
    """Create ``scratch/upper`` and ``scratch/work`` for an overlay mount; returns them."""
    upper, work = scratch / "upper", scratch / "work"
    try:
        upper.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RuntimeUnavailableError(
            f"cannot create the overlay upper/work dirs under {scratch}: {exc}",
            hint="check that the scratch directory is writable and on a local filesystem",
        ) from exc
    return upper, work
