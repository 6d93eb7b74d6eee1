"""Sealed serving of a detached serve (bless.flows.serve.detached): the watcher process's loop, its start, its end.

The loop runs in a thread of the test against our fake runtime and a fake engine server (as in
test_serve_seal.py); the watcher's identity is then this process. Starting and ending a real watcher process
(``python -m bless.cli.seal_watch``) uses a local engine: a sleeping process in its own session.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bless.core.profile import UnprovenCompilePolicy
from bless.engines import get_adapter
from bless.errors import ExitCode, NotServingError
from bless.flows import serve
from bless.flows.serve import detached
from bless.runtime.base import Runtime
from bless.store import Store
from bless.store.layout import SERVE_UNPROVEN_COMPILES, StorePaths
from bless.system.procid import process_alive, process_identity
from tests.support.fakes import FakeEngineServer, FakeRuntime
from tests.unit.test_serve_flow import _engine
from tests.unit.test_serve_seal import SEAL_LINE, _plan, _refused, _wait_for


@pytest.fixture
def server() -> Iterator[FakeEngineServer]:
    with _engine() as engine:
        yield engine


def _no_watcher(result: serve.LaunchResult, runtime: Runtime) -> None:
    """A detached start whose watcher the test runs itself: the record still says one is expected."""


def _detached(
    store: Store, tmp_path: Path, server: FakeEngineServer, policy: UnprovenCompilePolicy
) -> tuple[serve.LaunchResult, FakeRuntime, detached.WatchDoc]:
    the_plan, runtime = _plan(store, tmp_path, server.port, policy)
    result = serve.start(the_plan, runtime=runtime, detach=True, seal_detached=_no_watcher)
    runtime.forbidden.pop("cleanup_ours", None)  # a start never cleans up; ending a serve (as serve-full stop) does
    return result, runtime, detached.watch_doc(result, runtime)


class Watching:
    """run_watcher in a thread, as the watcher process runs it (from the watch document, read back)."""

    def __init__(self, store: Store, runtime: FakeRuntime, doc: detached.WatchDoc) -> None:
        self.done = threading.Event()
        self.outcome: list[detached.WatchOutcome] = []
        self.errors: list[BaseException] = []
        doc = detached.WatchDoc.from_dict(json.loads(json.dumps(doc.to_dict())))  # what the process reads

        def body() -> None:
            try:
                outcome = detached.run_watcher(
                    doc,
                    runtime=runtime,
                    adapter=get_adapter(doc.engine).for_factors(doc.factors),
                    store=store,
                    done=self.done,
                    docker=lambda: runtime,
                    poll_s=0.2,
                )
                self.outcome.append(outcome)
            except BaseException as exc:
                self.errors.append(exc)

        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()

    def result(self, timeout_s: float = 15.0) -> detached.WatchOutcome:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the watcher did not end"
        if self.errors:
            raise self.errors[0]
        return self.outcome[0]


def test_readiness_waits_for_the_watcher_then_refuse_flips_it_to_46_and_the_engine_keeps_running(
    store: Store, tmp_path: Path, server: FakeEngineServer
) -> None:
    result, runtime, doc = _detached(store, tmp_path, server, "refuse")
    name = doc.name
    pending = _refused(store, name, runtime)
    assert pending is not None and "not started yet" in pending.message and pending.details["reason"] == "not_sealed"
    watching = Watching(store, runtime, doc)
    _wait_for(lambda: _refused(store, name, runtime) is None)  # the watcher recorded itself: ready
    watcher = serve.check_ready(store, name, docker=lambda: runtime).watcher
    assert watcher is not None and watcher["pid"] == process_identity()["pid"]
    assert watcher["proc_start"] == process_identity()["proc_start"]
    recorded = json.loads(StorePaths.seal_watcher(doc.serve_dir).read_text())
    assert recorded["pid"] == process_identity()["pid"]

    runtime.container(result.started.name).log += f"(EngineCore pid=7) {SEAL_LINE}\n"
    _wait_for(lambda: _refused(store, name, runtime) is not None)
    refusal = _refused(store, name, runtime)
    assert refusal is not None and refusal.exit_code == 46 and "fused_moe_kernel" in refusal.message
    assert runtime.container(result.started.name).running, "refuse keeps the engine up"
    events = (doc.serve_dir / SERVE_UNPROVEN_COMPILES).read_text().splitlines()
    assert [json.loads(line)["kernel"] for line in events] == ["fused_moe_kernel"]

    watching.done.set()  # serve-full stop's SIGTERM
    outcome = watching.result()
    assert (
        outcome.ended_by == "signal"
        and outcome.exit_code == 0
        and [e.kernel for e in outcome.seen] == ["fused_moe_kernel"]
    )
    assert runtime.container(result.started.name).running, "told to end, the watcher leaves the engine to stop"


def test_stop_stops_the_engine_gracefully_clears_readiness_and_keeps_the_evidence(
    store: Store, tmp_path: Path, server: FakeEngineServer
) -> None:
    result, runtime, doc = _detached(store, tmp_path, server, "stop")
    watching = Watching(store, runtime, doc)
    _wait_for(lambda: _refused(store, doc.name, runtime) is None)
    assert len(store.leases.leases()) == 1
    runtime.container(result.started.name).log += f"{SEAL_LINE}\n"
    outcome = watching.result()  # nothing else: the policy ends the serve by itself
    assert outcome.ended_by == "unproven-compile" and outcome.exit_code == ExitCode.UNPROVEN_COMPILE
    assert outcome.failure is not None and "fused_moe_kernel" in outcome.failure.message
    assert outcome.engine_stop is not None and outcome.engine_stop.graceful
    container = runtime.container(result.started.name)
    assert container.stopped and container.removed and not container.running
    assert not store.paths.ready_file(doc.name).exists(), "no readiness once the serve ended"
    assert store.leases.leases() == [], "the lease is released as serve-full stop releases it"
    assert outcome.stopped is not None and any("kept as evidence" in note for note in outcome.stopped.notes)
    assert (doc.serve_dir / SERVE_UNPROVEN_COMPILES).is_file() and (doc.serve_dir / serve.ENGINE_LOG).is_file()
    refusal = _refused(store, doc.name, runtime)
    assert refusal is not None and refusal.details["reason"] == "no_record"


def test_the_watcher_exits_when_the_engine_is_gone(store: Store, tmp_path: Path, server: FakeEngineServer) -> None:
    result, runtime, doc = _detached(store, tmp_path, server, "refuse")
    watching = Watching(store, runtime, doc)
    _wait_for(lambda: _refused(store, doc.name, runtime) is None)
    runtime.container(result.started.name).exit_code = 1  # the engine died
    outcome = watching.result(timeout_s=10)
    assert outcome.ended_by == "engine-gone" and outcome.exit_code == 0
    assert "stop" not in runtime.calls and "cleanup_ours" not in runtime.calls, "nothing else is touched"


def test_a_watcher_that_is_gone_while_the_engine_answers_is_not_sealed(
    store: Store, tmp_path: Path, server: FakeEngineServer
) -> None:
    _result, runtime, doc = _detached(store, tmp_path, server, "refuse")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = process_identity(gone.pid)
    gone.wait()
    serve.ready.record_watcher(store, doc.name, identity)
    refusal = _refused(store, doc.name, runtime)
    assert refusal is not None and refusal.exit_code == 46 and refusal.details["reason"] == "not_sealed"
    assert "not sealed" in refusal.message and f"pid {gone.pid}" in refusal.message
    recycled = {**process_identity(), "proc_start": -1}  # this pid, another start time: not the watcher
    serve.ready.record_watcher(store, doc.name, recycled)
    assert _refused(store, doc.name, runtime) is not None


def test_a_watcher_that_does_not_start_stops_the_detached_engine(
    store: Store, tmp_path: Path, server: FakeEngineServer
) -> None:
    the_plan, runtime = _plan(store, tmp_path, server.port, "refuse")

    def failing(result: serve.LaunchResult, runtime_: Runtime) -> None:
        command = [sys.executable, "-c", "import sys; print('cannot watch', file=sys.stderr); sys.exit(3)"]
        detached.start_watcher(result, runtime_, command=lambda path: command)

    with pytest.raises(NotServingError) as refused:
        serve.start(the_plan, runtime=runtime, detach=True, seal_detached=failing)
    assert "seal watcher of the detached serve did not start" in refused.value.message
    assert "cannot watch" in refused.value.message, "the watcher's log tail says why"
    assert runtime.calls[-2:] == ["stop", "remove"]
    assert not store.paths.ready_file(the_plan.profile.name).exists()
    assert store.leases.leases() == [], "the lease handed to the stopped engine is released"


def test_serve_full_stop_ends_a_real_watcher_process_before_the_local_engine(
    store: Store, tmp_path: Path, server: FakeEngineServer
) -> None:
    """python -m bless.cli.seal_watch, started as --detach starts it, then serve-full stop NAME."""
    result, runtime, doc = _detached(store, tmp_path, server, "refuse")
    assert len(store.leases.release_named(result.started.name)) == 1  # this test's engine is a local process
    engine = _engine_process()
    watcher_pid: int | None = None
    try:
        local_doc = _as_local_engine(store, result, doc, engine)
        identity = detached.spawn_watcher(local_doc, start_s=60)
        watcher_pid = identity["pid"]
        assert process_alive(identity) is True and identity["pid"] != process_identity()["pid"]
        assert serve.check_ready(store, doc.name, docker=lambda: runtime).watcher is not None  # sealed, answering
        outcome = serve.stop_serving(doc.name, store=store, docker=_no_docker, timeout_s=5)
        assert engine.wait(timeout=10) == -signal.SIGTERM
    finally:
        for process in (engine,):
            if process.poll() is None:
                process.kill()
                process.wait()
    assert outcome.stopped[0] == f"seal watcher pid {watcher_pid}", outcome
    assert f"pid {engine.pid}" in outcome.stopped
    assert process_alive(identity) is False
    assert not StorePaths.seal_watcher_log(doc.serve_dir).exists(), "the serve dir is removed with it"


def _no_docker() -> FakeRuntime:
    raise AssertionError("stopping a local engine must not need Docker")


def _make_old(path: Path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_serve_full_stop_keeps_the_evidence_of_an_unproven_compile_under_refuse_and_gc_ages_it_out(
    store: Store, tmp_path: Path, server: FakeEngineServer
) -> None:
    """The refusal's hint names unproven-compiles.jsonl: stopping the serve must not delete it."""
    result, runtime, doc = _detached(store, tmp_path, server, "refuse")
    watching = Watching(store, runtime, doc)
    _wait_for(lambda: _refused(store, doc.name, runtime) is None)
    runtime.container(result.started.name).log += f"{SEAL_LINE}\n"
    _wait_for(lambda: _refused(store, doc.name, runtime) is not None)
    watching.done.set()  # serve-full stop's SIGTERM
    watching.result()
    outcome = serve.stop_serving(doc.name, store=store, docker=lambda: runtime, timeout_s=5)
    evidence = doc.serve_dir / SERVE_UNPROVEN_COMPILES
    assert evidence.is_file(), "the evidence the refusal's hint names is kept"
    assert [json.loads(line)["kernel"] for line in evidence.read_text().splitlines()] == ["fused_moe_kernel"]
    assert str(doc.serve_dir) not in outcome.serve_dirs_removed
    assert any("kept as evidence" in note and str(doc.serve_dir) in note for note in outcome.notes), outcome
    assert store.leases.leases() == [] and not store.paths.ready_file(doc.name).exists()

    _make_old(doc.serve_dir, 2 * 3600)  # what gc removes of a serve dir without evidence
    assert doc.serve_dir not in {action.path for action in store.gc(keep=0).actions}, "kept for the next rebless"
    for path in (evidence, doc.serve_dir):
        _make_old(path, 31 * 24 * 3600)
    assert doc.serve_dir in {action.path for action in store.gc(keep=0).actions}
    assert not doc.serve_dir.exists(), "gc ages the evidence out"


