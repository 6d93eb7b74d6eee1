"""The Runtime contract: what the orchestrator and serve-full rely on, checked against every runtime.

One suite, three runtimes: Docker (a real Docker Engine and a busybox image; marked integration),
the local runtime with mount namespaces (when root, as in CI) and the local runtime forced into its
copy mode. The engine is a POSIX shell script, so the same script runs in a container and on the
host; mount targets are absolute paths under the test's tmp dir, passed to the script in its env.

What differs between runtimes on purpose (image handling, published ports, Docker's init, process
groups, the copy mode's materialized trees) stays in tests/unit/test_runtime_local.py and
tests/integration/test_runtime_docker.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bless import container_labels as labels
from bless.errors import BlessError, ContainerConflictError
from bless.evidence_types import UpperEntry
from bless.runtime.base import ContainerSpec, Mount, Runtime, Started
from bless.runtime.local import LocalRuntime
from tests.support.runtime_helpers import make_lower, tree_digest, wait_exit, wait_log

# Exits 0 on SIGTERM.
GRACEFUL = 'trap "exit 0" TERM; echo ready; sleep 600 & wait'
# Ignores SIGTERM, and so does its sleep (it inherits the disposition).
STUBBORN = 'trap "" TERM; echo ready; sleep 600'
# No handler anywhere: the engine dies of SIGTERM (128 + 15), as on a host.
PLAIN = "echo ready; exec sleep 600"


@dataclass
class Host:
    """One runtime under test, with what a test needs to build specs for it."""

    runtime: Runtime
    kind: str
    image: str | None
    run_id: str
    logs_dir: Path

    @property
    def labels(self) -> dict[str, str]:
        return labels.labels_for(run_id=self.run_id, phase=labels.PHASE_TRIAL, config_hash="c" * 64, profile="contract")

    def spec(self, script: str, *, name: str | None = None, **kw: Any) -> ContainerSpec:
        name = name or f"bless-contract-{uuid.uuid4().hex[:10]}"
        kw.setdefault("env", {})
        kw.setdefault("labels", self.labels)
        return ContainerSpec(
            name=name,
            command=("sh", "-c", script),
            image=self.image,
            log_path=self.logs_dir / f"{name}.log",
            **kw,
        )


@pytest.fixture(
    params=[
        pytest.param("docker", marks=pytest.mark.integration),
        "local",
        "local-copy",
    ]
)
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Host]:
    """A runtime of each kind; every test must leave nothing of its run behind."""
    run_id = f"contract-{uuid.uuid4().hex[:12]}"
    runtime: Runtime
    image: str | None = None
    if request.param == "docker":
        from bless.runtime.docker import DockerRuntime

        image = request.getfixturevalue("busybox_image")
        runtime = DockerRuntime()
    else:
        runtime = LocalRuntime(use_mount_namespace=False) if request.param == "local-copy" else LocalRuntime()
    logs_dir = tmp_path / "logs"
    logs_dir.mkdir()
    yield Host(runtime, request.param, image, run_id, logs_dir)
    leftovers = runtime.list_ours({labels.RUN_ID: run_id})
    if leftovers:
        runtime.cleanup_ours({labels.RUN_ID: run_id})
    assert leftovers == [], f"test left engines of ours behind: {[c.name for c in leftovers]}"


def finish(runtime: Runtime, started: Started) -> None:
    runtime.stop(started, 5)
    runtime.remove(started)


# -- process lifecycle ----------------------------------------------------------------------------


def test_logs_and_exit_code(host: Host) -> None:
    started = host.runtime.start(host.spec("echo to-stdout; echo to-stderr >&2; exit 3"))
    assert wait_exit(host.runtime, started) == 3
    assert not host.runtime.is_running(started)
    logs = host.runtime.logs(started)
    assert "to-stdout" in logs and "to-stderr" in logs
    result = host.runtime.stop(started, 2)  # already exited: reported as it exited, without waiting
    assert result.exit_code == 3 and result.graceful and result.seconds < 1
    host.runtime.remove(started)
    assert host.runtime.name_holder(started.name) == "free"


def test_follow_log_hands_out_each_line_once_as_the_log_grows(host: Host) -> None:
    """What the seal watcher reads: only what came since the last read, every line once, none held back, at once.

    The engine keeps running: a read returns what is there now, it never waits for more (or for the exit).
    """
    started = host.runtime.start(
        host.spec(
            "i=0; while [ $i -lt 3 ]; do echo line-$i; i=$((i+1)); done; sleep 1; echo tail-a; echo tail-b >&2; "
            "exec sleep 60"
        )
    )
    try:
        follower = host.runtime.follow_log(started)
        seen: list[str] = []
        deadline = time.monotonic() + 30
        while "tail-b" not in seen and time.monotonic() < deadline:
            began = time.monotonic()
            chunk = follower.read(1 << 20)
            assert time.monotonic() - began < 5, "a read waited for more output"
            assert chunk.lost is None
            seen += chunk.data.decode().splitlines()
            time.sleep(0.1)
        follower.close()
        # Each line once; stdout and stderr are two pipes, so only each one's own order is kept.
        assert sorted(seen) == ["line-0", "line-1", "line-2", "tail-a", "tail-b"]
        assert [line for line in seen if line != "tail-b"] == ["line-0", "line-1", "line-2", "tail-a"]
        assert host.runtime.is_running(started), "read while the engine runs"
    finally:
        finish(host.runtime, started)


def test_graceful_stop_vs_killed_after_timeout(host: Host) -> None:
    graceful = host.runtime.start(host.spec(GRACEFUL))
    stubborn = host.runtime.start(host.spec(STUBBORN))
    try:
        wait_log(host.runtime, graceful, "ready")
        wait_log(host.runtime, stubborn, "ready")
        assert host.runtime.is_running(graceful) and host.runtime.exit_code(graceful) is None
        first = host.runtime.stop(graceful, 5)
        assert first.graceful and first.exit_code == 0 and first.seconds < 5
        second = host.runtime.stop(stubborn, 1)
        assert not second.graceful and second.exit_code == 137 and 1 <= second.seconds < 10
        assert not host.runtime.is_running(stubborn) and host.runtime.exit_code(stubborn) == 137
        again = host.runtime.stop(graceful, 5)  # already stopped: same verdict, no wait
        assert again.graceful and again.exit_code == 0 and again.seconds < 1
    finally:
        host.runtime.remove(graceful)
        host.runtime.remove(stubborn)


def test_death_by_sigterm_is_graceful_143(host: Host) -> None:
    started = host.runtime.start(host.spec(PLAIN))
    try:
        wait_log(host.runtime, started, "ready")
        result = host.runtime.stop(started, 10)
        assert result.graceful and result.exit_code == 143
    finally:
        host.runtime.remove(started)


def test_env_is_what_the_spec_says(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine sees the spec's env, never the caller's secrets."""
    monkeypatch.setenv("BLESS_TEST_SECRET_TOKEN", "do-not-leak")
    started = host.runtime.start(host.spec('echo "knob=$ENGINE_KNOB secret=${BLESS_TEST_SECRET_TOKEN:-unset}"',
                                           env={"ENGINE_KNOB": "on"}))  # fmt: skip
    assert wait_exit(host.runtime, started) == 0
    assert "knob=on secret=unset" in host.runtime.logs(started)
    finish(host.runtime, started)


