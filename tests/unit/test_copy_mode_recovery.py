"""The local runtime's copy mode on a full target, and after a killed start (issue 25, item 8).

A pod without CAP_SYS_ADMIN serves a verified copy of the blessed tree. On a target too small the copy
failed halfway, left its partial tree behind and said 50 (runtime unavailable), not 15 (no space); the
container restarted and met "the target exists and is not an empty directory" (50) on every restart
until the pod was deleted. The same after a serve-full killed mid-copy. The copy is now made whole in a
staging directory of its own inside the target, then swapped in: a full disk is 15 with the target left
as found, and a target that holds only bless's own partial copy is cleared and copied again.

The disks are real small tmpfs mounts (root); the kill is a real SIGKILL of a process copying.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from bless import container_labels as labels
from bless.errors import ExitCode, NoSpaceError, RuntimeUnavailableError
from bless.runtime.base import ContainerSpec, Mount
from bless.runtime.local import LocalRuntime
from bless.runtime.materialize import COPY_MARK, PARTIAL
from tests.support.runtime_helpers import tree_digest, wait_exit
from tests.unit.test_full_disk import small_disk

LABELS = labels.labels_for(
    run_id=f"unit-{uuid.uuid4().hex[:8]}", phase=labels.PHASE_SERVE, config_hash="0" * 64, profile="unit"
)


def _spec(tmp_path: Path, source: Path, target: Path) -> ContainerSpec:
    name = f"bless-unit-{uuid.uuid4().hex[:8]}"
    return ContainerSpec(
        name=name,
        command=(sys.executable, "-c", "pass"),
        env={},
        labels=LABELS,
        log_path=tmp_path / f"{name}.log",
        mounts=(Mount("ro", source, str(target)),),
    )


def _source(root: Path, files: int, size: int) -> Path:
    source = root / "blessed"
    for index in range(files):
        path = source / f"d{index % 50:02d}" / f"f{index:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    return source


@pytest.mark.parametrize("pre_existing", [True, False], ids=["mount-point-target", "absent-target"])
def test_a_full_target_is_15_and_leaves_nothing_behind(tmp_path: Path, pre_existing: bool) -> None:
    source = _source(tmp_path, files=40, size=64 << 10)  # 2.5 MiB into 1 MiB
    runtime = LocalRuntime(use_mount_namespace=False)
    with small_disk(tmp_path / "disk", "1m") as disk:
        target = disk if pre_existing else disk / "cache" / "blessed"
        with pytest.raises(NoSpaceError) as info:
            runtime.start(_spec(tmp_path, source, target))
        assert info.value.exit_code == ExitCode.NO_SPACE and int(info.value.exit_code) == 15
        assert "No space left" in info.value.message and info.value.hint
        if pre_existing:
            assert list(disk.iterdir()) == [], "the failed copy is cleared from the target"
        else:
            assert not target.exists(), "the target the copy created is removed"
        # Nothing blocks the next start once the tree fits: no "target is not empty" loop.
        small = _source(tmp_path / "small", files=4, size=1 << 10)
        started = runtime.start(_spec(tmp_path, small, target))
        assert tree_digest(target) == tree_digest(small)
        assert wait_exit(runtime, started) == 0
        runtime.stop(started, 2)
        runtime.remove(started)


_COPIER = """
import sys
from pathlib import Path
from bless import container_labels as labels
from bless.runtime.base import ContainerSpec, Mount
from bless.runtime.local import LocalRuntime
source, target, log = sys.argv[1:4]
spec = ContainerSpec(
    name="bless-unit-killed", command=(sys.executable, "-c", "pass"), env={},
    labels=labels.labels_for(run_id="killed", phase=labels.PHASE_SERVE, config_hash="0" * 64, profile="unit"),
    log_path=Path(log), mounts=(Mount("ro", Path(source), target),),
)
LocalRuntime(use_mount_namespace=False).start(spec)
"""


def test_a_start_killed_mid_copy_is_recovered_by_the_next_start(tmp_path: Path) -> None:
    source = _source(tmp_path, files=6000, size=2 << 10)
    target = tmp_path / "emptydir"
    target.mkdir()  # a pod's emptyDir: the target exists before serve-full runs
    copier = subprocess.Popen(
        [sys.executable, "-c", _COPIER, str(source), str(target), str(tmp_path / "killed.log")],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    deadline = time.monotonic() + 30
    while not any(target.iterdir()) and time.monotonic() < deadline and copier.poll() is None:
        time.sleep(0.002)
    time.sleep(0.05)
    assert copier.poll() is None, "the copy ended before it could be killed midway (make the source bigger)"
    copier.send_signal(signal.SIGKILL)
    copier.wait()
    assert any(target.iterdir()), "the killed start left a partial copy"
    assert tree_digest(target) != tree_digest(source)
    runtime = LocalRuntime(use_mount_namespace=False)
    started = runtime.start(_spec(tmp_path, source, target))  # refused with 50 before, on every restart
    assert not (target / PARTIAL).exists()
    assert tree_digest(target) == tree_digest(source), "a whole copy, nothing of the partial one left"
    assert wait_exit(runtime, started) == 0
    runtime.stop(started, 2)
    runtime.remove(started)


def test_a_target_holding_anything_else_is_still_refused(tmp_path: Path) -> None:
    source = _source(tmp_path, files=2, size=16)
    target = tmp_path / "target"
    target.mkdir()
    (target / "someone-elses.txt").write_text("keep me")
    with pytest.raises(RuntimeUnavailableError, match="not an empty directory") as info:
        LocalRuntime(use_mount_namespace=False).start(_spec(tmp_path, source, target))
    assert info.value.exit_code == ExitCode.RUNTIME_UNAVAILABLE
    assert (target / "someone-elses.txt").read_text() == "keep me"


NON_ROOT = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_a_non_root_user_copies_and_removes_a_read_only_blessed_tree() -> None:
    """A pod under Pod Security "restricted" runs serve-full as a user other than root: the blessed tree's 0555
    directories must still be moved out of the staging directory and removed after (EACCES before)."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="bless-nonroot-", dir="/tmp"))
    try:
        base.chmod(0o755)
        source = base / "blessed"
        (source / "reference" / "inner").mkdir(parents=True)
        (source / "reference" / "inner" / "artifact.bin").write_bytes(b"x" * 100)
        for directory in (source / "reference" / "inner", source / "reference", source):
            for entry in directory.iterdir():
                entry.chmod(0o444 if entry.is_file() else 0o555)
        source.chmod(0o555)
        target = base / "cache"
        target.mkdir()
        os.chown(target, NON_ROOT, NON_ROOT)
        script = (
            "import os, sys\n"
            "from pathlib import Path\n"
            "from bless.runtime.materialize import clear_contents, copy_whole\n"  # imported as root: the
            f"os.setgid({NON_ROOT}); os.setuid({NON_ROOT})\n"  # interpreter's files may be root's alone
            "copy_whole(Path(sys.argv[1]), Path(sys.argv[2]))\n"
            "assert (Path(sys.argv[2]) / 'reference' / 'inner' / 'artifact.bin').read_bytes() == b'x' * 100\n"
            "clear_contents(Path(sys.argv[2]))\n"
            "assert not any(Path(sys.argv[2]).iterdir())\n"
        )
        repo = Path(__file__).resolve().parents[2]
        proc = subprocess.run(
            [sys.executable, "-c", script, str(source), str(target)],
            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(repo)}, cwd=base,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
    finally:
        for walked, _dirs, _files in os.walk(base):
            os.chmod(walked, 0o755)
        shutil.rmtree(base)