def test_serve_full_stop_still_removes_a_serve_dir_without_evidence(
    store: Store, tmp_path: Path, server: FakeEngineServer
) -> None:
    _result, runtime, doc = _detached(store, tmp_path, server, "refuse")
    watching = Watching(store, runtime, doc)
    _wait_for(lambda: _refused(store, doc.name, runtime) is None)
    watching.done.set()
    watching.result()
    outcome = serve.stop_serving(doc.name, store=store, docker=lambda: runtime, timeout_s=5)
    assert outcome.serve_dirs_removed == (str(doc.serve_dir),) and not doc.serve_dir.exists()


def _as_local_engine(
    store: Store, result: serve.LaunchResult, doc: detached.WatchDoc, engine: subprocess.Popen[bytes]
) -> detached.WatchDoc:
    """The detached serve's watch doc with ``engine`` (a local process, leased as the serve) as its engine."""
    the_plan = result.plan
    assert the_plan.manifest is not None
    store.leases.acquire(
        the_plan.manifest.config_hash,
        the_plan.manifest.cache.dir_id,
        name=the_plan.container_name,
        holder=process_identity(engine.pid),
        serve_dir=the_plan.serve_dir,
    )
    started = dataclasses.replace(
        result.started,
        id=str(engine.pid),
        spec=dataclasses.replace(
            result.started.spec, mounts=tuple(m for m in result.started.spec.mounts if m.kind == "private")
        ),
    )
    return dataclasses.replace(
        doc,
        runtime_kind="local",
        started=started,
        engine_holder=process_identity(engine.pid),
        local_mount_namespace=False,
    )


