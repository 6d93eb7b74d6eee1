"""What is the Docker runtime's own, against a real Docker Engine and a busybox image built on the spot.

The contract every runtime keeps (lifecycle, stop verdicts, names, mounts) is checked in
tests/contract/test_runtime.py; here: labels and published ports, overlay volumes, foreign
containers, Docker's init, helper containers. Each test uses its own run id and must leave no
container of ours behind: the ``ctx`` fixture asserts ``list_ours`` is empty at the end.
Foreign (unlabeled) containers are made with the plain SDK and removed in ``finally``.
"""

from __future__ import annotations

import os
import stat
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bless import container_labels as labels
from bless.errors import ContainerConflictError, EngineFailedError, ImageMissingError, RuntimeUnavailableError
from bless.runtime.base import ContainerSpec, Mount, Started
from bless.runtime.docker import DockerRuntime, overlay_volume_name
from tests.support.runtime_helpers import make_lower, tree_digest, wait_exit

pytestmark = pytest.mark.integration

# A shell that exits 0 on SIGTERM.
GRACEFUL = 'trap "exit 0" TERM; echo ready; sleep 600 & wait'


class Ctx:
    def __init__(self, rt: DockerRuntime, run_id: str, image: str) -> None:
        self.rt = rt
        self.run_id = run_id
        self.image = image
        self.labels = labels.labels_for(
            run_id=run_id, phase=labels.PHASE_TRIAL, config_hash="f" * 64, profile="docker-it"
        )

    def name(self) -> str:
        return f"bless-it-{uuid.uuid4().hex[:10]}"

    def spec(self, *command: str, **kw: Any) -> ContainerSpec:
        kw.setdefault("name", self.name())
        kw.setdefault("env", {})
        kw.setdefault("labels", self.labels)
        kw.setdefault("image", self.image)
        return ContainerSpec(command=command, **kw)


@pytest.fixture
def ctx(busybox_image: str) -> Iterator[Ctx]:
    run_id = f"it-{uuid.uuid4().hex[:12]}"
    rt = DockerRuntime()
    context = Ctx(rt, run_id, busybox_image)
    yield context
    leftovers = rt.list_ours({labels.RUN_ID: run_id})
    if leftovers:
        rt.cleanup_ours({labels.RUN_ID: run_id})
    assert leftovers == [], f"test left containers of ours behind: {[c.name for c in leftovers]}"


