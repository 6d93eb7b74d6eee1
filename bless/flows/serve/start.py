"""Start a planned engine: ready, re-checked, reusing the blessed artifact, canary-checked.

On success the engine is left running for :mod:`~bless.flows.serve.follow` and
:mod:`~bless.flows.serve.finish` (or the operator, with ``--detach``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bless.errors import (
    CacheNotUsedError,
    CanaryFailedError,
    EngineFailedError,
    EngineHttpError,
    NotReadyError,
)
from bless.flows.engine_start import EngineSession, log_tail
from bless.flows.events import Event, EventSink, ignore_events
from bless.flows.serve.lease import serving_lease
from bless.flows.serve.names import stop_command
from bless.flows.serve.plan import LaunchPlan
from bless.flows.serve.ready import clear_ready, mark_ready
from bless.flows.serve.serve_dir import CANARY_FILE, ENGINE_LOG, discard_serve_dir, save_evidence, upper_summary
from bless.flows.serve.snapshot import cache_changed_error
from bless.replay.canary import CanaryResult, run_canary
from bless.replay.reuse import compiled_outside_reasons
from bless.runtime.base import Runtime, Started
from bless.system.os_refusals import os_errors, os_refusal
from bless.system.procid import process_identity

_MAX_PROBLEMS_IN_MESSAGE = 8

NO_CANARY_BANNER = (
    "CANARY SKIPPED (--no-canary): the engine was not checked against the blessed golden outputs; "
    "the cache was verified, the served outputs were not."
)


@dataclass(frozen=True)
class LaunchResult:
    """A started, ready, canary-checked engine. ``started`` is the runtime's handle for follow/finish."""

    plan: LaunchPlan
    started: Started
    url: str
    canary: CanaryResult
    recheck: str
    timings: Mapping[str, float]
    detached: bool
    warnings: tuple[str, ...] = ()
    #: The serving lease, held until :func:`finish` releases it (None once detached: the engine holds it).
    lease: ExitStack | None = field(default=None, repr=False, compare=False)
    #: A detached blessed serve's seal watcher (its process identity: bless.flows.serve.detached).
    seal_watcher: Mapping[str, Any] | None = None

    def release_lease(self) -> None:
        """Let gc collect the served version again (idempotent; what :func:`finish` calls)."""
        if self.lease is not None:
            self.lease.close()

    @property
    def container_name(self) -> str:
        return self.started.name

    @property
    def container_id(self) -> str:
        return self.started.id

    @property
    def host_port(self) -> int | None:
        return self.started.host_port

    @property
    def upper_dir(self) -> Path | None:
        """Where the engine's writes land (the overlay's upper layer), while it runs."""
        mount = self.plan.mount
        return mount.scratch / "upper" if mount is not None and mount.scratch is not None else None

    def to_dict(self) -> dict[str, Any]:
        # By hand (not JsonForm): a view of the plan, the handle and the canary, not of the fields.
        warnings = list(self.plan.warnings) + list(self.warnings)
        if self.canary.status == "skipped" and self.plan.blessed:
            warnings.append(NO_CANARY_BANNER)
        return {
            "blessed": self.plan.blessed,
            "debug": self.plan.debug,
            "config_hash": self.plan.config_hash,
            "container": {"name": self.container_name, "id": self.container_id},
            "host_ip": self.plan.spec.host_ip,
            "host_port": self.host_port,
            "url": self.url,
            "detached": self.detached,
            # How to end a detached serve and clean up after it (container, overlay volume, serve dir, lease).
            "stop_command": stop_command(self.plan.profile.name, self.plan.store_root) if self.detached else None,
            "seal_watcher": dict(self.seal_watcher) if self.seal_watcher is not None else None,
            "canary": self.canary.to_dict(),
            "recheck": self.recheck,
            "serve_dir": str(self.plan.serve_dir),
            "upper_dir": str(self.upper_dir) if self.upper_dir else None,
            "notes": list(self.started.notes),
            "warnings": warnings,
            "timings": {key: round(value, 4) for key, value in self.timings.items()},
        }