def _engine_process() -> subprocess.Popen[bytes]:
    """A stand-in engine (a sleeping process) with a /dev/shm of its own where a mount namespace can be had.

    The watcher lists the engine's /dev/shm; a local engine without a namespace shares this host's, where other
    tests and programs write at any moment (a compile of nobody's, to a fail-closed seal). As root the stand-in
    gets its own tmpfs, as the local runtime gives a real engine in a namespace.
    """
    if os.geteuid() != 0:
        return subprocess.Popen(["sleep", "300"], start_new_session=True)
    engine = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         "mount -t tmpfs -o size=1m bless-test-shm /dev/shm && exec sleep 300"],
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while Path(f"/proc/{engine.pid}/cmdline").read_bytes().split(b"\0")[0] != b"sleep":
        assert engine.poll() is None and time.monotonic() < deadline, "the stand-in engine did not start"
        time.sleep(0.02)
    return engine


@contextlib.contextmanager
def _real_watcher(
    store: Store, tmp_path: Path, server: FakeEngineServer
) -> Iterator[tuple[detached.WatchDoc, dict[str, Any], FakeRuntime]]:
    """A detached serve of a local engine (a sleeping process) sealed by a real watcher process; stopped at the end."""
    result, runtime, doc = _detached(store, tmp_path, server, "refuse")
    assert len(store.leases.release_named(result.started.name)) == 1  # this engine is a local process
    engine = _engine_process()
    try:
        local_doc = _as_local_engine(store, result, doc, engine)
        identity = detached.spawn_watcher(local_doc, start_s=60)
        try:
            yield local_doc, identity, runtime
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(identity["pid"], signal.SIGCONT)
            serve.stop_serving(doc.name, store=store, docker=_no_docker, timeout_s=5)
    finally:
        if engine.poll() is None:
            engine.kill()
        engine.wait()


