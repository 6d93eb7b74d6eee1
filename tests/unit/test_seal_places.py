"""The seal watches every writable place the engine has, and what a start writes is a compile while serving.

Sealed serving left readiness at 0 while the engine wrote new ``.so`` files into the temp dir's
``bless-inductor-*``, a ``.pyc`` into a ``__pycache__``, or anything into ``/dev/shm``: the first two were noise
whenever they appeared (they are a start's: Inductor's scratch filled by the load, bytecode of imports), and
``/dev/shm`` was not looked at. Now the watcher's first look is the start's (noise stays noise there); the same
writes later are compiles nobody proved; the engine's ``/dev/shm`` is listed by the runtime (Docker: an exec in
the container, a tmpfs ``docker diff`` does not show; local: the engine's own view, a private tmpfs in a mount
namespace). In copy mode (a pod) the private HOME and temp dir are copies the engine writes into while it runs:
the watcher lists those copies, not only the sources the stop brings the writes back to.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import pytest

from bless import container_labels as labels
from bless.core.profile import UnprovenCompilePolicy
from bless.engines.base import SHARED_MEMORY_RULE, classify_outside
from bless.engines.reference import OUTSIDE_RULES, ReferenceAdapter
from bless.engines.vllm.adapter import VllmAdapter
from bless.evidence_types import OutsideEntry
from bless.flows import serve
from bless.flows.engine_start import EngineSession, list_private
from bless.runtime.base import ContainerSpec, Mount
from bless.runtime.local import LocalRuntime
from bless.store import Store
from tests.support.fakes import FakeRuntime
from tests.unit.test_serve_flow import _engine
from tests.unit.test_serve_seal import _plan, _refused, _serve_while, _wait_for, _watching


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "root")


def _write(path: Path, data: bytes = b"x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_a_starts_writes_are_noise_at_the_first_look_and_compiles_after_it(store: Store, tmp_path: Path) -> None:
    with _watching(store, tmp_path) as (the_plan, runtime, result, watcher):
        container = runtime.container(result.started.name)
        tmp = the_plan.serve_dir / serve.PRIVATE_DIR / "tmp"
        # What the start wrote: its Inductor scratch, bytecode of its imports, a shared-memory segment.
        _write(tmp / "bless-inductor-abc" / "fx" / "c.so")
        _write(tmp / "lib" / "__pycache__" / "mod.cpython-311.pyc")
        container.shm = ["/dev/shm/psm_start"]
        assert watcher.poll() == [], "the start's own writes are noise at the first look"
        # The same kinds of writes while serving, and anything in /dev/shm.
        _write(tmp / "bless-inductor-abc" / "fx" / "new.so")
        _write(tmp / "lib" / "__pycache__" / "late.cpython-311.pyc")
        container.shm = ["/dev/shm/psm_start", "/dev/shm/psm_late", "/dev/shm/x/inductor/k.so"]
        found = watcher.poll()
        assert watcher.poll() == [], "each write is one event, once"
    assert sorted(event.path or "" for event in found) == [
        "/dev/shm/psm_late",
        "/dev/shm/x/inductor/k.so",
        "TMPDIR/bless-inductor-abc/fx/new.so",
        "TMPDIR/lib/__pycache__/late.cpython-311.pyc",
    ]
    reasons = {event.path: event.reason or "" for event in found}
    assert "written while serving" in reasons["TMPDIR/bless-inductor-abc/fx/new.so"]
    assert "named by no rule" in reasons["/dev/shm/x/inductor/k.so"]


@pytest.mark.parametrize(
    "write",
    ["TMPDIR/bless-inductor-x/kernel.so", "TMPDIR/x/__pycache__/m.cpython-311.pyc", "/dev/shm/anything"],
    ids=["inductor-scratch", "pyc", "dev-shm"],
)
def test_refuse_fails_readiness_with_46_for_each(store: Store, tmp_path: Path, write: str) -> None:
    policy: UnprovenCompilePolicy = "refuse"

    def during(
        plan_: serve.LaunchPlan, runtime: FakeRuntime, result: serve.LaunchResult, hooks: serve.ServeHooks
    ) -> None:
        name = plan_.profile.name
        time.sleep(1.5)  # the watcher's first look (the start's) is done
        assert serve.check_ready(store, name).unproven == ()
        if write.startswith("/dev/shm/"):
            runtime.container(result.started.name).shm = [write]
        else:
            _write(plan_.serve_dir / serve.PRIVATE_DIR / "tmp" / write.removeprefix("TMPDIR/"))
        _wait_for(lambda: _refused(store, name) is not None)
        refusal = _refused(store, name)
        assert refusal is not None and int(refusal.exit_code) == 46
        hooks.stop.set()

    outcome, _the_plan, _events = _serve_while(store, tmp_path, policy, during)
    assert [event.path for event in outcome.unproven] == [write]


def test_both_adapters_judge_shared_memory_alike() -> None:
    """A flat segment is a start's noise; a kernel-named file or a directory tree there never is."""
    segment = OutsideEntry("container", "/dev/shm/psm_1a2b")
    kernel = OutsideEntry("container", "/dev/shm/k.so")
    tree = OutsideEntry("container", "/dev/shm/x/fxgraph/entry")
    for adapter in (ReferenceAdapter(), VllmAdapter()):
        at_start = adapter.classify_outside([segment, kernel, tree])
        assert at_start.noise == (f"/dev/shm/psm_1a2b: {SHARED_MEMORY_RULE.reason}",)
        assert len(at_start.compiled) == 2
        assert len(adapter.classify_outside([segment], serving=True).compiled) == 1
    assert classify_outside(OUTSIDE_RULES, [segment], serving=True).noise == ()


