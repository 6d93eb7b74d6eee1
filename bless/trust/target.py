"""A blessing as a TUF target: its name, the bytes that are signed and checked, its custom fields.

A blessing's **manifest** is the target: its canonical bytes (:meth:`Manifest.to_json_bytes`, exactly
what the store writes) are listed with their length and sha256 in the ``targets`` role, under
``blessings/<config_hash>/<dir_id>.json`` with the config hash, engine and model as custom fields.
The manifest names every file's size and sha256, so the signature covers the whole tree.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

from tuf.api.metadata import TargetFile

from bless.errors import TargetMismatchError
from bless.fsutil import UnreadableFileError, read_bounded
from bless.manifest import MAX_MANIFEST_BYTES, Manifest

__all__ = ["blessing_target", "config_target_prefix", "manifest_file_bytes", "target_path"]

_TARGET_PREFIX = "blessings"


def config_target_prefix(config_hash: str) -> str:
    """What the target names of every blessed version of one config hash start with."""
    return f"{_TARGET_PREFIX}/{config_hash}/"


def target_path(config_hash: str, dir_id: str) -> str:
    """The TUF target name of one blessed version."""
    return f"{config_target_prefix(config_hash)}{dir_id}.json"


def blessing_target(manifest: Manifest, data: bytes) -> TargetFile:
    """The target entry of ``manifest`` (file bytes ``data``): length, sha256 and what the blessing is."""
    info = TargetFile.from_data(target_path(manifest.config_hash, manifest.cache.dir_id), data, ["sha256"])
    info.unrecognized_fields["custom"] = {
        "config_hash": manifest.config_hash,
        "dir_id": manifest.cache.dir_id,
        "engine": manifest.engine,
        "model": manifest.model_label,
        "created": manifest.created,
    }
    return info


def manifest_file_bytes(path: Path, manifest: Manifest) -> bytes:
    """The bytes that are signed and checked: the manifest file as the store wrote it.

    They must still be ``manifest`` (the file could have changed since it was read). Hashing the file
    costs far less than serializing a 2,000-file manifest again (indented JSON is encoded in Python).

    Raises:
        TargetMismatchError: the file no longer holds this manifest.
    """
    try:
        data = read_bounded(path, MAX_MANIFEST_BYTES)  # never blocks on a FIFO, never reads past the cap
        if data is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
        same = json.loads(data) == manifest.to_dict()
    except (OSError, ValueError, UnreadableFileError) as exc:
        raise TargetMismatchError(f"cannot read the manifest {path} again: {exc}") from None
    if not same:
        raise TargetMismatchError(
            f"{path} changed while it was being checked", hint="run the command again; find out what writes manifests"
        )
    return data
