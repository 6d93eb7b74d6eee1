"""The store's manifests: lookups by config hash, and every manifests dir the store published to.

A :class:`ManifestCatalog` reads manifests dirs (through :func:`~bless.store.scan.scan_manifests`
and a claim cache per dir) and keeps the record of the manifests dirs this store has published to
(:class:`~bless.store.dirs_record.ManifestsDirsRecord`), which gc consults to know what a blessed
version is still referenced by. It is one of the narrow parts the writer operations are given
(:class:`~bless.store.parts.StoreParts`); it knows nothing of them.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

from bless.core.factors import parse_config_hash_prefix
from bless.core.manifest import Manifest
from bless.errors import ManifestInvalidError
from bless.store.dirs_record import ManifestsDirsRecord
from bless.store.index import LiveManifest, ManifestIndex, manifest_summary
from bless.store.layout import StorePaths, check_hash
from bless.store.scan import Candidate, ClaimCache, ManifestReader, scan_manifests
from bless.system.entries import listdir
from bless.system.os_refusals import os_errors

__all__ = ["ManifestCatalog"]


class ManifestCatalog:
    """The manifests of one store: its manifests dir, and every dir it published to."""

    def __init__(self, paths: StorePaths, reader: ManifestReader) -> None:
        self._paths = paths
        self._reader = reader
        self._dirs_record = ManifestsDirsRecord(paths.state)

    # ------------------------------------------------------------------------------ lookups

    def _claims(self, directory: Path) -> ClaimCache:
        key = hashlib.sha256(str(directory).encode("utf-8", "surrogateescape")).hexdigest()[:16]
        return ClaimCache.open(self._paths.state / f"claims-{key}.json")

    def index_of(self, directory: Path) -> ManifestIndex:
        """Every manifest of ``directory``, each validated.

        Raises:
            ManifestInvalidError: when the directory exists but cannot be listed.
        """
        return scan_manifests(directory, cache=self._claims(directory), reader=self._reader)

    def index(self) -> ManifestIndex:
        """Every manifest of the manifests dir, each validated."""
        return self.index_of(self._paths.manifests_dir)

    def listing(self) -> ManifestIndex:
        """Every manifest of the manifests dir: validated, or known valid and unchanged (not opened)."""
        directory = self._paths.manifests_dir
        return scan_manifests(directory, cache=self._claims(directory), reader=self._reader, summaries=True)

    def _lookup(self, matches: Candidate) -> ManifestIndex:
        directory = self._paths.manifests_dir
        return scan_manifests(directory, candidate=matches, cache=self._claims(directory), reader=self._reader)

    def live(self, config_hash: str) -> LiveManifest | None:
        """The live manifest's path and manifest for ``config_hash`` (its FIELD; names are a hint), or None.

        Raises:
            ManifestDuplicateError: two manifest files claim this hash (naming both).
            ManifestInvalidError: a file claiming this hash is invalid, or a file's claim cannot be read.
            InputInvalidError: ``config_hash`` is not 64 lowercase hex digits.
        """
        check_hash(config_hash)
        wanted_name = f"{config_hash}.json"
        record = self._lookup(lambda claim, name: claim == config_hash or name == wanted_name).find(config_hash)
        if record is None:
            return None
        # find() returns validated records only, which carry their bytes
        assert record.manifest is not None and record.document is not None
        return LiveManifest(record.path, record.manifest, record.document)

    def live_prefix(self, prefix: str) -> LiveManifest:
        """The live manifest (path, manifest, bytes) whose config hash starts with ``prefix`` (at least 8 hex digits).

        Raises:
            InputInvalidError: a malformed prefix, or one that matches several hashes (listed).
            NoManifestError: no live manifest matches.
            ManifestDuplicateError, ManifestInvalidError: as :meth:`live`.
        """
        wanted = parse_config_hash_prefix(prefix)
        record = self._lookup(lambda claim, name: claim.startswith(wanted) or name.startswith(wanted)).find_prefix(
            wanted
        )
        # find_prefix() returns validated records only, which carry their bytes
        assert record.manifest is not None and record.document is not None
        return LiveManifest(record.path, record.manifest, record.document)

    def note_published(self, manifest_path: Path, manifest: Manifest) -> None:
        """Tell the claim cache what a just-published (validated) manifest file claims and shows.

        No lookup re-reads it, and ``bless list`` shows it without opening it.
        """
        cache = self._claims(manifest_path.parent)
        with contextlib.suppress(OSError):
            cache.put(manifest_path.name, manifest_path.stat(), manifest.config_hash, manifest_summary(manifest))
            cache.save()

    # ------------------------------------------------------------------ manifests dirs record

    def remember_manifests_dir(self) -> None:
        """Record this store's manifests dir among those it published to (before a publish commits).

        Writes the record even for ``root/manifests`` (recorded as no dir): a store with blessed
        versions and no record is one whose record was lost, and gc keeps everything there.

        Raises:
            VerifyFailedError: the record cannot be read (reason ``store_state``).
        """
        own = self._paths.manifests_dir
        self._dirs_record.add(own if own != self._paths.default_manifests_dir else None)

    def forget_manifests_dir(self, directory: Path) -> bool:
        """Drop ``directory`` from the record (it is gone for good); True when it was recorded.

        Raises:
            VerifyFailedError: the record cannot be read (reason ``store_state``).
        """
        with os_errors(f"updating {self._dirs_record.path}"):
            return self._dirs_record.remove(Path(directory).absolute())

    def known_manifests_dirs(self) -> list[Path]:
        """This store's manifests dir, ``root/manifests`` and every recorded one, without repeats."""
        dirs = [self._paths.manifests_dir, self._paths.default_manifests_dir, *self._dirs_record.dirs()]
        return list(dict.fromkeys(dirs))

    def unreadable_manifests_dirs(self) -> dict[Path, str]:
        """Recorded manifests dirs that cannot be listed now, with why (gc then removes no version)."""
        return self._dirs_record.unreadable()

    def manifests_dirs_unknown(self) -> str | None:
        """Why the set of manifests dirs to consult is not known (gc then removes no version), or None.

        The record exists but cannot be read, or it is missing although blessed versions exist (it
        was lost, or the store predates it: every publish writes it).
        """
        record = self._dirs_record.path
        problem = self._dirs_record.problem()
        if problem is not None:
            return (
                f"the record of the manifests dirs this store published to, {record}, {problem}; repair it "
                '(JSON: {"version": 1, "dirs": [every --manifests-dir this store published to]}) or restore it'
            )
        if not self._dirs_record.exists() and self._has_blessed_versions():
            return (
                f"the record of the manifests dirs this store published to, {record}, is missing (lost, or the "
                "store predates it); the next publish writes it, or create it listing every --manifests-dir "
                'this store published to (JSON: {"version": 1, "dirs": [...]}; [] when only root/manifests)'
            )
        return None

    def _has_blessed_versions(self) -> bool:
        for hash_entry in listdir(self._paths.blessed):
            if hash_entry.is_dir(follow_symlinks=False) and any(
                not e.name.startswith(".") for e in listdir(Path(hash_entry.path))
            ):
                return True
        return False

    def referenced_dir_ids(self, config_hash: str) -> set[str]:
        """dir_ids of ``config_hash`` that a manifest in any known manifests dir references.

        Raises:
            ManifestInvalidError: a manifest there is invalid (it could reference anything).
        """
        referenced: set[str] = set()
        for directory in self.known_manifests_dirs():
            for _, manifest in self.index_of(directory).require_all_valid():
                if manifest.config_hash == config_hash:
                    referenced.add(manifest.cache.dir_id)
        return referenced

    def referenced_dir_ids_if_sure(self, config_hash: str) -> set[str] | None:
        """:meth:`referenced_dir_ids`, or None when that cannot be known (a manifest or dir unreadable)."""
        if self.unreadable_manifests_dirs() or self.manifests_dirs_unknown() is not None:
            return None
        try:
            return self.referenced_dir_ids(config_hash)
        except ManifestInvalidError:
            return None
