"""Cache-reuse classification: did a trial load the blessed artifact, or compile again?

Evidence, strongest first: new compiled artifacts in the overlay's upper layer, the
blessed tree's hashes after the run, and the engine's load/compile/fatal log markers.
Every signal must say "reused"; any doubt fails the trial.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bless.core.json_form import JsonForm
from bless.core.verify import TreeCheck
from bless.evidence_types import LogSignals, OutsideVerdict, UpperVerdict


@dataclass(frozen=True)
class ReuseReport(JsonForm):
    passed: bool
    reasons: tuple[str, ...]
    load_markers: int
    compile_markers: int
    fatal_markers: int
    upper_expected_rewrites: int
    upper_new_artifacts: tuple[str, ...]
    upper_unexpected: tuple[str, ...]
    tree_unchanged: bool | None
    drift: tuple[str, ...] = ()
    outside: OutsideVerdict | None = None


def classify_reuse(
    signals: LogSignals,
    upper: UpperVerdict | None,
    tree_check: TreeCheck | None,
    drift: Sequence[str] = (),
    outside: OutsideVerdict | None = None,
) -> ReuseReport:
    """Combine log markers, upper-layer writes, writes outside the tree, the post-run tree check and
    engine-key drift into one verdict."""
    reasons: list[str] = []
    if not signals.load_markers:
        reasons.append("no load marker in the engine log: the blessed artifact was not loaded")
    if signals.compile_markers:
        reasons.append(f"compile/save marker(s) in the log: {signals.compile_markers[0].strip()[:200]}")
    if signals.fatal_markers:
        reasons.append(f"fatal marker(s) in the log: {signals.fatal_markers[0].strip()[:200]}")
    if upper is not None:
        if upper.new_artifacts:
            shown = ", ".join(upper.new_artifacts[:5])
            reasons.append(f"{len(upper.new_artifacts)} new compiled artifact(s) in the upper layer: {shown}")
        if upper.unexpected:
            shown = ", ".join(upper.unexpected[:5])
            reasons.append(f"{len(upper.unexpected)} unexpected write(s) in the upper layer: {shown}")
    if outside is not None and outside.compiled:
        reasons.extend(compiled_outside_reasons(outside))
    reasons.extend(drift)
    tree_unchanged = None
    if tree_check is not None:
        tree_unchanged = tree_check.ok
        if not tree_check.ok:
            first = tree_check.problems[0]
            reasons.append(
                f"the blessed tree changed during the run ({len(tree_check.problems)} problem(s); "
                f"first: {first.kind} {first.path}: {first.detail})"
            )
    return ReuseReport(
        passed=not reasons,
        reasons=tuple(reasons),
        load_markers=len(signals.load_markers),
        compile_markers=len(signals.compile_markers),
        fatal_markers=len(signals.fatal_markers),
        upper_expected_rewrites=len(upper.expected_rewrites) if upper else 0,
        upper_new_artifacts=upper.new_artifacts if upper else (),
        upper_unexpected=upper.unexpected if upper else (),
        tree_unchanged=tree_unchanged,
        drift=tuple(drift),
        outside=outside,
    )


#: How many compiled-outside paths a reason names (the evidence keeps them all).
SHOWN_OUTSIDE = 5


def compiled_outside_reasons(outside: OutsideVerdict) -> list[str]:
    """One reason per compiled file outside the blessing (the first few), then how many more."""
    reasons = [f"compiled outside the blessing: {item}" for item in outside.compiled[:SHOWN_OUTSIDE]]
    if len(outside.compiled) > SHOWN_OUTSIDE:
        reasons.append(f"... and {len(outside.compiled) - SHOWN_OUTSIDE} more file(s) compiled outside the blessing")
    return reasons
