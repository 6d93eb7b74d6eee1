"""Atomic publish: the blessed tree lands read-only first, the manifest rename is the commit point.

Steps (:data:`PUBLISH_STEPS`, each preceded by a fault point of its name): ``validate``
(serialize the manifest, re-hash the staged tree and require it equals the manifest's listing),
``move-tree`` (rename into ``blessed/<hash>/<dir_id>`` from under ``root/staging``, else copy to a
``.partial-`` sibling and rename), ``fsync-tree``, ``make-read-only`` (files 0444, dirs 0555, then
the tree is verified again), ``archive-old``, ``write-manifest-tmp``, ``rename-manifest`` (the
commit point, then fsync of the manifests dir), ``clear-intent`` (drop the publishing marker),
``done``. Before the commit, a failure gives the tree back (or removes the copy); ``kill -9``
anywhere leaves the old blessing or the new one, and :meth:`Store.recover` removes the debris.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bless.core.manifest import Manifest
from bless.core.untrusted_text import shown
from bless.core.verify import TreeError, TreeListing, hash_tree, verify_tree
from bless.errors import (
    AlreadyBlessedError,
    BlessError,
    InputInvalidError,
    ManifestInvalidError,
    StoreUnavailableError,
    VerifyFailedError,
)
from bless.store.faults import FaultHook
from bless.store.gc import recover
from bless.store.index import LiveManifest
from bless.store.layout import PARTIAL_PREFIX, PUBLISHING_PREFIX, StorePaths, check_hash
from bless.system.durable import (
    FILE_MODE,
    READ_ONLY_DIR_MODE,
    READ_ONLY_FILE_MODE,
    atomic_write_bytes,
    ensure_dir,
    fsync_dir,
    write_tmp,
)
from bless.system.entries import holds
from bless.system.os_refusals import os_errors, os_refusal
from bless.system.trees import fsync_tree, remove_tree, set_tree_modes

if TYPE_CHECKING:
    from bless.store.parts import StoreParts

__all__ = ["PublishResult", "publish"]

_CREATED = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})")


@dataclass(frozen=True)
class PublishResult:
    """What :meth:`Store.publish` did. ``archived_manifest`` is the replaced manifest's copy, if any."""

    config_hash: str
    manifest_path: Path
    blessed_dir: Path
    archived_manifest: Path | None


#: The steps of :func:`publish`, in order; each is preceded by a fault point of its name, where the
#: crash tests kill a publish. The calls below take their names from here, so the tests that
#: parametrize over this tuple follow a renamed step; a fault point added with a name of its own is
#: caught by the test that compares this tuple with the points a real publish reaches.
PUBLISH_STEPS: tuple[str, ...] = (
    "validate",
    "move-tree",
    "fsync-tree",
    "make-read-only",
    "archive-old",
    "write-manifest-tmp",
    "rename-manifest",
    "clear-intent",
    "done",
)
(
    VALIDATE,
    MOVE_TREE,
    FSYNC_TREE,
    MAKE_READ_ONLY,
    ARCHIVE_OLD,
    WRITE_MANIFEST_TMP,
    RENAME_MANIFEST,
    CLEAR_INTENT,
    DONE,
) = PUBLISH_STEPS
#: The step whose rename commits the new blessing: a kill before it leaves the old blessing, a kill
#: at any later step the new one.
COMMIT_STEP = RENAME_MANIFEST


@dataclass(frozen=True)
class _Publication:
    """One publish under the hash lock: what goes where, as :func:`_validate` decided it."""

    manifest: Manifest
    #: The manifest file's bytes, exactly as they are committed.
    document: bytes
    staged_dir: Path
    #: ``blessed/<hash>/<dir_id>``.
    target: Path
    #: The file the new manifest replaces (the live one's, whatever its name), else ``<hash>.json``.
    manifest_target: Path
    live: LiveManifest | None

    @property
    def config_hash(self) -> str:
        return self.manifest.config_hash

    @property
    def intent(self) -> Path:
        """``blessed/<hash>/.publishing-<dir_id>``: says a publish of ``target`` is under way."""
        return self.target.parent / f"{PUBLISHING_PREFIX}{self.target.name}"


