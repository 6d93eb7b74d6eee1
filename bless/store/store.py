"""The :class:`Store` facade: one object for the store's layout, lookups and writer operations.

The facade builds the store's narrow parts (:class:`~bless.store.parts.StoreParts`: paths, locks,
leases and the manifest catalog) and hands them to the writer operations (:mod:`~bless.store.publish`,
:mod:`~bless.store.reject`, :mod:`~bless.store.gc`); those never call back into it.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bless.core.manifest import Manifest
from bless.core.verify import ProgressFn, TreeCheck, verify_tree
from bless.errors import InputInvalidError
from bless.store.catalog import ManifestCatalog
from bless.store.faults import FaultHook, no_fault
from bless.store.gc import RUN_RECORD, GcReport
from bless.store.gc import gc as run_gc
from bless.store.gc import recover as run_recover
from bless.store.index import LiveManifest, ManifestIndex, ManifestRecord
from bless.store.layout import NEW_STAGING_PREFIX, OWNER_FILE, StorePaths, check_run_id
from bless.store.lease import LeaseBook
from bless.store.locks import HashLocks
from bless.store.parts import StoreParts
from bless.store.publish import PublishResult
from bless.store.publish import publish as run_publish
from bless.store.reject import reject as run_reject
from bless.store.scan import ManifestReader
from bless.store.trusted_paths import refuse_untrusted_paths
from bless.system.durable import atomic_write_bytes, ensure_dir, fsync_dir
from bless.system.os_refusals import os_errors, os_refusal
from bless.system.procid import process_identity
from bless.system.trees import remove_tree

__all__ = ["Store", "default_root"]


def builtin_root() -> Path:
    """``~/.cache/bless``: the store root when neither ``--root`` nor ``$BLESS_ROOT`` names one."""
    return Path.home() / ".cache" / "bless"


def default_root() -> Path:
    """The store root: ``$BLESS_ROOT`` when set and non-empty, else :func:`builtin_root`."""
    env = os.environ.get("BLESS_ROOT", "").strip()
    if env:
        return Path(env).expanduser()
    return builtin_root()


class Store:
    """The store under ``root``; live manifests in ``manifests_dir`` (default ``root/manifests``).

    Creating a Store touches nothing on disk; writer operations create the layout as needed.
    ``reader`` is how manifest files are read (tests count what a lookup reads).
    """

    def __init__(self, root: Path, manifests_dir: Path | None = None, *, reader: ManifestReader | None = None) -> None:
        paths = StorePaths.of(root, manifests_dir)
        self._paths = paths
        self._parts = StoreParts(
            paths=paths,
            locks=HashLocks(paths.locks),
            leases=LeaseBook(paths.leases),
            catalog=ManifestCatalog(paths, reader or ManifestReader()),
        )

    @property
    def root(self) -> Path:
        """The store root."""
        return self._paths.root

    @property
    def manifests_dir(self) -> Path:
        """Where live manifests are (``root/manifests`` unless given)."""
        return self._paths.manifests_dir

    @property
    def leases(self) -> LeaseBook:
        """Serving leases (:mod:`bless.store.lease`): what gc must keep while a server runs."""
        return self._parts.leases

    def keep_run_logs(self, run_id: str, published: PublishResult, logs: Iterable[Path]) -> Path:
        """Copy an accepted run's engine logs to ``runs/<run_id>/``, recording which blessing they made.

        gc removes them with that blessed version (see :mod:`bless.store.gc`).
        """
        check_run_id(run_id)
        directory = self._paths.runs / run_id
        with os_errors(f"keeping the engine logs in {directory}"):
            ensure_dir(directory)
            for log in logs:
                shutil.copy2(log, directory / log.name)
            record = {"config_hash": published.config_hash, "dir_id": published.blessed_dir.name}
            atomic_write_bytes(directory / RUN_RECORD, (json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
        return directory

    @property
    def paths(self) -> StorePaths:
        """Every directory of the store."""
        return self._paths

    def blessed_dir(self, manifest: Manifest) -> Path:
        """``root/blessed/<config_hash>/<dir_id>``: derived from the manifest, never stored.

        Raises:
            ManifestInvalidError: when the hash or dir_id could name a path outside the store.
        """
        return self._paths.blessed_dir(manifest.config_hash, manifest.cache.dir_id)

    def check_permissions(self, manifest: Manifest, *, live: LiveManifest | None = None) -> None:
        """Refuse a blessing that users other than its owner could replace.

        The store root, the manifests dir, the manifest file, ``blessed/``, ``blessed/<hash>/`` and
        the blessed tree's root must not be writable by group or others (nor, below the root, be
        symlinks): whoever can write there can swap the manifest and its tree together, and every
        byte would still verify. The manifest file, ``blessed/`` and ``blessed/<hash>/`` must carry no
        setuid, setgid or sticky bit either (bless makes them with exact modes; the tree's own modes are
        :func:`~bless.core.verify.verify_tree`'s); the root and the manifests dir may (an operator's
        setgid shared directory). Call before hashing (verify, serve-full, gate --verify).

        ``live``: the manifest's live record when the caller looked it up already (serve-full serves
        those very bytes), so it is not looked up again.

        Raises:
            VerifyFailedError: naming each unsafe path, its mode, and the chmod that fixes it.
            ManifestInvalidError: as :meth:`find` and :meth:`blessed_dir`.
        """
        self._check_permissions(manifest, self.blessed_dir(manifest), live)

    def _check_permissions(self, manifest: Manifest, tree: Path, live: LiveManifest | None) -> None:
        """:meth:`check_permissions` of the blessed tree ``tree`` (``live``: None looks it up)."""
        live = live if live is not None else self.live(manifest.config_hash)
        checked = [
            self.root,
            self.manifests_dir,
            *([live.path] if live else []),
            self._paths.blessed,
            tree.parent,
            tree,
        ]
        exact = [*([live.path] if live else []), self._paths.blessed, tree.parent]  # the tree: verify_tree's
        refuse_untrusted_paths(checked, config_hash=manifest.config_hash, root=self.root, exact=exact)

    def verify_blessing(
        self,
        manifest: Manifest,
        *,
        progress: ProgressFn | None = None,
        before_hashing: Callable[[Path], None] | None = None,
        live: LiveManifest | None = None,
        workers: int | None = None,
    ) -> TreeCheck:
        """The one check of a blessing (verify, gate --verify, serve-full, push): permissions, then bytes.

        :meth:`check_permissions` first (raising :class:`VerifyFailedError`; ``live`` as there), then
        ``before_hashing`` with the blessed dir (serve-full stamps its snapshot there, and takes the dir
        from it), then :func:`~bless.core.verify.verify_tree` (read-only expected; ``workers`` hashing threads,
        None: its default); the caller judges the result.
        """
        blessed_dir = self.blessed_dir(manifest)
        self._check_permissions(manifest, blessed_dir, live)
        if before_hashing is not None:
            before_hashing(blessed_dir)
        return verify_tree(blessed_dir, manifest.cache.files, manifest.cache.dirs, progress=progress, workers=workers)

    def new_staging_dir(self, run_id: str) -> Path:
        """Create ``root/staging/<run_id>/`` with an ``.owner`` record (pid, host) and return it.

        The directory appears complete (owner record included) or not at all, so :meth:`gc` can
        always tell whether its run is still alive. Put candidate trees in subdirectories: the
        ``.owner`` file is not part of any cache.

        Raises:
            InputInvalidError: bad run id, or a staging dir of that name exists.
            NoSpaceError: a full or read-only disk.
        """
        check_run_id(run_id)
        self._paths.ensure_layout()
        staging = self._paths.staging
        final = staging / run_id
        if os.path.lexists(final):
            raise InputInvalidError(f"staging dir {final} already exists", hint="use a new run id")
        tmp = staging / f"{NEW_STAGING_PREFIX}{run_id}-{secrets.token_hex(4)}"
        with os_errors(f"creating a staging dir in {staging}"):
            ensure_dir(tmp)
        try:
            owner = {**process_identity(), "run_id": run_id}
            atomic_write_bytes(tmp / OWNER_FILE, (json.dumps(owner, sort_keys=True) + "\n").encode("utf-8"))
            # rename(2) onto an existing non-empty dir fails: two runs with one id cannot both win.
            tmp.rename(final)
        except OSError as exc:
            remove_tree(tmp)
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):  # another run took the id since the check above
                raise InputInvalidError(f"staging dir {final} already exists", hint="use a new run id") from None
            raise os_refusal(exc, f"creating staging dir {final}") from None
        with os_errors(f"syncing {staging}"):
            fsync_dir(staging)
        return final

    # ---------------------------------------------------------------------------------- locks

    @contextmanager
    def lock(self, config_hash: str, *, wait: bool = False, timeout: float | None = None) -> Iterator[None]:
        """Hold the per-hash writer lock for the ``with`` body (see :meth:`HashLocks.lock`).

        Raises:
            LockHeldError: another process holds it (at once, or after ``timeout`` when waiting).
        """
        with self._parts.locks.lock(config_hash, wait=wait, timeout=timeout):
            yield

    # ------------------------------------------------------------------------------ manifests

    def index(self) -> ManifestIndex:
        """Every manifest of the manifests dir, each validated (``bless list``, gate, gc)."""
        return self._parts.catalog.index()

    def listing(self) -> ManifestIndex:
        """Every manifest of the manifests dir for ``bless list``: validated, or known valid and unchanged.

        A file validated before and unchanged since is not opened (its record carries the cached
        :func:`~bless.store.index.manifest_summary`, not the manifest): see :func:`scan_manifests`.
        """
        return self._parts.catalog.listing()

    def records(self) -> list[ManifestRecord]:
        """Every ``*.json`` in the manifests dir (dotfiles skipped), parsed and validated, by name.

        Invalid files are listed too, with their error. A missing manifests dir has no records.

        Raises:
            ManifestInvalidError: when the manifests dir exists but cannot be listed.
        """
        return list(self.index().records)

    def live(self, config_hash: str) -> LiveManifest | None:
        """The live manifest's path, manifest and bytes for ``config_hash``, or None (raises as :meth:`find`)."""
        return self._parts.catalog.live(config_hash)

    def find(self, config_hash: str) -> Manifest | None:
        """The live manifest whose ``config_hash`` FIELD is ``config_hash`` (file names are a hint).

        Only candidate files are schema-validated: those claiming the hash, or named for it.

        Raises:
            ManifestDuplicateError: two manifest files claim this hash (naming both).
            ManifestInvalidError: a file claiming this hash is invalid, or a file's claim cannot be
                read (fail closed: it might be the one claiming this hash).
            InputInvalidError: ``config_hash`` is not 64 lowercase hex digits.
        """
        live = self.live(config_hash)
        return live.manifest if live else None

    def manifest_path(self, config_hash: str) -> Path | None:
        """Where the live manifest for ``config_hash`` is (any file name), or None. Raises as :meth:`find`."""
        live = self.live(config_hash)
        return live.path if live else None

    def live_prefix(self, prefix: str) -> LiveManifest:
        """The live manifest (path, manifest, bytes) whose config hash starts with ``prefix`` (at least 8 hex digits).

        Raises:
            InputInvalidError: a malformed prefix, or one that matches several hashes (listed).
            NoManifestError: no live manifest matches.
            ManifestDuplicateError, ManifestInvalidError: as :meth:`find`.
        """
        return self._parts.catalog.live_prefix(prefix)

    def forget_manifests_dir(self, directory: Path) -> bool:
        """Drop ``directory`` from the record of manifests dirs published to; True when it was recorded.

        Raises:
            VerifyFailedError: the record cannot be read (reason ``store_state``).
        """
        return self._parts.catalog.forget_manifests_dir(directory)

    # ------------------------------------------------------------------------ writer operations

    def publish(self, staged_dir: Path, manifest: Manifest, *, fault: FaultHook | None = None) -> PublishResult:
        """Publish ``staged_dir`` as the blessing ``manifest`` describes, atomically.

        Steps (see :data:`~bless.store.publish.PUBLISH_STEPS`): validate, move the tree into
        ``blessed/<hash>/<dir_id>`` (renamed from under ``root/staging``, else copied: the source is
        left untouched), fsync it, make it read-only (files 0444, dirs 0555) and verify it again,
        archive the live manifest of this hash, write the new manifest to a temp file and rename it
        over the live one (THE commit point). Takes the hash lock (re-entrantly) and runs
        :meth:`recover` first. A live blessing of the hash is replaced (archived); refusing without
        ``--rebless`` is the caller's decision. On a failure before the commit the tree is put back
        (or the copy removed) and the live blessing is unchanged. ``fault`` is the crash tests'
        seam (:mod:`bless.store.faults`); production callers pass nothing.

        Raises:
            ManifestInvalidError: the manifest does not validate, another manifest in the dir is
                invalid, or ``<hash>.json`` holds another hash's manifest.
            InputInvalidError: the staged tree cannot be recorded or differs from the manifest.
            AlreadyBlessedError: this very version (same dir_id) is already the live blessing.
            VerifyFailedError: the tree changed while it was being published.
            LockHeldError, ManifestDuplicateError: as :meth:`lock` and :meth:`find`.
        """
        return run_publish(self._parts, staged_dir, manifest, fault or no_fault)

    def reject(
        self,
        staged_dir: Path,
        *,
        config_hash: str,
        run_id: str,
        candidate: int,
        summary_md: str,
        evidence: Mapping[str, Any],
        fault: FaultHook | None = None,
        interrupted: bool = False,
    ) -> Path:
        """Keep a rejected candidate as evidence; publish nothing.

        Moves ``staged_dir`` (copies it when it is not under ``root/staging``) to
        ``rejected/<hash>/<run_id>-c<candidate>/tree`` and writes ``summary.md`` and
        ``evidence.json`` there. The directory is assembled under a ``.partial-`` name and renamed
        into place, so it appears complete. A missing ``staged_dir`` (nothing was staged) gives a
        directory without ``tree/``. Returns the directory; the caller may add files to it.

        ``interrupted``: the candidate's run was stopped by a signal and got no verdict: its evidence goes to
        ``interrupted/<hash>/<run_id>-c<candidate>/`` instead, so nothing that reads ``rejected/`` counts it as
        a rejection (gc keeps the ``keep`` newest of these per hash, apart from rejected evidence). Same
        atomicity, durability, crash recovery and refusals.

        Raises:
            InputInvalidError: bad hash / run id / candidate, evidence not JSON-serializable, or
                that evidence directory already exists.
            LockHeldError: another process holds the hash lock.
        """
        return run_reject(
            self._parts,
            staged_dir,
            config_hash=config_hash,
            run_id=run_id,
            candidate=candidate,
            summary_md=summary_md,
            evidence=evidence,
            fault=fault or no_fault,
            interrupted=interrupted,
        )

    def recover(self, *, fault: FaultHook | None = None) -> list[Path]:
        """Clean up after crashed writers; return what was removed (or, for rejects, completed).

        Removes dot temp files of manifests, archive copies, holder records and evidence files,
        ``.partial-`` copies under ``blessed/``, and half-created staging dirs whose creator is
        dead. A ``.partial-`` dir under ``rejected/`` or ``interrupted/`` holds evidence: it is renamed to its
        final name instead.
        Each hash is cleaned under its lock (skipped while another process holds it, which may be
        publishing right now). Never touches a blessed dir a manifest references: only
        ``.partial-`` names are removed there.
        """
        return run_recover(self._parts, fault=fault or no_fault)

    def gc(self, *, keep: int = 0, dry_run: bool = False, fault: FaultHook | None = None) -> GcReport:
        """Remove what no blessing needs; with ``dry_run``, only list it.

        Per config hash (under its lock; skipped with a note while held): blessed versions that no
        manifest in any manifests dir this store knows (its own, ``root/manifests``, and every dir
        it has published to) references, beyond the ``keep`` newest (by dir_id, which starts with a
        UTC timestamp), and rejected evidence dirs beyond the ``keep`` newest (by mtime); likewise the
        evidence dirs of interrupted runs (``interrupted/``, counted apart from the rejections). Also
        staging dirs whose owner process is dead on this host, and the debris :meth:`recover`
        removes. When a recorded manifests dir cannot be read, or the record of those dirs is
        unreadable or (with blessed versions present) missing, no blessed version is removed. Nothing
        is removed through a symlink in the store (each one is noted instead). A
        version a live serving lease holds is kept (a provably stale lease is removed instead), as
        is the serve dir it names; other ``serve/`` dirs untouched for an hour go, and ``runs/``
        logs go with the blessed version they produced. Archived manifests are kept (history).

        Raises:
            ManifestInvalidError: a manifest is invalid: gc cannot know what it references.
            InputInvalidError: negative ``keep``.
            StoreUnavailableError: a hash's lock file is not a regular file, or cannot be opened
                (reason ``store_lock``), or a store dir is not a directory.
        """
        with os_errors(f"gc of {self.root}"):
            return run_gc(self._parts, keep=keep, dry_run=dry_run, fault=fault or no_fault)
