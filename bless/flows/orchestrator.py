"""``bless run``: bootstrap a compile cache, prove it with K trials, publish or reject it.

Phase 1 (bootstrap) starts the engine on an empty staging cache mounted read-write,
waits for readiness, runs the replay protocol (its outputs become the golden outputs),
stops gracefully, normalizes ownership, checks the adapter's expected artifacts and
hashes the tree. Phase 2 runs K trials, each a fresh engine that sees the staged tree
as a read-only lower layer (overlay) and must reuse it: coherent outputs equal to the
golden ones, a load marker, no compile marker, no new artifacts in the upper layer, and
the tree byte-identical afterwards. Accept publishes through the store (manifest last);
reject keeps the evidence. ``--candidates N`` bootstraps afresh after a rejection.

Trials run ``--parallel N`` at a time, one per GPU slot (see bless/devices.py): each has its
own GPU set, overlay upper layer, port and log. A failed trial stops new ones from starting
(those running finish and count); Ctrl-C stops every running engine. The outputs are also
compared across devices: a cache that answers differently on another GPU than where it was
compiled is rejected.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bless import __version__, labels
from bless.devices import GpuSlot, Output, check_slot_memory, cross_device_reasons, plan_slots, visible_gpus
from bless.engines.base import EngineAdapter
from bless.errors import (
    AlreadyBlessedError,
    BootstrapFailedError,
    EngineHttpError,
    InterruptedByUserError,
    NotReadyError,
    WeakerBlessingError,
)
from bless.factors import GpuInfo, ResolvedConfig
from bless.flows.events import Event, EventSink, ignore_events, new_run_id
from bless.flows.safety import check_unsafe
from bless.flows.session import EngineSession, engine_spec, log_tail
from bless.manifest import Manifest, cache_tree_from_listing, default_provenance, utc_now
from bless.probes import probe_gpus
from bless.reuse import ReuseReport, classify_reuse
from bless.runtime.base import ContainerInfo, Mount, Runtime
from bless.store import PublishResult, Store, atomic_write_bytes, process_alive, process_identity
from bless.trials import (
    CoherenceReport,
    failure_rate_bound,
    golden_from,
    golden_text_map,
    golden_token_map,
    run_protocol,
    warm_up,
)
from bless.verify import TreeListing, hash_tree, verify_tree

DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class RunOptions:
    trials: int
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


@dataclass(frozen=True)
class TrialResult:
    index: int
    passed: bool
    reasons: tuple[str, ...]
    coherence: CoherenceReport | None
    reuse: ReuseReport | None
    engine: dict[str, Any]
    timings: dict[str, float]
    upper: dict[str, Any]
    slot: GpuSlot = field(default_factory=lambda: GpuSlot(0))

    def outputs_seen(self) -> dict[str, set[Output]]:
        """Every distinct output per prompt this trial saw (all protocol modes)."""
        seen: dict[str, set[Output]] = {}
        for observation in self.coherence.observations if self.coherence else ():
            seen.setdefault(observation.prompt, set()).add((observation.text, observation.token_ids))
        return seen

    def to_dict(self) -> dict[str, Any]:
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
        }


@dataclass(frozen=True)
class CandidateResult:
    index: int
    accepted: bool
    bootstrap: dict[str, Any]
    trials: tuple[TrialResult, ...]
    reasons: tuple[str, ...]
    rejected_dir: str | None = None
    #: Wall time of phase 2 (all K trials, parallel ones overlapping): what --parallel shortens.
    trials_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "accepted": self.accepted,
            "reasons": list(self.reasons),
            "trials_seconds": round(self.trials_seconds, 3) if self.trials_seconds is not None else None,
            "bootstrap": self.bootstrap,
            "trials": [trial.to_dict() for trial in self.trials],
            "rejected_dir": self.rejected_dir,
        }


@dataclass(frozen=True)
class RunResult:
    """Everything a run did. ``published`` is False when every candidate was rejected."""

    config_hash: str
    run_id: str
    published: bool
    candidates: tuple[CandidateResult, ...]
    trials_planned: int
    confidence: float
    failure_rate_bound: float | None
    manifest_path: str | None
    blessed_dir: str | None
    archived_manifest: str | None
    wall_seconds: float
    engine_seconds: float
    warnings: tuple[str, ...] = ()
    slots: tuple[GpuSlot, ...] = (GpuSlot(0),)

    def to_dict(self) -> dict[str, Any]:
        # Parallel trials overlap: their summed engine time can exceed the wall time, so the
        # overhead ratio only means something when trials ran one at a time.
        serial = len(self.slots) <= 1
        return {
            "config_hash": self.config_hash,
            "run_id": self.run_id,
            "published": self.published,
            "warnings": list(self.warnings),
            "trials_planned": self.trials_planned,
            "confidence": self.confidence,
            "failure_rate_bound": self.failure_rate_bound,
            "manifest_path": self.manifest_path,
            "blessed_dir": self.blessed_dir,
            "archived_manifest": self.archived_manifest,
            "wall_seconds": round(self.wall_seconds, 3),
            "engine_seconds": round(self.engine_seconds, 3),
            "orchestration_overhead": round(1 - self.engine_seconds / self.wall_seconds, 4)
            if self.wall_seconds and serial
            else None,
            "parallel": len(self.slots),
            "slots": [{"slot": slot.index, "label": slot.label, "gpus": slot.records()} for slot in self.slots],
            "candidates": [candidate.to_dict() for candidate in self.candidates],
        }


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
        """``gpu_probe`` lists this host's GPUs (nvidia-smi); ``cuda_visible_devices`` is the operator's
        restriction of them (indices or UUIDs), None for all."""
        self.resolved = resolved
        self.profile = resolved.profile
        self.store = store
        self.runtime = runtime
        self.adapter = adapter.for_factors(resolved.factors)
        self._events = events
        self._events_lock = threading.Lock()
        self.gpu_probe = gpu_probe
        self.cuda_visible_devices = cuda_visible_devices
        self.slots: tuple[GpuSlot, ...] = (GpuSlot(0),)
        # Parallel trials: the running sessions (stopped all at once on Ctrl-C) and the cancel flag.
        self._trial_lock = threading.Lock()
        self._running: dict[int, EngineSession] = {}
        self._cancelled = False
        self.run_id = new_run_id()
        self.image = resolved.factors["runtime"].get("image_id")
        self.engine_seconds = 0.0
        self._published: PublishResult | None = None
        self._warnings: list[str] = []
        identity = process_identity()
        self._owner_process = json.dumps(
            {key: identity[key] for key in ("host", "pid", "proc_start")}, sort_keys=True, separators=(",", ":")
        )

    def events(self, event: Event) -> None:
        """Hand an event to the sink; parallel trials report from several threads, one at a time."""
        with self._events_lock:
            self._events(event)

    # --- top level -------------------------------------------------------------------------------

    def _plan_slots(self, options: RunOptions) -> tuple[GpuSlot, ...]:
        """Trial slots on this host's GPUs, each with enough free memory now (else 52, naming the GPU)."""
        hardware = self.profile.hardware
        if hardware.accelerator != "cuda":
            return plan_slots(hardware, [], requested=options.parallel, trials=options.trials)
        gpus = visible_gpus(self.gpu_probe(), self.cuda_visible_devices)
        slots = plan_slots(hardware, gpus, requested=options.parallel, trials=options.trials)
        check_slot_memory(hardware, slots, gpus)
        return slots

    def run(self, options: RunOptions) -> RunResult:
        """Bless the profile: lock, refuse if blessed (unless rebless), try up to N candidates."""
        started = time.monotonic()
        self.adapter.require_known_version(allow_unknown=options.allow_unknown_engine_version)
        allowed_unsafe = check_unsafe(self.resolved, self.adapter, allow_test_knobs=options.allow_test_knobs)
        self.runtime.ping()
        self.slots = self._plan_slots(options)
        config_hash = self.resolved.config_hash
        with self.store.lock(config_hash, wait=options.wait_lock):
            self.store.recover()
            existing = self.store.find(config_hash)
            if existing is not None and not options.rebless:
                raise AlreadyBlessedError(
                    f"{config_hash} is already blessed ({self.store.manifest_path(config_hash)})",
                    hint="use --rebless to bless again (the prior blessing is archived), or bless verify it",
                )
            if existing is not None:
                self._check_bound_kept(existing, options)
            for note in self.adapter.notes():
                self.events(Event("note", f"{self.adapter.name} adapter: {note}"))
            leftovers, spared = self._clean_leftovers(config_hash)
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
                    hint=f"evidence is under {self.store.root / 'rejected' / config_hash}",
                ) from None
            finally:
                shutil.rmtree(run_dir, ignore_errors=True)

    def _check_bound_kept(self, existing: Manifest, options: RunOptions) -> None:
        """Refuse a rebless that would publish a weaker bound, unless allowed (then warn)."""
        weaker = weaker_than(existing, options)
        if weaker is None:
            return
        if not options.allow_weaker:
            # Refused before any engine starts: nothing is spent on a run that may not publish.
            raise WeakerBlessingError(
                weaker,
                hint=f"bless with at least --trials {existing_passes(existing)} to keep the bound, "
                "or add --allow-weaker to publish the weaker one",
                details={"config_hash": existing.config_hash, "trials": options.trials},
            )
        self._warnings.append(f"{weaker}; publishing it anyway (--allow-weaker)")
        self.events(Event("warning", self._warnings[-1]))

    def _clean_leftovers(self, config_hash: str) -> tuple[list[str], list[str]]:
        """Remove this hash's bless-run containers whose run is gone; returns (removed, spared).

        The per-hash lock is per store root: a run of the same config from another root on the same
        runtime may be going on right now, and its containers are not leftovers. Those whose creating
        process still runs (or cannot be checked from here) are spared; a start under one of their
        names is then a clear conflict rather than a stolen container.
        """
        removed: list[str] = []
        spared: list[str] = []
        # Only bless-run phases: a serving container of the same config must survive a rebless.
        for phase in (labels.PHASE_BOOTSTRAP, labels.PHASE_TRIAL, labels.PHASE_HELPER):
            selector = {labels.CONFIG_HASH: config_hash, labels.PHASE: phase}
            runs: dict[str, list[ContainerInfo]] = {}
            for info in self.runtime.list_ours(selector):
                runs.setdefault(info.labels.get(labels.RUN_ID, ""), []).append(info)
            for run_id, infos in sorted(runs.items()):
                if not run_id or any(_owner_running(info.labels) for info in infos):
                    spared.extend(info.name for info in infos)
                else:
                    removed.extend(self.runtime.cleanup_ours({**selector, labels.RUN_ID: run_id}))
        return removed, spared

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
            trials_planned=options.trials,
            confidence=options.confidence,
            failure_rate_bound=failure_rate_bound(passes, options.confidence) if published else None,
            manifest_path=str(publish.manifest_path) if publish else None,
            blessed_dir=str(publish.blessed_dir) if publish else None,
            archived_manifest=str(publish.archived_manifest) if publish and publish.archived_manifest else None,
            wall_seconds=time.monotonic() - started,
            engine_seconds=self.engine_seconds,
            warnings=tuple(self._warnings),
            slots=self.slots,
        )

    # --- one candidate ---------------------------------------------------------------------------

    def _candidate(
        self, index: int, work: Path, options: RunOptions, allowed_unsafe: list[str], started: float
    ) -> CandidateResult:
        tree = work / "cache"
        evidence = work / "evidence"
        tree.mkdir(parents=True)
        evidence.mkdir(parents=True)
        self.adapter.prepare_cache_dir(tree)
        trials: list[TrialResult] = []
        bootstrap: dict[str, Any] = {}
        self._step = "the bootstrap"  # what an interruption stops: said in the rejection's summary
        try:
            self.events(Event("phase", f"candidate {index}: phase 1, bootstrap compile", {"candidate": index}))
            bootstrap, golden_report, listing, artifacts = self._bootstrap(index, tree, evidence)
            golden = golden_from(golden_report, self.profile.trials.max_tokens)
            proof = _TrialInputs(index, tree, listing, golden, artifacts.engine_keys, work, evidence)
            trials_started = time.monotonic()
            self._run_trials(proof, options, trials)
            trials_seconds = time.monotonic() - trials_started
        except BootstrapFailedError as exc:
            self._reject(index, tree, evidence, bootstrap, trials, (exc.message,), options)
            raise
        except KeyboardInterrupt:
            self._reject(index, tree, evidence, bootstrap, trials, ("interrupted",), options, interrupted=self._step)
            raise
        trials.sort(key=lambda t: t.index)
        reference = {p: (c.text, c.token_ids) for p, c in golden_report.outputs.items()}
        cross_device = cross_device_reasons(
            self.slots[0].label, reference, [(t.slot.label, t.outputs_seen()) for t in trials]
        )
        failed = [t for t in trials if not t.passed]
        if failed or cross_device:
            reasons = tuple([*(f"trial {t.index}: {r}" for t in failed for r in t.reasons), *cross_device])
            rejected = self._reject(index, tree, evidence, bootstrap, trials, reasons, options)
            self.events(Event("candidate-end", f"candidate {index} rejected", {"candidate": index}))
            return CandidateResult(index, False, bootstrap, tuple(trials), reasons, str(rejected), trials_seconds)
        manifest = self._manifest(index, listing, artifacts, golden, bootstrap, trials, options, allowed_unsafe)
        self._published = self.store.publish(tree, manifest)
        # The engine logs of an accepted run stay readable next to the store (not in the manifest),
        # until gc removes the blessed version they made.
        self.store.keep_run_logs(self.run_id, self._published, sorted(evidence.glob("*.log")))
        self.events(Event("candidate-end", f"candidate {index} accepted and published", {"candidate": index}))
        return CandidateResult(index, True, bootstrap, tuple(trials), (), trials_seconds=trials_seconds)

    def _session(
        self, phase: str, name: str, mount: Mount, candidate: int, log_path: Path, slot: GpuSlot
    ) -> EngineSession:
        plan = self.profile.trials
        spec = engine_spec(
            self.resolved,
            self.adapter,
            self.runtime,
            name=name,
            labels={
                **labels.labels_for(
                    run_id=self.run_id,
                    phase=phase,
                    config_hash=self.resolved.config_hash,
                    profile=self.profile.name,
                ),
                labels.OWNER_PROCESS: self._owner_process,
            },
            cache_mount=mount,
            image=self.image,
            extra_env={
                # A trial must load the blessed cache: the engine's force-load switch turns a failed
                # load into a failed start instead of a silent recompile (never for the bootstrap).
                **(self.adapter.replay_env() if phase != labels.PHASE_BOOTSTRAP else {}),
                "BLESS_RUN_ID": self.run_id,
                "BLESS_PHASE": phase,
                "BLESS_CANDIDATE": str(candidate),
            },
            log_path=log_path,
            gpu_ids=slot.device_ids or None,
        )
        return EngineSession(
            self.runtime,
            spec,
            ready_timeout_s=plan.ready_timeout_s,
            request_timeout_s=plan.request_timeout_s,
            stop_timeout_s=plan.stop_timeout_s,
        )

    def _name(self, phase: str, candidate: int, trial: int | None = None) -> str:
        # Deterministic: the per-hash lock makes it unique among our runs, and a foreign
        # container squatting it is detected (and refused) rather than raced.
        suffix = f"-t{trial}" if trial is not None else ""
        return f"bless-{phase}-{self.resolved.config_hash[:12]}-c{candidate}{suffix}"

    def _bootstrap(
        self, candidate: int, tree: Path, evidence: Path
    ) -> tuple[dict[str, Any], CoherenceReport, TreeListing, Any]:
        mount = Mount("rw", tree, self.adapter.cache_mount_path)
        log_path = evidence / "bootstrap.log"
        slot = self.slots[0]  # the golden outputs come from this slot's GPUs: the cross-device reference
        name = self._name("bootstrap", candidate)
        session = self._session(labels.PHASE_BOOTSTRAP, name, mount, candidate, log_path, slot)
        report: CoherenceReport | None = None
        failure: str | None = None
        try:
            with session:
                try:
                    session.wait_ready()
                    report = warm_up(session.client, self.profile.trials)
                except NotReadyError as exc:
                    failure = session.not_ready_message(exc)
                except EngineHttpError as exc:
                    failure = f"request failed: {exc.message}; engine log tail:\n{log_tail(session.current_log())}"
        finally:
            # Also when interrupted (Ctrl-C/SIGTERM): the engine log is evidence the rejection keeps.
            self._write_log(log_path, session.log)
        info = {**session.evidence(), "slot": slot.index, "gpus": slot.records()}
        self._count_engine_time(session, report)
        if failure is not None:
            raise BootstrapFailedError(failure, hint="read the engine log above; fix the profile or the image")
        assert report is not None and session.stop_result is not None
        if not session.stop_result.graceful:
            raise BootstrapFailedError(
                f"the engine did not stop within {self.profile.trials.stop_timeout_s} s and was killed: "
                "its artifacts may be incomplete",
                hint="raise trials.stop_timeout_s or fix the engine's shutdown",
            )
        self.runtime.normalize_ownership(tree, image=self.image)
        listing = hash_tree(tree)
        artifacts = self.adapter.summarize_artifacts(listing)
        signals = self.adapter.read_log(session.log)
        info.update(
            {
                "timings": dict(signals.timings),
                "requests": report.requests,
                "request_seconds": round(report.request_seconds, 3),
                "compile_markers": len(signals.compile_markers),
                "files": len(listing.files),
                "total_size": listing.total_size,
            }
        )
        return info, report, listing, artifacts

    def _run_trials(self, proof: _TrialInputs, options: RunOptions, results: list[TrialResult]) -> None:
        """Run K trials, up to one per slot at a time, appending each verdict to ``results``.

        A failed trial frees its slot and stops new trials from starting (those running finish
        and count: more evidence for the rejection). Any exception in this thread (Ctrl-C
        arrives here) or in a trial stops every running engine, waits for the trials to unwind,
        and is raised again.
        """
        upcoming = deque(range(1, options.trials + 1))
        free = deque(self.slots)
        running: dict[Future[TrialResult], tuple[int, GpuSlot]] = {}
        self._cancelled = False
        with ThreadPoolExecutor(max_workers=len(self.slots), thread_name_prefix="bless-trial") as pool:
            try:
                while True:
                    stop_starting = any(not result.passed for result in results)
                    while free and upcoming and not stop_starting:
                        trial, slot = upcoming.popleft(), free.popleft()
                        self.events(Event("trial-start", f"candidate {proof.candidate}: trial {trial}/{options.trials}"
                                          + (f" on {slot.label}" if slot.gpus else ""),
                                          {"candidate": proof.candidate, "trial": trial, "of": options.trials,
                                           "slot": slot.index, "gpus": slot.short}))  # fmt: skip
                        running[pool.submit(self._trial, proof, trial, slot)] = (trial, slot)
                    self._step = _running_step(running.values())
                    if not running:
                        return
                    done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                    for future in done:
                        trial, slot = running.pop(future)
                        free.append(slot)
                        result = future.result()
                        results.append(result)
                        verdict = "pass" if result.passed else "FAIL"
                        self.events(Event("trial-end", f"trial {trial}/{options.trials}: {verdict}",
                                          {"candidate": proof.candidate, "trial": trial, "slot": slot.index,
                                           "gpus": slot.short, "result": result.to_dict()}))  # fmt: skip
            except BaseException:
                self._stop_running_trials()
                _wait_out(running)
                raise

    def _stop_running_trials(self) -> None:
        """Stop every running trial's engine at once (Ctrl-C, or a trial raised); later starts stop themselves."""
        with self._trial_lock:
            self._cancelled = True
            sessions = list(self._running.values())
        threads = [threading.Thread(target=_stop_quietly, args=(session,), daemon=True) for session in sessions]
        for thread in threads:
            thread.start()
        for thread in threads:
            _join_quietly(thread)

    def _trial(self, proof: _TrialInputs, index: int, slot: GpuSlot) -> TrialResult:
        scratch = proof.work / f"trial-{index}"
        if self.profile.cache_mount == "ro-bind" and self.adapter.readonly_bind_ok:
            mount = Mount("ro", proof.tree, self.adapter.cache_mount_path)
        else:
            mount = Mount("overlay", proof.tree, self.adapter.cache_mount_path, scratch=scratch)
        log_path = proof.evidence / f"trial-{index}.log"
        name = self._name("trial", proof.candidate, index)
        session = self._session(labels.PHASE_TRIAL, name, mount, proof.candidate, log_path, slot)
        coherence: CoherenceReport | None = None
        reasons: list[str] = []

        def phase(what: str) -> None:
            data = {"candidate": proof.candidate, "trial": index, "phase": what, "gpus": slot.short}
            self.events(Event("trial-phase", f"trial {index}: {what}", data))

        try:
            phase("starting")
            with session:
                with self._trial_lock:
                    cancelled = self._cancelled
                    if not cancelled:
                        self._running[index] = session
                try:
                    if cancelled:
                        reasons.append("interrupted before it became ready")
                    else:
                        phase("loading")
                        session.wait_ready()
                        phase("replaying")
                        coherence = run_protocol(
                            session.client,
                            self.profile.trials,
                            golden=golden_token_map(proof.golden),
                            golden_text=golden_text_map(proof.golden),
                        )
                except NotReadyError as exc:
                    reasons.append(session.not_ready_message(exc))
                except EngineHttpError as exc:
                    reasons.append(f"request failed: {exc.message}")
                finally:
                    phase("stopping")
        finally:
            with self._trial_lock:
                self._running.pop(index, None)
            self._write_log(log_path, session.log)  # kept as evidence when interrupted too
        phase("checking")
        tree, listing = proof.tree, proof.listing
        self._count_engine_time(session, coherence)
        if coherence is not None:
            reasons.extend(coherence.reasons)
        signals = self.adapter.read_log(session.log)
        upper = self.adapter.classify_upper(session.upper) if mount.kind == "overlay" else None
        tree_check = verify_tree(tree, listing.files, listing.dirs, expect_read_only=False)
        drift = self.adapter.drift_reasons(proof.engine_keys, signals.engine_keys)
        reuse = classify_reuse(signals, upper, tree_check, drift)
        reasons.extend(reuse.reasons)
        if session.stop_result is not None and not session.stop_result.graceful:
            reasons.append(f"the engine did not stop within {self.profile.trials.stop_timeout_s} s")
        shutil.rmtree(scratch, ignore_errors=True)
        return TrialResult(
            index=index,
            passed=not reasons,
            reasons=tuple(dict.fromkeys(reasons)),
            coherence=coherence,
            reuse=reuse,
            engine=session.evidence(),
            timings=dict(signals.timings),
            slot=slot,
            upper={
                "written": len(session.upper),
                "entries": [{"path": e.path, "kind": e.kind, "size": e.size} for e in session.upper[:200]],
            },
        )

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
                "planned": options.trials,
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
                "devices": list({g["uuid"] or str(g["index"]): g for t in trials for g in t.slot.records()}.values()),
            },
            golden=golden,
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

    def _reject(
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
        summary = render_summary(
            self.resolved, self.run_id, candidate, bootstrap, trials, reasons, options, interrupted=interrupted
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
        rejected = self.store.reject(
            tree,
            config_hash=self.resolved.config_hash,
            run_id=self.run_id,
            candidate=candidate,
            summary_md=summary,
            evidence=record,
        )
        for log in sorted(evidence.glob("*.log")):
            shutil.copy2(log, rejected / log.name)
        return rejected

    def _write_log(self, path: Path, log: str) -> None:
        atomic_write_bytes(path, log.encode("utf-8", "replace"))

    def _count_engine_time(self, session: EngineSession, report: CoherenceReport | None) -> None:
        self.engine_seconds += (session.start_to_ready_s or 0.0) + (report.request_seconds if report else 0.0)
        if session.stop_result is not None:
            self.engine_seconds += session.stop_result.seconds


@dataclass(frozen=True)
class _TrialInputs:
    """What every trial of one candidate proves against: the staged tree and the bootstrap's facts."""

    candidate: int
    tree: Path
    listing: TreeListing
    golden: list[dict[str, Any]]
    engine_keys: Mapping[str, Any]
    work: Path
    evidence: Path


def _running_step(running: Any) -> str:
    """``trial 3`` / ``trials 2, 3``: the trials an interruption would stop, for the rejection's summary."""
    trials = sorted(trial for trial, _ in running)
    if not trials:
        return "the trials (none running)"
    return ("trial " if len(trials) == 1 else "trials ") + ", ".join(str(trial) for trial in trials)


def _stop_quietly(session: EngineSession) -> None:
    """Stop one engine from a helper thread; its own trial reports whatever went wrong."""
    with contextlib.suppress(Exception):  # the trial's own stop, in its thread, raises it again
        session.stop()


def _join_quietly(thread: threading.Thread) -> None:
    """Join, even through another Ctrl-C: the engines must be stopped before the run gives up."""
    while thread.is_alive():
        try:
            thread.join()
        except KeyboardInterrupt:
            continue


def _wait_out(running: Mapping[Future[TrialResult], Any]) -> None:
    """Wait for every running trial to unwind (their engines are being stopped), through more Ctrl-Cs."""
    pending = set(running)
    while pending:
        try:
            _, pending = wait(pending, timeout=0.5)
        except KeyboardInterrupt:
            continue


def existing_passes(manifest: Manifest) -> int:
    """How many trials in a row the blessing passed (K of K: a run stops at its first failure)."""
    passed = manifest.trials.get("passed")
    return passed if isinstance(passed, int) and not isinstance(passed, bool) and passed >= 0 else 0


def weaker_than(existing: Manifest, options: RunOptions) -> str | None:
    """Why a rebless with ``options`` would publish a weaker failure-rate bound than ``existing``, or None.

    Both bounds are taken at the confidence of the blessing being replaced, so a different
    ``--confidence`` alone never makes a rebless look weaker or stronger: only the evidence (how
    many trials passed) counts.
    """
    stored = existing.trials.get("failure_rate_bound")
    confidence = stored.get("confidence") if isinstance(stored, Mapping) else None
    if not isinstance(confidence, float) or not 0 < confidence < 1:
        confidence = DEFAULT_CONFIDENCE
    passes = existing_passes(existing)
    before = failure_rate_bound(passes, confidence)
    after = failure_rate_bound(options.trials, confidence)
    if after <= before:
        return None
    return (
        f"--rebless with K={options.trials} would replace a {passes}/{passes} blessing of "
        f"{existing.config_hash[:16]}: failure-rate bound {before:.0%} -> {after:.0%} per start "
        f"at {confidence:.0%} confidence (weaker)"
    )


def _owner_running(container_labels: Mapping[str, str]) -> bool:
    """Whether the bless process that created a container may still run (True when it cannot be told)."""
    raw = container_labels.get(labels.OWNER_PROCESS)
    if raw is None:
        return False  # made before owners were labeled: a leftover, as always
    try:
        owner = json.loads(raw)
    except ValueError:
        return True
    return not isinstance(owner, dict) or process_alive(owner) is not False


def render_summary(
    resolved: ResolvedConfig,
    run_id: str,
    candidate: int,
    bootstrap: dict[str, Any],
    trials: list[TrialResult],
    reasons: tuple[str, ...],
    options: RunOptions,
    *,
    interrupted: str | None = None,
) -> str:
    """The ``summary.md`` a human reads first in a rejected-evidence dir.

    ``interrupted`` names the step a signal stopped (``"trial 2"``, ``"the bootstrap"``): that step
    started but has no verdict, so it is not among the finished trials.
    """
    progress = f"- trials finished: {len(trials)} of {options.trials} planned"
    if interrupted is not None:
        progress += f"; interrupted during {interrupted}"
    lines = [
        f"# Rejected: candidate {candidate} of run {run_id}",
        "",
        f"- profile: `{resolved.profile.label}`",
        f"- config hash: `{resolved.config_hash}`",
        f"{progress} (a run stops at the first failing trial)",
        "",
        "## Why",
        "",
        *[f"- {reason}" for reason in reasons],
        "",
        "## Trials",
        "",
        "| trial | verdict | start->ready s | reasons |",
        "|---|---|---|---|",
        *[
            f"| {t.index} | {'pass' if t.passed else 'FAIL'} | {t.engine.get('start_to_ready_s')} | "
            f"{'; '.join(t.reasons)[:300].replace('|', '/')} |"
            for t in trials
        ],
        "",
        "## Bootstrap",
        "",
        "```json",
        json.dumps(bootstrap, indent=2, sort_keys=True),
        "```",
        "",
        "Files here: `tree/` (the rejected cache), `evidence.json` (everything above, machine-readable),",
        "`bootstrap.log` and `trial-N.log` (engine logs).",
        "",
    ]
    return "\n".join(lines)


def run_bless(
    resolved: ResolvedConfig,
    *,
    store: Store,
    runtime: Runtime,
    adapter: EngineAdapter,
    options: RunOptions,
    events: EventSink = ignore_events,
    cuda_visible_devices: str | None = None,
) -> RunResult:
    """Convenience entry point: one orchestrator, one run (on the GPUs ``cuda_visible_devices`` leaves)."""
    orchestrator = Orchestrator(
        resolved,
        store=store,
        runtime=runtime,
        adapter=adapter,
        events=events,
        cuda_visible_devices=cuda_visible_devices,
    )
    return orchestrator.run(options)


__all__ = ["Event", "Orchestrator", "RunOptions", "RunResult", "run_bless"]
