"""What ``bless run`` is asked to do and what it reports: :class:`RunOptions` in, :class:`RunResult` out.

The ``to_dict`` forms are what ``bless run --json`` prints and what a rejection's ``evidence.json``
and a manifest's trial results record, so their keys are part of the tool's output.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bless.core.coverage import CoverageRun
from bless.core.json_form import JsonForm, as_json, rounded
from bless.core.profile import Profile
from bless.errors import TrialsFailedError, UsageError
from bless.replay.devices import GpuSlot, Output
from bless.replay.reuse import ReuseReport
from bless.replay.trials import CoherenceReport, trials_for

DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class RunOptions:
    """How one ``bless run`` goes: K trials at a confidence, how many candidates, what it may override."""

    #: K, as asked (``--trials``); None: the profile's ``[trials] count``, unless ``max_failure_rate`` derives it.
    trials: int | None = None
    #: Derive K so that K/K passes bound the per-start failure rate at ``confidence`` (``--max-failure-rate``).
    max_failure_rate: float | None = None
    confidence: float = DEFAULT_CONFIDENCE
    candidates: int = 1
    rebless: bool = False
    wait_lock: bool = False
    #: Publish even when the blessing replaced by ``rebless`` had a stronger failure-rate bound.
    allow_weaker: bool = False
    #: Bless with an engine version the adapter has no rules for (its nearest older rules are used and recorded).
    allow_unknown_engine_version: bool = False
    #: Let the reference engine's test knobs through (bless's own tests only; no option or env var sets it).
    allow_test_knobs: bool = False
    #: Trials at once, one per GPU slot; None: as many slots as the GPUs present fit (CPU: 1).
    parallel: int | None = None

    def planned(self, profile: Profile) -> RunOptions:
        """These options with K worked out for ``profile``: derived from ``max_failure_rate`` at ``confidence``,
        else ``trials``, else the profile's ``[trials] count``.

        Raises:
            UsageError: a failure rate no K can bound at that confidence.
        """
        if self.max_failure_rate is None:
            return dataclasses.replace(self, trials=self.trials or profile.trials.count)
        try:
            k = trials_for(self.max_failure_rate, self.confidence)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return dataclasses.replace(self, trials=k, max_failure_rate=None)

    @property
    def k(self) -> int:
        """K, the trials planned (once worked out: :meth:`planned`)."""
        if self.trials is None:
            raise ValueError("K is not worked out yet: RunOptions.planned(profile) works it out")
        return self.trials


@dataclass(frozen=True)
class TrialResult:
    """One trial's verdict, the reasons it failed, and the evidence it left (engine, reuse, upper layer)."""

    index: int
    passed: bool
    reasons: tuple[str, ...]
    coherence: CoherenceReport | None
    reuse: ReuseReport | None
    engine: dict[str, Any]
    timings: dict[str, float]
    upper: dict[str, Any]
    slot: GpuSlot = field(default_factory=lambda: GpuSlot(0))
    #: The coverage requests the trial replayed (None: coverage off, or the replay never got there).
    coverage: CoverageRun | None = None

    def outputs_seen(self) -> dict[str, set[Output]]:
        """Every distinct output per prompt this trial saw (all protocol modes)."""
        seen: dict[str, set[Output]] = {}
        for observation in self.coherence.observations if self.coherence else ():
            seen.setdefault(observation.prompt, set()).add((observation.text, observation.token_ids))
        return seen

    def to_dict(self) -> dict[str, Any]:
        """The trial as JSON: verdict, slot and GPUs, engine facts, timings, coherence, reuse, upper layer."""
        # By hand (not JsonForm): the engine facts are spread into the trial's keys, the slot as its index and GPUs.
        return {
            "index": self.index,
            "passed": self.passed,
            "reasons": list(self.reasons),
            "slot": self.slot.index,
            "gpus": self.slot.records(),
            **self.engine,
            "timings": self.timings,
            "coherence": self.coherence.to_dict() if self.coherence else None,
            "reuse": self.reuse.to_dict() if self.reuse else None,
            "upper": self.upper,
            "coverage": self.coverage.to_dict() if self.coverage else None,
        }


@dataclass(frozen=True)
class CandidateResult(JsonForm):
    """One candidate cache: its bootstrap, its trials, and whether it was accepted or where its evidence is."""

    json_keys = ("index", "accepted", "reasons", "trials_seconds", "bootstrap", "trials", "rejected_dir")

    index: int
    accepted: bool
    bootstrap: dict[str, Any]
    trials: tuple[TrialResult, ...]
    reasons: tuple[str, ...]
    rejected_dir: Path | None = None
    #: Wall time of phase 2 (all K trials, parallel ones overlapping): what --parallel shortens.
    trials_seconds: float | None = field(default=None, metadata=as_json(to_json=rounded(3)))


def _slot_records(slots: tuple[GpuSlot, ...]) -> list[dict[str, Any]]:
    return [{"slot": slot.index, "label": slot.label, "gpus": slot.records()} for slot in slots]


@dataclass(frozen=True)
class RunResult(JsonForm):
    """Everything a run did (its JSON form is ``bless run --json``'s). ``published`` is False when every
    candidate was rejected."""

    json_keys = (
        "config_hash",
        "run_id",
        "published",
        "warnings",
        "trials_planned",
        "confidence",
        "failure_rate_bound",
        "manifest_path",
        "blessed_dir",
        "archived_manifest",
        "wall_seconds",
        "engine_seconds",
        "orchestration_overhead",
        "parallel",
        "slots",
        "candidates",
    )

    config_hash: str
    run_id: str
    published: bool
    candidates: tuple[CandidateResult, ...]
    trials_planned: int
    confidence: float
    failure_rate_bound: float | None
    manifest_path: Path | None
    blessed_dir: Path | None
    archived_manifest: Path | None
    wall_seconds: float = field(metadata=as_json(to_json=rounded(3)))
    engine_seconds: float = field(metadata=as_json(to_json=rounded(3)))
    warnings: tuple[str, ...] = ()
    slots: tuple[GpuSlot, ...] = field(default=(GpuSlot(0),), metadata=as_json(to_json=_slot_records))

    def json_extra(self) -> dict[str, Any]:
        """The share of wall time not spent in the engine, and how many trials ran at once."""
        # Parallel trials overlap: their summed engine time can exceed the wall time, so the
        # overhead ratio only means something when trials ran one at a time.
        serial = len(self.slots) <= 1
        overhead = 1 - self.engine_seconds / self.wall_seconds if self.wall_seconds and serial else None
        return {"orchestration_overhead": rounded(4)(overhead), "parallel": len(self.slots)}

    @property
    def failure(self) -> TrialsFailedError | None:
        """The refusal of a run that published nothing (41), naming the last candidate's reasons; None when
        it published."""
        if self.published:
            return None
        last = self.candidates[-1]
        return TrialsFailedError(
            f"{len(self.candidates)} candidate(s) rejected; nothing published. Last: " + "; ".join(last.reasons[:3]),
            hint=f"read {last.rejected_dir}/summary.md; a nondeterministic engine cannot be blessed, "
            "and more candidates try fresh compiles",
            remedy="read_rejection_summary",
            details={"rejected_dirs": [c.rejected_dir and str(c.rejected_dir) for c in self.candidates]},
        )