def start(
    plan_: LaunchPlan,
    *,
    runtime: Runtime,
    no_canary: bool = False,
    detach: bool = False,
    keep_upper_on_interrupt: bool = False,
    events: EventSink = ignore_events,
    seal_detached: Callable[[LaunchResult, Runtime], None] | None = None,
) -> LaunchResult:
    """Start the planned engine, wait until ready, re-check the blessed files, run the canary.

    Failures stop the container and remove it, keep the serve dir (upper layer + ``engine.log``)
    as evidence and raise: EngineFailedError (44) when it never became ready, CacheChangedError
    (43) when a blessed file changed, CanaryFailedError (42) when an output differs from the
    golden one. On success the engine is left running (foreground or detached alike): the
    caller follows it and calls :func:`finish`, or leaves it to the operator (``--detach``).

    The serving lease on the blessed version (so ``bless gc`` never removes what is served, even once
    a rebless superseded it) is taken here, before the engine starts, and held until :func:`finish`;
    a detached engine is handed the lease; a failed start releases it.

    ``seal_detached`` (``detach`` only): starts the seal watcher of the detached engine once it holds its
    lease (:func:`bless.flows.serve.detached.start_watcher`); the readiness record says a watcher is expected,
    so no probe passes before it runs. It raises having left nothing running; the engine is then stopped
    as on any failure here.
    """
    lease = ExitStack()
    held = lease.enter_context(serving_lease(plan_.store, plan_))
    try:
        result = _start(
            plan_, runtime, no_canary=no_canary, keep_upper_on_interrupt=keep_upper_on_interrupt, events=events
        )
    except BaseException:
        lease.close()
        raise
    try:
        sealed = detach and seal_detached is not None
        _mark_ready(plan_, result, runtime, detached=detach, watcher={} if sealed else None)
        if detach:
            held.hand_over(result.started, runtime.kind)  # the running engine keeps it
            if seal_detached is not None:
                seal_detached(result, runtime)
    except BaseException:
        # Serving without a readiness record would never take traffic, and a detached engine whose
        # lease still names serve-full would lose it to gc once serve-full exits: stop what was
        # started, say why.
        session = plan_.session(runtime, started=result.started)
        try:
            session.stop()
        finally:
            clear_ready(plan_.store, plan_.profile.name)
            runtime.remove(result.started)
            if held.handed_over and held.lease is not None:
                with suppress(OSError):  # the engine it names is gone; say why serving failed, not this
                    plan_.store.leases.release(held.lease)
            lease.close()
        raise
    if detach:
        lease.close()
        return dataclasses.replace(result, detached=True)
    return dataclasses.replace(result, lease=lease)


def _mark_ready(
    plan_: LaunchPlan, result: LaunchResult, runtime: Runtime, *, detached: bool, watcher: Mapping[str, Any] | None
) -> None:
    """The readiness record (``serve-full ready``): written last, once the engine is canary-checked."""
    holder: dict[str, Any]
    if not detached:
        holder = process_identity()  # serve-full keeps serving in the foreground
    elif runtime.kind == "local" and result.started.id.isdigit():
        holder = process_identity(int(result.started.id))
    else:
        holder = {"container": result.started.id, "name": result.started.name}
    assert result.host_port is not None  # a started engine published its port (_start checks)
    try:
        mark_ready(
            plan_.store,
            name=plan_.profile.name,
            config_hash=plan_.config_hash,
            host=plan_.client_host,
            port=result.host_port,
            canary=result.canary.status,
            holder=holder,
            unproven_policy=plan_.profile.unproven_compile,
            watcher=watcher,
            ranks=plan_.ranks,
        )
    except OSError as exc:
        raise os_refusal(
            exc,
            f"writing the readiness record under {plan_.store.root}",
            hint="the engine was stopped; check that the store root is a directory this user can write",
        ) from None


def _start(
    plan_: LaunchPlan,
    runtime: Runtime,
    *,
    no_canary: bool,
    keep_upper_on_interrupt: bool,
    events: EventSink,
) -> LaunchResult:
    """:func:`start` under its lease: the engine up, ready, re-checked and canary-checked."""
    timings = dict(plan_.timings)
    session = plan_.session(runtime)
    _make_serve_dir(plan_)
    try:
        with ExitStack() as stack:
            started = _up_and_ready(plan_, session, stack, timings, events)
            recheck = _recheck_blessed_files(plan_, session, timings, events)
            _refuse_cache_not_used(plan_, session)
            canary = _canary(plan_, session, no_canary=no_canary, events=events)
            timings["canary_s"] = canary.seconds
            # Success: the engine stays up; follow()/finish() or the operator take over.
            stack.pop_all()
    except BaseException as exc:
        # The session's exit stopped and removed the container. Nothing to keep when no container
        # ever ran, or when the user interrupted the start (unless asked to keep it).
        interrupted = isinstance(exc, KeyboardInterrupt) and not keep_upper_on_interrupt
        if session.started is None or interrupted:
            discard_serve_dir(plan_.serve_dir, runtime=runtime, image=plan_.spec.image)
        raise
    return LaunchResult(
        plan=plan_,
        started=started,
        url=f"http://{plan_.client_host}:{started.host_port}",
        canary=canary,
        recheck=recheck,
        timings=timings,
        detached=False,
    )