def _spec(tmp_path: Path, command: str, mounts: tuple[Mount, ...] = ()) -> ContainerSpec:
    name = f"bless-unit-{uuid.uuid4().hex[:8]}"
    return ContainerSpec(
        name=name,
        command=(sys.executable, "-c", command),
        env={},
        labels=labels.labels_for(run_id="places", phase=labels.PHASE_SERVE, config_hash="0" * 64, profile="unit"),
        log_path=tmp_path / f"{name}.log",
        mounts=mounts,
    )


_WRITE_AND_WAIT = """
import sys, time
from pathlib import Path
for path in sys.argv[1:]:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(b"k")
Path(sys.argv[1]).with_name("done").write_text("")
time.sleep(600)
"""


def _wait_file(path: Path) -> None:
    _wait_for(path.exists, hang_s=60)


def test_copy_mode_watches_the_copies_the_engine_writes_into(tmp_path: Path) -> None:
    """A pod: HOME and temp are copies at their targets; the watcher lists them while the engine runs."""
    private = tmp_path / "serve" / "private"
    (private / "home").mkdir(parents=True)
    (private / "tmp").mkdir()
    home, tmp = tmp_path / "state" / "home", tmp_path / "state" / "tmp"
    mounts = (Mount("private", private / "home", str(home)), Mount("private", private / "tmp", str(tmp)))
    kernel = home / ".triton" / "cache" / "k" / "k.cubin"
    scratch = tmp / "bless-inductor-1" / "late.so"
    spec = _spec(tmp_path, _WRITE_AND_WAIT, mounts)
    spec = ContainerSpec(**{**spec.__dict__, "command": (*spec.command, str(kernel), str(scratch))})
    runtime = LocalRuntime(use_mount_namespace=False)
    session = EngineSession(runtime, spec, ready_timeout_s=5, request_timeout_s=5, stop_timeout_s=5)
    with session:
        _wait_file(kernel.with_name("done"))
        assert list_private(private) == [], "nothing is in the sources while the engine runs"
        shown = sorted(entry.shown for entry in session.outside_so_far())
    assert shown == ["HOME/.triton/cache/k/done", "HOME/.triton/cache/k/k.cubin", "TMPDIR/bless-inductor-1/late.so"]
    assert sorted(entry.shown for entry in session.outside) == shown, "after the stop: the same, from the sources"


def _writer(tmp_path: Path, done: Path, *paths: str) -> ContainerSpec:
    """An engine that writes ``paths`` (``done``'s sibling ``x`` first, then ``done``), then waits to be stopped."""
    spec = _spec(tmp_path, _WRITE_AND_WAIT)
    return ContainerSpec(**{**spec.__dict__, "command": (*spec.command, str(done.with_name("x")), *paths)})


@pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root on Linux")
def test_a_local_engine_in_a_namespace_gets_its_own_dev_shm_and_it_is_listed(tmp_path: Path) -> None:
    marker = f"bless-unit-{uuid.uuid4().hex[:8]}"
    runtime = LocalRuntime(use_mount_namespace=True)
    done = tmp_path / "flag" / "done"
    started = runtime.start(_writer(tmp_path, done, f"/dev/shm/{marker}/k.so"))
    try:
        _wait_file(done)
        listed = runtime.shm_entries(started)
        assert [entry.path for entry in listed] == [f"/dev/shm/{marker}/k.so"], "its own tmpfs: nothing else"
        assert not os.path.lexists(f"/dev/shm/{marker}"), "the host's /dev/shm is not the engine's"
    finally:
        runtime.stop(started, 5)
        runtime.remove(started)
    assert runtime.shm_entries(started) == []


def test_a_local_engine_in_copy_mode_shares_this_dev_shm_and_it_is_listed(tmp_path: Path) -> None:
    marker = f"bless-unit-{uuid.uuid4().hex[:8]}"
    runtime = LocalRuntime(use_mount_namespace=False)
    done = tmp_path / "flag" / "done"
    started = runtime.start(_writer(tmp_path, done, f"/dev/shm/{marker}.seg"))
    try:
        _wait_file(done)
        assert f"/dev/shm/{marker}.seg" in [entry.path for entry in runtime.shm_entries(started)]
    finally:
        runtime.stop(started, 5)
        runtime.remove(started)
        Path(f"/dev/shm/{marker}.seg").unlink(missing_ok=True)


def test_a_sealed_start_writes_no_bytecode_and_a_debug_start_is_left_alone(store: Store, tmp_path: Path) -> None:
    """An image installed without bytecode (uv's default) would write a .pyc per module a request imports first:
    sealed starts turn that off, so a .pyc that appears while serving is the anomaly the watcher reports."""
    with _engine() as server:
        the_plan, _runtime = _plan(store, tmp_path, server.port, "refuse")
    assert the_plan.spec.env["PYTHONDONTWRITEBYTECODE"] == "1"
    debug = serve.plan(
        the_plan.profile, store=store, runtime=_runtime, adapter=the_plan.adapter, gpu_probe=lambda: [], debug=True
    )
    assert "PYTHONDONTWRITEBYTECODE" not in debug.spec.env
