"""Evidence types shared by runtimes, adapters and the reuse protocol.

A runtime reports what an engine wrote (``UpperEntry``), an adapter reads logs and trees
(``LogSignals``, ``ArtifactSummary``) and judges writes (``UpperVerdict``); the reuse
protocol combines them. They live here, importing nothing of ours, so that neither the
runtimes nor the protocol depend on the engines package.
"""

from __future__ import annotations

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
