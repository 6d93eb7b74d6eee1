"""What earlier sealed serves of a profile met that their blessing did not hold, read back by the next bless run.

serve-full keeps a serve dir with ``unproven-compiles.jsonl`` whenever a compile the blessing did not hold was
seen (:mod:`bless.flows.serve.seal`). ``bless run`` (a rebless, typically) reads those events for the profile and,
once its bootstrap has compiled the new candidate, says which of them the new tree still does not hold: a Triton
kernel is held when the tree has its cache key's directory (Triton names it by a hash of everything the kernel
is compiled from), a file in the cache's writable layer when the tree has that path. What no tree can hold (a
write to HOME or temp) stays unproven. Under ``[coverage] mode = "require"`` a candidate that still lacks one is
rejected; otherwise the run warns. Evidence that cannot be read in full (over its bound, a line that is no event,
a file that says it is full) refuses the run under ``require`` (47) and is warned about otherwise: never skipped.
The manifest records the outcome.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bless.core.unproven_evidence import EVIDENCE_MAX_BYTES, parse_evidence
from bless.core.verify import TreeListing
from bless.store.layout import StorePaths
from bless.system.bounded_read import UnreadableFileError, read_bounded

#: A serve dir is ``<profile name>-<UTC stamp>-<6 hex>`` (bless.flows.serve.serve_dir.new_serve_dir).
_SERVE_DIR_SUFFIX = re.compile(r"-\d{8}T\d{6}Z-[0-9a-f]{6}$")


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


@dataclass(frozen=True)
class ServedRecords:
    """What the kept serve dirs of a profile recorded, and which of their evidence could not be read in full."""

    compiles: list[ServedCompile]
    #: One line each: the evidence file and why it cannot be read (too large, a bad line, full, unreadable).
    unreadable: list[str]


def recorded_compiles(paths: StorePaths, profile_name: str, config_hash: str) -> ServedRecords:
    """Every unproven compile the kept serve dirs of ``profile_name`` recorded while serving ``config_hash``.

    A serve of another configuration (another GPU product, other serve arguments) compiled for that one: its
    kernels are no evidence about this one. Evidence that cannot be read in full is never skipped silently: a file
    over the bound or not readable, a line that is no event (it could be of this configuration), or a file that
    says it is full (of this configuration) is listed in ``unreadable`` for the caller to refuse or warn about.
    """
    found: list[ServedCompile] = []
    unreadable: list[str] = []
    root = paths.serve
    if not root.is_dir():
        return ServedRecords(found, unreadable)
    for serve_dir in sorted(root.iterdir()):
        name = serve_dir.name
        if not name.startswith(f"{profile_name}-") or _SERVE_DIR_SUFFIX.sub("", name) != profile_name:
            continue
        path = StorePaths.unproven_compiles(serve_dir)
        try:
            data = read_bounded(path, EVIDENCE_MAX_BYTES)
        except UnreadableFileError as exc:
            unreadable.append(f"{path}: {exc}")
            continue
        parsed = parse_evidence(data or b"")
        if parsed.bad_lines:
            unreadable.append(
                f"{path}: {parsed.bad_lines} line(s) are no unproven-compile event "
                f"(first: line {parsed.first_bad_line})"
            )
        if any(marker.get("config_hash") in (config_hash, None) for marker in parsed.full):
            unreadable.append(f"{path}: the serve met more distinct compiles than the file lists (it says it is full)")
        for event in parsed.events:
            if event.get("config_hash") == config_hash:
                found.append(
                    ServedCompile(name, _text(event.get("kernel")), _text(event.get("key")), _text(event.get("path")))
                )
    return ServedRecords(list(dict.fromkeys(found)), unreadable)


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


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def triton_subdir(locations: Mapping[str, str]) -> str | None:
    """Where the tree keeps Triton's cache (the ``TRITON_CACHE_DIR`` compile location), if it declares one."""
    return locations.get("TRITON_CACHE_DIR")


__all__ = [
    "ServedCompile",
    "ServedRecords",
    "holdable",
    "outcome",
    "recorded_compiles",
    "still_unproven",
    "triton_subdir",
]
