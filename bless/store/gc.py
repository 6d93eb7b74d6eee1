"""Recovery after crashed writers, and garbage collection of what no blessing needs.

:func:`recover` removes debris (dot temp files, ``.partial-`` copies, half-created staging dirs)
and completes evidence dirs a crash cut short. :func:`gc` also removes blessed versions that no
manifest in ANY manifests dir this store has published to references, old evidence (``rejected/``
and, by the same rule but counted apart, ``interrupted/``) and the staging dirs of dead runs. Every
hash is handled under its lock (skipped while a writer holds it), and gc fails safe: an invalid
manifest, a manifests dir it cannot read, or a lost or unreadable record of those dirs keeps every
blessed version. A tree a live serving lease holds is never removed.

Nothing is removed through a symlink: a symlink where the store layout has a directory (``blessed/``,
``blessed/<hash>/``, ``serve/``...) or an entry gc would remove is reported and left alone, since
following it would delete whatever it points at, outside the store.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bless.core.factors import CONFIG_HASH, is_config_hash
from bless.errors import InputInvalidError
from bless.store.faults import FaultHook
from bless.store.layout import (
    NEW_STAGING_PREFIX,
    OWNER_FILE,
    PARTIAL_PREFIX,
    PUBLISHING_PREFIX,
    StorePaths,
    is_dir_id,
)
from bless.store.lease import Lease
from bless.system.durable import TMP_MARK, fsync_dir
from bless.system.entries import age_s, listdir
from bless.system.json_files import read_json_object
from bless.system.os_refusals import os_errors
from bless.system.procid import process_alive
from bless.system.trees import remove_tree, symlink_on_the_way, tree_bytes

if TYPE_CHECKING:
    from bless.store.parts import StoreParts

__all__ = [
    "RUN_LOGS_MAX_AGE_S",
    "RUN_RECORD",
    "SERVE_EVIDENCE_MAX_AGE_S",
    "STALE_S",
    "GcAction",
    "GcReport",
    "StagingOwner",
    "gc",
    "recover",
    "staging_owner",
]

# A leftover we cannot attribute to a process (no owner record) is only removed once it is this old,
# so that we never race its creator.
STALE_S = 3600.0

# Engine logs of an accepted run that names no blessing go once they are this old.
RUN_LOGS_MAX_AGE_S = 30 * 24 * 3600.0
#: A serve dir that holds unproven-compile evidence (what a sealed serve met, read by the next ``bless run``)
#: goes once neither it nor that file has changed for this long.
SERVE_EVIDENCE_MAX_AGE_S = 30 * 24 * 3600.0
#: ``runs/<run_id>/.blessing.json``: which blessed version a run's logs belong to.
RUN_RECORD = ".blessing.json"

# Temp files whose name carries the config hash they belong to (manifests dir, locks dir).
_HASHED_TMP = re.compile(r"\.(?P<hash>" + CONFIG_HASH.pattern + r")(?:\.holder|\.json)?" + re.escape(TMP_MARK))


@dataclass(frozen=True)
class GcAction:
    """One removal (done, or planned when dry-running) and the bytes it frees."""

    path: Path
    reason: str
    bytes: int
    #: For the evidence of an interrupted ``bless run``: the step it was stopped in (no verdict).
    interrupted_during: str | None = None


@dataclass(frozen=True)
class GcReport:
    """The result of :meth:`Store.gc`. ``notes`` says what was skipped and why (e.g. a held lock)."""

    actions: tuple[GcAction, ...]
    dry_run: bool
    notes: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        """Bytes freed (or that would be freed) by all actions."""
        return sum(action.bytes for action in self.actions)


def _hashed_tmp(name: str) -> str | None:
    match = _HASHED_TMP.match(name)
    return match.group("hash") if match else None


def _debris_hashes(parts: StoreParts) -> list[str]:
    """Config hashes that may have crash debris somewhere in the store."""
    paths = parts.paths
    hashes: set[str] = set()
    for directory in (paths.blessed, paths.archive, paths.rejected, paths.interrupted):
        hashes.update(e.name for e in listdir(directory) if is_config_hash(e.name))
    for directory in (paths.manifests_dir, paths.locks):
        for entry in listdir(directory):
            claimed = _hashed_tmp(entry.name)
            if claimed is not None:
                hashes.add(claimed)
    return sorted(hashes)


def _leased_dir_ids(parts: StoreParts, config_hash: str) -> set[str]:
    """dir_ids of ``config_hash`` a lease may hold: its holder is alive or cannot be judged."""
    return {lease.dir_id for lease in parts.leases.leases(config_hash) if lease.alive is not False}


def _debris(parts: StoreParts, config_hash: str) -> list[tuple[Path, str, bool]]:
    """Crash debris of one hash: (path, reason, finalize) where finalize = complete, do not delete."""
    paths = parts.paths
    found: list[tuple[Path, str, bool]] = []
    referenced: set[str] | None = None
    leased: set[str] | None = None
    for entry in listdir(paths.blessed / config_hash):
        if entry.name.startswith(PARTIAL_PREFIX):
            found.append((Path(entry.path), "partial copy of an interrupted publish", False))
        elif entry.name.startswith(PUBLISHING_PREFIX):
            dir_id = entry.name[len(PUBLISHING_PREFIX) :]
            if referenced is None:
                referenced = parts.catalog.referenced_dir_ids_if_sure(config_hash)
                if referenced is None:
                    continue  # cannot tell whether that publish committed: leave it to a later run
            if leased is None:
                leased = _leased_dir_ids(parts, config_hash)
            tree = paths.blessed / config_hash / dir_id
            # A superseded version a server still holds (its publish marker left by a crash after
            # the commit) is the lease's to keep: only its marker goes, and gc handles the tree.
            if dir_id not in referenced and dir_id not in leased and is_dir_id(dir_id) and os.path.lexists(tree):
                # Before its marker, so that a crash here leaves the marker to retry with.
                found.append((tree, "tree of an interrupted publish (no manifest references it)", False))
            found.append((Path(entry.path), "marker of an interrupted publish", False))
    for directory, what in ((paths.manifests_dir, "manifest"), (paths.locks, "lock holder")):
        for entry in listdir(directory):
            if _hashed_tmp(entry.name) == config_hash:
                found.append((Path(entry.path), f"temp {what} file of an interrupted write", False))
    for entry in listdir(paths.archive / config_hash):
        if entry.name.startswith(".") and TMP_MARK in entry.name:
            found.append((Path(entry.path), "temp archive file of an interrupted publish", False))
    for base, what in ((paths.rejected, "reject"), (paths.interrupted, "filing of an interrupted run's evidence")):
        for entry in listdir(base / config_hash):
            if entry.name.startswith(PARTIAL_PREFIX):
                # Holds a moved staged tree: evidence. Complete it rather than delete it.
                found.append((Path(entry.path), f"completed an interrupted {what} (kept as evidence)", True))
            elif entry.is_dir(follow_symlinks=False):
                for inner in listdir(Path(entry.path)):
                    if inner.name.startswith(".") and TMP_MARK in inner.name:
                        found.append((Path(inner.path), f"temp evidence file of an interrupted {what}", False))
    return found


@dataclass(frozen=True)
class StagingOwner:
    """Who a staging dir belongs to, from its ``.owner`` record, and whether that run is dead."""

    #: The ``.owner`` record (pid, host, ...); None where there is none (or it cannot be read).
    record: dict[str, Any] | None
    #: Whether the owner process runs: None where it cannot be told here (another host, no record).
    alive: bool | None
    #: The run is dead and its staging dir may be removed: its owner is provably gone, or it has
    #: no owner record and has been untouched for over :data:`STALE_S`.
    dead: bool


def staging_owner(path: Path) -> StagingOwner:
    """The owner of the staging dir ``path``, and whether its run is dead (the one rule for it)."""
    record = read_json_object(path / OWNER_FILE)
    alive = process_alive(record) if record is not None else None
    dead = alive is False or (record is None and age_s(path) > STALE_S)
    return StagingOwner(record=record, alive=alive, dead=dead)


def _staging_debris(parts: StoreParts) -> list[tuple[Path, str]]:
    """Half-created staging dirs (``.new-*``) whose creator is gone."""
    found: list[tuple[Path, str]] = []
    for entry in listdir(parts.paths.staging):
        if not entry.name.startswith(NEW_STAGING_PREFIX):
            continue
        path = Path(entry.path)
        if staging_owner(path).dead:
            found.append((path, "half-created staging dir of a run that is gone"))
    return found


def _finalize_evidence(partial: Path) -> None:
    # ".partial-<run>-c<N>-<token>" -> "<run>-c<N>" (or a fresh name if that exists).
    base = partial.name[len(PARTIAL_PREFIX) :].rsplit("-", 1)[0] or "unknown"
    final = partial.parent / base
    if os.path.lexists(final):
        final = partial.parent / f"{base}-recovered-{secrets.token_hex(4)}"
    partial.rename(final)
    fsync_dir(partial.parent)


@dataclass
class _Sweep:
    """Removals of one recover or gc pass: done (or only listed when dry-running), with notes."""

    dry_run: bool
    fault: FaultHook
    #: Where removals may happen: the store root and its manifests dir (temp files of a crash).
    bases: tuple[Path, ...]
    actions: list[GcAction] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def drop(
        self, path: Path, reason: str, *, point: str, finalize: bool = False, interrupted: str | None = None
    ) -> None:
        """Remove ``path`` (or, with ``finalize``, complete an evidence dir a crash cut short) and record it.

        Never through a symlink (see the module docstring): such a path is noted and left alone.
        """
        base = max((b for b in self.bases if path.is_relative_to(b)), key=lambda b: len(b.parts), default=None)
        why = symlink_on_the_way(path, base) if base is not None else f"{path} is outside the store"
        if why is not None:
            self.notes.append(f"{path}: left alone, gc never follows or removes symlinks in the store ({why})")
            return
        size = 0 if finalize else tree_bytes(path)
        if not self.dry_run:
            try:
                self.fault(point)
                if finalize:
                    _finalize_evidence(path)
                else:
                    remove_tree(path, within=base)
            except OSError as exc:
                self.notes.append(f"{path}: could not clean up: {exc.strerror or exc}")
                return
        self.actions.append(GcAction(path, reason, size, interrupted))

    def note(self, text: str) -> None:
        """Add a note once (recovery and gc may both come across the same thing)."""
        if text not in self.notes:
            self.notes.append(text)


def _new_sweep(parts: StoreParts, *, dry_run: bool, fault: FaultHook) -> _Sweep:
    return _Sweep(dry_run, fault, bases=(parts.paths.root, parts.paths.manifests_dir))


def _symlink_note(why: str) -> str:
    return (
        f"{why}: gc never follows a symlink in the store, so nothing there or below it was removed; "
        "replace it with the directory it should be (or remove the symlink) by hand"
    )


def _real_dir(parts: StoreParts, directory: Path, sweep: _Sweep) -> bool:
    """Is ``directory`` (in the store layout) a real directory reached without symlinks? Notes why not."""
    why = symlink_on_the_way(directory, parts.paths.root)
    if why is not None:
        sweep.note(_symlink_note(why))
        return False
    try:
        return stat.S_ISDIR(os.lstat(directory).st_mode)
    except OSError:
        return False  # missing: nothing to clean there


def _hash_dirs_ok(parts: StoreParts, config_hash: str, sweep: _Sweep) -> bool:
    """Are the per-hash dirs gc may remove from or lock in free of symlinks? Notes each that is not."""
    paths = parts.paths
    ok = True
    for directory in (
        *(d / config_hash for d in (paths.blessed, paths.archive, paths.rejected, paths.interrupted, paths.leases)),
        paths.locks,
    ):
        why = symlink_on_the_way(directory, paths.root)
        if why is not None:
            sweep.note(_symlink_note(why))
            ok = False
    return ok


def _recover(parts: StoreParts, sweep: _Sweep) -> None:
    for config_hash in _debris_hashes(parts):
        if not _hash_dirs_ok(parts, config_hash, sweep):
            continue
        if not _debris(parts, config_hash):
            continue  # look before locking: most hashes have no debris
        with parts.locks.try_lock(config_hash) as locked:
            if not locked:
                sweep.notes.append(f"{config_hash[:16]}...: lock held by a running bless; debris left alone")
                continue
            # Listed again under the lock (nobody is writing this hash) and the lease guard (a
            # lease taken from here on sees what this pass removed; one taken before is seen).
            with parts.leases.guard(config_hash):
                for path, reason, finalize in _debris(parts, config_hash):
                    sweep.drop(path, reason, point="recover-remove", finalize=finalize)
    if _real_dir(parts, parts.paths.staging, sweep):
        for path, reason in _staging_debris(parts):
            sweep.drop(path, reason, point="recover-remove")


def recover(parts: StoreParts, *, fault: FaultHook) -> list[Path]:
    """Clean up crash debris; what was removed (or, for rejects, completed). See :meth:`Store.recover`."""
    with os_errors(f"recovering the store {parts.paths.root}"):
        sweep = _new_sweep(parts, dry_run=False, fault=fault)
        _recover(parts, sweep)
    return [action.path for action in sweep.actions]


def _holder_text(lease: Lease) -> str:
    holder = lease.holder or {}
    return f"{lease.name!r} (pid {holder.get('pid', '?')} on {holder.get('host', '?')})"


def _gc_hash(parts: StoreParts, config_hash: str, sweep: _Sweep, *, keep: int, sure: bool) -> None:
    """One hash, under its writer lock and its lease guard: superseded versions, stale leases, evidence."""
    paths = parts.paths
    with parts.leases.guard(config_hash):
        # Under the lease guard: a server takes its lease before it verifies, so a version leased
        # from here on is one this pass has not removed, and one leased before is seen here.
        leased: dict[str, Lease] = {}
        for lease in parts.leases.leases(config_hash):
            if lease.alive is False:
                holder = lease.holder or {}
                sweep.drop(lease.path, f"stale serving lease: pid {holder.get('pid', '?')} is gone", point="gc-remove")
            else:
                leased.setdefault(lease.dir_id, lease)
        if sure:
            # Under the writer lock, so a publish cannot commit between this read and the removals.
            referenced = parts.catalog.referenced_dir_ids(config_hash)
            versions = sorted(
                (
                    Path(e.path)
                    for e in listdir(paths.blessed / config_hash)
                    # Only names a publish makes: anything else there is not gc's to judge.
                    if is_dir_id(e.name) and e.is_dir(follow_symlinks=False) and e.name not in referenced
                ),
                key=lambda p: p.name,
                reverse=True,
            )
            for path in versions[keep:]:
                if path.name in leased:
                    lease = leased[path.name]
                    sweep.notes.append(
                        f"{path}: kept, being served by {_holder_text(lease)} (lease {lease.path}; remove it "
                        "only once that server is gone)"
                    )
                else:
                    sweep.drop(path, "blessed version no manifest references", point="gc-remove")
        if not sweep.dry_run:
            parts.leases.prune_empty(config_hash)
    # Rejections and interrupted runs are kept by the same rule, each counted apart: the newest
    # interruptions never push a rejection out of the --keep N kept.
    for path in _beyond_newest(paths.rejected / config_hash, keep):
        interrupted = _interrupted_during(path)
        if interrupted is None:
            sweep.drop(path, "rejected evidence beyond the newest kept", point="gc-remove")
        else:  # filed with the rejections by a bless from before interrupted/
            _drop_interrupted(sweep, path, interrupted)
    for path in _beyond_newest(paths.interrupted / config_hash, keep):
        _drop_interrupted(sweep, path, _interrupted_during(path) or "an unrecorded step")


def _beyond_newest(directory: Path, keep: int) -> list[Path]:
    """The evidence dirs in ``directory`` beyond the ``keep`` newest (by mtime)."""
    evidence = [
        Path(e.path) for e in listdir(directory) if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")
    ]
    evidence.sort(key=lambda p: (os.lstat(p).st_mtime, p.name), reverse=True)
    return evidence[keep:]


def _drop_interrupted(sweep: _Sweep, path: Path, step: str) -> None:
    reason = f"evidence of a run interrupted during {step} (not a rejection) beyond the newest kept"
    sweep.drop(path, reason, point="gc-remove", interrupted=step)


def _interrupted_during(evidence_dir: Path) -> str | None:
    """The step an interrupted run stopped in, from its ``evidence.json``; None for a real rejection."""
    record = read_json_object(evidence_dir / "evidence.json") or {}
    step = record.get("interrupted_during")
    return step if isinstance(step, str) and step else None


def _gc_staging(parts: StoreParts, sweep: _Sweep) -> None:
    if not _real_dir(parts, parts.paths.staging, sweep):
        return
    for entry in listdir(parts.paths.staging):
        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path)
        verdict = staging_owner(path)
        owner = verdict.record
        if verdict.dead and owner is not None:
            sweep.drop(
                path, f"staging of a run that is not running (pid {owner.get('pid')} is gone)", point="gc-remove"
            )
        elif verdict.dead:
            sweep.drop(path, "staging dir without an owner record, untouched for over an hour", point="gc-remove")
        elif verdict.alive is None and owner is not None:
            sweep.notes.append(f"{path}: owner on host {owner.get('host')!r} cannot be checked here; kept")


def _gc_serve_dirs(parts: StoreParts, sweep: _Sweep) -> None:
    """``serve/<name>-<stamp>-<token>/`` of serves that are not running: no live lease names them."""
    if not _real_dir(parts, parts.paths.serve, sweep):
        return
    # By identity, not by name: a lease taken through another path to the root (a symlink, a bind
    # mount) names this same dir differently.
    serving: set[tuple[int, int]] = set()
    for lease in parts.leases.leases():
        if lease.alive is not False and lease.serve_dir:
            try:
                st = Path(lease.serve_dir).stat()
            except (OSError, ValueError):
                continue  # gone (or not a path): it protects nothing that exists
            serving.add((st.st_dev, st.st_ino))
    for entry in listdir(parts.paths.serve):
        path = Path(entry.path)
        if entry.name.startswith("."):
            continue
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if (st.st_dev, st.st_ino) in serving:
            continue
        if stat.S_ISLNK(st.st_mode):
            sweep.note(_symlink_note(f"{path} is a symlink"))
            continue
        evidence = StorePaths.unproven_compiles(path)
        if os.path.lexists(evidence):
            # What a sealed serve met, kept for the next bless run of its profile: aged out, by its last event.
            if min(age_s(path), age_s(evidence)) > SERVE_EVIDENCE_MAX_AGE_S:
                sweep.drop(path, "serve dir of a stopped serve with unproven-compile evidence, untouched for over "
                           "30 days", point="gc-remove")  # fmt: skip
            continue
        # A serve-full that is starting may not have written its lease yet: only old dirs go.
        if age_s(path) > STALE_S:
            sweep.drop(path, "serve dir of a serve that is not running (no live lease), untouched for over an hour",
                       point="gc-remove")  # fmt: skip


def _gc_run_logs(parts: StoreParts, sweep: _Sweep) -> None:
    """``runs/<run_id>/``: engine logs go with the blessed version they produced, or when very old."""
    if not _real_dir(parts, parts.paths.runs, sweep):
        return
    removed = {action.path for action in sweep.actions}
    for entry in listdir(parts.paths.runs):
        path = Path(entry.path)
        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        record = read_json_object(path / RUN_RECORD) or {}
        config_hash, dir_id = record.get("config_hash"), record.get("dir_id")
        if is_config_hash(config_hash) and is_dir_id(dir_id):
            blessed = parts.paths.blessed / str(config_hash) / str(dir_id)
            if blessed in removed or not os.path.lexists(blessed):
                sweep.drop(path, "engine logs of a blessed version that no longer exists", point="gc-remove")
        elif age_s(path) > RUN_LOGS_MAX_AGE_S:
            sweep.drop(path, "engine logs without a blessing record, untouched for over 30 days", point="gc-remove")


def gc(parts: StoreParts, *, keep: int, dry_run: bool, fault: FaultHook) -> GcReport:
    """See :meth:`Store.gc`."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise InputInvalidError(f"keep must be a non-negative integer, got {keep!r}")
    paths = parts.paths
    # Fail closed before touching anything: an unreadable manifest may reference any version, and
    # so may one in a manifests dir gc does not know of (its record lost or unreadable).
    unsure = parts.catalog.unreadable_manifests_dirs()
    unknown = parts.catalog.manifests_dirs_unknown()
    for directory in parts.catalog.known_manifests_dirs():
        if directory not in unsure:
            parts.catalog.index_of(directory).require_all_valid()
    sweep = _new_sweep(parts, dry_run=dry_run, fault=fault)
    _recover(parts, sweep)
    fault("gc-start")
    if unknown is not None:
        sweep.notes.append(
            f"{unknown}: a manifests dir gc does not know of may reference any blessed version, so none is removed"
        )
    for directory, why in sorted(unsure.items()):
        sweep.notes.append(
            f"manifests dir {directory} ({why}) was published to: its manifests may reference any blessed "
            "version, so none is removed; make it readable again, or forget it with "
            "bless gc --forget-manifests-dir DIR"
        )
    hashes = {e.name for e in listdir(paths.blessed) if is_config_hash(e.name)}
    hashes |= {e.name for e in listdir(paths.rejected) if is_config_hash(e.name)}
    hashes |= {e.name for e in listdir(paths.interrupted) if is_config_hash(e.name)}
    hashes |= {e.name for e in listdir(paths.leases) if is_config_hash(e.name)}
    for config_hash in sorted(hashes):
        if not _hash_dirs_ok(parts, config_hash, sweep):
            continue
        with parts.locks.try_lock(config_hash) as locked:
            if not locked:
                sweep.notes.append(f"{config_hash[:16]}...: lock held by a running bless; skipped")
                continue
            _gc_hash(parts, config_hash, sweep, keep=keep, sure=not unsure and unknown is None)
    _gc_staging(parts, sweep)
    _gc_serve_dirs(parts, sweep)
    _gc_run_logs(parts, sweep)
    fault("gc-done")
    return GcReport(actions=tuple(sweep.actions), dry_run=dry_run, notes=tuple(sweep.notes))
