"""serve-full: every step in one call, :func:`serve_full`; the command line only renders and handles signals.

The steps, in order: the per-name start lock (:mod:`.start_lock`); ``--from``'s pull (a callable the caller gives,
so this flow imports no registry code and no other flow); the plan, every refusal before anything starts
(:mod:`.checks`, then :mod:`.plan`); the pulled blessing must be the profile's; the signature under ``--trust``,
checked on the very bytes the plan parsed; the start with its lease, readiness, re-check and canary
(:mod:`.start`); then, in the foreground, the engine's log until it exits or ``stop`` is set, and the graceful end
(:mod:`.follow`, :mod:`.finish`), with sealed serving watching for unproven compiles all along (:mod:`.seal`).
``--detach`` returns once the canary passed and the detached engine's own seal watcher runs (:mod:`.detached`);
``--dry-run`` after the plan.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bless import runtime as runtimes  # get_runtime looked up at call time (a test may swap it)
from bless.core.profile import Profile
from bless.engines import get_adapter
from bless.engines.base import EngineAdapter
from bless.errors import BlessError, EngineFailedError, InterruptedByUserError, NoManifestError
from bless.flows.events import Event, EventSink, ignore_events
from bless.flows.serve import detached
from bless.flows.serve import seal as sealing
from bless.flows.serve.finish import FinishResult, finish
from bless.flows.serve.follow import follow
from bless.flows.serve.plan import LaunchPlan, ServePlan, plan
from bless.flows.serve.serve_dir import ENGINE_LOG
from bless.flows.serve.start import LaunchResult, start
from bless.flows.serve.start_lock import StartingLock
from bless.flows.trust_policy import trust_verdict
from bless.runtime.base import Runtime
from bless.store import Store
from bless.trust import trust_report

__all__ = ["Fetched", "ServeHooks", "ServeOutcome", "ServeRequest", "serve_full"]


@dataclass(frozen=True)
class Fetched:
    """What ``--from`` installed (or found present): which blessing, and its report for the plan."""

    reference: str
    config_hash: str
    dir_id: str
    report: Mapping[str, Any]


@dataclass(frozen=True)
class ServeRequest:
    """What the operator asked for."""

    profile: Profile
    store: Store
    detach: bool = False
    dry_run: bool = False
    debug: bool = False
    no_canary: bool = False
    keep_upper: bool = False
    allow_unknown_engine_version: bool = False
    #: ``--trust DIR``: the blessing must be a validly signed, fresh, current target.
    trust_dir: Path | None = None
    #: ``--from REF``: pulls the blessing into ``store`` (a no-op when present); None without ``--from``.
    fetch: Callable[[Store], Fetched] | None = None
    #: The operator's ``CUDA_VISIBLE_DEVICES`` (None: unset): selects and orders the GPUs the engine's ranks run on.
    cuda_visible_devices: str | None = None


@dataclass
class ServeHooks:
    """Where the flow talks to its caller while it runs (the command line renders; tests record)."""

    events: EventSink = ignore_events
    #: The plan is decided and nothing is started yet (the command line shows it and the banners).
    on_plan: Callable[[Mapping[str, Any]], None] = lambda plan_dict: None
    #: The engine is canary-checked and serving in the foreground: from here a signal only asks to stop.
    on_serving: Callable[[LaunchResult], None] = lambda result: None
    #: The engine's log while serving in the foreground.
    write_log: Callable[[str], None] = lambda text: None
    #: Set (by the caller's signal handler, or by sealed serving under ``unproven_compile = stop``) to end
    #: serving gracefully.
    stop: threading.Event = field(default_factory=threading.Event)
    #: The signal that set ``stop`` or interrupted the start, for messages (``SIGTERM``).
    signal_name: Callable[[], str | None] = lambda: None
    #: ``--detach`` of a blessed start: starts the detached engine's seal watcher, returns its process identity
    #: (:func:`bless.flows.serve.detached.start_watcher`; tests give their own).
    start_watcher: Callable[[LaunchResult, Runtime, EventSink], Mapping[str, Any]] = lambda result, runtime, events: (
        detached.start_watcher(result, runtime, events=events)
    )


@dataclass(frozen=True)
class ServeOutcome:
    """How a serve-full ended: the plan, the start, and (foreground) how serving ended."""

    plan: ServePlan
    dry_run: bool = False
    result: LaunchResult | None = None
    finish: FinishResult | None = None
    ended_by: str | None = None
    #: A failure after serving began (the engine exited by itself, had to be killed, or compiled what the
    #: blessing does not hold under ``unproven_compile = stop``): reported with the data.
    failure: BlessError | None = None
    #: The unproven compiles sealed serving saw (foreground serves).
    unproven: tuple[sealing.UnprovenCompile, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        # By hand (not JsonForm): the result, finish and unproven keys appear only once serving got that far.
        data: dict[str, Any] = {"dry_run": self.dry_run, "plan": dict(self.plan)}
        if self.result is not None:
            data["result"] = self.result.to_dict()
        if self.finish is not None:
            data["ended_by"] = self.ended_by
            data["finish"] = self.finish.to_dict()
            data["unproven_compile"] = {
                "policy": self.result.plan.profile.unproven_compile if self.result is not None else None,
                "count": len(self.unproven),
                "events": [event.to_dict() for event in self.unproven],
            }
        return data


def _blessing_checks(request: ServeRequest, the_plan: LaunchPlan, fetched: Fetched | None) -> dict[str, Any]:
    """The plan's ``from`` and ``trust`` sections; refuses a pulled blessing that is not the profile's."""
    manifest = the_plan.manifest
    if manifest is None:  # --debug: nothing blessed is served
        return {}
    if fetched is not None and (fetched.config_hash, fetched.dir_id) != (manifest.config_hash, manifest.cache.dir_id):
        raise NoManifestError(
            f"--from {fetched.reference} holds blessing {fetched.config_hash[:16]}... ({fetched.dir_id}), but the "
            f"profile resolves here to {manifest.config_hash[:16]}... ({manifest.cache.dir_id})",
            hint="serve the profile that blessing was made from, on matching hardware; a diff of the two "
            "configurations shows which factors differ",
            remedy="serve_its_profile",
            details={"pulled": fetched.config_hash, "profile": manifest.config_hash},
        )
    assert the_plan.manifest_bytes is not None  # a blessed plan parsed them
    # Checked on the very bytes the plan parsed, not a second read of the file.
    verdict = trust_verdict(request.store, manifest, request.trust_dir, data=the_plan.manifest_bytes)
    sections: dict[str, Any] = {"trust": trust_report(verdict)}
    if fetched is not None:
        sections["from"] = dict(fetched.report)
    return sections


def serve_full(
    request: ServeRequest,
    *,
    runtime: Runtime | None = None,
    adapter: EngineAdapter | None = None,
    hooks: ServeHooks | None = None,
) -> ServeOutcome:
    """Serve ``request.profile`` on its blessed cache, fail closed (the module docstring lists the steps).

    ``runtime``: the profile's runtime kind's by default; ``adapter``: the profile's engine's by default
    (resolution specialises it for the resolved factors).

    Raises a :class:`~bless.errors.BlessError` for every refusal before serving began (each its own exit
    code) and InterruptedByUserError (130) for a signal before the engine was ready and canary-checked.
    A failure once serving began is returned in :attr:`ServeOutcome.failure`, with what was served.
    """
    hooks = hooks or ServeHooks()
    profile, store = request.profile, request.store
    runtime = runtime if runtime is not None else runtimes.get_runtime(profile.runtime_kind)
    adapter = adapter if adapter is not None else get_adapter(profile.engine)
    with StartingLock(store, profile.name) as starting:
        fetched = request.fetch(store) if request.fetch is not None else None
        the_plan = plan(
            profile,
            store=store,
            runtime=runtime,
            adapter=adapter,
            debug=request.debug,
            allow_unknown_engine_version=request.allow_unknown_engine_version,
            cuda_visible_devices=request.cuda_visible_devices,
        )
        plan_dict = the_plan.to_dict()
        checks = _blessing_checks(request, the_plan, fetched)
        if "trust" in checks:
            plan_dict["trust"] = checks["trust"]
        if "from" in checks:
            plan_dict["from"] = checks["from"]
        if request.dry_run:
            return ServeOutcome(plan=plan_dict, dry_run=True)
        hooks.on_plan(plan_dict)
        # start() holds the serving lease until finish() (a detached engine is handed it).
        watchers: list[Mapping[str, Any]] = []

        def seal_detached(started: LaunchResult, runtime_: Runtime) -> None:
            watchers.append(hooks.start_watcher(started, runtime_, hooks.events))

        try:
            result = start(
                the_plan,
                runtime=runtime,
                no_canary=request.no_canary,
                detach=request.detach,
                keep_upper_on_interrupt=request.keep_upper,
                events=hooks.events,
                seal_detached=seal_detached if request.detach and the_plan.blessed else None,
            )
        except KeyboardInterrupt:
            raise InterruptedByUserError(
                f"{hooks.signal_name() or 'SIGINT'} before the engine was ready and canary-checked: "
                f"container {the_plan.container_name} was stopped and removed",
                hint="serve again",
                remedy="serve_again",
            ) from None
        starting.release()  # the running container holds the name now
    if request.detach:
        if watchers:
            result = dataclasses.replace(result, seal_watcher=dict(watchers[0]))
        return ServeOutcome(plan=plan_dict, result=result)
    return _serve_foreground(request, the_plan, result, plan_dict, runtime=runtime, hooks=hooks)


def _serve_foreground(
    request: ServeRequest,
    the_plan: LaunchPlan,
    result: LaunchResult,
    plan_dict: ServePlan,
    *,
    runtime: Runtime,
    hooks: ServeHooks,
) -> ServeOutcome:
    """Follow the engine's log until it exits or ``hooks.stop`` is set, then end gracefully."""
    hooks.on_serving(result)
    seal = _seal(the_plan, runtime, hooks)
    try:
        with _watched(the_plan, result, runtime, seal):
            exit_code = follow(runtime, result.started, hooks.write_log, stop=hooks.stop)
        engine_exited = exit_code is not None
        sealed_stop = seal is not None and seal.stop_requested and not engine_exited
        if sealed_stop:
            hooks.events(Event("phase", "unproven compile (unproven_compile = stop): stopping the engine gracefully"))
        elif not engine_exited:
            hooks.events(Event("phase", f"{hooks.signal_name() or 'signal'}: stopping the engine gracefully"))
        # The serve dir holds the unproven-compiles evidence: it is kept whenever there is some.
        unproven = seal is not None and bool(seal.seen)
        finished = finish(
            the_plan, result, runtime=runtime, keep_upper=request.keep_upper, failed=engine_exited or unproven
        )
    finally:
        result.release_lease()  # finish released it; this covers a failure before it
    failure: BlessError | None = None
    if sealed_stop:
        assert seal is not None
        failure = sealing.unproven_compile_error(seal)
    elif engine_exited:
        failure = EngineFailedError(
            f"the engine exited by itself with code {exit_code} while serving; the serve dir is kept: "
            f"{the_plan.serve_dir}",
            hint=f"read its log above (also in {the_plan.serve_dir / ENGINE_LOG})",
            details={"exit_code": exit_code, "serve_dir": str(the_plan.serve_dir)},
        )
    elif finished.stop is not None and not finished.stop.graceful:
        failure = EngineFailedError(
            f"the engine did not stop within {request.profile.trials.stop_timeout_s} s and was killed",
            hint="raise trials.stop_timeout_s, or fix the engine's SIGTERM handling",
        )
    ended_by = "engine-exit" if engine_exited else (hooks.signal_name() or "signal")
    if sealed_stop:
        ended_by = "unproven-compile"
    return ServeOutcome(
        plan=plan_dict,
        result=result,
        finish=finished,
        ended_by=ended_by,
        failure=failure,
        unproven=tuple(seal.seen) if seal is not None else (),
    )


def _seal(the_plan: LaunchPlan, runtime: Runtime, hooks: ServeHooks) -> sealing.Seal | None:
    """Sealed serving's policy for a blessed start (None for ``--debug``: nothing blessed to hold it to)."""
    if not the_plan.blessed:
        return None
    return sealing.Seal(
        store=the_plan.store,
        name=the_plan.profile.name,
        serve_dir=the_plan.serve_dir,
        policy=the_plan.profile.unproven_compile,
        events=hooks.events,
        stop=hooks.stop,
        config_hash=the_plan.config_hash,
    )


@contextmanager
def _watched(the_plan: LaunchPlan, result: LaunchResult, runtime: Runtime, seal: sealing.Seal | None) -> Iterator[None]:
    """The watcher running for the ``with`` body (nothing for ``--debug``)."""
    if seal is None:
        yield
        return
    session = the_plan.session(runtime, started=result.started)
    watcher = sealing.SealWatcher(runtime=runtime, session=session, adapter=the_plan.adapter)
    with sealing.watching(watcher, seal):
        yield
