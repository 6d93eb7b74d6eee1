"""What earlier sealed serves of a profile met that their blessing did not hold, read back by the next bless run.

serve-full keeps a serve dir with ``unproven-compiles.jsonl`` whenever a compile the blessing did not hold was
seen (:mod:`bless.flows.serve.seal`). ``bless run`` (a rebless, typically) reads those events for the profile and,
once its bootstrap has compiled the new candidate, says which of them the new tree still does not hold: a Triton
kernel is held when the tree has its cache key's directory (Triton names it by a hash of everything the kernel
is compiled from), a file in the cache's writable layer when the tree has that path. What no tree can hold (a
write to HOME or temp) stays unproven. Under ``[coverage] mode = "require"`` a candidate that still lacks one is
rejected; otherwise the run warns. The manifest records the outcome.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bless.core.verify import TreeListing
from bless.store.layout import StorePaths
from bless.system.bounded_read import UnreadableFileError, read_bounded

#: A serve dir is ``<profile name>-<UTC stamp>-<6 hex>`` (bless.flows.serve.serve_dir.new_serve_dir).
_SERVE_DIR_SUFFIX = re.compile(r"-\d{8}T\d{6}Z-[0-9a-f]{6}$")
_EVIDENCE_MAX = 16 << 20


@dataclass(frozen=True)
class ServedCompile:
    """One unproven compile an earlier serve recorded: a Triton kernel (by cache key) or a written path."""

    serve_dir: str
    kernel: str | None
    key: str | None
    path: str | None

    def describe(self) -> str:
        """``kernel fused_moe_kernel (key ...)`` or the path, and which serve saw it."""
        what = f"kernel {self.kernel} (key {self.key})" if self.key else f"{self.path}"
        return f"{what}, seen by serve {self.serve_dir}"


def recorded_compiles(paths: StorePaths, profile_name: str, config_hash: str) -> list[ServedCompile]:
    """Every unproven compile the kept serve dirs of ``profile_name`` recorded while serving ``config_hash``.

    A serve of another configuration (another GPU product, other serve arguments) compiled for that one: its
    kernels are no evidence about this one. Unreadable lines are skipped.
    """
    found: list[ServedCompile] = []
    root = paths.serve
    if not root.is_dir():
        return found
    for serve_dir in sorted(root.iterdir()):
        name = serve_dir.name
        if not name.startswith(f"{profile_name}-") or _SERVE_DIR_SUFFIX.sub("", name) != profile_name:
            continue
        try:
            data = read_bounded(StorePaths.unproven_compiles(serve_dir), _EVIDENCE_MAX)
        except UnreadableFileError:
            continue
        for line in (data or b"").decode("utf-8", "replace").splitlines():
            event = _event(line)
            if event is not None and event.get("config_hash") == config_hash:
                found.append(
                    ServedCompile(name, _text(event.get("kernel")), _text(event.get("key")), _text(event.get("path")))
                )
    return list(dict.fromkeys(found))


def holdable(served: ServedCompile, triton_subdir: str | None) -> bool:
    """Whether a blessing's tree could hold it: a Triton kernel by its key, or a path inside the cache.

    A write to HOME or the temp dir (``HOME/...``, ``TMPDIR/...``), a container path, or an event that names
    nothing is compiled state no tree holds: a missing compile location, reported but never a reason to reject.
    """
    if served.key:
        return triton_subdir is not None
    return served.path is not None and not served.path.startswith(("HOME/", "TMPDIR/", "/"))


def still_unproven(
    compiles: Sequence[ServedCompile], listing: TreeListing, triton_subdir: str | None
) -> list[ServedCompile]:
    """The recorded compiles that the candidate tree ``listing`` still does not hold."""
    paths = {entry.path for entry in listing.files}
    prefixes = {path.rsplit("/", 1)[0] + "/" for path in paths}
    missing: list[ServedCompile] = []
    for served in compiles:
        if served.key and triton_subdir:
            held = f"{triton_subdir}/{served.key}/" in prefixes
        elif served.path:
            held = served.path in paths
        else:
            held = False
        if not held:
            missing.append(served)
    return missing


def outcome(compiles: Sequence[ServedCompile], missing: Sequence[ServedCompile]) -> dict[str, Any]:
    """The manifest's record: how many earlier serves' compiles the blessing now holds, and which it does not."""
    return {
        "recorded": len(compiles),
        "held": len(compiles) - len(missing),
        "missing": [served.describe() for served in missing],
    }


def _event(line: str) -> Mapping[str, Any] | None:
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return event if isinstance(event, dict) and event.get("event") == "unproven_compile" else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def triton_subdir(locations: Mapping[str, str]) -> str | None:
    """Where the tree keeps Triton's cache (the ``TRITON_CACHE_DIR`` compile location), if it declares one."""
    return locations.get("TRITON_CACHE_DIR")


__all__ = ["ServedCompile", "holdable", "outcome", "recorded_compiles", "still_unproven", "triton_subdir"]
