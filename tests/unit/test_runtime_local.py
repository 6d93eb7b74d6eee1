"""What is the local runtime's own, for real: Python one-liners play the engine.

The contract every runtime keeps (lifecycle, stop verdicts, names, mounts) is checked in
tests/contract/test_runtime.py; here: process groups, env filtering, ports, the namespace and copy modes.

Runs everywhere without Docker. The mount-namespace tests need root (they mount for
real, in a private namespace that vanishes with the engine); the copy mode is forced
with ``LocalRuntime(use_mount_namespace=False)`` so it is tested as root too.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import socket
import stat
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bless import container_labels as labels
from bless.errors import BlessError, ContainerConflictError, InputInvalidError, RuntimeUnavailableError
from bless.evidence_types import UpperEntry
from bless.runtime.base import ContainerSpec, Mount, Started
from bless.runtime.local import COMMAND_NOT_FOUND, MOUNT_SETUP_FAILED, LocalRuntime, inherited_env
from bless.runtime.upper import diff_trees, normalize_modes, scan_upper
from tests.support.runtime_helpers import make_lower, tree_digest, wait_exit, wait_log

IS_ROOT = sys.platform.startswith("linux") and os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="mount namespaces need root on Linux")

RUN_ID = f"unit-{uuid.uuid4().hex[:8]}"
LABELS = labels.labels_for(run_id=RUN_ID, phase=labels.PHASE_TRIAL, config_hash="0" * 64, profile="unit")


def make_spec(tmp_path: Path, code: str, *, name: str | None = None, **kw: Any) -> ContainerSpec:
    name = name or f"bless-unit-{uuid.uuid4().hex[:8]}"
    kw.setdefault("labels", LABELS)
    kw.setdefault("env", {})
    kw.setdefault("log_path", tmp_path / f"{name}.log")
    return ContainerSpec(name=name, command=(sys.executable, "-c", code), **kw)


@pytest.fixture
def rt() -> Iterator[LocalRuntime]:
    runtime = LocalRuntime()
    yield runtime
    leftovers = runtime.list_ours({labels.RUN_ID: RUN_ID})
    runtime.cleanup_ours({labels.RUN_ID: RUN_ID})
    assert leftovers == [], f"test left engines behind: {leftovers}"


@pytest.fixture
def copy_rt() -> Iterator[LocalRuntime]:
    runtime = LocalRuntime(use_mount_namespace=False)
    yield runtime
    leftovers = runtime.list_ours({labels.RUN_ID: RUN_ID})
    runtime.cleanup_ours({labels.RUN_ID: RUN_ID})
    assert leftovers == [], f"test left engines behind: {leftovers}"


def finish(rt: LocalRuntime, started: Started) -> None:
    rt.stop(started, 2)
    rt.remove(started)


# -- process basics ----------------------------------------------------------------


def test_engines_are_processes_and_conflicts_say_why(rt: LocalRuntime, tmp_path: Path) -> None:
    """The lifecycle contract is in tests/contract/test_runtime.py; here what is the local runtime's own."""
    spec = make_spec(tmp_path, "import time; print('ready', flush=True); time.sleep(60)")
    started = rt.start(spec)
    assert started.id.isdigit()  # the engine's pid
    with pytest.raises(ContainerConflictError, match="still running"):
        rt.start(spec)
    finish(rt, started)
    exited = make_spec(tmp_path, "pass")
    started = rt.start(exited)
    wait_exit(rt, started)
    with pytest.raises(ContainerConflictError, match="not removed"):
        rt.start(exited)
    finish(rt, started)


def test_group_leftovers_die_with_the_engine(rt: LocalRuntime, tmp_path: Path) -> None:
    # The child ignores SIGTERM and outlives its parent; a container would take it down
    # with PID 1, and so must we.
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
        "print('child', child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    started = rt.start(make_spec(tmp_path, code))
    wait_log(rt, started, "child")
    child_pid = int(rt.logs(started).split("child", 1)[1].split()[0])
    result = rt.stop(started, 2)
    assert result.graceful  # the engine itself died of SIGTERM
    rt.remove(started)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            break
        # Reparented to init (or a subreaper) as a zombie until reaped: check its state.
        try:
            state = Path(f"/proc/{child_pid}/stat").read_text().split(")")[-1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"child {child_pid} of the engine survived stop()")


