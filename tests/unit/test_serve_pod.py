"""serve-full in a pod: the verified copy, the readiness record behind ``serve-full ready``, the termination log.

The copy mode runs for real (``LocalRuntime(use_mount_namespace=False)``, a real subprocess), as a pod
without CAP_SYS_ADMIN gets it; the readiness record is checked against a real HTTP engine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bless import container_labels as labels
from bless.cli import boundary
from bless.cli.boundary import Report
from bless.errors import CanaryFailedError, ExitCode, NotServingError, StoreUnavailableError, VerifyFailedError
from bless.flows import serve
from bless.flows.serve.checks import verify_copy
from bless.runtime.base import ContainerSpec, Mount
from bless.runtime.local import LocalRuntime
from bless.store import Store
from bless.system.procid import process_identity
from tests.support.fakes import FakeEngineServer, openai_engine
from tests.unit.store_helpers import make_manifest, write_tree
from tests.unit.test_serve import GOLDEN, _blessed_plan

# -- the verified copy --------------------------------------------------------------------------------


def test_verify_copy_passes_an_exact_copy_even_though_it_is_writable(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "blessed")
    manifest = make_manifest(tree)
    copy = tmp_path / "copy"
    shutil.copytree(tree, copy)
    copy.chmod(0o777)  # an emptyDir: writable by all, and the engine writes into the copy on purpose
    verify_copy(manifest, tree, copy)


@pytest.mark.parametrize("tamper", ["rewrite", "extra", "missing"])
def test_verify_copy_refuses_a_copy_that_is_not_the_blessing(tmp_path: Path, tamper: str) -> None:
    tree = write_tree(tmp_path / "blessed")
    manifest = make_manifest(tree)
    copy = tmp_path / "copy"
    shutil.copytree(tree, copy)
    if tamper == "rewrite":
        (copy / "artifact.bin").write_bytes(b"not what was blessed")
    elif tamper == "extra":
        (copy / "nested" / "planted.so").write_bytes(b"x")
    else:
        (copy / "nested" / "deep" / "kernel.so").unlink()
    with pytest.raises(VerifyFailedError) as excinfo:
        verify_copy(manifest, tree, copy)
    assert excinfo.value.exit_code == ExitCode.VERIFY_FAILED
    assert "the copy the engine would read is not the verified blessing" in excinfo.value.message


def _spec(tmp_path: Path, mount: Mount) -> ContainerSpec:
    return ContainerSpec(
        name="pod-engine",
        command=(sys.executable, "-c", "import time; time.sleep(30)"),
        env={},
        labels=labels.labels_for(run_id="r1", phase=labels.PHASE_SERVE, config_hash="0" * 64, profile="pod"),
        mounts=(mount,),
        log_path=tmp_path / "engine.log",
    )


def test_the_copy_mode_checks_the_copy_before_the_engine_starts_and_undoes_it_on_refusal(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "blessed")
    target = tmp_path / "cache-path"
    target.mkdir()  # the pod's emptyDir at the pinned cache path
    seen: list[Path] = []

    def refuse(copy: Path) -> None:
        seen.append(copy)
        assert (copy / "artifact.bin").read_bytes() == (tree / "artifact.bin").read_bytes()
        raise VerifyFailedError("planted")

    runtime = LocalRuntime(use_mount_namespace=False)
    assert runtime.copies_mounts
    mount = Mount("overlay", tree, str(target), scratch=tmp_path / "scratch", check_copy=refuse)
    with pytest.raises(VerifyFailedError):
        runtime.start(_spec(tmp_path, mount))
    assert seen == [target]
    assert target.is_dir() and list(target.iterdir()) == [], "the refused copy is removed, the emptyDir stays"
    assert not (tmp_path / "engine.log").exists(), "no engine was started"


def test_the_copy_mode_starts_the_engine_on_a_copy_that_passed(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "blessed")
    target = tmp_path / "cache-path"
    checked: list[Path] = []
    runtime = LocalRuntime(use_mount_namespace=False)
    mount = Mount("overlay", tree, str(target), scratch=tmp_path / "scratch", check_copy=checked.append)
    started = runtime.start(_spec(tmp_path, mount))
    try:
        assert checked == [target] and runtime.is_running(started)
    finally:
        runtime.stop(started, 5)
        runtime.remove(started)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)")
def test_the_namespace_probe_sees_what_unshare_can_do() -> None:
    """Root is not enough (a pod without CAP_SYS_ADMIN): the probe asks unshare itself."""
    from bless.runtime.local import _mount_namespace_possible

    can = subprocess.run(["unshare", "--mount", "true"], check=False, capture_output=True).returncode == 0
    assert _mount_namespace_possible() is can


def test_a_plan_on_a_copying_runtime_verifies_the_copy_and_says_so(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    store.paths.ensure_layout()
    with FakeEngineServer(openai_engine(lambda prompt, n: [0])) as server:
        plan, runtime = _blessed_plan(store, tmp_path, server.port)
    assert plan.mount is not None and plan.mount.check_copy is None
    mount = plan.to_dict()["mount"]
    assert mount is not None and str(mount["presented_as"]).startswith("overlay")
    runtime.copies_mounts = True  # as the local runtime without a mount namespace
    plan = serve.plan(plan.profile, store=store, runtime=runtime, adapter=plan.adapter, allow_test_knobs=True)
    assert plan.mount is not None and plan.mount.check_copy is not None
    mount = plan.to_dict()["mount"]
    assert mount is not None and str(mount["presented_as"]).startswith("verified copy")
    assert plan.blessed_dir is not None
    copy = tmp_path / "copy"
    shutil.copytree(plan.blessed_dir, copy)
    plan.mount.check_copy(copy)  # the blessing itself passes
    next(p for p in copy.rglob("*") if p.is_file()).write_bytes(b"tampered")
    with pytest.raises(VerifyFailedError):
        plan.mount.check_copy(copy)


# -- the readiness record -----------------------------------------------------------------------------


def _mark(store: Store, port: int, **changes: Any) -> None:
    record: dict[str, Any] = {
        "name": "pod",
        "config_hash": "0" * 64,
        "host": "127.0.0.1",
        "port": port,
        "canary": "passed",
        "holder": process_identity(),
        **changes,
    }
    serve.mark_ready(store, **record)


def _reason(store: Store, **kwargs: Any) -> str:
    with pytest.raises(NotServingError) as excinfo:
        serve.check_ready(store, "pod", **kwargs)
    assert int(excinfo.value.exit_code) == int(ExitCode.NOT_SERVING) == 46
    return str(excinfo.value.details["reason"])


def test_ready_only_with_a_record_a_live_holder_and_an_answering_engine(store: Store) -> None:
    assert _reason(store) == "no_record"
    with FakeEngineServer(openai_engine(lambda prompt, n: [0])) as server:
        _mark(store, server.port)
        assert serve.check_ready(store, "pod").port == server.port
    assert _reason(store) == "engine_silent"  # the engine went away; the record alone proves nothing
    serve.clear_ready(store, "pod")
    assert _reason(store) == "no_record"


def test_a_skipped_canary_is_not_ready_unless_accepted(store: Store) -> None:
    with FakeEngineServer(openai_engine(lambda prompt, n: [0])) as server:
        _mark(store, server.port, canary="skipped")
        assert _reason(store) == "canary_skipped"
        assert serve.check_ready(store, "pod", accept_skipped_canary=True).canary == "skipped"


def test_a_record_whose_holder_died_is_stale(store: Store) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with FakeEngineServer(openai_engine(lambda prompt, n: [0])) as server:
        _mark(store, server.port, holder=process_identity(gone.pid) | {"pid": gone.pid, "proc_start": 1})
        assert _reason(store) == "holder_gone"


@pytest.mark.parametrize("content", [b"{not json", b'{"name": "pod"}', b'{"name":"pod","port":0}', b"[]"])
def test_a_malformed_record_is_refused(store: Store, content: bytes) -> None:
    path = store.paths.ready_file("pod")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    assert _reason(store) == "unreadable"


def test_start_writes_the_record_after_the_canary_and_finish_removes_it_first(store: Store, tmp_path: Path) -> None:
    replies = {str(g["prompt"]): list(g["token_ids"]) for g in GOLDEN}
    with FakeEngineServer(openai_engine(lambda prompt, n: replies.get(prompt, [0])[:n])) as server:
        plan, runtime = _blessed_plan(store, tmp_path, server.port)
        name = plan.profile.name
        result = serve.start(plan, runtime=runtime)
        record = serve.check_ready(store, name)
        assert (record.canary, record.port, record.holder["pid"]) == ("passed", server.port, os.getpid())
        serve.finish(plan, result, runtime=runtime, keep_upper=False, failed=False)
        with pytest.raises(NotServingError):
            serve.check_ready(store, name)


def test_a_failed_canary_writes_no_record(store: Store, tmp_path: Path) -> None:
    with FakeEngineServer(openai_engine(lambda prompt, n: [7] * n)) as server:
        plan, runtime = _blessed_plan(store, tmp_path, server.port)
        with pytest.raises(CanaryFailedError, match=r"golden prompt\(s\) differ from the blessed output") as info:
            serve.start(plan, runtime=runtime)
    assert info.value.exit_code == ExitCode.CANARY_FAILED
    assert not store.paths.ready_file(plan.profile.name).exists()


# -- the termination log --------------------------------------------------------------------------------


def test_a_refusal_is_written_to_the_termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "termination-log"
    monkeypatch.setenv(boundary.TERMINATION_LOG_ENV, str(log))

    def refuse() -> Report:
        raise VerifyFailedError("1 problem(s) in /x: a.bin (size)", hint="re-bless")

    assert boundary.execute(refuse, json_output=False, verbose=False) == 21
    assert (
        log.read_text() == "bless exit 21 (verification failed): 1 problem(s) in /x: a.bin (size)\nWhat to do: re-bless"
    )


def test_the_termination_log_keeps_within_what_kubernetes_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "termination-log"
    monkeypatch.setenv(boundary.TERMINATION_LOG_ENV, str(log))
    boundary.write_termination_log(21, "verification failed", "x" * 10_000, None)
    assert len(log.read_bytes()) <= boundary.TERMINATION_LOG_MAX


def test_success_writes_nothing_and_an_unwritable_log_is_no_second_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(boundary.TERMINATION_LOG_ENV, str(tmp_path / "no-such-dir" / "log"))
    assert boundary.execute(lambda: Report({}, lambda c, d: None), json_output=False, verbose=False) == 0
    boundary.write_termination_log(21, "verification failed", "why", None)  # cannot be written: ignored
    assert not (tmp_path / "no-such-dir").exists()


def test_serve_full_ready_exits_46_says_why_and_leaves_the_termination_log_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bless.cli.serve import ready_app

    log = tmp_path / "termination-log"
    monkeypatch.setenv(boundary.TERMINATION_LOG_ENV, str(log))
    result = CliRunner().invoke(ready_app, ["pod", "--root", str(tmp_path / "root"), "--json"])
    assert result.exit_code == 46
    document = json.loads(result.stdout)
    assert document["ok"] is False and document["error"]["details"]["reason"] == "no_record"
    # The probe runs in the serving container, with its environment: it must not write the container's reason.
    assert not log.exists()


def test_a_readiness_record_that_cannot_be_written_stops_the_engine_and_says_why(store: Store, tmp_path: Path) -> None:
    replies = {str(g["prompt"]): list(g["token_ids"]) for g in GOLDEN}
    with FakeEngineServer(openai_engine(lambda prompt, n: replies.get(prompt, [0])[:n])) as server:
        plan, runtime = _blessed_plan(store, tmp_path, server.port)
        store.paths.ready.write_text("a file where the directory goes")
        with pytest.raises(StoreUnavailableError, match="writing the readiness record"):
            serve.start(plan, runtime=runtime)
    assert runtime.calls[-2:] == ["stop", "remove"], "never left serving without a record"
    assert store.leases.leases() == [], "the serving lease was released"
