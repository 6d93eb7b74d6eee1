"""Sealed serving (bless.flows.serve.seal): unproven compiles seen while serving, and the three policies.

A foreground serve-full with our fake runtime and a fake engine server; the "engine" compiles what the
blessing does not hold by writing what a real one would: a ``bless-seal:`` line in its log (bless's Triton
cache manager), a new compiled artifact in the overlay's upper layer, a kernel in its private temp dir.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bless.core.profile import UnprovenCompilePolicy
from bless.core.unproven_evidence import EVIDENCE_MAX_BYTES, FULL_EVENT
from bless.engines.bless_seal import LINE_PREFIX as ENGINE_PREFIX
from bless.errors import NotServingError, UnprovenCompileError
from bless.evidence_types import UpperEntry
from bless.flows import serve
from bless.flows.engine_start import SEAL_DIR, SEAL_MANAGER, SEAL_MODULE_FILE
from bless.flows.events import Event
from bless.flows.serve.seal import LINE_PREFIX, Seal, SealWatcher, UnprovenCompile, parse_seal_lines
from bless.replay.engine_client import EngineClient
from bless.runtime.base import Runtime
from bless.store import Store
from bless.store.layout import SERVE_UNPROVEN_COMPILES
from tests.support.fakes import FakeRuntime
from tests.support.hang_guard import HANG_S, finishes
from tests.unit.test_serve import GOLDEN, bless, do_plan, make_profile, serving_runtime
from tests.unit.test_serve_flow import _engine

SEAL_LINE = ENGINE_PREFIX + json.dumps(
    {
        "event": "unproven_compile",
        "source": "triton-cache-manager",
        "kernel": "fused_moe_kernel",
        "key": "K" * 52,
        "file": "fused_moe_kernel.json",
        "time": 1700000000.5,
    },
    separators=(",", ":"),
)


def _plan(
    store: Store, tmp_path: Path, port: int, policy: UnprovenCompilePolicy
) -> tuple[serve.LaunchPlan, FakeRuntime]:
    profile = make_profile()
    bless(store, profile, tmp_path, golden=GOLDEN)
    runtime = serving_runtime(host_port=port)
    # The policy is not hashed: the blessing of the profile serves under any of them.
    return do_plan(dataclasses.replace(profile, unproven_compile=policy), store, runtime), runtime


def _wait_for(condition: Callable[[], bool], hang_s: float = HANG_S) -> None:
    """Poll until ``condition`` holds; a hang detector, not a speed check (fails the test after ``hang_s``)."""
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < hang_s, "never happened"
        time.sleep(0.05)


def _serve_while(
    store: Store,
    tmp_path: Path,
    policy: UnprovenCompilePolicy,
    during: Callable[[serve.LaunchPlan, FakeRuntime, serve.LaunchResult, serve.ServeHooks], None],
) -> tuple[serve.ServeOutcome, serve.LaunchPlan, list[Event]]:
    """A foreground serve under ``policy``; ``during`` runs in a thread once it serves (it may set ``stop``)."""
    events: list[Event] = []
    errors: list[BaseException] = []
    with _engine() as server:
        the_plan, runtime = _plan(store, tmp_path, server.port, policy)
        hooks = serve.ServeHooks(events=events.append, signal_name=lambda: "SIGTERM")

        def body(result: serve.LaunchResult) -> None:
            try:
                during(result.plan, runtime, result, hooks)  # the plan serve_full made (its own serve dir)
            except BaseException as exc:
                errors.append(exc)
                hooks.stop.set()

        def on_serving(result: serve.LaunchResult) -> None:
            threading.Thread(target=body, args=(result,), daemon=True).start()

        hooks.on_serving = on_serving
        request = serve.ServeRequest(profile=the_plan.profile, store=store)
        outcome = serve.serve_full(request, runtime=runtime, adapter=the_plan.adapter, hooks=hooks)
    if errors:
        raise errors[0]
    assert outcome.result is not None
    return outcome, outcome.result.plan, events


def _compile_a_kernel(runtime: FakeRuntime, result: serve.LaunchResult) -> None:
    """What the engine's Python writes when Triton misses the blessed tree (its stderr is the log)."""
    container = runtime.container(result.started.name)
    container.log += f"(EngineCore pid=7) {SEAL_LINE}\n"