def publish(parts: StoreParts, staged_dir: Path, manifest: Manifest, fault: FaultHook) -> PublishResult:
    """See :meth:`bless.store.Store.publish`."""
    staged_dir = Path(staged_dir).absolute()
    config_hash = manifest.config_hash
    check_hash(config_hash, ManifestInvalidError)
    parts.paths.ensure_layout()
    with os_errors(f"publishing {config_hash[:16]}..."), parts.locks.lock(config_hash):
        recover(parts, fault=fault)

        fault(VALIDATE)
        job = _validate(parts, staged_dir, manifest)
        _clear_target(job)
        # Recorded before the commit: gc must know every manifests dir a blessing can be named in.
        parts.catalog.remember_manifests_dir()
        # Durable before the tree moves: a tree a crash leaves behind with no manifest is debris
        # recover() removes, told apart from a superseded version (which only gc removes).
        ensure_dir(job.target.parent)
        atomic_write_bytes(job.intent, b"")

        archived = _commit(parts.paths, job, fault)
        _after_commit(parts, job, fault)

        fault(DONE)
        return PublishResult(
            config_hash=config_hash,
            manifest_path=job.manifest_target,
            blessed_dir=job.target,
            archived_manifest=archived,
        )


def _validate(parts: StoreParts, staged_dir: Path, manifest: Manifest) -> _Publication:
    """Serialize the manifest, check the manifests dir and the staged tree; decide where each goes."""
    config_hash = manifest.config_hash
    document = manifest.to_json_bytes()  # validates against the schema
    target = parts.paths.blessed_dir(config_hash, manifest.cache.dir_id)
    parts.catalog.index().require_all_valid()
    live = parts.catalog.live(config_hash)
    manifest_target = live.path if live else parts.paths.manifests_dir / f"{config_hash}.json"
    if live is None and os.path.lexists(manifest_target):
        # Every manifest validated above, so it is a valid manifest of another hash.
        raise ManifestInvalidError(
            f"{manifest_target} is named for {config_hash[:16]}... but holds another hash's manifest",
            hint="rename that file after the config_hash it contains",
        )
    _check_staged(staged_dir, manifest)
    return _Publication(manifest, document, staged_dir, target, manifest_target, live)


def _clear_target(job: _Publication) -> None:
    """Refuse this very version when it is live; otherwise remove what an earlier try left at the target."""
    if not os.path.lexists(job.target):
        return
    if job.live is not None and job.live.manifest.cache.dir_id == job.manifest.cache.dir_id:
        raise AlreadyBlessedError(
            f"{job.config_hash[:16]}... is already blessed with this very version ({job.target.name})",
            hint="nothing to publish; re-bless to make a new version",
        )
    # No live manifest references it: debris of an interrupted publish of this same
    # version (or a superseded copy of it). We hold the lock, so nobody else uses it.
    remove_tree(job.target)


def _commit(paths: StorePaths, job: _Publication, fault: FaultHook) -> Path | None:
    """Move, fsync, seal and re-verify the tree, archive the old manifest, rename the new one in.

    Returns the archived copy of the replaced manifest, if any. A failure before the rename gives
    the tree back (:func:`_undo_uncommitted`) and is raised as a store refusal when it is an OS error.
    """
    renamed: bool | None = None  # None: nothing moved yet
    tmp: Path | None = None
    try:
        fault(MOVE_TREE)
        renamed = _move_tree(paths, job.staged_dir, job.target, fault)

        fault(FSYNC_TREE)
        fsync_tree(job.target)
        fsync_dir(job.target.parent)
        fsync_dir(paths.blessed)
        if renamed:
            fsync_dir(job.staged_dir.parent)

        fault(MAKE_READ_ONLY)
        _seal(job)

        fault(ARCHIVE_OLD)
        archived = _archive_manifest(paths, job.live) if job.live is not None else None

        fault(WRITE_MANIFEST_TMP)
        tmp = write_tmp(paths.manifests_dir, job.config_hash, job.document, FILE_MODE)

        fault(RENAME_MANIFEST)
        tmp.replace(job.manifest_target)  # THE commit point
        tmp = None
        fault("rename-manifest:before-fsync")
    except BaseException as exc:
        _undo_uncommitted(job, renamed, tmp, fault)
        refusal = _publish_refusal(exc, job.config_hash)
        if refusal is None:
            raise
        raise refusal from exc
    return archived


