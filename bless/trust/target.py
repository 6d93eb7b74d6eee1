"""A blessing as a TUF target: its name, its length and sha256 of the signed bytes, its custom fields.

A blessing's **manifest** is the target: its canonical bytes (:meth:`Manifest.to_json_bytes`, exactly
what the store writes) are listed with their length and sha256 in the ``targets`` role, under
``blessings/<config_hash>/<dir_id>.json`` with the config hash, engine and model as custom fields.
The manifest names every file's size and sha256, so the signature covers the whole tree.
"""

from __future__ import annotations

from tuf.api.metadata import TargetFile

from bless.core.manifest import Manifest

__all__ = ["blessing_target", "config_target_prefix", "target_path"]

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