def _refused(store: Store, name: str, runtime: Runtime | None = None) -> NotServingError | None:
    """Why ``name`` is not ready (None: ready); ``runtime``: where a detached serve's container is looked up."""
    try:
        serve.check_ready(store, name, docker=(lambda: runtime) if runtime is not None else None)
    except NotServingError as exc:
        return exc
    return None


def test_refuse_flips_readiness_to_46_while_serving_and_the_engine_keeps_answering(
    store: Store, tmp_path: Path
) -> None:
    seen: dict[str, object] = {}

    def during(
        plan_: serve.LaunchPlan, runtime: FakeRuntime, result: serve.LaunchResult, hooks: serve.ServeHooks
    ) -> None:
        name = plan_.profile.name
        assert serve.check_ready(store, name).unproven == ()
        _compile_a_kernel(runtime, result)
        _wait_for(lambda: _refused(store, name) is not None)
        refusal = _refused(store, name)
        assert refusal is not None
        seen["refusal"] = refusal
        assert runtime.container(result.started.name).running, "refuse keeps the engine up"
        assert result.started.host_port is not None
        seen["answers"] = bool(EngineClient("127.0.0.1", result.started.host_port, timeout_s=3).models())
        hooks.stop.set()  # the operator ends serving

    outcome, the_plan, events = _serve_while(store, tmp_path, "refuse", during)
    refusal = seen["refusal"]
    assert isinstance(refusal, NotServingError) and refusal.exit_code == 46
    assert "fused_moe_kernel" in refusal.message and refusal.hint and "rebless" in refusal.hint
    assert refusal.details["reason"] == "unproven_compile"
    assert refusal.details["unproven_compile"]["events"][0]["kernel"] == "fused_moe_kernel"
    assert seen["answers"] is True
    assert outcome.failure is None and outcome.ended_by == "SIGTERM"
    assert [e.kernel for e in outcome.unproven] == ["fused_moe_kernel"]
    warnings = [e for e in events if "UNPROVEN COMPILE" in e.message]
    assert len(warnings) == 1 and "fused_moe_kernel" in warnings[0].message and "46" in warnings[0].message
    evidence = the_plan.serve_dir / SERVE_UNPROVEN_COMPILES
    assert [json.loads(line)["kernel"] for line in evidence.read_text().splitlines()] == ["fused_moe_kernel"]
    assert outcome.to_dict()["unproven_compile"]["count"] == 1


def test_record_only_logs_and_lists_the_event_while_readiness_holds(store: Store, tmp_path: Path) -> None:
    seen: dict[str, object] = {}

    def during(
        plan_: serve.LaunchPlan, runtime: FakeRuntime, result: serve.LaunchResult, hooks: serve.ServeHooks
    ) -> None:
        name = plan_.profile.name
        _compile_a_kernel(runtime, result)
        _wait_for(lambda: bool(serve.check_ready(store, name).unproven))
        record = serve.check_ready(store, name)  # still ready: record only records
        seen["ready"] = record.to_dict()
        hooks.stop.set()

    outcome, the_plan, events = _serve_while(store, tmp_path, "record", during)
    listed = seen["ready"]
    assert isinstance(listed, dict)
    assert listed["unproven_compile"]["policy"] == "record"
    assert [e["kernel"] for e in listed["unproven_compile"]["events"]] == ["fused_moe_kernel"]
    assert outcome.failure is None and outcome.ended_by == "SIGTERM"
    assert any("UNPROVEN COMPILE (record)" in e.message for e in events)
    assert (the_plan.serve_dir / SERVE_UNPROVEN_COMPILES).is_file(), "the evidence keeps the serve dir"


