"""One trial of phase 2: a fresh engine on the staged tree must reuse it, and the verdict says why not.

The engine sees the staged tree read-only (as an overlay's lower layer, or a read-only bind where the
adapter allows) and must give coherent outputs equal to the golden ones, print a load marker and no
compile marker, write no new artifacts to the upper layer, leave the tree byte-identical, and stop in
time. The request protocol it replays is :mod:`bless.replay.trials`; when trials run is
:mod:`bless.flows.run.schedule`.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bless import container_labels as labels
from bless.core.coverage import CoveragePlan, CoverageRun
from bless.core.profile import TrialSettings
from bless.core.verify import TreeListing, verify_tree
from bless.engines.base import EngineAdapter
from bless.errors import EngineHttpError, NotReadyError
from bless.evidence_types import LogSignals, OutsideVerdict
from bless.flows.engine_start import EngineSession
from bless.flows.events import Event, EventSink
from bless.flows.run.containers import RunContainers, keep_private, write_log
from bless.flows.run.results import TrialResult
from bless.flows.run.schedule import TrialSchedule
from bless.replay.devices import GpuSlot
from bless.replay.reuse import ReuseReport, classify_reuse
from bless.replay.trials import CoherenceReport, drive_coverage, golden_text_map, golden_token_map, run_protocol
from bless.runtime.base import Mount


@dataclass(frozen=True)
class TrialInputs:
    """What every trial of one candidate proves against: the staged tree and the bootstrap's facts."""

    candidate: int
    tree: Path
    listing: TreeListing
    golden: list[dict[str, Any]]
    engine_keys: Mapping[str, Any]
    work: Path
    evidence: Path


def run_trial(
    proof: TrialInputs,
    index: int,
    slot: GpuSlot,
    *,
    containers: RunContainers,
    schedule: TrialSchedule,
    events: EventSink,
) -> TrialResult:
    """Run trial ``index`` of ``proof``'s candidate on ``slot`` and judge it.

    The engine is tracked by ``schedule`` while it runs, so an interruption stops it; a trial
    that starts after the trials were stopped fails as interrupted. Its log is kept in the
    candidate's evidence whatever happens.
    """
    profile = containers.profile
    adapter = containers.adapter
    scratch = proof.work / f"trial-{index}"
    mount = _trial_mount(containers, proof.tree, scratch)
    log_path = proof.evidence / f"trial-{index}.log"
    name = containers.name("trial", proof.candidate, index)
    private = scratch / "private"
    session = containers.session(labels.PHASE_TRIAL, name, mount, proof.candidate, log_path, slot, private)

    def phase(what: str) -> None:
        data = {"candidate": proof.candidate, "trial": index, "phase": what, "gpus": slot.short}
        events(Event("trial-phase", f"trial {index}: {what}", data))

    coherence, covered, reasons = _replay(
        proof,
        index,
        session,
        profile.trials,
        schedule=schedule,
        phase=phase,
        log_path=log_path,
        coverage=containers.coverage,
        mode=profile.coverage,
    )
    phase("checking")
    containers.count_engine_time(session, coherence)
    if coherence is not None:
        reasons.extend(coherence.reasons)
    signals = adapter.read_log(session.log)
    reuse, outside = _judge_reuse(proof, session, adapter, signals, overlay=mount.kind == "overlay")
    reasons.extend(reuse.reasons)
    if session.stop_result is not None and not session.stop_result.graceful:
        reasons.append(f"the engine did not stop within {profile.trials.stop_timeout_s} s")
    if outside.compiled and private.is_dir():
        # The files themselves are the evidence of what was compiled outside the blessing.
        keep_private(private, proof.evidence / f"trial-{index}-outside")
    shutil.rmtree(scratch, ignore_errors=True)
    return TrialResult(
        index=index,
        passed=not reasons,
        reasons=tuple(dict.fromkeys(reasons)),
        coherence=coherence,
        reuse=reuse,
        engine={**session.evidence(), "ranks_loaded": _ranks_loaded(signals)},
        timings=dict(signals.timings),
        slot=slot,
        upper={
            "written": len(session.upper),
            "entries": [{"path": e.path, "kind": e.kind, "size": e.size} for e in session.upper[:200]],
        },
        coverage=covered,
    )


def _ranks_loaded(signals: LogSignals) -> list[str]:
    """The ``rank_<R>_<D>`` dirs whose AOT model the engine logged loading, as its adapter read them (vLLM)."""
    ranks = signals.engine_keys.get("ranks_loaded")
    return [str(rank) for rank in ranks] if isinstance(ranks, list) else []


def _trial_mount(containers: RunContainers, tree: Path, scratch: Path) -> Mount:
    """The staged tree as the engine sees it: a read-only bind where the adapter allows, else an overlay."""
    adapter = containers.adapter
    if containers.profile.cache_mount == "ro-bind" and adapter.readonly_bind_ok:
        return Mount("ro", tree, adapter.cache_mount_path)
    return Mount("overlay", tree, adapter.cache_mount_path, scratch=scratch)


def _replay(
    proof: TrialInputs,
    index: int,
    session: EngineSession,
    settings: TrialSettings,
    *,
    schedule: TrialSchedule,
    phase: Callable[[str], None],
    log_path: Path,
    coverage: CoveragePlan | None,
    mode: str,
) -> tuple[CoherenceReport | None, CoverageRun | None, list[str]]:
    """The engine started, ready, replaying the protocol and the coverage load; stopped, its log written.

    Returns the coherence report (None: the replay never ran), the coverage requests sent (None: none)
    and why the trial failed so far.
    """
    coherence: CoherenceReport | None = None
    covered: CoverageRun | None = None
    reasons: list[str] = []
    try:
        phase("starting")
        with session:
            cancelled = not schedule.register(index, session)
            try:
                if cancelled:
                    reasons.append("interrupted before it became ready")
                else:
                    phase("loading")
                    session.wait_ready()
                    phase("replaying")
                    coherence = run_protocol(
                        session.client,
                        settings,
                        golden=golden_token_map(proof.golden),
                        golden_text=golden_text_map(proof.golden),
                    )
                    if coverage is not None:
                        # The bootstrap's coverage load again: its kernels must load, none may compile.
                        phase("covering")
                        covered = drive_coverage(session.client, coverage, mode)
            except NotReadyError as exc:
                reasons.append(session.not_ready_message(exc))
            except EngineHttpError as exc:
                reasons.append(f"request failed: {exc.message}")
            finally:
                phase("stopping")
    finally:
        schedule.unregister(index)
        write_log(log_path, session.log)  # kept as evidence when interrupted too
    return coherence, covered, reasons


def _judge_reuse(
    proof: TrialInputs, session: EngineSession, adapter: EngineAdapter, signals: LogSignals, *, overlay: bool
) -> tuple[ReuseReport, OutsideVerdict]:
    """Did the stopped engine reuse the staged tree: its log, its writes (upper layer, outside), the tree itself."""
    upper = adapter.classify_upper(session.upper) if overlay else None
    tree_check = verify_tree(proof.tree, proof.listing.files, proof.listing.dirs, expect_read_only=False)
    drift = adapter.drift_reasons(proof.engine_keys, signals.engine_keys)
    outside = adapter.classify_outside(session.outside)
    return classify_reuse(signals, upper, tree_check, drift, outside), outside