def test_a_frozen_watcher_is_not_sealed_its_heartbeat_goes_stale(
    store: Store, tmp_path: Path, server: FakeEngineServer
) -> None:
    """SIGSTOP leaves the watcher alive (process_alive says so) but blind: readiness needs its heartbeat."""
    with _real_watcher(store, tmp_path, server) as (doc, identity, runtime):
        heartbeat = store.paths.ready_heartbeat(doc.name)
        _wait_for(lambda: _refused(store, doc.name, runtime) is None)
        before = heartbeat.stat().st_mtime
        _wait_for(lambda: heartbeat.stat().st_mtime > before)  # renewed after every poll
        os.kill(identity["pid"], signal.SIGSTOP)
        time.sleep(1.5)  # a poll it would have made
        frozen_at = heartbeat.stat().st_mtime
        _make_old(heartbeat, serve.ready.HEARTBEAT_STALE_S + 5)  # as long as a frozen watcher leaves it
        assert process_alive(identity) is True, "alive, as a stopped process is"
        refusal = _refused(store, doc.name, runtime)
        assert refusal is not None and refusal.exit_code == 46 and refusal.details["reason"] == "not_sealed"
        assert "frozen" in refusal.message and f"pid {identity['pid']}" in refusal.message
        time.sleep(1.5)
        assert heartbeat.stat().st_mtime < frozen_at, "a stopped watcher renews nothing"
        os.kill(identity["pid"], signal.SIGCONT)
        _wait_for(lambda: _refused(store, doc.name, runtime) is None)  # it looks again: sealed again


