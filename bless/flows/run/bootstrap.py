"""Phase 1: compile a candidate cache into an empty staging tree and record the golden outputs.

The engine starts on the staging tree mounted read-write, becomes ready, replays the warm-up
protocol (its outputs become the golden outputs the trials must reproduce) and stops gracefully;
the tree's ownership is then normalized and the tree hashed. Any failure is a
:class:`~bless.errors.BootstrapFailedError`: there is no cache to prove.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from bless import container_labels as labels
from bless.core.coverage import CoverageRun
from bless.core.verify import TreeListing, hash_tree
from bless.errors import BootstrapFailedError, EngineHttpError, NotReadyError
from bless.flows.engine_start import compile_locations, log_tail
from bless.flows.run.containers import RunContainers, write_log
from bless.replay.devices import GpuSlot
from bless.replay.trials import CoherenceReport, drive_coverage, warm_up
from bless.runtime.base import Mount
from bless.system.os_refusals import os_errors


def run_bootstrap(
    containers: RunContainers, candidate: int, tree: Path, evidence: Path, slot: GpuSlot
) -> tuple[dict[str, Any], CoherenceReport, TreeListing, Any]:
    """Bootstrap ``candidate`` into ``tree`` on ``slot``; returns (facts, warm-up report, listing, artifacts).

    The engine log is written to ``evidence`` whatever happens, interruptions included.
    """
    adapter = containers.adapter
    settings = containers.profile.trials
    mount = Mount("rw", tree, adapter.cache_mount_path)
    log_path = evidence / "bootstrap.log"
    name = containers.name("bootstrap", candidate)
    # Every declared compile location exists in the staged tree before the start (and so in the blessing):
    # a later start finds its dir on the read-only lower layer instead of creating it in the upper one.
    with os_errors(f"creating the compile locations in {tree}"):
        for subdir in compile_locations(containers.resolved).values():
            (tree / subdir).mkdir(parents=True, exist_ok=True)
    private = evidence / "bootstrap-private"
    session = containers.session(labels.PHASE_BOOTSTRAP, name, mount, candidate, log_path, slot, private)
    report: CoherenceReport | None = None
    covered: CoverageRun | None = None
    failure: str | None = None
    try:
        with session:
            try:
                session.wait_ready()
                report = warm_up(session.client, settings)
                if containers.coverage is not None:
                    covered = drive_coverage(session.client, containers.coverage, containers.profile.coverage)
            except NotReadyError as exc:
                failure = session.not_ready_message(exc)
            except EngineHttpError as exc:
                failure = f"request failed: {exc.message}; engine log tail:\n{log_tail(session.current_log())}"
    finally:
        # Also when interrupted (Ctrl-C/SIGTERM): the engine log is evidence the rejection keeps.
        write_log(log_path, session.log)
    info = {**session.evidence(), "slot": slot.index, "gpus": slot.records()}
    containers.count_engine_time(session, report)
    if failure is not None:
        raise BootstrapFailedError(failure, hint="read the engine log above; fix the profile or the image")
    assert report is not None and session.stop_result is not None
    if not session.stop_result.graceful:
        raise BootstrapFailedError(
            f"the engine did not stop within {settings.stop_timeout_s} s and was killed: "
            "its artifacts may be incomplete",
            hint="raise trials.stop_timeout_s or fix the engine's shutdown",
        )
    containers.runtime.normalize_ownership(tree, image=containers.image)
    listing = hash_tree(tree)
    artifacts = adapter.summarize_artifacts(listing)
    signals = adapter.read_log(session.log)
    # Recorded, not judged: what the bootstrap compiled outside the tree is missing from the blessing,
    # and the trials, which must not compile anything, are what fails on it.
    outside = adapter.classify_outside(session.outside)
    shutil.rmtree(private, ignore_errors=True)
    info.update(
        {
            "timings": dict(signals.timings),
            "requests": report.requests,
            "request_seconds": round(report.request_seconds, 3),
            "compile_markers": len(signals.compile_markers),
            "files": len(listing.files),
            "total_size": listing.total_size,
            "outside": outside.to_dict(),
        }
        | ({"coverage": covered.to_dict()} if covered is not None else {})
    )
    return info, report, listing, artifacts
