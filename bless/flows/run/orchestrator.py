"""The run itself: lock the hash, try up to N candidates (bootstrap, trials), publish the first accepted.

:class:`Orchestrator` owns the order of things and the outcomes: refusals before any engine starts
(already blessed, weaker bound, unsafe settings, not enough GPU memory), the candidate loop, the
cross-device comparison, the manifest a publish writes, and the evidence a rejection (or an
interruption, filed apart: it is no verdict) keeps. Phase 1 is
:mod:`.bootstrap`, phase 2 :mod:`.schedule` and :mod:`.trial`.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bless import runtime as runtimes  # get_runtime looked up at call time (a test may swap it)
from bless._version import __version__
from bless.core.coverage import CoveragePlan, describe_plan
from bless.core.factors import GpuInfo, ResolvedConfig
from bless.core.manifest import Manifest, cache_tree_from_listing, default_provenance
from bless.core.profile import Profile, load_profile
from bless.core.verify import TreeListing
from bless.engines.base import EngineAdapter
from bless.errors import AlreadyBlessedError, BootstrapFailedError, CoverageIncompleteError, InterruptedByUserError
from bless.flows.engine_start import compile_locations
from bless.flows.events import Event, EventSink, ignore_events, new_run_id
from bless.flows.resolve import resolve_for_command
from bless.flows.run.bootstrap import run_bootstrap
from bless.flows.run.containers import RunContainers
from bless.flows.run.rebless_rule import check_bound_kept
from bless.flows.run.results import CandidateResult, RunOptions, RunResult, TrialResult
from bless.flows.run.schedule import TrialSchedule
from bless.flows.run.served import (
    ServedCompile,
    holdable,
    outcome,
    recorded_compiles,
    still_unproven,
    triton_subdir,
)
from bless.flows.run.summary import render_summary
from bless.flows.run.trial import TrialInputs, run_trial
from bless.flows.safety import check_unsafe
from bless.probes import probe_gpus
from bless.replay.devices import GpuSlot, check_slot_memory, cross_device_reasons, trial_slots, visible_gpus
from bless.replay.trials import failure_rate_bound, golden_from
from bless.runtime.base import Runtime
from bless.store import PublishResult, Store
from bless.system.clock import utc_now
from bless.system.os_refusals import os_errors


class Orchestrator:
    """Runs phases 1 and 2 for one resolved profile against one store and runtime."""

    def __init__(
        self,
        resolved: ResolvedConfig,
        *,
        store: Store,
        runtime: Runtime,
        adapter: EngineAdapter,
        events: EventSink = ignore_events,
        gpu_probe: Callable[[], list[GpuInfo]] = probe_gpus,
        cuda_visible_devices: str | None = None,
    ):
        """``adapter`` is the one specialised for ``resolved``'s factors, as resolution returns it
        (:class:`bless.flows.resolve.ProfileResolution`). ``gpu_probe`` lists this host's GPUs (nvidia-smi);
        ``cuda_visible_devices`` is the operator's restriction of them (indices or UUIDs), None for all."""
        self.resolved = resolved
        self.profile = resolved.profile
        self.store = store
        self.runtime = runtime
        self.adapter = adapter
        self._events = events
        self._events_lock = threading.Lock()
        self.gpu_probe = gpu_probe
        self.cuda_visible_devices = cuda_visible_devices
        self.slots: tuple[GpuSlot, ...] = (GpuSlot(0),)
        self.run_id = new_run_id()
        self.image = resolved.factors["runtime"].get("image_id")
        self.containers = RunContainers(
            resolved, adapter=self.adapter, runtime=runtime, run_id=self.run_id, image=self.image, store_root=store.root
        )
        self._published: PublishResult | None = None
        self.coverage = CoveragePlan(self.adapter.name, "")
        self.served: list[ServedCompile] = []
        self.served_outcome: dict[str, Any] = {}
        self._warnings: list[str] = []

    def events(self, event: Event) -> None:
        """Hand an event to the sink; parallel trials report from several threads, one at a time."""
        with self._events_lock:
            self._events(event)

    # --- top level -------------------------------------------------------------------------------

    def _trial_slots(self, options: RunOptions) -> tuple[GpuSlot, ...]:
        """Trial slots on this host's GPUs, each with enough free memory now (else 52, naming the GPU)."""
        hardware = self.profile.hardware
        if hardware.accelerator != "cuda":
            return trial_slots(hardware, [], requested=options.parallel, trials=options.k)
        gpus = visible_gpus(self.gpu_probe(), self.cuda_visible_devices)
        slots = trial_slots(hardware, gpus, requested=options.parallel, trials=options.k)
        check_slot_memory(hardware, slots, gpus)
        return slots

    def run(self, options: RunOptions) -> RunResult:
        """Bless the profile: lock, refuse if blessed (unless rebless), try up to N candidates.

        K is worked out from the profile here when ``options`` leave it open (:meth:`RunOptions.planned`).
        """
        started = time.monotonic()
        options = options.planned(self.profile)
        self.adapter.require_known_version(allow_unknown=options.allow_unknown_engine_version)
        allowed_unsafe = check_unsafe(self.resolved, self.adapter, allow_test_knobs=options.allow_test_knobs)
        self._plan_coverage()
        self.runtime.ping()
        self.slots = self._trial_slots(options)
        config_hash = self.resolved.config_hash
        with self.store.lock(config_hash, wait=options.wait_lock):
            self.store.recover()
            existing = self.store.find(config_hash)
            if existing is not None and not options.rebless:
                raise AlreadyBlessedError(
                    f"{config_hash} is already blessed ({self.store.manifest_path(config_hash)})",
                    hint="replace it with a new blessing (rebless: the prior blessing is archived), or verify it",
                    details={"config_hash": config_hash},
                    remedy="rebless",
                )
            if existing is not None:
                warning = check_bound_kept(existing, options)
                if warning is not None:
                    self._warnings.append(warning)
                    self.events(Event("warning", warning))
            for note in self.adapter.notes():
                self.events(Event("note", f"{self.adapter.name} adapter: {note}"))
            leftovers, spared = self.containers.clean_leftovers(config_hash)
            if leftovers:
                self.events(Event("note", f"removed leftover containers of a crashed run: {', '.join(leftovers)}"))
            if spared:
                self.events(Event("note", f"left alone, their run is still going: {', '.join(spared)}"))
            run_dir = self.store.new_staging_dir(self.run_id)
            candidates: list[CandidateResult] = []
            try:
                for index in range(1, options.candidates + 1):
                    result = self._candidate(index, run_dir / f"c{index}", options, allowed_unsafe, started)
                    candidates.append(result)
                    if result.accepted:
                        return self._finish(candidates, options, started, published=True)
                return self._finish(candidates, options, started, published=False)
            except KeyboardInterrupt:
                raise InterruptedByUserError(
                    f"run {self.run_id} interrupted; engines stopped, nothing published",
                    hint=f"evidence is under {self.store.paths.interrupted / config_hash}",
                ) from None
            finally:
                shutil.rmtree(run_dir, ignore_errors=True)

    def _finish(
        self, candidates: list[CandidateResult], options: RunOptions, started: float, *, published: bool
    ) -> RunResult:
        accepted = candidates[-1] if published else None
        passes = len(accepted.trials) if accepted else 0
        publish = self._published if published else None
        return RunResult(
            config_hash=self.resolved.config_hash,
            run_id=self.run_id,
            published=published,
            candidates=tuple(candidates),
            trials_planned=options.k,
            confidence=options.confidence,
            failure_rate_bound=failure_rate_bound(passes, options.confidence) if published else None,
            manifest_path=publish.manifest_path if publish else None,
            blessed_dir=publish.blessed_dir if publish else None,
            archived_manifest=publish.archived_manifest if publish else None,
            wall_seconds=time.monotonic() - started,
            engine_seconds=self.containers.engine_seconds,
            warnings=tuple(self._warnings),
            slots=self.slots,
        )

    def _plan_coverage(self) -> None:
        """The coverage model's answer for this configuration; a gap refuses a ``require`` profile (47).

        With mode ``off`` the plan is still recorded (what serving may reach unproven), not driven.
        """
        mode = self.profile.coverage
        self.coverage = self.adapter.coverage_plan(self.resolved)
        gaps = [f"{family.name}: {family.reason}" for family in self.coverage.gaps]
        if gaps and mode == "require":
            raise CoverageIncompleteError(
                f"the profile requires full coverage, but the {self.adapter.name} coverage model cannot reach "
                + "; ".join(gaps),
                hint="change what the reason names (serve arguments, env, model), or lower [coverage] mode to auto",
            )
        for gap in gaps:
            warning = f"coverage gap, serving may compile kernels no request proved: {gap}"
            self._warnings.append(warning)
            self.events(Event("warning", warning))
        if mode == "off" and self.coverage.drives:
            warning = f"coverage off: {len(self.coverage.drives)} class(es) of lazily compiled kernels are not driven"
            self._warnings.append(warning)
            self.events(Event("warning", warning))
        for line in describe_plan(self.coverage):
            self.events(Event("note", f"coverage: {line}"))
        self.containers.coverage = self.coverage if mode != "off" and self.coverage.drives else None
        records = recorded_compiles(self.store.paths, self.profile.name, self.resolved.config_hash)
        self._refuse_or_warn_unreadable_served(records.unreadable)
        self.served = records.compiles
        if self.served:
            kernels = sorted({s.kernel or s.path or "?" for s in self.served})
            self.events(
                Event(
                    "note",
                    f"earlier serves of {self.profile.name} recorded {len(self.served)} unproven compile(s) "
                    f"({', '.join(kernels[:8])}): each candidate is checked for them after its bootstrap",
                )
            )

    def _refuse_or_warn_unreadable_served(self, unreadable: Sequence[str]) -> None:
        """Evidence of earlier serves that cannot be read in full: refused under ``require`` (47), else warned."""
        if not unreadable:
            return
        shown = "; ".join(unreadable[:5]) + (f" (and {len(unreadable) - 5} more)" if len(unreadable) > 5 else "")
        if self.profile.coverage == "require":
            raise CoverageIncompleteError(
                f"the profile requires full coverage, but what earlier serves of {self.profile.name} met cannot be "
                f"read in full, so a candidate cannot be shown to hold it: {shown}",
                hint="read the file (written while serving); once its compiles are covered, or it is judged "
                "irrelevant, remove that serve dir, then run again (or lower [coverage] mode to auto)",
                details={"unreadable": list(unreadable)},
            )
        warning = (
            f"what earlier serves of {self.profile.name} met cannot be read in full, so candidates are not "
            f"checked for it: {shown}"
        )
        self._warnings.append(warning)
        self.events(Event("warning", warning))

    def _served_still_missing(self, listing: TreeListing) -> str | None:
        """What earlier serves met that this candidate's tree still lacks, in words (None: it holds them all)."""
        subdir = triton_subdir(compile_locations(self.resolved))
        missing = still_unproven(self.served, listing, subdir)
        self.served_outcome = outcome(self.served, missing)
        if not missing:
            return None
        text = (
            f"{len(missing)} of the {len(self.served)} compile(s) earlier serves of this profile met are still not "
            f"in the candidate: {'; '.join(m.describe() for m in missing[:5])}"
        )
        # Only what a tree could hold rejects a candidate; the rest (a write to HOME, say) can only be said.
        if self.profile.coverage != "require" or not any(holdable(m, subdir) for m in missing):
            self._warnings.append(text)
            self.events(Event("warning", text))
            return None
        return text

    # --- one candidate ---------------------------------------------------------------------------

    def _candidate(
        self, index: int, work: Path, options: RunOptions, allowed_unsafe: list[str], started: float
    ) -> CandidateResult:
        tree = work / "cache"
        evidence = work / "evidence"
        with os_errors(f"preparing candidate {index} in {work}"):
            tree.mkdir(parents=True)
            evidence.mkdir(parents=True)
            self.adapter.prepare_cache_dir(tree)
        trials: list[TrialResult] = []
        bootstrap: dict[str, Any] = {}
        schedule = TrialSchedule(self.slots, self.events)
        try:
            self.events(Event("phase", f"candidate {index}: phase 1, bootstrap compile", {"candidate": index}))
            # The golden outputs come from the first slot's GPUs: the cross-device reference.
            bootstrap, golden_report, listing, artifacts = run_bootstrap(
                self.containers, index, tree, evidence, self.slots[0]
            )
            golden = golden_from(golden_report, self.profile.trials.max_tokens)
            proof = TrialInputs(index, tree, listing, golden, artifacts.engine_keys, work, evidence)
            missing = self._served_still_missing(listing)
            if missing and self.profile.coverage == "require":
                reasons: tuple[str, ...] = (missing,)
                rejected = self._keep_evidence(index, tree, evidence, bootstrap, trials, reasons, options)
                self.events(Event("candidate-end", f"candidate {index} rejected", {"candidate": index}))
                return CandidateResult(index, False, bootstrap, (), reasons, rejected)

            def one_trial(trial: int, slot: GpuSlot) -> TrialResult:
                return run_trial(proof, trial, slot, containers=self.containers, schedule=schedule, events=self.events)

            trials_started = time.monotonic()
            schedule.run(index, options.k, one_trial, trials)
            trials_seconds = time.monotonic() - trials_started
        except BootstrapFailedError as exc:
            self._keep_evidence(index, tree, evidence, bootstrap, trials, (exc.message,), options)
            raise
        except KeyboardInterrupt:
            # What the interruption stopped, said in the evidence's summary: until trials start, the bootstrap.
            step = schedule.step if schedule.step is not None else "the bootstrap"
            self._keep_evidence(index, tree, evidence, bootstrap, trials, ("interrupted",), options, interrupted=step)
            raise
        trials.sort(key=lambda t: t.index)
        reference = {p: (c.text, c.token_ids) for p, c in golden_report.outputs.items()}
        cross_device = cross_device_reasons(
            self.slots[0].label, reference, [(t.slot.label, t.outputs_seen()) for t in trials]
        )
        failed = [t for t in trials if not t.passed]
        if failed or cross_device:
            reasons = tuple([*(f"trial {t.index}: {r}" for t in failed for r in t.reasons), *cross_device])
            rejected = self._keep_evidence(index, tree, evidence, bootstrap, trials, reasons, options)
            self.events(Event("candidate-end", f"candidate {index} rejected", {"candidate": index}))
            return CandidateResult(index, False, bootstrap, tuple(trials), reasons, rejected, trials_seconds)
        manifest = self._manifest(index, listing, artifacts, golden, bootstrap, trials, options, allowed_unsafe)
        self._published = self.store.publish(tree, manifest)
        # The engine logs of an accepted run stay readable next to the store (not in the manifest),
        # until gc removes the blessed version they made.
        self.store.keep_run_logs(self.run_id, self._published, sorted(evidence.glob("*.log")))
        self.events(Event("candidate-end", f"candidate {index} accepted and published", {"candidate": index}))
        return CandidateResult(index, True, bootstrap, tuple(trials), (), trials_seconds=trials_seconds)

    # --- outcomes --------------------------------------------------------------------------------
    def _manifest(
        self,
        candidate: int,
        listing: TreeListing,
        artifacts: Any,
        golden: list[dict[str, Any]],
        bootstrap: dict[str, Any],
        trials: list[TrialResult],
        options: RunOptions,
        allowed_unsafe: list[str],
    ) -> Manifest:
        """The manifest an accepted candidate is published with: its factors, tree, trials and provenance."""
        bound = failure_rate_bound(len(trials), options.confidence)
        return Manifest(
            config_hash=self.resolved.config_hash,
            factors=self.resolved.factors,
            created=utc_now(),
            tool_version=__version__,
            profile_name=self.profile.name,
            cache=cache_tree_from_listing(listing, mount_path=self.adapter.cache_mount_path),
            artifacts={"items": list(artifacts.artifacts), "engine_keys": dict(artifacts.engine_keys)},
            trials={
                "planned": options.k,
                "passed": sum(t.passed for t in trials),
                "failure_rate_bound": {"confidence": options.confidence, "max_failure_rate": round(bound, 6)},
                "protocol": {
                    "prompts": len(self.profile.trials.prompts),
                    "repeats": self.profile.trials.repeats,
                    "max_tokens": self.profile.trials.max_tokens,
                    "concurrent": self.profile.trials.concurrent,
                    "cache_mount": "ro" if self.profile.cache_mount == "ro-bind" else "overlay",
                },
                "results": [trial.to_dict() for trial in trials],
                "parallel": len(self.slots),
                # Every GPU a trial proved the cache on (the cross-device check compared them all).
                "devices": list(
                    {
                        gpu.uuid or str(gpu.index): {"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name}
                        for t in trials
                        for gpu in t.slot.gpus
                    }.values()
                ),
            },
            golden=golden,
            coverage={
                "mode": self.profile.coverage,
                "plan": self.coverage.to_dict(),
                "gaps": [f"{family.name}: {family.reason}" for family in self.coverage.gaps],
            }
            | ({"bootstrap": bootstrap["coverage"]} if "coverage" in bootstrap else {})
            | ({"from_serves": self.served_outcome} if self.served else {}),
            provenance=default_provenance(
                self.runtime.kind,
                run_id=self.run_id,
                candidate=candidate,
                image_id=self.image,
                bootstrap=bootstrap,
                recorded_env=dict(self.resolved.recorded_env),
                allowed_unsafe=allowed_unsafe,
                adapter_notes=list(self.adapter.notes()),
            ),
        )

    def _keep_evidence(
        self,
        candidate: int,
        tree: Path,
        evidence: Path,
        bootstrap: dict[str, Any],
        trials: list[TrialResult],
        reasons: tuple[str, ...],
        options: RunOptions,
        *,
        interrupted: str | None = None,
    ) -> Path:
        """Hand an unpublished candidate's tree, summary and evidence to the store; returns where they went.

        A rejected candidate goes to ``rejected/``; with ``interrupted`` (the step a signal stopped) it has
        no verdict, and the store files it under ``interrupted/``, apart from the rejections.
        """
        summary = render_summary(
            self.resolved,
            self.run_id,
            candidate,
            bootstrap,
            trials,
            reasons,
            options,
            interrupted=interrupted,
            # What store.reject will keep: the tree only when something was staged, and the logs copied below.
            has_tree=os.path.lexists(tree),
            logs=[log.name for log in sorted(evidence.glob("*.log"))],
        )
        record = {
            "config_hash": self.resolved.config_hash,
            "run_id": self.run_id,
            "candidate": candidate,
            "reasons": list(reasons),
            "interrupted_during": interrupted,
            "bootstrap": bootstrap,
            "trials": [trial.to_dict() for trial in trials],
            "factors": dict(self.resolved.factors),
        }
        kept = self.store.reject(
            tree,
            config_hash=self.resolved.config_hash,
            run_id=self.run_id,
            candidate=candidate,
            summary_md=summary,
            evidence=record,
            interrupted=interrupted is not None,
        )
        with os_errors(f"keeping the evidence of candidate {candidate} in {kept}"):
            for log in sorted(evidence.glob("*.log")):
                shutil.copy2(log, kept / log.name)
            for outside in sorted(evidence.glob("*-outside")):
                # What a trial wrote outside the blessing (its private HOME and temp dir): regular files and
                # links, the evidence of what was compiled; sockets and pipes carry nothing to keep.
                shutil.copytree(outside, kept / outside.name, symlinks=True, ignore=_special_files)
        return kept


def _special_files(directory: str, names: list[str]) -> set[str]:
    """Names in ``directory`` that are neither directories, regular files nor links (copytree's ignore)."""
    special = set()
    for name in names:
        mode = (Path(directory) / name).lstat().st_mode
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            special.add(name)
    return special


def bless_profile(
    source: Path | Profile,
    options: RunOptions,
    *,
    store: Store,
    events: EventSink = ignore_events,
    runtime: Runtime | None = None,
    cuda_visible_devices: str | None = None,
) -> RunResult:
    """Bless a profile (``bless run``, :func:`bless.run_blessing`): the command's one call.

    Loads ``source`` (a profile file, or a profile already loaded), works out K (:meth:`RunOptions.planned`),
    makes the profile's runtime (``runtime``: another one), resolves the profile through
    :func:`~bless.flows.resolve.resolve_for_command` (this machine's hardware, the image's ID from the
    runtime), reports ``config hash HASH (LABEL); K=K`` as a note, and runs one orchestrator on the GPUs
    ``cuda_visible_devices`` leaves.

    Raises:
        UsageError: a failure rate no K can bound at that confidence.
        BlessError: the profile's, resolution's and the run's refusals (each its own exit code).
    """
    profile = load_profile(source) if isinstance(source, Path) else source
    planned = options.planned(profile)
    engine_runtime = runtime if runtime is not None else runtimes.get_runtime(profile.runtime_kind)
    resolution = resolve_for_command(profile, image_resolver=engine_runtime.resolve_image)
    events(
        Event(
            "note",
            f"config hash {resolution.config_hash} ({profile.label}); K={planned.k}",
            {"config_hash": resolution.config_hash, "trials": planned.k},
        )
    )
    orchestrator = Orchestrator(
        resolution.resolved,
        store=store,
        runtime=engine_runtime,
        adapter=resolution.adapter,
        events=events,
        cuda_visible_devices=cuda_visible_devices,
    )
    return orchestrator.run(planned)
