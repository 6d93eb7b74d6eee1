"""``bless list``: every blessing of a store's manifests dir, and what makes lookups there fail closed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bless.core.json_form import JsonForm
from bless.core.untrusted_text import shown
from bless.errors import ManifestDuplicateError, ManifestInvalidError
from bless.store import Store, manifest_summary

__all__ = ["BlessingList", "list_blessings"]


@dataclass(frozen=True)
class BlessingList(JsonForm):
    """The valid blessings (summaries), the invalid manifest files (with their error), and duplicate claims
    (its JSON form is ``bless list --json``'s)."""

    root: Path
    manifests_dir: Path
    manifests: tuple[dict[str, Any], ...]
    invalid: tuple[dict[str, Any], ...]
    duplicates: dict[str, list[str]]

    @property
    def failure(self) -> ManifestInvalidError | ManifestDuplicateError | None:
        """Why lookups in this dir refuse (22 invalid files, else 23 duplicates), reported after the listing."""
        if self.invalid:
            return ManifestInvalidError(
                f"{len(self.invalid)} manifest file(s) in {shown(str(self.manifests_dir))} are invalid: "
                + ", ".join(shown(item["path"]) for item in self.invalid),
                hint="restore them from the store's archive or version control, or move them out of the "
                "manifests dir; until then every lookup (verifying, serving) refuses",
                remedy="restore_invalid_manifests",
                details={"invalid": [item["path"] for item in self.invalid]},
            )
        if self.duplicates:
            return ManifestDuplicateError(
                f"{len(self.duplicates)} config hash(es) are claimed by more than one manifest file",
                hint="keep the right file of each and move the other(s) out of the manifests dir",
                details={"duplicates": self.duplicates},
            )
        return None


def list_blessings(store: Store) -> BlessingList:
    """Every manifest file of ``store``'s manifests dir: valid ones summarized, invalid ones with their error."""
    index = store.listing()
    manifests: list[dict[str, Any]] = []
    invalid: list[dict[str, Any]] = []
    for record in index.records:
        summary = record.summary or (manifest_summary(record.manifest) if record.manifest is not None else None)
        if summary is None:
            error = record.error or ManifestInvalidError(f"{record.path}: unreadable")
            invalid.append({"path": str(record.path), "error": error.to_dict()})
            continue
        row = {key: value for key, value in summary.items() if key != "dir_id"}
        manifests.append({"config_hash": row.pop("config_hash"), "path": str(record.path), **row})
    duplicates = {config_hash: [str(path) for path in paths] for config_hash, paths in index.duplicates().items()}
    return BlessingList(store.root, store.manifests_dir, tuple(manifests), tuple(invalid), duplicates)