def _make_serve_dir(plan_: LaunchPlan) -> None:
    # The name is unique per start, so an existing dir or a file in the way is the store's state.
    with os_errors(
        f"creating the serve dir {plan_.serve_dir}",
        hint="check that the store root and its serve/ are directories this user can write",
    ):
        plan_.serve_dir.mkdir(parents=True, exist_ok=False)


def _up_and_ready(
    plan_: LaunchPlan, session: EngineSession, stack: ExitStack, timings: dict[str, float], events: EventSink
) -> Started:
    """The container started under ``stack`` (its exit stops and removes it) and the engine ready (else 44)."""
    events(Event("phase", f"starting container {plan_.spec.name}"))
    t0 = time.perf_counter()
    stack.enter_context(session)
    started = session.started
    assert started is not None
    timings["create_s"] = time.perf_counter() - t0
    if started.host_port is None:
        session.stop()
        raise EngineFailedError(
            f"container {started.name} published no port; engine log tail:\n{log_tail(session.log)}",
            hint="read the engine log; check the image and the command",
        )
    events(Event("phase", "waiting for the engine to become ready"))
    try:
        session.wait_ready()
    except NotReadyError as exc:
        message = session.not_ready_message(exc)
        session.stop()
        save_evidence(plan_.serve_dir, session.log)
        raise EngineFailedError(
            message,
            hint=f"read the engine log (kept in {plan_.serve_dir / ENGINE_LOG}); the serve dir is kept",
            details={"serve_dir": str(plan_.serve_dir)},
        ) from None
    timings["start_to_ready_s"] = time.perf_counter() - t0
    events(Event("ready", f"ready in {timings['start_to_ready_s']:.1f} s", {"seconds": timings["start_to_ready_s"]}))
    return started


def _recheck_blessed_files(
    plan_: LaunchPlan, session: EngineSession, timings: dict[str, float], events: EventSink
) -> str:
    """The blessed files compared with their verified snapshot now that the engine read them (43 when changed)."""
    if plan_.snapshot is None:
        return "skipped (debug: no blessed cache)"
    t_check = time.perf_counter()
    changes = plan_.snapshot.changes()
    timings["recheck_s"] = time.perf_counter() - t_check
    if changes:
        session.stop()
        save_evidence(plan_.serve_dir, session.log)
        assert plan_.blessed_dir is not None
        raise cache_changed_error(
            changes,
            when="between verification and the engine becoming ready",
            blessed_dir=plan_.blessed_dir,
        )
    events(Event("note", f"blessed files unchanged since verification ({len(plan_.snapshot.stamps)} entries)"))
    return f"unchanged ({len(plan_.snapshot.stamps)} entries)"


def _refuse_cache_not_used(plan_: LaunchPlan, session: EngineSession) -> None:
    """Stop the engine and refuse when its boot log says it did not serve the blessed artifact as is."""
    if plan_.manifest is None:
        return
    not_used = _cache_not_used(plan_, session)
    if not_used:
        session.stop()
        save_evidence(plan_.serve_dir, session.log)
        raise CacheNotUsedError(
            "; ".join(not_used),
            hint=f"the engine log is kept in {plan_.serve_dir / ENGINE_LOG}; a config the config hash "
            "considers equal made the engine compile or key its cache differently: report it, and bless "
            "this machine's configuration (rebless)",
            details={
                "serve_dir": str(plan_.serve_dir),
                "reasons": not_used,
                "engine_log": str(plan_.serve_dir / ENGINE_LOG),
            },
            remedy="rebless_cache_not_used",
        )