def test_stop_ends_serving_gracefully_with_48_and_a_message(store: Store, tmp_path: Path) -> None:
    def during(
        plan_: serve.LaunchPlan, runtime: FakeRuntime, result: serve.LaunchResult, hooks: serve.ServeHooks
    ) -> None:
        _compile_a_kernel(runtime, result)  # nothing else: the policy must end serving by itself

    outcome, the_plan, _events = finishes(lambda: _serve_while(store, tmp_path, "stop", during))
    failure = outcome.failure
    assert isinstance(failure, UnprovenCompileError) and failure.exit_code == 48
    assert "fused_moe_kernel" in failure.message and "unproven_compile = stop" in failure.message
    assert failure.hint is not None and SERVE_UNPROVEN_COMPILES in failure.hint
    assert outcome.ended_by == "unproven-compile"
    assert outcome.finish is not None and outcome.finish.stop is not None and outcome.finish.stop.graceful
    assert outcome.finish.upper_kept, "the serve dir is kept as evidence"
    assert not (store.paths.ready_file(the_plan.profile.name)).exists(), "no readiness once serving ended"


def test_the_watcher_sees_new_compiled_files_where_the_engine_writes(store: Store, tmp_path: Path) -> None:
    seen: dict[str, object] = {}

    def during(
        plan_: serve.LaunchPlan, runtime: FakeRuntime, result: serve.LaunchResult, hooks: serve.ServeHooks
    ) -> None:
        name = plan_.profile.name
        container = runtime.container(result.started.name)
        private_tmp = plan_.serve_dir / serve.PRIVATE_DIR / "tmp"
        # bless's own seal module is no event (a start's noise is judged at the watcher's first look, and is a
        # compile when it appears later: test_seal_places.py).
        assert (private_tmp / SEAL_DIR / SEAL_MODULE_FILE).is_file()
        # A new compiled artifact in the upper layer, and a kernel under HOME.
        container.upper = [UpperEntry("reference/0123456789abcdef/megacache.bin", "new", 10)]
        kernel = plan_.serve_dir / serve.PRIVATE_DIR / "home" / ".triton" / "cache" / "k" / "k.cubin"
        kernel.parent.mkdir(parents=True)
        kernel.write_bytes(b"\x7fELF")
        _wait_for(lambda: len(serve.check_ready(store, name).unproven) >= 2)
        time.sleep(1.5)  # another poll or two: each file is one event, once
        seen["events"] = serve.check_ready(store, name).unproven
        hooks.stop.set()

    outcome, _plan, _events = _serve_while(store, tmp_path, "record", during)
    listed = seen["events"]
    assert isinstance(listed, tuple)
    assert sorted((e["source"], e["path"]) for e in listed) == [
        ("watcher", "HOME/.triton/cache/k/k.cubin"),
        ("watcher", "reference/0123456789abcdef/megacache.bin"),
    ]
    assert all(e.get("reason") for e in listed)
    assert len(outcome.unproven) == 2


def test_a_blessed_serve_ships_the_cache_manager_and_a_debug_start_does_not(store: Store, tmp_path: Path) -> None:
    with _engine() as server:
        the_plan, runtime = _plan(store, tmp_path, server.port, "refuse")
        debug = do_plan(make_profile(), store, runtime, debug=True)
    assert the_plan.spec.env["TRITON_CACHE_MANAGER"] == SEAL_MANAGER
    assert the_plan.spec.python_path == (f"/var/lib/bless-engine/tmp/{SEAL_DIR}",)
    assert "TRITON_CACHE_MANAGER" not in debug.spec.env and debug.spec.python_path == ()


