"""Reading a manifests directory into a :class:`~bless.store.index.ManifestIndex`.

A lookup schema-validates only its candidates: the files whose claimed config hash (or file name,
a hint) matches what is looked for. What every other file claims is read cheaply (its
``config_hash`` field, no schema validation) and cached in the store, keyed by the file's
identity (inode, size, mtime, ctime), so an unchanged file is not even opened again. Content is
the truth: a candidate is always fully validated, and a file whose claim cannot be read makes
every lookup refuse (fail closed). ``bless list``, ``bless gc`` and publish validate everything.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bless.core.factors import is_config_hash
from bless.core.manifest import MAX_MANIFEST_BYTES, Manifest, read_manifest, strict_json
from bless.core.untrusted_text import shown
from bless.errors import ManifestInvalidError, StoreUnavailableError
from bless.store.index import ManifestIndex, ManifestRecord, manifest_summary
from bless.system.bounded_read import UnreadableFileError, read_bounded
from bless.system.durable import atomic_write_bytes
from bless.system.entries import listdir
from bless.system.json_files import read_json_object

__all__ = ["ClaimCache", "ManifestReader", "scan_manifests"]

_CACHE_VERSION = 1

#: Which files a lookup must validate: ``(claimed hash, file name) -> candidate?`` (a file whose
#: claim cannot be read is always a candidate).
Candidate = Callable[[str, str], bool]


class ManifestReader:
    """How a scan reads one manifest file: its claimed hash cheaply, or the whole validated manifest.

    A reader remembers the last manifest it validated per file, keyed by the file's identity (inode,
    size, mtime, ctime): one command looks a blessing up several times (show: the lookup, then its
    path; verify: the lookup, then the permission check), and a million-file manifest takes seconds
    to validate. A file changed in any way has another identity and is read again.
    """

    def __init__(self) -> None:
        self._validated: dict[str, tuple[list[int], Manifest, bytes]] = {}

    def claim(self, path: Path) -> str | None:
        """The ``config_hash`` a file claims, without schema validation; None when it cannot be told."""
        try:
            raw = read_bounded(path, MAX_MANIFEST_BYTES)
            # Strict, as the full read is: with a duplicate config_hash key, json.loads keeps the last one, and a
            # file that read() refuses would claim another hash than its name's, so a lookup of that name's hash
            # answered "no manifest" (20) instead of refusing it (22).
            document = strict_json(raw) if raw is not None else None
        except (UnreadableFileError, ValueError, RecursionError):
            return None
        claimed = document.get("config_hash") if isinstance(document, dict) else None
        return claimed if is_config_hash(claimed) else None

    def read(self, path: Path) -> tuple[Manifest, bytes]:
        """The validated manifest and the exact bytes it was parsed from (ManifestInvalidError naming the file)."""
        try:
            identity = _identity(path.lstat())
        except OSError:
            return read_manifest(path)  # it names the error
        remembered = self._validated.get(str(path))
        if remembered is not None and remembered[0] == identity:
            return remembered[1], remembered[2]
        # Identity taken before reading: a file changed meanwhile is remembered under its old
        # identity, which no file has any longer, so it is read again next time.
        manifest, document = read_manifest(path)
        self._validated[str(path)] = (identity, manifest, document)
        return manifest, document


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


@dataclass
class ClaimCache:
    """What each manifest file claims, keyed by its identity; persisted at ``path`` (best effort).

    The cache is a hint for which files to skip; it lives in the store's ``state/`` (as protected as
    the blessed trees themselves) and never replaces validating a candidate.
    """

    path: Path | None
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    dirty: bool = False

    @classmethod
    def open(cls, path: Path | None) -> ClaimCache:
        """The cache stored at ``path`` (empty when missing, unreadable or of another version)."""
        document = read_json_object(path) if path is not None else None
        entries: dict[str, dict[str, Any]] = {}
        if document is not None and document.get("version") == _CACHE_VERSION:
            raw = document.get("entries")
            if isinstance(raw, dict):
                entries = {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, dict)}
        return cls(path, entries)

    def get(self, name: str, st: os.stat_result) -> str | None:
        """The cached claim of file ``name`` when the file is unchanged since it was cached."""
        entry = self.entries.get(name)
        if entry is None or entry.get("id") != _identity(st):
            return None
        claim = entry.get("claim")
        return claim if is_config_hash(claim) else None

    def put(self, name: str, st: os.stat_result, claim: str, summary: dict[str, Any] | None = None) -> None:
        """Remember that file ``name`` (as it is now) claims ``claim`` (and, validated, shows ``summary``)."""
        entry: dict[str, Any] = {"id": _identity(st), "claim": claim}
        old = self.entries.get(name)
        if summary is not None:
            entry["summary"] = summary
        elif old is not None and {k: old.get(k) for k in ("id", "claim")} == entry and "summary" in old:
            entry["summary"] = old["summary"]  # the same file, validated before: its summary still holds
        if old != entry:
            self.entries[name] = entry
            self.dirty = True

    def summary(self, name: str, st: os.stat_result) -> dict[str, Any] | None:
        """The ``bless list`` fields of file ``name`` when it was validated as it is now (else None)."""
        entry = self.entries.get(name)
        if entry is None or entry.get("id") != _identity(st):
            return None
        summary = entry.get("summary")
        if not isinstance(summary, dict) or summary.get("config_hash") != entry.get("claim"):
            return None
        return summary

    def keep_only(self, names: set[str]) -> None:
        """Forget files that are gone."""
        for name in set(self.entries) - names:
            del self.entries[name]
            self.dirty = True

    def save(self) -> None:
        """Write the cache when it changed and its directory (the store's ``state/``) exists.

        Best effort: a reader without write access to the store still gets correct lookups, and a
        reader never creates directories in the store (a writer's ``ensure_layout`` makes ``state/``,
        owned by the store's owner).
        """
        if self.path is None or not self.dirty or not self.path.parent.is_dir():
            return
        document = {"version": _CACHE_VERSION, "entries": self.entries}
        with contextlib.suppress(OSError):
            atomic_write_bytes(self.path, (json.dumps(document, sort_keys=True) + "\n").encode("utf-8"))
            self.dirty = False


def scan_manifests(
    directory: Path,
    *,
    candidate: Candidate | None = None,
    cache: ClaimCache | None = None,
    reader: ManifestReader | None = None,
    summaries: bool = False,
) -> ManifestIndex:
    """Index every ``*.json`` of ``directory`` (dotfiles skipped; a missing dir is empty).

    With ``candidate`` None every file is validated; otherwise only the files ``candidate`` selects
    (and those whose claim cannot be read cheaply, so their error is precise). ``summaries`` (for
    ``bless list``): a file validated before and unchanged since (its identity in the claim cache)
    is not opened again; its record carries the summary the cache kept instead of the manifest, so
    listing takes no longer for a million-file manifest than for a small one.

    Raises:
        StoreUnavailableError: when the directory exists but cannot be listed.
    """
    reader = reader or ManifestReader()
    try:
        entries = listdir(directory)
    except OSError as exc:
        # The directory itself is unusable (below a file, no permission): no manifest is at fault.
        raise StoreUnavailableError(
            f"{directory}: cannot list manifests: {exc.strerror or exc}",
            hint="check that the store root and the manifests dir are directories this user can read",
            remedy="readable_store_root",
        ) from None
    records: list[ManifestRecord] = []
    seen: set[str] = set()
    for entry in entries:
        if entry.name.startswith(".") or not entry.name.endswith(".json"):
            continue  # temp files of a publish in progress are dotfiles
        path = directory / entry.name
        seen.add(entry.name)
        try:
            st = path.stat()
        except OSError as exc:
            error = ManifestInvalidError(f"{shown(str(path))}: cannot read: {exc.strerror or exc}")
            records.append(ManifestRecord(path, None, error))
            continue
        if not stat.S_ISREG(st.st_mode):
            # Never open a FIFO or device (opening a FIFO blocks until a writer shows up).
            records.append(ManifestRecord(path, None, ManifestInvalidError(f"{shown(str(path))}: not a regular file")))
            continue
        claim: str | None = None
        summary = cache.summary(entry.name, st) if summaries and cache is not None else None
        if summary is not None:
            records.append(ManifestRecord(path, None, None, summary["config_hash"], summary))
            continue
        if candidate is not None:
            claim = cache.get(entry.name, st) if cache is not None else None
            if claim is None:
                claim = reader.claim(path)
            if claim is not None and not candidate(claim, entry.name):
                if cache is not None:
                    cache.put(entry.name, st, claim)
                records.append(ManifestRecord(path, None, None, claim))
                continue
        try:
            manifest, document = reader.read(path)
        except ManifestInvalidError as exc:
            records.append(ManifestRecord(path, None, exc, claim))
            continue
        if cache is not None:
            cache.put(entry.name, st, manifest.config_hash, manifest_summary(manifest))
        records.append(ManifestRecord(path, manifest, None, document=document))
    if cache is not None:
        cache.keep_only(seen)
        cache.save()
    return ManifestIndex.of(directory, records)