def test_python_path_goes_first_on_the_engine_s_pythonpath(host: Host) -> None:
    """A sealed start's module dir, before the spec's PYTHONPATH (a local reference engine's checkout)."""
    started = host.runtime.start(
        host.spec('echo "pp=$PYTHONPATH"', env={"PYTHONPATH": "/spec/dir"}, python_path=("/seal/dir",))
    )
    assert wait_exit(host.runtime, started) == 0
    assert "pp=/seal/dir:/spec/dir" in host.runtime.logs(started)
    finish(host.runtime, started)


# -- names, ownership, leftovers ------------------------------------------------------------------


def test_a_name_is_held_until_removed_and_removal_needs_a_stop(host: Host) -> None:
    spec = host.spec(GRACEFUL)
    started = host.runtime.start(spec)
    assert host.runtime.name_holder(spec.name) == "ours"
    assert host.runtime.name_holder(f"bless-contract-nobody-{uuid.uuid4().hex[:6]}") == "free"
    with pytest.raises(ContainerConflictError) as info:
        host.runtime.start(spec)
    assert info.value.exit_code == 12
    with pytest.raises(ContainerConflictError, match="still running"):
        host.runtime.remove(started)  # never forced
    assert host.runtime.is_running(started)
    ours = host.runtime.list_ours({labels.RUN_ID: host.run_id})
    assert [(c.name, c.status) for c in ours] == [(spec.name, "running")]
    assert host.runtime.list_ours({labels.RUN_ID: f"another-{host.run_id}"}) == []
    assert host.runtime.cleanup_ours({labels.RUN_ID: host.run_id}) == [spec.name]
    assert host.runtime.name_holder(spec.name) == "free"
    assert not host.runtime.is_running(started)


