"""Evidence types shared by runtimes, adapters and the reuse protocol.

A runtime reports what an engine wrote (``UpperEntry``), an adapter reads logs and trees
(``LogSignals``, ``ArtifactSummary``) and judges writes (``UpperVerdict``); the reuse
protocol combines them. They live here, importing nothing of ours, so that neither the
runtimes nor the protocol depend on the engines package.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class ArtifactSummary:
    """What the adapter found in a bootstrapped tree: the artifacts and engine-native keys."""

    artifacts: tuple[str, ...]
    engine_keys: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LogSignals:
    """Cache-reuse evidence read from an engine log."""

    load_markers: tuple[str, ...]
    compile_markers: tuple[str, ...]
    fatal_markers: tuple[str, ...]
    timings: Mapping[str, float] = field(default_factory=dict)
    engine_keys: Mapping[str, Any] = field(default_factory=dict)


UpperKind = Literal["new", "rewritten", "deleted"]


@dataclass(frozen=True)
class UpperEntry:
    """One path written to an overlay's upper layer during a run."""

    path: str
    kind: UpperKind
    size: int


@dataclass(frozen=True)
class UpperVerdict:
    """The adapter's reading of upper-layer writes: allowed rewrites vs new compiled artifacts."""

    expected_rewrites: tuple[str, ...]
    new_artifacts: tuple[str, ...]
    unexpected: tuple[str, ...]

    @property
    def recompiled(self) -> bool:
        return bool(self.new_artifacts)


OutsideWhere = Literal["HOME", "TMPDIR", "container"]
OutsideKind = Literal["file", "link", "socket", "other"]
#: The engine's shared memory, which the seal watcher lists while serving (``Runtime.shm_entries``).
SHM_DIR = "/dev/shm"


def outside_kind(mode: int) -> OutsideKind:
    """What an ``lstat`` mode is, as an :class:`OutsideEntry` says it."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "link"
    return "socket" if stat.S_ISSOCK(mode) else "other"


@dataclass(frozen=True)
class OutsideEntry:
    """One file an engine wrote outside the blessed tree during a start.

    ``where`` is the engine's private HOME or temp dir (fresh and empty at the start, so every
    file in it was written by this start; ``path`` relative to it), or ``container``: a change
    Docker lists in the container's own filesystem, or a file in the engine's ``/dev/shm``
    while it serves (``path`` absolute).
    """

    where: OutsideWhere
    path: str
    size: int | None = None
    #: What it is: a regular file, a symbolic link, a socket (an engine's IPC endpoint), or anything else.
    #: Docker's diff does not say: its entries are ``file``.
    kind: OutsideKind = "file"

    @property
    def shown(self) -> str:
        """``HOME/.triton/cache/x`` or ``/usr/lib/x``: the path as people read it."""
        return self.path if self.where == "container" else f"{self.where}/{self.path}"


@dataclass(frozen=True)
class OutsideVerdict:
    """The adapter's reading of writes outside the blessed tree.

    ``noise`` is what the adapter names as expected and harmless (``shown path: reason``);
    ``compiled`` is everything else: compiled state the blessing does not hold, which fails a trial
    and refuses a serve (fail closed: a write nobody named counts as compiled).
    """

    noise: tuple[str, ...]
    compiled: tuple[str, ...]

    def counts(self) -> dict[str, int]:
        """``{"written": n, "noise": n, "compiled": n}`` for tables and ``--json``."""
        return {
            "written": len(self.noise) + len(self.compiled),
            "noise": len(self.noise),
            "compiled": len(self.compiled),
        }

    def to_dict(self, limit: int = 200) -> dict[str, Any]:
        """The counts, then the first ``limit`` named paths of each kind (``path: reason``)."""
        # By hand (not JsonForm): counts, and the lists cut to ``limit``.
        return {**self.counts(), "compiled_files": list(self.compiled[:limit]), "noise_files": list(self.noise[:limit])}
