"""The manifest index: which manifest file claims which config hash. Pure: no I/O.

One set of lookup rules for :class:`~bless.store.Store`, ``bless gate`` and ``bless list``:

* a manifest is found by its ``config_hash`` FIELD; a file name is only a hint;
* two files claiming one hash are store corruption (:class:`ManifestDuplicateError`, naming both);
* fail closed: a file whose claim cannot be read might be the one looked for, so any lookup
  refuses while one exists (:class:`ManifestInvalidError`); a file that claims the hash looked for
  but does not validate refuses that lookup too. A file that validly parses as claiming ANOTHER
  hash is not a candidate, so a lookup does not need to validate it (``bless list`` and
  ``bless gc`` still validate every file).

Records come from :mod:`bless.store.scan`, which reads the directory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bless.core.factors import parse_config_hash_prefix
from bless.core.manifest import Manifest
from bless.core.untrusted_text import shown
from bless.errors import InputInvalidError, ManifestDuplicateError, ManifestInvalidError, NoManifestError

__all__ = ["ManifestIndex", "ManifestRecord", "manifest_summary"]


@dataclass(frozen=True)
class ManifestRecord:
    """One ``*.json`` file of a manifests directory.

    ``manifest`` is set when the file was fully validated, ``error`` when it is invalid. ``claim`` is
    the config hash the file claims (from the validated manifest, or read cheaply without schema
    validation), None when it cannot be told: such a file blocks every lookup.
    """

    path: Path
    manifest: Manifest | None
    error: ManifestInvalidError | None
    claim: str | None = None
    #: What ``bless list`` shows of a valid manifest (:func:`manifest_summary`); set instead of
    #: ``manifest`` when a listing took it from the claim cache without opening the file.
    summary: Mapping[str, Any] | None = None
    #: The exact bytes ``manifest`` was parsed from (what a signature covers), when it was validated.
    document: bytes | None = None

    def __post_init__(self) -> None:
        if self.manifest is not None and self.claim is None:
            object.__setattr__(self, "claim", self.manifest.config_hash)


@dataclass(frozen=True)
class LiveManifest:
    """The live manifest of a config hash: its file, the validated manifest, and the bytes it was parsed from."""

    path: Path
    manifest: Manifest
    #: Exactly what was validated (what a signature covers): no second read can differ from it.
    document: bytes


def manifest_summary(manifest: Manifest) -> dict[str, Any]:
    """The fields ``bless list`` shows of a manifest (small, JSON-ready: the claim cache keeps it)."""
    return {
        "config_hash": manifest.config_hash,
        "dir_id": manifest.cache.dir_id,
        "engine": manifest.engine,
        "model": manifest.model_label,
        "profile_name": manifest.profile_name,
        "created": manifest.created,
        "trials_passed": manifest.trials.get("passed"),
        "trials_planned": manifest.trials.get("planned"),
        "total_size": manifest.cache.total_size,
        "files": len(manifest.cache.files),
    }


@dataclass(frozen=True)
class ManifestIndex:
    """The records of one manifests directory, sorted by file name, and the lookup rules on them."""

    directory: Path
    records: tuple[ManifestRecord, ...]

    @classmethod
    def of(cls, directory: Path, records: Iterable[ManifestRecord]) -> ManifestIndex:
        """An index of ``records`` (any order) of ``directory``."""
        return cls(directory, tuple(sorted(records, key=lambda r: r.path.name)))

    @property
    def invalid(self) -> tuple[ManifestRecord, ...]:
        """Records that failed validation."""
        return tuple(r for r in self.records if r.error is not None)

    @property
    def unknown(self) -> tuple[ManifestRecord, ...]:
        """Records whose claimed hash cannot be told: every lookup refuses while there is one."""
        return tuple(r for r in self.records if r.claim is None)

    def manifests(self) -> list[Manifest]:
        """The validated manifests, in file-name order."""
        return [r.manifest for r in self.records if r.manifest is not None]

    def require_all_valid(self) -> list[tuple[Path, Manifest]]:
        """Every record's path and manifest; raises the first invalid record's error (fail closed).

        Raises:
            ManifestInvalidError: a record failed validation, or was not validated at all.
        """
        valid: list[tuple[Path, Manifest]] = []
        for record in self.records:
            if record.error is not None:
                raise record.error
            if record.manifest is None:
                raise ManifestInvalidError(f"{record.path}: not validated")
            valid.append((record.path, record.manifest))
        return valid

    def duplicates(self) -> dict[str, list[Path]]:
        """Config hashes claimed by more than one file, with the files (store corruption)."""
        claims: dict[str, list[Path]] = {}
        for record in self.records:
            if record.claim is not None:
                claims.setdefault(record.claim, []).append(record.path)
        return {claim: paths for claim, paths in claims.items() if len(paths) > 1}

    def _refuse_unknown(self) -> None:
        unknown = self.unknown
        if unknown:
            error = unknown[0].error
            if error is not None:
                raise error
            raise ManifestInvalidError(f"{shown(str(unknown[0].path))}: cannot tell which config hash it claims")

    def _duplicate_error(self, config_hash: str, paths: Sequence[Path]) -> ManifestDuplicateError:
        named = [str(p) for p in paths]
        return ManifestDuplicateError(
            f"{len(named)} manifests claim config hash {config_hash}: " + ", ".join(map(shown, named)),
            hint="the store is corrupt: keep the one that is right, move the other(s) out of "
            f"{shown(str(self.directory))}, then verify it",
            details={"config_hash": config_hash, "paths": named, "directory": str(self.directory)},
            remedy="keep_one_manifest",
        )

    def find(self, config_hash: str) -> ManifestRecord | None:
        """The one valid record whose manifest's ``config_hash`` field is ``config_hash``, or None.

        Raises:
            ManifestInvalidError: a file's claim cannot be told, or a file claiming this hash is invalid.
            ManifestDuplicateError: two files claim this hash (naming every one).
        """
        self._refuse_unknown()
        matches = [r for r in self.records if r.claim == config_hash]
        if len(matches) > 1:
            raise self._duplicate_error(config_hash, [r.path for r in matches])
        if not matches:
            return None
        (record,) = matches
        if record.error is not None:
            raise record.error
        if record.manifest is None or record.manifest.config_hash != config_hash:
            raise ManifestInvalidError(f"{record.path}: claims {config_hash} but was not validated as such")
        return record

    def find_prefix(self, prefix: str) -> ManifestRecord:
        """The record whose config hash starts with ``prefix`` (8 to 64 hex digits).

        Raises:
            InputInvalidError: a malformed prefix, or one that matches several hashes (listed).
            NoManifestError: no manifest matches.
            ManifestInvalidError, ManifestDuplicateError: as :meth:`find`.
        """
        wanted = parse_config_hash_prefix(prefix)
        self._refuse_unknown()
        hashes = sorted({r.claim for r in self.records if r.claim is not None and r.claim.startswith(wanted)})
        if not hashes:
            raise NoManifestError(
                f"no blessed manifest has a config hash starting with {wanted}",
                hint=f"list the blessings in {self.directory}, or bless this config first",
                details={"prefix": wanted},
            )
        if len(hashes) > 1:
            raise InputInvalidError(
                f"config hash prefix {wanted} is ambiguous: it matches " + ", ".join(hashes),
                hint="give more characters of the config hash",
                details={"prefix": wanted, "candidates": hashes},
            )
        record = self.find(hashes[0])
        assert record is not None  # a record claims it
        return record