def test_an_exited_engine_holds_its_name_until_removed(host: Host) -> None:
    spec = host.spec("true")
    started = host.runtime.start(spec)
    wait_exit(host.runtime, started)
    assert host.runtime.name_holder(spec.name) == "ours"
    with pytest.raises(ContainerConflictError):
        host.runtime.start(spec)
    finish(host.runtime, started)
    host.runtime.remove(started)  # idempotent
    again = host.runtime.start(spec)
    assert wait_exit(host.runtime, again) == 0
    finish(host.runtime, again)


def test_an_engine_without_our_labels_is_refused(host: Host) -> None:
    spec = host.spec("true", labels={"purpose": "test"})
    with pytest.raises(BlessError, match="owner label"):
        host.runtime.start(spec)
    assert host.runtime.name_holder(spec.name) == "free"


# -- mounts -------------------------------------------------------------------------------------------


def test_rw_mount_writes_reach_the_host(host: Host, tmp_path: Path) -> None:
    source = tmp_path / "rw"
    source.mkdir()
    (source / "existing").write_text("hello")
    (source / "dropped").write_text("the engine deletes this")
    # The copy mode presents a copy and brings the engine's writes back when it stops.
    target = str(tmp_path / "mnt" / "rw")
    started = host.runtime.start(
        host.spec('echo "read=$(cat "$T/existing")"; echo from-engine > "$T/written"; rm "$T/dropped"',
                  env={"T": target}, mounts=(Mount("rw", source, target),))
    )  # fmt: skip
    assert wait_exit(host.runtime, started) == 0, host.runtime.logs(started)
    assert "read=hello" in host.runtime.logs(started)
    finish(host.runtime, started)
    assert (source / "written").read_text() == "from-engine\n"
    assert sorted(p.name for p in source.iterdir()) == ["existing", "written"]


RO_WRITER = """
echo "read=$(cat "$T/a.txt")"
if echo x > "$T/a.txt" 2>/dev/null; then echo RO_WRITABLE; else echo RO_REFUSED; fi
if touch "$T/new" 2>/dev/null; then echo RO_WRITABLE; else echo RO_REFUSED; fi
"""


def test_ro_mount_writes_never_go_unnoticed(host: Host, tmp_path: Path) -> None:
    """Enforced: a write fails. Not enforced (the copy mode says so): the write is reported."""
    source = make_lower(tmp_path)
    before = tree_digest(source)
    target = str(tmp_path / "mnt" / "ro")
    started = host.runtime.start(host.spec(RO_WRITER, env={"T": target}, mounts=(Mount("ro", source, target),)))
    assert wait_exit(host.runtime, started) == 0, host.runtime.logs(started)
    logs = host.runtime.logs(started)
    assert "read=original a" in logs
    if started.enforced_read_only:
        assert logs.count("RO_REFUSED") == 2 and "RO_WRITABLE" not in logs
        assert host.runtime.upper_entries(started) == []
    else:
        assert host.kind == "local-copy" and any("NOT enforced" in note for note in started.notes)
        assert host.runtime.upper_entries(started) == [
            UpperEntry("a.txt", "rewritten", 2),
            UpperEntry("new", "new", 0),
        ]
    assert tree_digest(source) == before
    finish(host.runtime, started)


OVERLAY_WRITER = """
echo "c=$(cat "$T/sub/c.txt")"
printf 'rewritten a!' > "$T/a.txt"
rm "$T/b.txt"
rm -r "$T/gone"
printf 'brand new' > "$T/new.txt"
printf dd > "$T/sub/d.txt"
echo DONE
"""


def test_overlay_keeps_the_lower_layer_and_classifies_the_upper(host: Host, tmp_path: Path) -> None:
    lower = make_lower(tmp_path)
    before = tree_digest(lower)
    scratch = tmp_path / "scratch"
    target = str(tmp_path / "mnt" / "cache")
    started = host.runtime.start(
        host.spec(OVERLAY_WRITER, env={"T": target}, mounts=(Mount("overlay", lower, target, scratch=scratch),))
    )
    try:
        assert wait_exit(host.runtime, started) == 0, host.runtime.logs(started)
        logs = host.runtime.logs(started)
        assert "c=untouched c" in logs and "DONE" in logs
        assert tree_digest(lower) == before
        assert host.runtime.upper_entries(started) == [
            UpperEntry("a.txt", "rewritten", len("rewritten a!")),
            UpperEntry("b.txt", "deleted", 0),
            UpperEntry("gone/x.bin", "deleted", 0),
            UpperEntry("new.txt", "new", len("brand new")),
            UpperEntry("sub/d.txt", "new", 2),
        ]
    finally:
        finish(host.runtime, started)
    assert tree_digest(lower) == before