def _seal(job: _Publication) -> None:
    """Make the tree read-only, then hash it again against the manifest."""
    set_tree_modes(job.target, READ_ONLY_FILE_MODE, READ_ONLY_DIR_MODE, durable=True)
    # Hashing again costs time but closes the gap between validate and now (a writer
    # that still had a staged file open): the commit must cover exactly these bytes.
    check = verify_tree(job.target, job.manifest.cache.files, job.manifest.cache.dirs)
    if not check.ok:
        named = "; ".join(f"{shown(p.path)}: {p.detail}" for p in check.problems[:5])
        raise VerifyFailedError(
            f"the staged tree changed while it was being published: {named}",
            hint="make sure no process still writes the staged cache, then bless again",
            details={"problems": [p.to_dict() for p in check.problems]},
        )


def _undo_uncommitted(job: _Publication, renamed: bool | None, tmp: Path | None, fault: FaultHook) -> None:
    """After a failure: drop the temp manifest and, unless the commit happened, give the tree back."""
    if tmp is not None:
        with contextlib.suppress(OSError):
            tmp.unlink()
    # Give the tree back unless the commit happened after all (an interrupt landing
    # right after os.replace): then the live manifest references it.
    if not holds(job.manifest_target, job.document):
        with contextlib.suppress(OSError):
            if renamed is not None:
                _undo_move(job.target, job.staged_dir, renamed, fault)
            job.intent.unlink()


def _publish_refusal(exc: BaseException, config_hash: str) -> BlessError | None:
    """The refusal a failed publish raises for ``exc`` (a full disk, another OS error), or None to re-raise it."""
    if isinstance(exc, OSError):
        return os_refusal(
            exc,
            f"publishing {config_hash[:16]}...",
            hint="nothing was published; the previous blessing (if any) is unchanged",
        )
    return None


def _after_commit(parts: StoreParts, job: _Publication, fault: FaultHook) -> None:
    """Make the commit durable, tell the claim cache, drop the publishing marker."""
    manifests_dir = parts.paths.manifests_dir
    try:
        fsync_dir(manifests_dir)
    except OSError as exc:
        raise StoreUnavailableError(
            f"published {job.config_hash[:16]}... but could not fsync {manifests_dir}: {exc.strerror or exc}",
            hint="the blessing is visible but may not survive a power loss; verify it",
            remedy="verify_after_fsync",
        ) from exc
    parts.catalog.note_published(job.manifest_target, job.manifest)
    fault(CLEAR_INTENT)
    with contextlib.suppress(OSError):
        job.intent.unlink()  # a leftover marker of a committed publish is harmless: recover drops it


def _listing_difference(expected: Manifest, listing: TreeListing) -> list[str]:
    """Human lines saying how a hashed tree differs from a manifest's listing."""
    want = {f.path: f for f in expected.cache.files}
    got = {f.path: f for f in listing.files}
    lines = [f"missing file {p}" for p in sorted(want.keys() - got.keys())]
    lines += [f"extra file {p}" for p in sorted(got.keys() - want.keys())]
    for path in sorted(want.keys() & got.keys()):
        if want[path] != got[path]:
            w, g = want[path], got[path]
            lines.append(f"changed file {path} (manifest {w.size} B {w.sha256[:12]}, tree {g.size} B {g.sha256[:12]})")
    lines += [f"missing directory {d}" for d in sorted(set(expected.cache.dirs) - set(listing.dirs))]
    lines += [f"extra directory {d}" for d in sorted(set(listing.dirs) - set(expected.cache.dirs))]
    if not lines and listing.total_size != expected.cache.total_size:
        lines.append(f"total size {listing.total_size} != manifest {expected.cache.total_size}")
    return lines


