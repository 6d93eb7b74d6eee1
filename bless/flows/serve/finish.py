"""How serving ends: a graceful stop, the container removed, the serve dir discarded or kept."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bless.evidence_types import OutsideVerdict, UpperEntry
from bless.flows.serve.plan import LaunchPlan
from bless.flows.serve.ready import clear_ready
from bless.flows.serve.serve_dir import discard_serve_dir, save_evidence, upper_summary
from bless.flows.serve.start import LaunchResult
from bless.runtime.base import ContainerStop, Runtime


@dataclass(frozen=True)
class FinishResult:
    """How serving ended: the stop, and what became of the upper layer."""

    stop: ContainerStop | None
    upper_kept: bool
    upper_dir: str | None
    upper_entries: tuple[UpperEntry, ...]
    notes: tuple[str, ...] = ()
    #: What the engine wrote outside the blessed tree while it served (its private HOME and temp dir).
    outside: OutsideVerdict | None = None

    def to_dict(self) -> dict[str, Any]:
        # By hand (not JsonForm): the stop flattened into three keys, the upper entries as a count and a summary.
        return {
            "stopped_gracefully": self.stop.graceful if self.stop else None,
            "exit_code": self.stop.exit_code if self.stop else None,
            "stop_seconds": round(self.stop.seconds, 3) if self.stop else None,
            "upper_kept": self.upper_kept,
            "upper_dir": self.upper_dir,
            "upper_written": len(self.upper_entries),
            "upper_entries": upper_summary(self.upper_entries),
            "outside": self.outside.to_dict() if self.outside else None,
            "notes": list(self.notes),
        }


def finish(
    plan_: LaunchPlan, result: LaunchResult, *, runtime: Runtime, keep_upper: bool, failed: bool
) -> FinishResult:
    """Stop gracefully, remove the container, then discard the serve dir (kept with ``keep_upper`` or ``failed``)."""
    session = plan_.session(runtime, started=result.started)
    notes: list[str] = []
    clear_ready(plan_.store, plan_.profile.name)  # first: no probe may pass while the engine stops
    try:
        stop = session.stop()
    finally:
        try:
            runtime.remove(result.started)
        finally:
            result.release_lease()  # nothing serves the blessed version any more
    upper = tuple(session.upper)
    outside = plan_.adapter.classify_outside(session.outside)
    if outside.compiled:
        # Compiled after the ready-time check (a batch shape nothing had warmed up?): served unproven code.
        notes.append(
            f"the engine compiled {len(outside.compiled)} file(s) outside the blessing while serving "
            f"(first: {outside.compiled[0]}); the serve dir is kept as evidence"
        )
    kept = keep_upper or failed or bool(outside.compiled)
    if kept:
        save_evidence(plan_.serve_dir, session.log)
    else:
        problem = discard_serve_dir(plan_.serve_dir, runtime=runtime, image=plan_.spec.image)
        if problem:
            notes.append(problem)
            kept = True
    upper_dir = result.upper_dir
    return FinishResult(
        stop=stop,
        upper_kept=kept,
        upper_dir=str(upper_dir) if kept and upper_dir else None,
        upper_entries=upper,
        notes=tuple(notes),
        outside=outside,
    )
