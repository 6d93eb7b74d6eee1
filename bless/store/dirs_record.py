"""``state/manifests-dirs.json``: every manifests dir (outside the root) a store has published to.

Recorded before a publish commits, so that gc, run with any ``--manifests-dir`` or none, consults
every dir a manifest referencing a blessed tree can live in. ``root/manifests`` is always consulted
and never recorded, so a relocated root (``cp -a``) does not name its old place.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

from bless.store.fsutil import FILE_MODE, atomic_write_bytes, ensure_dir, read_json_object

__all__ = ["ManifestsDirsRecord"]

_NAME = "manifests-dirs.json"


class ManifestsDirsRecord:
    """The record in one store's ``state/`` directory."""

    def __init__(self, state_dir: Path) -> None:
        self._state = state_dir
        self.path = state_dir / _NAME

    def dirs(self) -> list[Path]:
        """The recorded dirs (none when the record is missing or unreadable)."""
        document = read_json_object(self.path) or {}
        dirs = document.get("dirs")
        return [Path(d) for d in dirs if isinstance(d, str)] if isinstance(dirs, list) else []

    def _write(self, dirs: list[Path]) -> None:
        document = {"version": 1, "dirs": sorted({str(d) for d in dirs})}
        atomic_write_bytes(self.path, (json.dumps(document, indent=2) + "\n").encode("utf-8"))

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # Two publishes of different hashes may add a dir at once: read-modify-write under a lock.
        ensure_dir(self._state)
        with FileLock(str(self._state / f"{_NAME}.lock"), mode=FILE_MODE):
            yield

    def add(self, directory: Path) -> None:
        """Record ``directory`` (absolute) unless it is recorded already."""
        with self._locked():
            recorded = self.dirs()
            if directory not in recorded:
                self._write([*recorded, directory])

    def remove(self, directory: Path) -> bool:
        """Drop ``directory`` from the record; True when it was recorded."""
        with self._locked():
            recorded = self.dirs()
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