def _check_staged(staged_dir: Path, manifest: Manifest) -> None:
    """Hash the staged tree and require it to be exactly the manifest's listing."""
    try:
        st = os.lstat(staged_dir)
    except OSError as exc:
        raise InputInvalidError(f"staged tree {staged_dir}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InputInvalidError(f"staged tree {staged_dir} is not a directory (symlinks are not followed)")
    try:
        listing = hash_tree(staged_dir)
    except TreeError as exc:
        raise InputInvalidError(
            f"staged tree cannot be published: {exc}",
            details={"problems": [p.to_dict() for p in exc.problems]},
        ) from None
    differences = _listing_difference(manifest, listing)
    if differences:
        more = f" (and {len(differences) - 5} more)" if len(differences) > 5 else ""
        shown = "; ".join(differences[:5]) + more
        raise InputInvalidError(
            f"staged tree {staged_dir} does not match the manifest: {shown}",
            hint="the manifest must be built from the staged tree as it is; nothing was published",
            details={"differences": differences},
        )


def _make_dir_movable(path: Path) -> None:
    """Moving a directory to another parent rewrites its ``..``: give the owner write access."""
    mode = stat.S_IMODE(os.lstat(path).st_mode)
    if stat.S_ISDIR(os.lstat(path).st_mode) and mode & 0o700 != 0o700:
        path.chmod(mode | 0o700)


def rename_staged(paths: StorePaths, source: Path, destination: Path) -> bool:
    """Rename ``source`` to ``destination`` when it is under ``root/staging`` (ours to consume).

    False when the caller must copy instead: ``source`` is elsewhere (never consumed), or staging
    is on another file system than ``destination``.
    """
    if not paths.under_staging(source):
        return False
    _make_dir_movable(source)
    try:
        source.rename(destination)
    except OSError as exc:
        if exc.errno != errno.EXDEV:  # staging on another mount: copy instead
            raise
        return False
    return True


def _move_tree(paths: StorePaths, source: Path, target: Path, fault: FaultHook) -> bool:
    """Move a staged tree to ``target``; True when renamed, False when copied (source kept).

    Renamed only from under ``root/staging`` (same file system, and ours to consume); anything
    else is copied into a ``.partial-`` sibling of ``target`` first, so a crash mid-copy leaves
    a name :meth:`Store.recover` knows is debris, then renamed into place.
    """
    ensure_dir(target.parent)
    if rename_staged(paths, source, target):
        return True
    partial = target.parent / f"{PARTIAL_PREFIX}{target.name}-{secrets.token_hex(4)}"

    def copy_file(src: str, dst: str) -> str:
        fault("move-tree:copy-file")
        return shutil.copyfile(src, dst)

    try:
        shutil.copytree(source, partial, symlinks=True, copy_function=copy_file)
        fault("move-tree:before-rename")
        partial.rename(target)
    except BaseException:
        with contextlib.suppress(OSError):
            remove_tree(partial)
        raise
    return False


def _undo_move(target: Path, staged_dir: Path, renamed: bool, fault: FaultHook) -> None:
    """Before the commit: give the staged tree back (writable again), or drop our copy."""
    if not os.path.lexists(target):
        return
    fault("undo")
    if renamed and not os.path.lexists(staged_dir):
        set_tree_modes(target, FILE_MODE, 0o755, durable=False, leave_linked=True)
        fault("undo:before-rename")
        target.rename(staged_dir)
    else:
        remove_tree(target)


def _created_stamp(created: str) -> str:
    """``2024-05-01T12:34:56Z`` -> ``20240501T123456Z`` (archive file names sort by time)."""
    match = _CREATED.match(created)
    if match is None:  # the schema forbids this; keep a sortable name anyway
        return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    y, mo, d, h, mi, s = match.groups()
    return f"{y}{mo}{d}T{h}{mi}{s}Z"


def _archive_manifest(paths: StorePaths, live: LiveManifest) -> Path:
    """Copy the live manifest file, byte for byte, to ``archive/<hash>/<created>-<tree12>.json``."""
    directory = paths.archive / live.manifest.config_hash
    ensure_dir(directory)
    raw = live.path.read_bytes()
    stem = f"{_created_stamp(live.manifest.created)}-{live.manifest.cache.tree_sha256[:12]}"
    path = directory / f"{stem}.json"
    counter = 1
    # Same second and same tree but other bytes (other trials): never overwrite history.
    while path.exists() and path.read_bytes() != raw:
        counter += 1
        path = directory / f"{stem}-{counter}.json"
    atomic_write_bytes(path, raw)
    fsync_dir(paths.archive)
    return path