_ENGINE = """
import os, sys, time
from pathlib import Path
cache, home = Path(sys.argv[1]), Path(sys.argv[2])
(cache / "written-while-serving.bin").write_bytes(b"engine write")  # what vLLM's rewrites leave in a copy
next(p for p in cache.rglob("*.bin") if p.name != "written-while-serving.bin").write_bytes(b"rewritten")
(home / ".cache").mkdir()
(home / ".cache" / "state").write_text("x")
(cache / "ready").write_text("ready")
time.sleep(600)
"""


def test_a_serve_killed_after_its_copy_is_recovered_by_the_restart_in_the_same_pod(tmp_path: Path) -> None:
    """The emptyDirs keep a complete copy and the engine's writes: the restart clears, copies again, verifies."""
    source = _source(tmp_path, files=20, size=256)
    home_source = tmp_path / "private" / "home"
    home_source.mkdir(parents=True)
    cache_target, state_target = tmp_path / "engine-cache", tmp_path / "engine-state"
    cache_target.mkdir()  # the pod's emptyDirs exist before serve-full runs
    state_target.mkdir()
    home_target = state_target / "home"
    verified: list[Path] = []

    def check_copy(copy: Path) -> None:
        assert tree_digest(copy) == tree_digest(source), "the engine would start on what was not verified"
        verified.append(copy)

    def spec(command: tuple[str, ...]) -> ContainerSpec:
        return ContainerSpec(
            name=f"bless-unit-{uuid.uuid4().hex[:8]}",
            command=command,
            env={},
            labels=LABELS,
            log_path=tmp_path / f"{uuid.uuid4().hex[:8]}.log",
            mounts=(
                Mount("ro", source, str(cache_target), check_copy=check_copy),
                Mount("private", home_source, str(home_target)),
            ),
        )

    first = LocalRuntime(use_mount_namespace=False)
    started = first.start(spec((sys.executable, "-c", _ENGINE, str(cache_target), str(home_target))))
    deadline = time.monotonic() + 30
    while not (cache_target / "ready").exists():
        assert time.monotonic() < deadline and first.exit_code(started) is None, first.logs(started)
        time.sleep(0.02)
    os.killpg(int(started.id), signal.SIGKILL)  # the container is killed: nothing of serve-full runs after
    wait_exit(first, started)
    assert (home_target / ".cache" / "state").exists() and tree_digest(cache_target) != tree_digest(source)

    second = LocalRuntime(use_mount_namespace=False)  # the restarted container: a new serve-full
    restarted = second.start(spec((sys.executable, "-c", "pass")))  # refused with 50 before, on every restart
    assert verified == [cache_target, cache_target], "the copy is verified again before the engine starts"
    assert tree_digest(cache_target) == tree_digest(source), "the killed engine's writes are gone"
    assert list(home_target.iterdir()) == [], "the killed engine's HOME is fresh again"
    assert wait_exit(second, restarted) == 0
    second.stop(restarted, 2)
    second.remove(restarted)


def test_a_copy_without_bless_mark_is_still_refused(tmp_path: Path) -> None:
    """Only bless's mark makes a non-empty target bless's: the same contents without it are kept and refused."""
    source = _source(tmp_path, files=2, size=16)
    target = tmp_path / "target"
    shutil.copytree(source, target)
    with pytest.raises(RuntimeUnavailableError, match="no copy of bless's") as info:
        LocalRuntime(use_mount_namespace=False).start(_spec(tmp_path, source, target))
    assert info.value.exit_code == ExitCode.RUNTIME_UNAVAILABLE
    assert tree_digest(target) == tree_digest(source)
    assert COPY_MARK not in os.listxattr(target)