def _edit_record(store: Store, name: str, **changes: Any) -> None:
    path = store.paths.ready_file(name)
    record = json.loads(path.read_text())
    for key, value in changes.items():
        if value is _DROP:
            record.pop(key)
        else:
            record[key] = value
    path.write_text(json.dumps(record))


_DROP = object()


def test_readiness_refuses_a_missing_or_forged_watcher_field(
    store: Store, tmp_path: Path, server: FakeEngineServer
) -> None:
    with _real_watcher(store, tmp_path, server) as (doc, _identity, runtime):
        _wait_for(lambda: _refused(store, doc.name, runtime) is None)
        original = json.loads(store.paths.ready_file(doc.name).read_text())

        _edit_record(store, doc.name, watcher=_DROP)  # no watcher field at all
        refusal = _refused(store, doc.name, runtime)
        assert refusal is not None and refusal.details["reason"] == "unreadable", refusal

        _edit_record(store, doc.name, watcher=None)  # "no watcher expected", on a detached engine's record
        refusal = _refused(store, doc.name, runtime)
        assert refusal is not None and refusal.details["reason"] == "not_sealed" and "edited" in refusal.message

        other = subprocess.Popen(["sleep", "60"])
        try:
            _edit_record(store, doc.name, watcher=process_identity(other.pid))  # a live process, not the watcher
            refusal = _refused(store, doc.name, runtime)
            assert refusal is not None and refusal.details["reason"] == "not_sealed" and "edited" in refusal.message
        finally:
            other.kill()
            other.wait()

        store.paths.ready_file(doc.name).write_text(json.dumps(original))
        assert _refused(store, doc.name, runtime) is None, "the record as the watcher wrote it is sealed"


def test_a_container_holders_record_without_a_watcher_is_not_sealed(
    store: Store, tmp_path: Path, server: FakeEngineServer
) -> None:
    _result, runtime, doc = _detached(store, tmp_path, server, "refuse")
    _edit_record(store, doc.name, watcher=None)
    refusal = _refused(store, doc.name, runtime)
    assert refusal is not None and refusal.details["reason"] == "not_sealed" and "edited" in refusal.message
