"""``bless gc``: remove what no blessing needs, after forgetting manifests dirs that are gone for good."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bless.store import GcReport, Store

__all__ = ["GcOutcome", "collect_garbage"]


@dataclass(frozen=True)
class GcOutcome:
    """The manifests dirs forgotten, and what the store's gc removed (or would remove when dry-running)."""

    forgotten_manifests_dirs: tuple[str, ...]
    report: GcReport

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``bless gc --json``)."""
        # By hand (not JsonForm): the store's report flattened into it, beside the forgotten dirs.
        report = self.report
        return {
            "forgotten_manifests_dirs": list(self.forgotten_manifests_dirs),
            "dry_run": report.dry_run,
            "actions": [
                {
                    "path": str(action.path),
                    "reason": action.reason,
                    "bytes": action.bytes,
                    "interrupted_during": action.interrupted_during,
                }
                for action in report.actions
            ],
            "total_bytes": report.total_bytes,
            "notes": list(report.notes),
        }


def collect_garbage(
    store: Store, *, keep: int = 0, dry_run: bool = False, forget_manifests_dirs: Iterable[Path] = ()
) -> GcOutcome:
    """Forget ``forget_manifests_dirs`` (not when ``dry_run``), then :meth:`bless.store.Store.gc`.

    A forgotten dir is no longer consulted for what its manifests reference, so forget only dirs that
    are gone for good. ``keep``: also keep the N newest unreferenced versions / evidence dirs per hash.
    """
    forgotten = tuple(
        str(directory) for directory in forget_manifests_dirs if not dry_run and store.forget_manifests_dir(directory)
    )
    return GcOutcome(forgotten, store.gc(keep=keep, dry_run=dry_run))
