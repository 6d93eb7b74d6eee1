"""``serve-full ready`` never says ready when it cannot judge who serves (issue 25, item 6).

A detached Docker serve whose container died read ready as long as anything answered on its port (the
record's holder, ``{"container", "name"}``, was never looked up), and a forged record whose holder was
``{}``, a pid of ``true``, ``0``, ``-1`` or ``"123"``, another host, or no process start time read ready
too (``process_alive`` said "cannot tell", which was taken as alive). Unknown is not alive: each is a
refusal (46) naming why, while the engine keeps answering on the port.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

import pytest

from bless import container_labels as labels
from bless.errors import ExitCode, NotServingError, RuntimeUnavailableError
from bless.flows.serve.ready import check_ready, mark_ready
from bless.runtime.base import Runtime
from bless.store import Store
from bless.system.procid import process_identity
from tests.support.fakes import FakeEngineServer, FakeRuntime, json_reply

MODELS = {"/v1/models": json_reply({"object": "list", "data": [{"id": "m"}]})}
NAME = "p"


@pytest.fixture
def server() -> Any:
    with FakeEngineServer(routes=MODELS) as running:
        yield running


def _mark(store: Store, port: int, holder: Any, canary: str = "passed") -> None:
    mark_ready(
        store, name=NAME, config_hash="ab" * 32, host="127.0.0.1", port=port, canary=canary, holder=process_identity()
    )
    path = store.paths.ready_file(NAME)
    document = json.loads(path.read_text())
    document["holder"] = holder
    path.write_text(json.dumps(document))


def _reason(store: Store, docker: Callable[[], Runtime] | None = None, skipped: bool = False) -> NotServingError:
    with pytest.raises(NotServingError) as excinfo:
        check_ready(store, NAME, docker=docker, accept_skipped_canary=skipped)
    assert int(excinfo.value.exit_code) == int(ExitCode.NOT_SERVING) == 46
    return excinfo.value


def _serving_container(runtime: FakeRuntime) -> str:
    ours = labels.labels_for(run_id="r", phase=labels.PHASE_SERVE, config_hash="ab" * 32, profile=NAME)
    return runtime.plant("bless-serve-p", ours).name


def test_a_detached_docker_serve_whose_container_died_is_not_ready(store: Store, server: FakeEngineServer) -> None:
    runtime = FakeRuntime()
    container = _serving_container(runtime)
    # A --debug start (canary skipped, not sealed: no watcher); a blessed one is watched (test_serve_detached.py).
    _mark(store, server.port, {"container": container, "name": container}, canary="skipped")
    ready = check_ready(store, NAME, docker=lambda: runtime, accept_skipped_canary=True)
    assert ready.port == server.port  # running and answering: ready
    runtime.container(container).exit_code = 137  # the container died; something still answers on the port
    refusal = _reason(store, docker=lambda: runtime, skipped=True)
    assert refusal.details["reason"] == "holder_gone" and "not running" in refusal.message


def test_a_docker_holder_whose_container_is_gone_is_not_ready(store: Store, server: FakeEngineServer) -> None:
    runtime = FakeRuntime()
    _serving_container(runtime)
    _mark(store, server.port, {"container": "0123456789ab" * 2, "name": "bless-serve-p"})  # another id
    assert _reason(store, docker=lambda: runtime).details["reason"] == "holder_gone"


def test_a_docker_holder_that_cannot_be_looked_up_is_not_ready(store: Store, server: FakeEngineServer) -> None:
    def unreachable() -> Runtime:
        raise RuntimeUnavailableError("Docker Engine: ping failed: connection refused")

    _mark(store, server.port, {"container": "bless-serve-p", "name": "bless-serve-p"})
    assert _reason(store, docker=unreachable).details["reason"] == "holder_unknown"
    assert _reason(store, docker=None).details["reason"] == "holder_unknown"


def _honest() -> dict[str, Any]:
    return process_identity()


@pytest.mark.parametrize(
    ("holder", "reason", "said"),
    [
        ({}, "holder_malformed", "names no holder"),
        (_honest() | {"pid": True}, "holder_malformed", "True"),
        (_honest() | {"pid": 0}, "holder_malformed", "not a process id"),
        (_honest() | {"pid": -1}, "holder_malformed", "not a process id"),
        (_honest() | {"pid": "123"}, "holder_malformed", "'123'"),
        (_honest() | {"pid": 1.0}, "holder_malformed", "not a process id"),
        (_honest() | {"host": "elsewhere-" + socket.gethostname()}, "holder_elsewhere", "runs on host"),
        ({k: v for k, v in _honest().items() if k != "host"}, "holder_malformed", "no host"),
        ({k: v for k, v in _honest().items() if k != "proc_start"}, "holder_malformed", "no process start time"),
        (_honest() | {"proc_start": None}, "holder_malformed", "no process start time"),
        (_honest() | {"proc_start": True}, "holder_malformed", "no process start time"),
        ({"container": {}}, "holder_malformed", "not a container id"),
        ({"container": "a\nb"}, "holder_malformed", "not a container id"),
    ],
    ids=[
        "empty",
        "pid-true",
        "pid-0",
        "pid-minus-1",
        "pid-string",
        "pid-float",
        "another-host",
        "no-host",
        "no-proc-start",
        "proc-start-null",
        "proc-start-true",
        "container-object",
        "container-newline",
    ],
)
def test_a_holder_that_cannot_be_judged_is_not_ready(
    store: Store, server: FakeEngineServer, holder: dict[str, Any], reason: str, said: str
) -> None:
    _mark(store, server.port, _honest())
    assert check_ready(store, NAME).port == server.port  # the honest record of this live process is ready
    _mark(store, server.port, holder)
    refusal = _reason(store, docker=lambda: FakeRuntime())
    assert refusal.details["reason"] == reason and said in refusal.message, refusal.message
    assert refusal.hint


def test_serve_full_ready_refuses_a_forged_holder_with_46(store: Store, server: FakeEngineServer) -> None:
    from typer.testing import CliRunner

    from bless.cli.serve import ready_app

    _mark(store, server.port, {"pid": True, "host": socket.gethostname(), "proc_start": 1})
    result = CliRunner().invoke(ready_app, [NAME, "--root", str(store.root), "--json"])
    assert result.exit_code == ExitCode.NOT_SERVING, result.stdout
    assert json.loads(result.stdout)["error"]["details"]["reason"] == "holder_malformed"


def test_ready_without_a_record_names_the_other_root_that_serves_it_as_stop_does(store: Store, tmp_path: Any) -> None:
    """``serve-full ready NAME`` run against the default root while another root serves the profile: like
    ``serve-full stop NAME`` in the same situation, it names that root (and the command to run there)."""
    from bless.cli.error_hints import command_line_hint
    from bless.errors import ContainerConflictError
    from bless.flows.serve import serve_container_name, stop_serving

    other = tmp_path / "other root"
    runtime = FakeRuntime()
    ours = labels.labels_for(
        run_id="r", phase=labels.PHASE_SERVE, config_hash="ab" * 32, profile=NAME, store_root=other
    )
    runtime.plant(serve_container_name(NAME, per_root=other), ours)
    refusal = _reason(store, docker=lambda: runtime)
    assert refusal.details["reason"] == "other_root"
    assert str(other) in refusal.message and refusal.details["store_root"] == str(other.resolve())
    assert f"serve-full ready {NAME} --root '{other}'" in (command_line_hint(refusal) or "")
    with pytest.raises(ContainerConflictError) as stopped:
        stop_serving(NAME, store=store, docker=lambda: runtime, timeout_s=5)
    assert str(other) in stopped.value.message, "stop names the same root"
    # Without Docker, or with nothing serving it anywhere, the plain refusal stays.
    assert _reason(store).details["reason"] == "no_record"
    assert _reason(store, docker=lambda: FakeRuntime()).details["reason"] == "no_record"


@pytest.mark.parametrize(
    ("change", "said"),
    [({"name": None}, "no 'name' field"), ({"port": "eighty"}, "invalid literal for int()")],
)
def test_a_malformed_record_is_described_in_words_not_python_reprs(change: dict[str, object], said: str) -> None:
    """A hand-written or damaged record: the refusal names the field, not ``KeyError('name')``."""
    from bless.flows.serve.ready import ReadyRecord

    record = {
        "name": "p", "config_hash": "a" * 64, "host": "127.0.0.1", "port": 8000, "canary": "passed",
        "holder": {}, "since": "2026-11-28T00:00:00Z", "watcher": None,
    }  # fmt: skip
    record.update(change)
    document = {key: value for key, value in record.items() if value is not None or key == "watcher"}
    with pytest.raises(ValueError, match="malformed readiness record") as refused:
        ReadyRecord.from_dict(document)
    assert said in str(refused.value) and "Error(" not in str(refused.value)
