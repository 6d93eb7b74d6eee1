"""Sealed serving for ``serve-full --detach``: a watcher process of its own, alive as long as the engine.

A foreground serve-full watches its engine itself (:func:`bless.flows.serve.seal.watching`). A detached one
returns after the canary, so :func:`start_watcher` (called by :func:`~bless.flows.serve.start.start` once the
engine holds its lease) starts a small process, ``python -m bless.cli.seal_watch DOC``, in its own session,
its stdin closed and its output in the serve dir (``seal-watcher.log``). What it watches is handed over as a
JSON document, ``seal-watch.json`` in the serve dir (:class:`WatchDoc`: the store, the serve dir, the policy,
the runtime, the engine's :class:`~bless.runtime.base.Started` handle, the engine's name and the blessing's
factors, from which the adapter is specialized as the plan did): never by planning again.

The watcher (:func:`run_watcher`) first records its own process identity, in the serve dir
(``seal-watcher.json``, what ``serve-full stop`` reads to end it) and in the readiness record; the
readiness record says a watcher is expected from the start, so ``serve-full ready`` fails (46) until it
runs and again once it is gone while the engine still answers. :func:`start_watcher` waits (bounded) for
that record, and refuses the start when the watcher did not come up. Then the watcher runs the same
:class:`~bless.flows.serve.seal.SealWatcher` and :class:`~bless.flows.serve.seal.Seal` loop as a foreground
serve, until the engine is gone or it is told to end (``serve-full stop`` sends SIGTERM). Under the policy
``stop`` it stops the engine gracefully and ends the serve as ``serve-full stop`` would (readiness cleared,
container removed, lease released), keeping the serve dir as evidence.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bless.core.factors import config_hash
from bless.core.json_form import OMIT, JsonForm, as_json
from bless.engines.base import EngineAdapter
from bless.errors import BlessError, NotServingError, UnprovenCompileError
from bless.flows.engine_start import EngineSession
from bless.flows.events import Event, EventSink, ignore_events
from bless.flows.serve.ready import clear_ready, record_watcher, renew_heartbeat
from bless.flows.serve.seal import POLL_S, Seal, SealWatcher, UnprovenCompile, unproven_compile_error, watching
from bless.flows.serve.serve_dir import save_evidence
from bless.flows.serve.start import LaunchResult
from bless.flows.serve.stop import StopOutcome, stop_serving
from bless.flows.serve.watch_doc import WATCH_DOC_FORMAT, WatchDoc, load_watch_doc, watch_doc
from bless.runtime.base import ContainerStop, Runtime
from bless.runtime.local import LocalRuntime
from bless.store import Store
from bless.store.layout import StorePaths
from bless.system.durable import atomic_write_bytes
from bless.system.json_files import UnreadableJsonError, load_json_object
from bless.system.os_refusals import os_errors
from bless.system.procid import process_alive, process_identity

__all__ = [
    "WATCHER_MODULE",
    "WATCHER_START_S",
    "WATCH_DOC_FORMAT",
    "WatchDoc",
    "WatchOutcome",
    "load_watch_doc",
    "run_watcher",
    "spawn_watcher",
    "start_watcher",
    "watch_doc",
]

#: The module the watcher process runs (``python -m``): the command line's, which renders and exits.
WATCHER_MODULE = "bless.cli.seal_watch"
#: Seconds :func:`start_watcher` waits for the watcher to record itself before it refuses the start.
WATCHER_START_S = 60.0
_TICK_S = 0.05
_LOG_TAIL_CHARS = 3000

EndedBy = Literal["engine-gone", "signal", "unproven-compile"]


def _command(doc_path: Path) -> list[str]:
    return [sys.executable, "-m", WATCHER_MODULE, str(doc_path)]


def start_watcher(
    result: LaunchResult,
    runtime: Runtime,
    *,
    events: EventSink = ignore_events,
    command: Callable[[Path], Sequence[str]] = _command,
    start_s: float = WATCHER_START_S,
) -> dict[str, Any]:
    """Start the seal watcher of a detached, blessed start (:func:`spawn_watcher` of its :func:`watch_doc`)."""
    return spawn_watcher(watch_doc(result, runtime), events=events, command=command, start_s=start_s)


def spawn_watcher(
    doc: WatchDoc,
    *,
    events: EventSink = ignore_events,
    command: Callable[[Path], Sequence[str]] = _command,
    start_s: float = WATCHER_START_S,
) -> dict[str, Any]:
    """Write the watch document, start the watcher process and wait until it watches; its process identity.

    The watcher leads its own session (a signal to serve-full's group never reaches it), reads nothing
    from stdin and writes to ``seal-watcher.log`` in the serve dir. It watches once it has recorded itself
    in the readiness record (:func:`run_watcher`).

    Raises:
        NotServingError: the watcher exited, or did not record itself within ``start_s``, or could not be
            started (a watcher still running then is killed: it is this process's child).
        StoreUnavailableError: the document could not be written.
    """
    with os_errors(f"writing the seal watch document {doc.path}"):
        atomic_write_bytes(doc.path, (json.dumps(doc.to_dict(), indent=2, sort_keys=True) + "\n").encode())
    log_path = StorePaths.seal_watcher_log(doc.serve_dir)
    try:
        with log_path.open("ab") as log:
            child = subprocess.Popen(  # our own interpreter and module, a path we wrote
                list(command(doc.path)),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
    except OSError as exc:
        raise _not_started(doc, f"it could not be started ({exc})") from None
    try:
        identity = _wait_recorded(doc, child, start_s)
    except BaseException:
        if child.poll() is None:
            child.kill()
        child.wait()
        raise
    events(
        Event(
            "note",
            f"sealed: seal watcher pid {child.pid} watches the detached engine (unproven_compile = {doc.policy}); "
            f"its log: {log_path}",
            {"seal_watcher": identity},
        )
    )
    return identity


def _wait_recorded(doc: WatchDoc, child: subprocess.Popen[bytes], start_s: float) -> dict[str, Any]:
    """The watcher's identity once the readiness record names it; NotServingError when it never does."""
    deadline = time.monotonic() + start_s
    ready_file = StorePaths.of(doc.store_root).ready_file(doc.name)
    while time.monotonic() < deadline:
        code = child.poll()
        if code is not None:
            raise _not_started(doc, f"it exited with code {code}")
        with contextlib.suppress(UnreadableJsonError):
            record = load_json_object(ready_file)
            watcher = record.get("watcher") if record is not None else None
            if isinstance(watcher, dict) and watcher.get("pid") == child.pid and process_alive(watcher) is True:
                return watcher
        time.sleep(_TICK_S)
    raise _not_started(doc, f"it did not record itself within {start_s:g} s")


def _not_started(doc: WatchDoc, why: str) -> NotServingError:
    log_path = StorePaths.seal_watcher_log(doc.serve_dir)
    try:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-_LOG_TAIL_CHARS:].strip()
    except OSError:
        tail = ""
    return NotServingError(
        f"the seal watcher of the detached serve did not start: {why}; the engine was stopped, since it "
        "would serve unsealed" + (f"\nwatcher log tail:\n{tail}" if tail else ""),
        hint=f"read {log_path}; serve in the foreground (not detached), where the serve watches the engine itself",
        details={"serve_dir": str(doc.serve_dir), "reason": "not_sealed", "log": str(log_path)},
        remedy="serve_in_foreground",
    )


# -- the watcher process's body -----------------------------------------------------------------------


def _stopped_gracefully(stop: ContainerStop | None) -> bool | None:
    return None if stop is None else stop.graceful


@dataclass(frozen=True)
class WatchOutcome(JsonForm):
    """How a detached serve's watcher ended: the engine gone, a signal, or the policy ``stop``."""

    ended_by: EndedBy
    seen: tuple[UnprovenCompile, ...] = field(default=(), metadata=as_json(name="unproven_compile"))
    #: Under ``stop``: the engine's graceful stop (a container; None for a local engine) and the serve's end.
    engine_stop: ContainerStop | None = field(
        default=None, metadata=as_json(name="engine_stopped_gracefully", to_json=_stopped_gracefully)
    )
    stopped: StopOutcome | None = field(default=None, metadata=as_json(name="stop"))
    failure: UnprovenCompileError | None = field(default=None, metadata=OMIT)  # its exit code ends the watcher

    @property
    def exit_code(self) -> int:
        return int(self.failure.exit_code) if self.failure is not None else 0


def run_watcher(
    doc: WatchDoc,
    *,
    runtime: Runtime,
    adapter: EngineAdapter,
    store: Store,
    done: threading.Event,
    docker: Callable[[], Runtime],
    local: Callable[[], LocalRuntime] = LocalRuntime,
    events: EventSink = ignore_events,
    poll_s: float = POLL_S,
) -> WatchOutcome:
    """Seal the detached serve ``doc`` names until its engine is gone or ``done`` is set (a signal).

    ``runtime``: where the engine runs (rebuilt from ``doc``); ``adapter``: the engine's, specialized by the
    blessing's factors; ``docker``/``local``: what :func:`~bless.flows.serve.stop.stop_serving` is given when
    the policy ``stop`` ends the serve.

    Raises:
        NotServingError: the readiness record is gone (the serve ended before the watcher began) or cannot
            name the watcher.
    """
    identity = process_identity()
    _record_self(doc, store, identity)
    session = EngineSession(
        runtime,
        doc.started.spec,
        ready_timeout_s=0.0,
        request_timeout_s=0.0,
        stop_timeout_s=doc.stop_timeout_s,
        started=doc.started,
    )
    watcher = SealWatcher(runtime=runtime, session=session, adapter=adapter)
    policy_stop = threading.Event()
    seal = Seal(
        store=store,
        name=doc.name,
        serve_dir=doc.serve_dir,
        policy=doc.policy,
        events=events,
        stop=policy_stop,
        config_hash=config_hash(doc.factors),
    )
    engine_alive = _engine_alive(doc, runtime, events)
    events(Event("phase", f"sealing the detached serve {doc.name} (engine {doc.started.name}, pid {identity['pid']})"))
    gone = False
    with watching(watcher, seal, poll_s=poll_s, heartbeat=lambda: renew_heartbeat(store, doc.name)):
        next_check = 0.0
        while not (done.is_set() or policy_stop.is_set()):
            if time.monotonic() >= next_check:
                if not engine_alive():
                    gone = True
                    break
                next_check = time.monotonic() + poll_s
            done.wait(_TICK_S * 4)
    seen = tuple(seal.seen)
    if done.is_set():  # told to end (serve-full stop): whoever told it ends the serve
        events(Event("phase", "told to end: the watcher exits, the engine is left to serve-full stop"))
        return WatchOutcome("signal", seen)
    if seal.stop_requested:
        engine_stop, stopped = _end_the_serve(doc, session, store, runtime, docker=docker, local=local, events=events)
        return WatchOutcome("unproven-compile", seen, engine_stop, stopped, unproven_compile_error(seal))
    assert gone
    events(Event("phase", f"the engine {doc.started.name} is gone: nothing left to seal"))
    return WatchOutcome("engine-gone", seen)


def _record_self(doc: WatchDoc, store: Store, identity: Mapping[str, Any]) -> None:
    """This watcher's identity in the serve dir (for serve-full stop), then in the readiness record."""
    path = StorePaths.seal_watcher(doc.serve_dir)
    with os_errors(f"recording the seal watcher in {path}"):
        atomic_write_bytes(path, (json.dumps(dict(identity), indent=2, sort_keys=True) + "\n").encode())
    try:
        record = record_watcher(store, doc.name, identity)
    except (OSError, ValueError, BlessError) as exc:
        raise NotServingError(
            f"{doc.name}: the seal watcher could not record itself in the readiness record: {exc}",
            hint="check the store root's ready/ dir; stop the detached serve, then serve again",
            remedy="check_ready_dir_then_stop",
            details={"name": doc.name, "reason": "not_sealed"},
        ) from None
    if record is None:
        raise NotServingError(
            f"{doc.name}: no readiness record: the detached serve ended before its seal watcher started",
            hint="stopping the detached serve cleans up what is left; then serve again",
            remedy="stop_cleans_up",
            details={"name": doc.name, "reason": "no_record"},
        )


def _engine_alive(doc: WatchDoc, runtime: Runtime, events: EventSink) -> Callable[[], bool]:
    """Whether the engine still runs: a local engine by its process identity, a container by the runtime's word.

    A runtime that cannot answer (Docker restarting) counts as alive, said once: the watcher keeps looking.
    """
    holder = doc.engine_holder
    if holder is not None:
        return lambda: process_alive(holder) is not False
    failed: list[str] = []

    def container_alive() -> bool:
        try:
            return runtime.is_running(doc.started)
        except BlessError as exc:
            if not failed:
                events(Event("warning", f"cannot tell whether the engine runs ({exc.message}); still watching"))
            failed.append(exc.message)
            return True

    return container_alive


def _end_the_serve(
    doc: WatchDoc,
    session: EngineSession,
    store: Store,
    runtime: Runtime,
    *,
    docker: Callable[[], Runtime],
    local: Callable[[], LocalRuntime],
    events: EventSink,
) -> tuple[ContainerStop | None, StopOutcome]:
    """Policy ``stop``: readiness cleared first, the engine stopped gracefully, then what serve-full stop removes.

    The serve dir is kept as evidence (the unproven compiles, the engine's log).
    """
    events(Event("phase", "unproven compile (unproven_compile = stop): stopping the engine gracefully"))
    clear_ready(store, doc.name)  # no probe may pass while the engine stops
    engine_stop: ContainerStop | None = None
    if doc.engine_holder is None:  # a container: stopped here, so that its log is kept before it is removed
        engine_stop = session.stop()
        save_evidence(doc.serve_dir, session.log)
    stopped = stop_serving(
        doc.name, store=store, docker=docker, local=local, timeout_s=doc.stop_timeout_s, keep_serve_dirs=True
    )
    return engine_stop, stopped