def _cache_not_used(plan_: LaunchPlan, session: EngineSession) -> list[str]:
    """Why the boot log says the engine did not serve from the blessed artifact (empty: it did).

    The same reuse signals as a trial's: a load marker, no compile/save marker, and the engine's own
    cache key equal to the blessing's. Fail closed: a compile here means the served artifact is not
    the one the trials proved, whatever the canary says.
    """
    assert plan_.manifest is not None
    signals = plan_.adapter.read_log(session.current_log())
    reasons: list[str] = []
    if signals.compile_markers:
        reasons.append(
            f"the engine log shows {len(signals.compile_markers)} compile/save marker(s): it did not use the blessed "
            f"artifact as is ({signals.compile_markers[0].strip()[:200]})"
        )
    if not signals.load_markers:
        reasons.append("the engine log shows no load marker: it did not load the blessed artifact")
    blessed_keys = plan_.manifest.artifacts.get("engine_keys", {})
    reasons.extend(plan_.adapter.drift_reasons(blessed_keys, signals.engine_keys))
    # By the time it is ready the engine has compiled or loaded everything it serves with (kernels are
    # JIT-compiled during warm-up and graph capture): a compiled file outside the blessing is served unproven.
    reasons.extend(compiled_outside_reasons(plan_.adapter.classify_outside(session.outside_so_far())))
    return reasons


def _canary(plan_: LaunchPlan, session: EngineSession, *, no_canary: bool, events: EventSink) -> CanaryResult:
    """Run the canary (or say loudly why not); failures stop the engine and raise 42 or 44."""
    if plan_.manifest is None:
        reason = "debug start: no golden outputs (not a blessed start)"
        events(Event("warning", f"canary skipped: {reason}"))
        return CanaryResult("skipped", reason=reason)
    if no_canary:
        events(Event("warning", NO_CANARY_BANNER))
        return CanaryResult("skipped", reason="--no-canary")
    events(Event("phase", f"canary: {len(plan_.manifest.golden)} golden prompt(s)"))
    try:
        result = run_canary(session.client, plan_.manifest.golden)
    except EngineHttpError as exc:
        alive = session.is_alive()
        session.stop()
        save_evidence(plan_.serve_dir, session.log)
        if not alive:
            raise EngineFailedError(
                f"the engine exited during the canary ({exc.message}); engine log tail:\n{log_tail(session.log)}",
                hint=f"read the engine log (kept in {plan_.serve_dir / ENGINE_LOG})",
                details={"serve_dir": str(plan_.serve_dir)},
            ) from None
        raise CanaryFailedError(
            f"a canary request failed: {exc.message}",
            hint=f"read the engine log (kept in {plan_.serve_dir / ENGINE_LOG}); the engine was stopped",
            details={"serve_dir": str(plan_.serve_dir)},
        ) from None
    if result.status == "passed":
        events(Event("note", f"canary passed: {len(result.checks)} prompt(s) reproduced the golden token ids"))
        return result
    session.stop()
    upper = session.upper
    upper_dir = plan_.mount.scratch / "upper" if plan_.mount is not None and plan_.mount.scratch else None
    save_evidence(plan_.serve_dir, session.log, {"canary": result.to_dict(), "upper": upper_summary(upper)})
    bad = [check for check in result.checks if not check.match]
    lines = [
        f"  {check.prompt!r} (max_tokens {check.max_tokens}): {check.describe()}"
        for check in bad[:_MAX_PROBLEMS_IN_MESSAGE]
    ]
    if not result.checks:
        lines = ["  the manifest has no golden outputs"]
    written = f"{len(upper)} path(s) written" if upper else "nothing written"
    raise CanaryFailedError(
        f"{len(bad)} of {len(result.checks)} golden prompt(s) differ from the blessed output; the container "
        f"was stopped and removed\n" + "\n".join(lines) + f"\nupper layer kept: {upper_dir} ({written})",
        hint=f"do not serve this engine: the blessed cache verified but its outputs differ. Evidence in "
        f"{plan_.serve_dir} ({ENGINE_LOG}, {CANARY_FILE}, upper/); re-bless if the image or hardware changed",
        details={
            "canary": result.to_dict(),
            "serve_dir": str(plan_.serve_dir),
            "upper_dir": str(upper_dir) if upper_dir else None,
            "upper_kept": True,
            "upper_entries": upper_summary(upper),
        },
    )
