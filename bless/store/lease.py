"""Serving leases: a running server's claim on the blessed tree it serves, which gc honours.

``leases/<config_hash>/<dir_id>/<token>.json`` names the holder (a :func:`process_identity`
record: pid, host, process start time), the serve's name and its scratch dir under ``serve/``.
While the holder runs, gc keeps that blessed version (even once a rebless superseded it) and that
serve dir. A lease whose holder is provably gone (pid missing, a zombie, or the pid now belongs to
another process) is stale: gc removes it and no longer honours it. A lease gc cannot judge (another
host, an unreadable record) is honoured: fail safe.

Taking a lease and gc's removals of one hash serialize on ``leases/<config_hash>/.lock``, so a
server that holds a lease and THEN verifies the tree can never have it removed under it.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bless.core.factors import is_config_hash
from bless.core.json_form import JsonForm
from bless.errors import InputInvalidError
from bless.store.layout import check_dir_id, check_hash, is_dir_id
from bless.system.clock import utc_now
from bless.system.durable import atomic_write_bytes, ensure_dir, fsync_dir
from bless.system.entries import listdir
from bless.system.file_locks import blocking_file_lock
from bless.system.json_files import read_json_object
from bless.system.procid import process_alive, process_identity

__all__ = ["Lease", "LeaseBook"]

_NAME_MAX = 200


@dataclass(frozen=True)
class Lease(JsonForm):
    """One lease file and what it says. ``alive``: is its holder running (None: cannot tell)."""

    path: Path
    config_hash: str
    dir_id: str
    name: str
    holder: dict[str, Any] | None
    serve_dir: str | None
    created: str | None
    alive: bool | None


class LeaseBook:
    """The leases of one store's ``leases/`` directory."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory

    @contextmanager
    def guard(self, config_hash: str) -> Iterator[None]:
        """Serialize lease changes and gc removals of one hash (blocks; both hold it briefly)."""
        check_hash(config_hash)
        directory = self._dir / config_hash
        ensure_dir(directory)
        with blocking_file_lock(directory / ".lock"):
            yield

    def acquire(
        self,
        config_hash: str,
        dir_id: str,
        *,
        name: str,
        holder: dict[str, Any] | None = None,
        serve_dir: Path | None = None,
    ) -> Lease:
        """Write a lease on ``blessed/<config_hash>/<dir_id>`` for ``holder`` (default: this process).

        Raises:
            InputInvalidError: a bad hash, dir id or name.
            OSError: the lease cannot be written.
        """
        check_hash(config_hash)
        check_dir_id(dir_id)
        if not isinstance(name, str) or not name or len(name) > _NAME_MAX or not name.isprintable():
            raise InputInvalidError(f"lease name {name!r} must be 1-{_NAME_MAX} printable characters")
        record = {
            "name": name,
            "holder": holder if holder is not None else process_identity(),
            "serve_dir": str(serve_dir) if serve_dir is not None else None,
            "created": utc_now(),
        }
        directory = self._dir / config_hash / dir_id
        with self.guard(config_hash):
            ensure_dir(directory)
            path = directory / f"{secrets.token_hex(8)}.json"
            atomic_write_bytes(path, (json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
        return self._read(path, config_hash, dir_id)

    def hand_over(self, lease: Lease, holder: dict[str, Any]) -> Lease:
        """Name another holder (e.g. the detached engine that outlives serve-full) in place, atomically."""
        record = read_json_object(lease.path) or {}
        record["holder"] = holder
        atomic_write_bytes(lease.path, (json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
        return self._read(lease.path, lease.config_hash, lease.dir_id)

    def release(self, lease: Lease) -> None:
        """Remove the lease (a lease already gone is fine)."""
        with contextlib.suppress(FileNotFoundError):
            lease.path.unlink()
            fsync_dir(lease.path.parent)

    def release_named(self, name: str) -> list[Lease]:
        """Remove every lease called ``name`` (``serve-full stop NAME``); returns what was removed."""
        released = [lease for lease in self.leases() if lease.name == name]
        for lease in released:
            self.release(lease)
        return released

    def _read(self, path: Path, config_hash: str, dir_id: str) -> Lease:
        record = read_json_object(path)
        holder = record.get("holder") if record is not None else None
        holder = holder if isinstance(holder, dict) else None
        serve_dir = record.get("serve_dir") if record is not None else None
        name = record.get("name") if record is not None else None
        created = record.get("created") if record is not None else None
        return Lease(
            path=path,
            config_hash=config_hash,
            dir_id=dir_id,
            name=name if isinstance(name, str) else "?",
            holder=holder,
            serve_dir=serve_dir if isinstance(serve_dir, str) else None,
            created=created if isinstance(created, str) else None,
            alive=process_alive(holder) if holder is not None else None,
        )

    def leases(self, config_hash: str | None = None) -> list[Lease]:
        """Every lease (of one hash, when given), with whether its holder is alive."""
        found: list[Lease] = []
        hashes = [config_hash] if config_hash is not None else [e.name for e in listdir(self._dir)]
        for hash_name in hashes:
            if not is_config_hash(hash_name):
                continue
            for version in listdir(self._dir / hash_name):
                if not is_dir_id(version.name) or not version.is_dir(follow_symlinks=False):
                    continue
                for entry in listdir(Path(version.path)):
                    if entry.name.endswith(".json") and not entry.name.startswith("."):
                        found.append(self._read(Path(entry.path), hash_name, version.name))
        return found

    def prune_empty(self, config_hash: str) -> None:
        """Remove empty per-version lease dirs of a hash (under :meth:`guard`)."""
        for version in listdir(self._dir / config_hash):
            if is_dir_id(version.name):
                with contextlib.suppress(OSError):
                    Path(version.path).rmdir()
