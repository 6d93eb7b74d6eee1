"""``bless show``: one blessing's manifest, and where its file and blessed tree are."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bless.core.manifest import Manifest
from bless.flows.lookup import lookup_manifest
from bless.store import Store

__all__ = ["ShownBlessing", "show_blessing"]


@dataclass(frozen=True)
class ShownBlessing:
    """A blessing as ``bless show`` reports it: the whole manifest, its file, its blessed dir."""

    manifest: Manifest
    manifest_path: Path | None
    blessed_dir: Path

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``bless show --json``): the manifest's fields and the two paths."""
        # By hand (not JsonForm): the manifest document with the two paths added.
        return {
            **self.manifest.to_dict(),
            "manifest_path": str(self.manifest_path) if self.manifest_path is not None else None,
            "blessed_dir": str(self.blessed_dir),
        }


def show_blessing(store: Store, text: str) -> ShownBlessing:
    """The blessing ``text`` names (a config hash or a unique prefix of at least 8 hex digits).

    Raises: as :func:`bless.flows.lookup.lookup_live`.
    """
    manifest = lookup_manifest(store, text)
    return ShownBlessing(manifest, store.manifest_path(manifest.config_hash), store.blessed_dir(manifest))