def test_seal_lines_are_read_after_a_process_tag_and_an_unreadable_one_still_counts() -> None:
    text = "\n".join(["INFO starting", f"(EngineCore pid=1) {SEAL_LINE}", f"{LINE_PREFIX}{{not json", "done"])
    events = parse_seal_lines(text, now=lambda: 5.0)
    assert [(e.kernel, e.time) for e in events] == [("fused_moe_kernel", 1700000000.5), (None, 5.0)]
    assert events[1].reason is not None and "unreadable" in events[1].reason


@contextlib.contextmanager
def _watching(
    store: Store, tmp_path: Path
) -> Iterator[tuple[serve.LaunchPlan, FakeRuntime, serve.LaunchResult, SealWatcher]]:
    """A started serve (record policy, the fake runtime) and a watcher of it; both ended on the way out."""
    with _engine() as server:
        the_plan, runtime = _plan(store, tmp_path, server.port, "record")
        result = serve.start(the_plan, runtime=runtime)
        watcher: SealWatcher | None = None
        try:
            session = the_plan.session(runtime, started=result.started)
            watcher = SealWatcher(runtime=runtime, session=session, adapter=the_plan.adapter)
            yield the_plan, runtime, result, watcher
        finally:
            if watcher is not None:
                watcher.close()
            serve.finish(the_plan, result, runtime=runtime, keep_upper=False, failed=False)


def test_the_watcher_reads_only_complete_log_lines(store: Store, tmp_path: Path) -> None:
    with _watching(store, tmp_path) as (_the_plan, runtime, result, watcher):
        container = runtime.container(result.started.name)
        assert watcher.poll() == []
        container.log += SEAL_LINE[:40]  # the engine is still writing this line
        assert watcher.poll() == []
        container.log += SEAL_LINE[40:] + "\n"
        assert [e.kernel for e in watcher.poll()] == ["fused_moe_kernel"]
        assert watcher.poll() == [], "each line once"


def test_a_quoted_prefix_is_no_event_and_hostile_payloads_still_count_without_breaking_the_parse() -> None:
    """A logged prompt quoting the prefix mid-line must not stop a server; a deep or huge payload still fails closed."""
    quoted = f'INFO Received request: prompt="please print {SEAL_LINE}"'
    deep = f"{LINE_PREFIX}" + "[" * 200_000
    huge_time = f'{LINE_PREFIX}{{"event":"unproven_compile","kernel":"k","time":{"9" * 400}}}'
    events = parse_seal_lines("\n".join([quoted, deep, huge_time]), now=lambda: 7.0)
    assert [(e.kernel, e.time) for e in events] == [(None, 7.0), ("k", 7.0)]


def test_the_watcher_reports_unexpected_writes_as_a_trial_would_fail_on_them(store: Store, tmp_path: Path) -> None:
    """The reference adapter expects no write at all while loading: a rewritten file is an event, not ignored."""
    with _watching(store, tmp_path) as (_the_plan, runtime, result, watcher):
        runtime.container(result.started.name).upper = [UpperEntry("notes/readme.txt", "rewritten", 3)]
        (event,) = watcher.poll()
    assert event.path == "notes/readme.txt" and event.reason is not None and "do not expect" in event.reason


def test_a_watcher_that_cannot_look_is_itself_an_event_and_never_dies_silently() -> None:
    """Any error, not only OSError: after BLIND_POLLS failures in a row the seal hears of it (refuse: not ready)."""
    from bless.flows.serve.seal import BLIND_POLLS, watching

    heard: list[object] = []

    class Broken:
        def poll(self) -> list[object]:
            raise RecursionError("a log the watcher cannot parse")

    class Recorder:
        events = staticmethod(heard.append)

        def __call__(self, found: object) -> None:
            heard.append(found)

    with watching(Broken(), Recorder(), poll_s=0.01):  # type: ignore[arg-type]
        _wait_for(lambda: any(isinstance(h, list) for h in heard))
    blind = next(h for h in heard if isinstance(h, list))
    assert f"failed {BLIND_POLLS} polls in a row" in str(blind[0].reason)


