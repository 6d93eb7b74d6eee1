"""``state/manifests-dirs.json``: every manifests dir (outside the root) a store has published to.

Recorded before a publish commits, so that gc, run with any ``--manifests-dir`` or none, consults
every dir a manifest referencing a blessed tree can live in. ``root/manifests`` is always consulted
and never recorded, so a relocated root (``cp -a``) does not name its old place. Every publish
writes the record (an empty list when it only used ``root/manifests``), so its absence in a store
that has blessed versions means it was lost or predates it: gc then cannot know every dir.

A record that cannot be read (corrupt, not a regular file) is never rewritten: that would forget
the dirs it lists. Adding to or removing from it is then refused until a person repairs it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bless.errors import VerifyFailedError
from bless.system.durable import atomic_write_bytes, ensure_dir
from bless.system.file_locks import blocking_file_lock
from bless.system.json_files import UnreadableJsonError, load_json_object

__all__ = ["ManifestsDirsRecord"]

_NAME = "manifests-dirs.json"


class ManifestsDirsRecord:
    """The record in one store's ``state/`` directory."""

    def __init__(self, state_dir: Path) -> None:
        self._state = state_dir
        self.path = state_dir / _NAME

    def problem(self) -> str | None:
        """Why the record cannot be used (it exists but is unreadable or malformed), or None."""
        try:
            self._read()
        except UnreadableJsonError as exc:
            return str(exc)
        return None

    def exists(self) -> bool:
        """Is there anything at the record's path (a file, or something else there)?"""
        return os.path.lexists(self.path)

    def _read(self) -> list[Path]:
        document = load_json_object(self.path)
        if document is None:
            return []
        dirs = document.get("dirs")
        if not isinstance(dirs, list) or not all(isinstance(d, str) and d for d in dirs):
            raise UnreadableJsonError('has no "dirs" list of paths')
        return [Path(d) for d in dirs]

    def dirs(self) -> list[Path]:
        """The recorded dirs (none when the record is missing or unusable: see :meth:`problem`)."""
        try:
            return self._read()
        except UnreadableJsonError:
            return []

    def _require(self) -> list[Path]:
        try:
            return self._read()
        except UnreadableJsonError as exc:
            raise VerifyFailedError(
                f"the store's record of its manifests dirs {self.path} {exc}: rewriting it would forget the dirs "
                "gc must consult before removing a blessed version",
                hint=f'repair {self.path} (JSON: {{"version": 1, "dirs": [every manifests dir this store '
                "published to]}) or restore it from a backup, then retry",
                details={"reason": "store_state", "path": str(self.path)},
                remedy="repair_dirs_record",
            ) from exc

    def _write(self, dirs: list[Path]) -> None:
        document = {"version": 1, "dirs": sorted({str(d) for d in dirs})}
        atomic_write_bytes(self.path, (json.dumps(document, indent=2) + "\n").encode("utf-8"))

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # Two publishes of different hashes may add a dir at once: read-modify-write under a lock.
        ensure_dir(self._state)
        with blocking_file_lock(self._state / f"{_NAME}.lock"):
            yield

    def add(self, directory: Path | None) -> None:
        """Record ``directory`` (absolute) unless it is recorded already; None only writes the record.

        Raises:
            VerifyFailedError: the record exists but cannot be read (reason ``store_state``).
        """
        with self._locked():
            recorded = self._require()
            if not self.exists() or (directory is not None and directory not in recorded):
                self._write([*recorded, *([directory] if directory is not None else [])])

    def remove(self, directory: Path) -> bool:
        """Drop ``directory`` from the record; True when it was recorded.

        Raises:
            VerifyFailedError: the record exists but cannot be read (reason ``store_state``).
        """
        with self._locked():
            recorded = self._require()
            if directory not in recorded:
                return False
            self._write([d for d in recorded if d != directory])
            return True

    def unreadable(self) -> dict[Path, str]:
        """Recorded dirs that cannot be listed now, with why."""
        unsure: dict[Path, str] = {}
        for directory in self.dirs():
            try:
                with os.scandir(directory):
                    pass
            except OSError as exc:
                unsure[directory] = exc.strerror or str(exc)
        return unsure