def test_env_is_filtered_and_home_pinned(rt: LocalRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLESS_TEST_SECRET_TOKEN", "do-not-leak")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    monkeypatch.setenv("HOME", "/root-of-the-caller")
    switches = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    for name, value in switches.items():
        monkeypatch.setenv(name, value)
    code = "import json, os; print('ENV=' + json.dumps(dict(os.environ)), flush=True)"
    started = rt.start(
        make_spec(tmp_path, code, env={"VLLM_FOO": "bar", "HOME": "/ignored"}, home=str(tmp_path / "home"))
    )
    assert wait_exit(rt, started) == 0
    env = json.loads(rt.logs(started).split("ENV=", 1)[1].splitlines()[0])
    assert env["HOME"] == str(tmp_path / "home")  # spec.home wins over env and the caller
    assert env["VLLM_FOO"] == "bar"
    assert env["LC_ALL"] == "C.UTF-8"
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert "CUDA_LAUNCH_BLOCKING" not in env  # a debug switch must come through the profile, where it is checked
    assert "PATH" in env
    assert "BLESS_TEST_SECRET_TOKEN" not in env
    # The host's NVLink-multicast switches reach a tensor-parallel engine (and a plain start of the benchmarks,
    # which take the same names from inherited_env).
    assert {name: env.get(name) for name in switches} == switches
    assert inherited_env({**switches, "BLESS_TEST_SECRET_TOKEN": "x", "LC_ALL": "C"}) == {**switches, "LC_ALL": "C"}
    finish(rt, started)


@pytest.mark.parametrize("inherited", [None, "/from/the/caller"])
def test_python_path_goes_first_on_what_the_engine_would_have_had(
    copy_rt: LocalRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inherited: str | None
) -> None:
    if inherited is None:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    else:
        monkeypatch.setenv("PYTHONPATH", inherited)
    code = "import os; print('PP=' + os.environ['PYTHONPATH'], flush=True)"
    started = copy_rt.start(make_spec(tmp_path, code, python_path=("/seal",)))
    assert wait_exit(copy_rt, started) == 0
    expected = "/seal" if inherited is None else f"/seal:{inherited}"
    assert f"PP={expected}\n" in copy_rt.logs(started)
    finish(copy_rt, started)
    # A PYTHONPATH the spec's env sets is kept after it too.
    started = copy_rt.start(make_spec(tmp_path, code, env={"PYTHONPATH": "/repo"}, python_path=("/seal",)))
    assert wait_exit(copy_rt, started) == 0
    assert "PP=/seal:/repo\n" in copy_rt.logs(started)
    finish(copy_rt, started)


def test_home_defaults_to_callers_home(rt: LocalRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    started = rt.start(make_spec(tmp_path, "import os; print('HOME=' + os.environ['HOME'])"))
    assert wait_exit(rt, started) == 0
    assert f"HOME={tmp_path}" in rt.logs(started)
    finish(rt, started)


def test_workdir(rt: LocalRuntime, tmp_path: Path) -> None:
    started = rt.start(make_spec(tmp_path, "import os; print('CWD=' + os.getcwd())", workdir=str(tmp_path)))
    assert wait_exit(rt, started) == 0
    assert f"CWD={tmp_path}" in rt.logs(started)
    finish(rt, started)


def test_refusals(rt: LocalRuntime, tmp_path: Path) -> None:
    with pytest.raises(BlessError, match="owner label"):
        rt.start(make_spec(tmp_path, "pass", labels={"some": "label"}))
    with pytest.raises(BlessError, match="log_path"):
        rt.start(make_spec(tmp_path, "pass", log_path=None))
    with pytest.raises(InputInvalidError, match="takes no image"):
        rt.resolve_image("bless-reference:1")
    with pytest.raises(InputInvalidError, match="absolute"):
        rt.start(make_spec(tmp_path, "pass", mounts=(Mount("rw", tmp_path, "relative/path"),)))
    rt.ping()


def test_missing_engine_binary(rt: LocalRuntime, copy_rt: LocalRuntime, tmp_path: Path) -> None:
    spec = ContainerSpec(
        name="bless-unit-nocmd",
        command=(str(tmp_path / "no-such-binary"),),
        env={},
        labels=LABELS,
        log_path=tmp_path / "x.log",
    )
    # Without a namespace the spawn itself fails, and nothing is registered.
    with pytest.raises(RuntimeUnavailableError, match="cannot start"):
        copy_rt.start(spec)
    assert copy_rt.name_holder(spec.name) == "free"
    if rt.uses_mount_namespace:
        # In a namespace the exec happens after the mounts: the engine exits 127 and says why.
        started = rt.start(spec)
        assert wait_exit(rt, started) == COMMAND_NOT_FOUND
        assert "engine command not found" in rt.logs(started)
        finish(rt, started)


def test_engine_port_is_free_on_loopback(rt: LocalRuntime) -> None:
    port = rt.engine_port(8000)
    assert 0 < port < 65536
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_started_reports_port(rt: LocalRuntime, tmp_path: Path) -> None:
    port = rt.engine_port(8000)
    started = rt.start(make_spec(tmp_path, "pass", port=port))
    assert started.host_port == port
    wait_exit(rt, started)
    finish(rt, started)
    with pytest.raises(InputInvalidError, match="cannot publish"):
        rt.start(make_spec(tmp_path, "pass", port=port, host_port=port + 1))


def test_normalize_ownership(rt: LocalRuntime, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "data").write_text("x")
    (tree / "run.sh").write_text("#!/bin/sh\n")
    (tree / "link").symlink_to("sub/data")
    (tree / "sub" / "data").chmod(0o600)
    (tree / "run.sh").chmod(0o700)
    (tree / "sub").chmod(0o700)
    rt.normalize_ownership(tree, image=None)
    assert stat.S_IMODE((tree / "sub" / "data").stat().st_mode) == 0o644
    assert stat.S_IMODE((tree / "run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((tree / "sub").stat().st_mode) == 0o755


# -- upper-layer helpers (pure) -------------------------------------------------------


def test_diff_trees_by_content(tmp_path: Path) -> None:
    lower, copy = tmp_path / "lower", tmp_path / "copy"
    for root in (lower, copy):
        (root / "d").mkdir(parents=True)
        (root / "same").write_text("same")
        (root / "d" / "changed").write_text("old")
        (root / "gone").write_text("bye")
    (copy / "d" / "changed").write_text("new!")
    (copy / "gone").unlink()
    (copy / "d" / "added").write_text("abc")
    assert diff_trees(copy, lower) == [
        UpperEntry("d/added", "new", 3),
        UpperEntry("d/changed", "rewritten", 4),
        UpperEntry("gone", "deleted", 0),
    ]


def test_scan_upper_missing_dir_is_empty(tmp_path: Path) -> None:
    assert scan_upper(tmp_path / "nope", tmp_path) == []


@needs_root
def test_scan_upper_whiteouts(tmp_path: Path) -> None:
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    (lower / "olddir").mkdir(parents=True)
    (lower / "olddir" / "f1").write_text("1")
    (lower / "kept").write_text("k")
    (lower / "rm").write_text("r")
    upper.mkdir()
    os.mknod(upper / "rm", stat.S_IFCHR | 0o000, os.makedev(0, 0))
    os.mknod(upper / "olddir", stat.S_IFCHR | 0o000, os.makedev(0, 0))
    (upper / "kept").write_text("kk")
    (upper / "fresh").mkdir()
    (upper / "fresh" / "n").write_text("nnn")
    assert scan_upper(upper, lower) == [
        UpperEntry("fresh/n", "new", 3),
        UpperEntry("kept", "rewritten", 2),
        UpperEntry("olddir/f1", "deleted", 0),
        UpperEntry("rm", "deleted", 0),
    ]


def test_normalize_modes_skips_symlinks(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("o")
    outside.chmod(0o600)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "link").symlink_to(outside)
    normalize_modes(tree)
    assert stat.S_IMODE(outside.stat().st_mode) == 0o600


# -- mount namespace (root) -------------------------------------------------------------


# Rewrites a.txt, deletes b.txt and the gone/ tree, adds new.txt and sub/d.txt.
OVERLAY_WRITER = (
    "import pathlib, shutil, sys\n"
    "t = pathlib.Path(sys.argv[1])\n"
    "(t / 'a.txt').write_text('rewritten a!')\n"
    "(t / 'b.txt').unlink()\n"
    "shutil.rmtree(t / 'gone')\n"
    "(t / 'new.txt').write_text('brand new')\n"
    "(t / 'sub' / 'd.txt').write_text('dd')\n"
    "print('sub/c.txt=' + (t / 'sub' / 'c.txt').read_text(), flush=True)\n"
)
EXPECTED_UPPER = [
    UpperEntry("a.txt", "rewritten", len("rewritten a!")),
    UpperEntry("b.txt", "deleted", 0),
    UpperEntry("gone/x.bin", "deleted", 0),
    UpperEntry("new.txt", "new", len("brand new")),
    UpperEntry("sub/d.txt", "new", 2),
]


def argv_spec(tmp_path: Path, code: str, *args: str, **kw: Any) -> ContainerSpec:
    base = make_spec(tmp_path, code, **kw)
    return ContainerSpec(
        name=base.name,
        command=(*base.command, *args),
        env=base.env,
        labels=base.labels,
        mounts=base.mounts,
        log_path=base.log_path,
    )


@needs_root
def test_ns_rw_bind(rt: LocalRuntime, tmp_path: Path) -> None:
    assert rt.uses_mount_namespace
    source = tmp_path / "src"
    source.mkdir()
    (source / "existing").write_text("hello")
    target = tmp_path / "mnt" / "rw"
    code = (
        "import pathlib, sys\n"
        "t = pathlib.Path(sys.argv[1])\n"
        "print('read=' + (t / 'existing').read_text(), flush=True)\n"
        "(t / 'written').write_text('from engine')\n"
    )
    started = rt.start(argv_spec(tmp_path, code, str(target), mounts=(Mount("rw", source, str(target)),)))
    assert started.enforced_read_only
    assert wait_exit(rt, started) == 0, rt.logs(started)
    assert "read=hello" in rt.logs(started)
    assert (source / "written").read_text() == "from engine"
    assert not (target / "written").exists()  # the bind lived only in the engine's namespace
    finish(rt, started)
    assert not (tmp_path / "mnt").exists()  # mount points we created are tidied up


@needs_root
def test_ns_ro_bind_refuses_writes(rt: LocalRuntime, tmp_path: Path) -> None:
    source = make_lower(tmp_path)
    before = tree_digest(source)
    target = tmp_path / "mnt" / "ro"
    code = (
        "import pathlib, sys\n"
        "t = pathlib.Path(sys.argv[1])\n"
        "print('read=' + (t / 'a.txt').read_text(), flush=True)\n"
        "for attempt in (lambda: (t / 'a.txt').write_text('x'), lambda: (t / 'new').write_text('x')):\n"
        "    try:\n"
        "        attempt()\n"
        "        print('WROTE', flush=True)\n"
        "    except OSError as exc:\n"
        "        print('errno', exc.errno, flush=True)\n"
    )
    started = rt.start(argv_spec(tmp_path, code, str(target), mounts=(Mount("ro", source, str(target)),)))
    assert wait_exit(rt, started) == 0, rt.logs(started)
    logs = rt.logs(started)
    assert "read=original a" in logs
    assert "WROTE" not in logs
    assert logs.count(f"errno {errno.EROFS}") == 2
    assert tree_digest(source) == before
    assert rt.upper_entries(started) == []
    finish(rt, started)


@needs_root
def test_ns_overlay_keeps_lower_and_classifies_upper(rt: LocalRuntime, tmp_path: Path) -> None:
    lower = make_lower(tmp_path)
    before = tree_digest(lower)
    scratch = tmp_path / "scratch"
    target = tmp_path / "mnt" / "cache"
    started = rt.start(
        argv_spec(
            tmp_path,
            OVERLAY_WRITER,
            str(target),
            mounts=(Mount("overlay", lower, str(target), scratch=scratch),),
        )
    )
    assert started.enforced_read_only and started.notes == ()
    assert wait_exit(rt, started) == 0, rt.logs(started)
    assert "sub/c.txt=untouched c" in rt.logs(started)
    assert tree_digest(lower) == before
    assert (scratch / "upper" / "a.txt").read_text() == "rewritten a!"
    assert (scratch / "upper" / "new.txt").exists()
    assert rt.upper_entries(started) == EXPECTED_UPPER
    finish(rt, started)
    assert (scratch / "upper" / "a.txt").exists()  # evidence stays for the caller


@needs_root
def test_ns_mount_failure_is_reported(rt: LocalRuntime, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    target = tmp_path / "mnt" / "bad"
    started = rt.start(make_spec(tmp_path, "print('engine ran')", mounts=(Mount("ro", not_a_dir, str(target)),)))
    assert wait_exit(rt, started) == MOUNT_SETUP_FAILED
    logs = rt.logs(started)
    assert "mount setup failed" in logs and "engine ran" not in logs
    finish(rt, started)


@needs_root
def test_ns_forced_is_available_as_root(tmp_path: Path) -> None:
    runtime = LocalRuntime(use_mount_namespace=True)
    runtime.ping()
    assert "enforced" in runtime.notes[0]


@needs_root
def test_ns_parallel_engines_on_one_target_keep_their_mounts_when_one_is_removed(
    rt: LocalRuntime, tmp_path: Path
) -> None:
    """Parallel trials mount the cache at the same target, each in its own namespace. Removing one
    must not rmdir the mount point the others still use: on Linux that detaches their mounts, and
    the next engine there saw an empty cache (seen on a 2-GPU run: "no compiled artifact")."""
    lower = make_lower(tmp_path)
    target = tmp_path / "not-yet" / "cache"  # created by the first engine's prologue
    reader = (
        "import pathlib, sys, time\n"
        "t, go = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])\n"
        "print('up', flush=True)\n"
        "while not go.exists(): time.sleep(0.02)\n"
        "print('a.txt=' + ((t / 'a.txt').read_text() if (t / 'a.txt').exists() else 'MISSING'), flush=True)\n"
    )
    go = tmp_path / "go"

    def overlay_spec(scratch: str) -> ContainerSpec:
        mount = Mount("overlay", lower, str(target), scratch=tmp_path / scratch)
        return dataclasses.replace(argv_spec(tmp_path, reader, str(target), str(go)), mounts=(mount,))

    first = rt.start(overlay_spec("s1"))
    wait_log(rt, first, "up")
    second = rt.start(overlay_spec("s2"))
    wait_log(rt, second, "up")
    rt.stop(first, 5)
    rt.remove(first)  # while the second engine still has its overlay at the target
    go.touch()
    assert wait_exit(rt, second) == 0
    assert "a.txt=original a" in rt.logs(second), rt.logs(second)
    finish(rt, second)
    assert not target.exists() and not target.parent.exists(), "the last one out removes the mount points"


# -- copy mode (no mount namespace) -------------------------------------------------------


def test_copy_mode_overlay(copy_rt: LocalRuntime, tmp_path: Path) -> None:
    lower = make_lower(tmp_path)
    before = tree_digest(lower)
    target = tmp_path / "materialized" / "cache"
    started = copy_rt.start(
        argv_spec(
            tmp_path,
            OVERLAY_WRITER,
            str(target),
            mounts=(Mount("overlay", lower, str(target), scratch=tmp_path / "scratch"),),
        )
    )
    assert not started.enforced_read_only
    assert any("NOT enforced" in note for note in started.notes)
    assert wait_exit(copy_rt, started) == 0, copy_rt.logs(started)
    assert tree_digest(lower) == before
    assert copy_rt.upper_entries(started) == EXPECTED_UPPER
    finish(copy_rt, started)
    assert not target.exists()  # the materialized copy goes with remove()


def test_copy_mode_ro_writes_are_reported(copy_rt: LocalRuntime, tmp_path: Path) -> None:
    lower = make_lower(tmp_path)
    target = tmp_path / "ro-copy"
    target.mkdir()  # an empty pre-existing target is fine, and is kept (emptied) on remove
    code = "import pathlib, sys; (pathlib.Path(sys.argv[1]) / 'a.txt').write_text('oops')"
    started = copy_rt.start(argv_spec(tmp_path, code, str(target), mounts=(Mount("ro", lower, str(target)),)))
    assert wait_exit(copy_rt, started) == 0
    assert (lower / "a.txt").read_text() == "original a"
    assert copy_rt.upper_entries(started) == [UpperEntry("a.txt", "rewritten", 4)]
    finish(copy_rt, started)
    assert target.is_dir() and list(target.iterdir()) == []


def test_copy_mode_refusals(copy_rt: LocalRuntime, tmp_path: Path) -> None:
    lower = make_lower(tmp_path)
    with pytest.raises(RuntimeUnavailableError, match="target other than its source"):
        copy_rt.start(make_spec(tmp_path, "pass", mounts=(Mount("ro", lower, str(lower)),)))
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep").write_text("mine")
    with pytest.raises(RuntimeUnavailableError, match="not an empty directory"):
        copy_rt.start(make_spec(tmp_path, "pass", mounts=(Mount("overlay", lower, str(busy)),)))
    assert (busy / "keep").read_text() == "mine"
    # rw at its own path works without mounting
    code = "import pathlib, sys; (pathlib.Path(sys.argv[1]) / 'w').write_text('ok')"
    started = copy_rt.start(argv_spec(tmp_path, code, str(lower), mounts=(Mount("rw", lower, str(lower)),)))
    assert wait_exit(copy_rt, started) == 0
    assert (lower / "w").read_text() == "ok"
    assert started.enforced_read_only  # nothing read-only was asked for
    finish(copy_rt, started)


def test_copy_mode_failed_start_undoes_copy(copy_rt: LocalRuntime, tmp_path: Path) -> None:
    lower = make_lower(tmp_path)
    target = tmp_path / "copy-then-fail"
    spec = ContainerSpec(
        name="bless-unit-fail",
        command=(str(tmp_path / "no-such-binary"),),
        env={},
        labels=LABELS,
        mounts=(Mount("ro", lower, str(target)),),
        log_path=tmp_path / "fail.log",
    )
    with pytest.raises(RuntimeUnavailableError):
        copy_rt.start(spec)
    assert not target.exists()


def test_a_parallel_trials_gpu_set_replaces_the_hosts_visible_devices(
    rt: LocalRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each parallel trial sees its own GPUs only, whatever CUDA_VISIBLE_DEVICES the host had."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    code = "import os; print('CVD=' + os.environ.get('CUDA_VISIBLE_DEVICES', '-'), flush=True)"
    started = rt.start(make_spec(tmp_path, code, gpus=1, gpu_ids=("GPU-aaaa", "GPU-bbbb")))
    assert wait_exit(rt, started) == 0
    assert "CVD=GPU-aaaa,GPU-bbbb" in rt.logs(started)
    finish(rt, started)


def test_ports_handed_out_are_never_handed_out_twice_until_removed(rt: LocalRuntime, tmp_path: Path) -> None:
    """Parallel trials each pick a port before any engine binds one: no two may get the same."""
    ports = [rt.engine_port(8000) for _ in range(200)]
    assert len(set(ports)) == len(ports)
    started = rt.start(make_spec(tmp_path, "pass", port=ports[0]))
    wait_exit(rt, started)
    finish(rt, started)
    assert ports[0] not in rt._ports_handed_out  # free again once its engine is removed


PRIVATE_WRITER = (
    "import pathlib, sys\n"
    "t = pathlib.Path(sys.argv[1])\n"
    "print('empty=' + str(not any(t.iterdir())), flush=True)\n"
    "(t / '.triton' / 'cache').mkdir(parents=True)\n"
    "(t / '.triton' / 'cache' / 'k.cubin').write_text('kernel')\n"
)


@pytest.mark.parametrize("mode", ["namespace", "copy"])
def test_a_private_dir_is_writable_at_its_target_and_its_writes_end_up_in_its_source(
    rt: LocalRuntime, copy_rt: LocalRuntime, tmp_path: Path, mode: str
) -> None:
    """The engine's HOME: fresh at the fixed target, its writes readable from the source after the stop."""
    runtime = rt if mode == "namespace" else copy_rt
    if mode == "namespace" and not runtime.uses_mount_namespace:
        pytest.skip("a mount namespace needs root")
    source = tmp_path / "private" / "home"
    source.mkdir(parents=True)
    target = tmp_path / "fixed" / "home"
    spec = argv_spec(tmp_path, PRIVATE_WRITER, str(target), mounts=(Mount("private", source, str(target)),))
    started = runtime.start(spec)
    assert started.enforced_read_only and not started.notes, "a private dir is nobody's read-only layer"
    assert wait_exit(runtime, started) == 0, runtime.logs(started)
    runtime.stop(started, 5)
    assert "empty=True" in runtime.logs(started)
    assert (source / ".triton" / "cache" / "k.cubin").read_text() == "kernel"
    finish(runtime, started)
    assert not target.exists(), "the fixed path is gone with the engine"


PLACED_READER = (
    "import pathlib, sys\n"
    "t = pathlib.Path(sys.argv[1])\n"
    "print('placed=' + (t / 'bless-seal' / 'bless_seal.py').read_text(), flush=True)\n"
    "(t / 'bless-seal' / '__pycache__').mkdir()\n"
    "(t / 'bless-seal' / '__pycache__' / 'bless_seal.cpython-311.pyc').write_text('bytecode')\n"
    "(t / 'k.cubin').write_text('kernel')\n"
)


@pytest.mark.parametrize("mode", ["namespace", "copy"])
def test_what_bless_placed_in_a_private_dir_reaches_the_engine_and_comes_back_once(
    rt: LocalRuntime, copy_rt: LocalRuntime, tmp_path: Path, mode: str
) -> None:
    """A sealed start's module, written into the private temp dir before the start: the source ends as the
    engine left the target (not a copy nested inside the placed dir)."""
    runtime = rt if mode == "namespace" else copy_rt
    if mode == "namespace" and not runtime.uses_mount_namespace:
        pytest.skip("a mount namespace needs root")
    source = tmp_path / "private" / "tmp"
    (source / "bless-seal").mkdir(parents=True)
    (source / "bless-seal" / "bless_seal.py").write_text("HOOK")
    target = tmp_path / "fixed" / "tmp"
    spec = argv_spec(tmp_path, PLACED_READER, str(target), mounts=(Mount("private", source, str(target)),))
    started = runtime.start(spec)
    assert wait_exit(runtime, started) == 0, runtime.logs(started)
    runtime.stop(started, 5)
    assert "placed=HOOK" in runtime.logs(started)
    assert sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file()) == [
        "bless-seal/__pycache__/bless_seal.cpython-311.pyc",
        "bless-seal/bless_seal.py",
        "k.cubin",
    ]
    finish(runtime, started)