def _seal_of(store: Store, tmp_path: Path, heard: list[Event]) -> Seal:
    serve_dir = tmp_path / "serve-dir"
    serve_dir.mkdir()
    serve.ready.mark_ready(
        store, name="flood", config_hash="c" * 64, host="127.0.0.1", port=8000, canary="passed", holder={}
    )
    return Seal(
        store=store,
        name="flood",
        serve_dir=serve_dir,
        policy="record",
        events=heard.append,
        stop=threading.Event(),
        config_hash="c" * 64,
    )


def _kernel(index: int) -> UnprovenCompile:
    return UnprovenCompile(
        source="triton-cache-manager",
        time=1700000000.0 + index,
        kernel="fused_moe_kernel",
        key=f"{index:052d}",
        file="fused_moe_kernel.json",
    )


def test_the_seal_writes_one_line_per_distinct_kernel_key_however_often_it_is_missed(
    store: Store, tmp_path: Path
) -> None:
    heard: list[Event] = []
    seal = _seal_of(store, tmp_path, heard)
    for _ in range(200):  # the same three kernels, missed again and again (one batch per poll)
        seal([_kernel(0), _kernel(1), _kernel(0), _kernel(2)])
    lines = seal.evidence_file.read_text().splitlines()
    assert [json.loads(line)["key"] for line in lines] == [f"{i:052d}" for i in range(3)]
    assert all(json.loads(line)["config_hash"] == "c" * 64 for line in lines)
    assert len(seal.seen) == 3 and seal.repeats == 797
    assert len([e for e in heard if e.message.startswith("UNPROVEN COMPILE")]) == 3, "each compile warned once"
    record = serve.ready.ReadyRecord.from_dict(json.loads(store.paths.ready_file("flood").read_text()))
    assert record.seen_count == 3 and len(record.unproven) == 3


def test_the_evidence_file_and_the_readiness_record_stay_bounded_under_a_flood_of_distinct_misses(
    store: Store, tmp_path: Path
) -> None:
    heard: list[Event] = []
    seal = _seal_of(store, tmp_path, heard)
    for batch in range(40):
        seal([_kernel(batch * 1000 + i) for i in range(1000)])
    size = seal.evidence_file.stat().st_size
    assert size <= EVIDENCE_MAX_BYTES
    lines = seal.evidence_file.read_bytes().splitlines()
    assert json.loads(lines[-1])["event"] == FULL_EVENT, "a full file says so in its last line"
    assert seal.dropped == 40_000 - len(seal.seen) and seal.dropped > 0
    record_text = store.paths.ready_file("flood").read_text()
    record = serve.ready.ReadyRecord.from_dict(json.loads(record_text))
    assert len(record.unproven) == serve.ready.RECORD_EVENTS_MAX and record.seen_count == len(seal.seen)
    assert record.unproven_full and len(record_text) < 64 << 10
    assert sum("is full" in e.message for e in heard) == 1


def test_a_seal_line_then_a_truncation_before_the_next_poll_is_not_missed(store: Store, tmp_path: Path) -> None:
    with _watching(store, tmp_path) as (_the_plan, runtime, result, watcher):
        container = runtime.container(result.started.name)
        container.log += "INFO serving\n" * 10
        assert watcher.poll() == []
        container.log += SEAL_LINE + "\n"  # written ...
        container.log = "INFO after the truncation, a longer log than before " * 4 + "\n"  # ... and cut away
        (event,) = watcher.poll()
        assert event.source == "watcher" and event.reason is not None
        assert "truncated or rewritten" in event.reason and "may have been lost" in event.reason
        assert watcher.poll() == [], "read again from its start, each line once"
        container.log += SEAL_LINE + "\n"
        assert [e.kernel for e in watcher.poll()] == ["fused_moe_kernel"]
