"""The local runtime's copy mode: one mount's source copied to its target, whole or not at all.

A copy is made in a fresh directory inside the target, :data:`PARTIAL`, then swapped in: each of its
top-level entries renamed into the target (one file system, so no second copy), and the staging directory
removed last. The target may be a mount point (a pod's ``emptyDir``), which cannot itself be replaced,
hence the staging directory inside it rather than beside it.

While :data:`PARTIAL` exists, everything in the target is bless's own unfinished copy: a copy starts only in
an empty target, and the staging directory goes only once every entry was moved. So a target that a
killed serve-full left behind (mid-copy or mid-swap) is recognised and cleared on the next start, instead
of being refused as "not empty" on every restart. A copy that fails (a full disk: :class:`NoSpaceError`,
exit 15) clears what it wrote before it refuses.

A whole copy stays bless's too: before anything is copied into it, the target directory itself is marked
with the extended attribute :data:`COPY_MARK` (invisible to the engine, to the copy's verification and to
the comparison with the original). A serve container killed after its copy was made (OOM, a failed
liveness probe) leaves a complete copy, and the engine's writes in it, in the pod's ``emptyDir``; the
restart in the same pod finds the mark, clears the target and copies again (the copy is then verified
as every copy is), instead of refusing "not empty" (50) on every restart. A file system without user
extended attributes gets no mark: such a target is refused as before, and the refusal says so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from pathlib import Path

from bless.errors import BlessError, RuntimeUnavailableError
from bless.system.os_refusals import NO_SPACE_ERRNOS, full_disk_error
from bless.system.trees import make_owner_writable, remove_tree

__all__ = ["COPY_MARK", "PARTIAL", "clear_contents", "copy_whole", "holds_copy", "holds_partial_copy"]

#: The staging directory of a copy in progress, inside its target: its presence marks the target as bless's.
PARTIAL = ".bless-partial-copy"
#: The extended attribute on a target directory whose contents are bless's copy (its value: the source copied).
COPY_MARK = "user.bless.copy"


class _NoSpace(Exception):
    """A file copy met a full disk: raised past copytree, which would keep going and lose the errno."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _copy_file(source: str, destination: str) -> object:
    try:
        return shutil.copy2(source, destination, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in NO_SPACE_ERRNOS:
            raise _NoSpace(exc) from exc
        raise


def holds_partial_copy(target: Path) -> bool:
    """Whether ``target`` holds bless's own unfinished copy (its staging directory is a real directory)."""
    try:
        return stat.S_ISDIR(os.lstat(target / PARTIAL).st_mode)
    except OSError:
        return False


def holds_copy(target: Path) -> bool:
    """Whether ``target`` (a directory, never a link) carries :data:`COPY_MARK`: its contents are bless's copy."""
    try:
        os.getxattr(target, COPY_MARK, follow_symlinks=False)
    except OSError:
        return False  # no mark, or a file system without user extended attributes
    return True


def _mark(target: Path, source: Path) -> None:
    """Mark ``target`` as bless's copy before anything is copied into it (best effort: see the module docstring)."""
    with contextlib.suppress(OSError):
        os.setxattr(target, COPY_MARK, os.fsencode(source)[:200], follow_symlinks=False)


def clear_contents(target: Path) -> None:
    """Remove everything inside ``target`` (never following a link); the directory itself stays."""
    for child in target.iterdir():
        remove_tree(child)  # read-only directories included (a non-root user's copy of a 0555 blessed tree)


def copy_whole(source: Path, target: Path) -> bool:
    """Copy ``source``'s tree to ``target`` (absent, empty, or holding bless's partial copy); True if created.

    RuntimeUnavailableError (50) for a target that holds anything else or cannot be written, NoSpaceError (15)
    for a full disk; either way the target is left as it was found (created: removed; else: emptied).
    """
    created = not os.path.lexists(target)
    if not created:
        if not target.is_dir() or target.is_symlink():
            raise RuntimeUnavailableError(
                f"cannot materialize {source} at {target}: the target exists and is not a directory",
                hint="remove it or choose another target",
            )
        if holds_partial_copy(target):
            _clear(target, source, "clearing the partial copy a killed start left")
        elif holds_copy(target):
            _clear(target, source, "clearing the copy a killed start left (copied again, then verified)")
        elif any(target.iterdir()):
            raise RuntimeUnavailableError(
                f"cannot materialize {source} at {target}: the target exists and is not an empty directory "
                f"(and holds no copy of bless's: no partial copy {PARTIAL}, no {COPY_MARK} mark)",
                hint="remove its contents or choose another target (a copy bless made on a file system without "
                "user extended attributes cannot be recognised: clear it before the restart)",
            )
    staging = target / PARTIAL
    try:
        target.mkdir(parents=True, exist_ok=True)
        _mark(target, source)
        shutil.copytree(source, staging, symlinks=True, copy_function=_copy_file)
        # A blessed tree's directories are 0555: a user other than root (a pod under Pod Security "restricted")
        # could neither move them out of the staging directory (that rewrites their "..") nor remove them after.
        # Read-only is not enforced on a copy anyway (root writes through such modes).
        make_owner_writable(staging)
        for child in sorted(staging.iterdir()):
            child.rename(target / child.name)
        staging.rmdir()  # last: until here, the target is marked as a partial copy
    except (OSError, _NoSpace) as exc:
        with contextlib.suppress(OSError):
            if created:
                shutil.rmtree(target)
            else:
                clear_contents(target)
        raise _refusal(exc, source, target) from None
    return created


def _clear(target: Path, source: Path, what: str) -> None:
    try:
        clear_contents(target)
    except OSError as exc:
        raise _refusal(exc, source, target, what) from None


def _refusal(exc: BaseException, source: Path, target: Path, what: str = "") -> BlessError:
    error = exc.error if isinstance(exc, _NoSpace) else exc
    what = what or f"copying {source} to {target}"
    if isinstance(error, shutil.Error) and os.strerror(errno.ENOSPC) in str(error):
        error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
    no_space = full_disk_error(error, what)
    if no_space is not None:
        return no_space
    return RuntimeUnavailableError(
        f"{what}: {_short(str(error))}",
        hint="the target must be creatable by this user; or run as root",
    )


def _short(text: str) -> str:
    return text if len(text) < 300 else text[:300] + "..."