def wait_process(docker_client: Any, started: Started, name: str, timeout: float = 30.0) -> None:
    """Until ``name`` runs in the container (so init has set up signal forwarding)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        top = docker_client.containers.get(started.id).top()
        if any(name in " ".join(row) for row in top.get("Processes") or []):
            return
        time.sleep(0.05)
    raise AssertionError(f"{name} never ran in {started.name}")


def finish(rt: DockerRuntime, started: Started, timeout_s: int = 5) -> None:
    rt.stop(started, timeout_s)
    rt.remove(started)


def test_labels_and_port_on_loopback_only(ctx: Ctx, docker_client: Any, tmp_path: Path) -> None:
    ctx.rt.ping()
    assert ctx.rt.resolve_image(ctx.image).startswith("sha256:")
    assert ctx.rt.engine_port(8080) == 8080
    www = tmp_path / "www"
    www.mkdir()
    (www / "index.html").write_text("hello from bless\n")
    spec = ctx.spec(
        "sh", "-c", 'trap "exit 0" TERM; httpd -f -p 8080 -h /www & wait',
        port=8080,
        mounts=(Mount("ro", www, "/www"),),
    )  # fmt: skip
    started = ctx.rt.start(spec)
    try:
        assert started.host_port is not None and started.host_port != 0
        attrs = docker_client.containers.get(started.id).attrs
        for key, value in ctx.labels.items():
            assert attrs["Config"]["Labels"][key] == value
        assert attrs["HostConfig"]["PortBindings"]["8080/tcp"] == [{"HostIp": "127.0.0.1", "HostPort": ""}]
        published = attrs["NetworkSettings"]["Ports"]["8080/tcp"]
        assert published and all(b["HostIp"] == "127.0.0.1" for b in published)
        assert {int(b["HostPort"]) for b in published} == {started.host_port}
        body = ""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{started.host_port}/index.html", timeout=2) as r:
                    body = r.read().decode()
                break
            except OSError:
                time.sleep(0.1)
        assert body == "hello from bless\n"
        assert [c.name for c in ctx.rt.list_ours({labels.RUN_ID: ctx.run_id})] == [spec.name]
        assert ctx.rt.name_holder(spec.name) == "ours"
    finally:
        result = ctx.rt.stop(started, 5)
        ctx.rt.remove(started)
    assert result.graceful and result.exit_code == 0
    assert ctx.rt.name_holder(spec.name) == "free"


def test_overlay_volume_is_ours_and_goes_with_the_container(ctx: Ctx, docker_client: Any, tmp_path: Path) -> None:
    """How Docker presents an overlay (a labelled volume); what the engine sees is in the contract suite."""
    lower = make_lower(tmp_path / "ov-src")
    scratch = tmp_path / "scratch"
    lower_before = tree_digest(lower)
    spec = ctx.spec(
        "sh", "-c", "printf 'rewritten a!' > /ov/a.txt",
        mounts=(Mount("overlay", lower, "/ov", scratch=scratch),),
    )  # fmt: skip
    started = ctx.rt.start(spec)
    volume_name = overlay_volume_name(spec.name, 0)
    try:
        assert wait_exit(ctx.rt, started) == 0, ctx.rt.logs(started)
        assert (scratch / "upper" / "a.txt").read_text() == "rewritten a!"
        volume = docker_client.volumes.get(volume_name)
        assert labels.is_ours(volume.attrs["Labels"])
        assert volume.attrs["Labels"][labels.RUN_ID] == ctx.run_id
    finally:
        finish(ctx.rt, started)
    names = [v.name for v in docker_client.volumes.list()]
    assert volume_name not in names
    assert (scratch / "upper" / "a.txt").exists()  # the evidence stays on the host
    assert tree_digest(lower) == lower_before


def test_foreign_container_with_our_name_is_refused_and_left_alone(
    ctx: Ctx, docker_client: Any, tmp_path: Path
) -> None:
    name = ctx.name()
    foreign = docker_client.containers.create(ctx.image, ["sleep", "600"], name=name)
    foreign_volume = docker_client.volumes.create(name=overlay_volume_name(ctx.name(), 0))
    try:
        assert ctx.rt.name_holder(name) == "foreign"
        with pytest.raises(ContainerConflictError, match="WITHOUT our labels") as info:
            ctx.rt.start(ctx.spec("sh", "-c", GRACEFUL, name=name))
        assert info.value.exit_code == 12
        assert "rename or remove it yourself" in (info.value.hint or "")
        assert docker_client.containers.get(name).id == foreign.id  # still there, untouched
        assert ctx.rt.cleanup_ours({labels.RUN_ID: ctx.run_id}) == []
        # A foreign volume squatting our overlay volume's name is refused the same way.
        squatted = foreign_volume.name.removesuffix("-overlay")
        lower = make_lower(tmp_path)
        with pytest.raises(ContainerConflictError, match="volume"):
            ctx.rt.start(
                ctx.spec("true", name=squatted, mounts=(Mount("overlay", lower, "/ov", scratch=tmp_path / "s"),))
            )
        assert ctx.rt.name_holder(squatted) == "free"
        docker_client.volumes.get(foreign_volume.name)  # still there
    finally:
        foreign.remove(force=True)
        foreign_volume.remove()


def test_init_forwards_sigterm_to_an_engine_without_handler(ctx: Ctx, docker_client: Any) -> None:
    # `sleep` installs no handler. As PID 1 it would ignore SIGTERM and need the kill;
    # behind Docker's init it dies of SIGTERM at once, like on a host (128 + 15).
    started = ctx.rt.start(ctx.spec("sleep", "600"))
    try:
        assert docker_client.containers.get(started.id).attrs["HostConfig"]["Init"] is True
        # A SIGTERM sent before init installed its handlers would be lost (init is PID 1 too).
        wait_process(docker_client, started, "sleep")
        result = ctx.rt.stop(started, 10)
        assert result.graceful and result.exit_code == 143
    finally:
        ctx.rt.remove(started)
    no_init = DockerRuntime(init=False)
    started = no_init.start(ctx.spec("sleep", "600"))
    try:
        result = no_init.stop(started, 1)
        assert not result.graceful and result.exit_code == 137
    finally:
        no_init.remove(started)


def test_cleanup_ours_removes_only_labeled(ctx: Ctx, docker_client: Any, tmp_path: Path) -> None:
    lower = make_lower(tmp_path)
    ours_a = ctx.rt.start(ctx.spec("sh", "-c", GRACEFUL))
    ours_b = ctx.rt.start(
        ctx.spec("sh", "-c", GRACEFUL, mounts=(Mount("overlay", lower, "/ov", scratch=tmp_path / "s"),))
    )
    foreign = docker_client.containers.run(ctx.image, ["sleep", "600"], name=ctx.name(), detach=True)
    try:
        removed = ctx.rt.cleanup_ours({labels.RUN_ID: ctx.run_id})
        assert sorted(removed) == sorted([ours_a.name, ours_b.name])
        assert ctx.rt.list_ours({labels.RUN_ID: ctx.run_id}) == []
        foreign.reload()
        assert foreign.status == "running"
        leftover_volumes = docker_client.volumes.list(filters={"label": f"{labels.RUN_ID}={ctx.run_id}"})
        assert leftover_volumes == []
    finally:
        foreign.remove(force=True)


def test_unreachable_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    rt = DockerRuntime()  # constructing never connects
    with pytest.raises(RuntimeUnavailableError) as info:
        rt.ping()
    assert info.value.exit_code == 50
    assert "ensure-docker.sh" in (info.value.hint or "")
    assert "nonexistent.sock" in (info.value.hint or "")
    with pytest.raises(RuntimeUnavailableError):
        DockerRuntime(base_url="unix:///nonexistent.sock").list_ours({})


def test_missing_image(ctx: Ctx, docker_client: Any, tmp_path: Path) -> None:
    with pytest.raises(ImageMissingError) as info:
        ctx.rt.resolve_image("bless-test-missing:0")
    assert info.value.exit_code == 51
    spec = ctx.spec(
        "true",
        image="bless-test-missing:0",
        mounts=(Mount("overlay", make_lower(tmp_path), "/ov", scratch=tmp_path / "s"),),
    )
    with pytest.raises(ImageMissingError):
        ctx.rt.start(spec)
    assert ctx.rt.name_holder(spec.name) == "free"
    # The overlay volume made before the create failed is gone too.
    assert overlay_volume_name(spec.name, 0) not in [v.name for v in docker_client.volumes.list()]


def test_failed_start_leaves_nothing_behind(ctx: Ctx, docker_client: Any, tmp_path: Path) -> None:
    lower = make_lower(tmp_path)
    mounts = (Mount("overlay", lower, "/ov", scratch=tmp_path / "s"),)
    # Behind Docker's init the container starts, and the engine "exits" 127 (as on a host).
    started = ctx.rt.start(ctx.spec("/no/such/engine", mounts=mounts))
    assert wait_exit(ctx.rt, started) == 127
    assert "no such file" in ctx.rt.logs(started).lower()
    finish(ctx.rt, started)
    # Without init the daemon itself refuses to start it: nothing may be left behind.
    no_init = DockerRuntime(init=False)
    spec = ctx.spec("/no/such/engine", mounts=mounts)
    with pytest.raises(EngineFailedError, match="no such file"):
        no_init.start(spec)
    assert ctx.rt.name_holder(spec.name) == "free"
    assert overlay_volume_name(spec.name, 0) not in [v.name for v in docker_client.volumes.list()]


def test_normalize_ownership_with_helper_container(
    ctx: Ctx, docker_client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    script = "mkdir -p /out/d && echo secret > /out/d/f && chmod 600 /out/d/f && chmod 700 /out/d"
    started = ctx.rt.start(ctx.spec("sh", "-c", script, mounts=(Mount("rw", out, "/out"),)))
    assert wait_exit(ctx.rt, started) == 0, ctx.rt.logs(started)
    finish(ctx.rt, started)
    assert stat.S_IMODE((out / "d" / "f").stat().st_mode) == 0o600
    helpers_before = {
        c.id for c in docker_client.containers.list(all=True, filters={"label": "org.bless.phase=helper"})
    }
    # Pretend to be an unprivileged user so the helper-container path runs for real.
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    monkeypatch.setattr(os, "getuid", lambda: 4242)
    monkeypatch.setattr(os, "getgid", lambda: 4343)
    ctx.rt.normalize_ownership(out, image=ctx.image)
    monkeypatch.undo()
    st_file, st_dir = (out / "d" / "f").stat(), (out / "d").stat()
    assert (st_file.st_uid, st_file.st_gid) == (4242, 4343)
    assert stat.S_IMODE(st_file.st_mode) == 0o644
    assert stat.S_IMODE(st_dir.st_mode) == 0o755
    helpers_after = {c.id for c in docker_client.containers.list(all=True, filters={"label": "org.bless.phase=helper"})}
    assert helpers_after <= helpers_before  # the helper removed itself


def test_python_path_goes_before_the_image_s_own_pythonpath(ctx: Ctx, docker_client: Any) -> None:
    """A sealed start's module dir first, then what the image set (the reference image's /opt/bless): the
    engine must still find its own packages."""
    import io

    tag = f"bless-it-pythonpath:{uuid.uuid4().hex[:8]}"
    dockerfile = f"FROM {ctx.image}\nENV PYTHONPATH=/image/dir\n".encode()
    docker_client.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True)
    try:
        started = ctx.rt.start(ctx.spec("sh", "-c", 'echo "pp=$PYTHONPATH"', image=tag, python_path=("/seal/dir",)))
        deadline = time.monotonic() + 30
        while ctx.rt.is_running(started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "pp=/seal/dir:/image/dir" in ctx.rt.logs(started)
        finish(ctx.rt, started)
    finally:
        docker_client.images.remove(tag, force=True)


def test_a_clean_up_racing_a_start_never_leaves_an_unlabelled_overlay_volume(
    ctx: Ctx, docker_client: Any, tmp_path: Path
) -> None:
    """A stop's clean-up (our unused volumes) run at the worst moment of a start: after its overlay is prepared,
    just before the container's create. Docker used to make an empty, unlabelled volume of that name for the
    create, which served no overlay and made every later start refuse (12)."""

    class Racing(DockerRuntime):
        def _create(self, docker: Any, image: str, spec: ContainerSpec, kwargs: dict[str, Any]) -> Any:
            ctx.rt.cleanup_ours({labels.RUN_ID: ctx.run_id})  # what a racing serve-full stop does
            return super()._create(docker, image, spec, kwargs)

    racing = Racing()
    lower = make_lower(tmp_path / "lower")
    spec = ctx.spec("sh", "-c", GRACEFUL, mounts=(Mount("overlay", lower, "/ov", scratch=tmp_path / "s"),))
    volume_name = overlay_volume_name(spec.name, 0)
    for _ in range(2):  # and the next start of the name goes ahead
        started = racing.start(spec)
        try:
            volume = docker_client.volumes.get(volume_name)
            assert labels.is_ours(volume.attrs["Labels"]), "the volume the container mounts carries our labels"
            assert volume.attrs["Options"]["type"] == "overlay" and str(lower) in volume.attrs["Options"]["o"]
        finally:
            finish(racing, started)
        assert volume_name not in [v.name for v in docker_client.volumes.list()]


_SHM_WRITER = "mkdir -p /dev/shm/x && echo k > /dev/shm/x/k.so && echo s > /dev/shm/psm_1 && echo ready; sleep 600"


@pytest.mark.parametrize("which", ["busybox", "reference"])
def test_shm_entries_lists_the_container_s_own_dev_shm_while_it_runs(
    ctx: Ctx, docker_client: Any, request: pytest.FixtureRequest, which: str
) -> None:
    """/dev/shm is a tmpfs docker diff never shows: the seal watcher reads it by an exec (GNU find, python3 or
    busybox's find), and nothing is left of it once the container stopped."""
    image = ctx.image if which == "busybox" else request.getfixturevalue("reference_image")
    started = ctx.rt.start(ctx.spec("sh", "-c", _SHM_WRITER, image=image))
    try:
        deadline = time.monotonic() + 60
        while "ready" not in ctx.rt.logs(started):
            assert time.monotonic() < deadline and ctx.rt.is_running(started), ctx.rt.logs(started)
            time.sleep(0.1)
        listed = ctx.rt.shm_entries(started)
        assert [(entry.where, entry.path) for entry in listed] == [
            ("container", "/dev/shm/psm_1"),
            ("container", "/dev/shm/x/k.so"),
        ]
        if which == "reference":  # GNU find: sizes and kinds too
            assert [(entry.size, entry.kind) for entry in listed] == [(2, "file"), (2, "file")]
        assert not any(entry.path.startswith("/dev/shm") for entry in ctx.rt.filesystem_changes(started))
    finally:
        finish(ctx.rt, started)
    assert ctx.rt.shm_entries(started) == []
