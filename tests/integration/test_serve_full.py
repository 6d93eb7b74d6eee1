"""serve-full end to end: real Docker, the real reference engine, the session's real blessing.

Refusals never start an engine, so they are cheap; each asserts the exit code, the key text, and
that NO container was created (Docker's own event log, filtered by the test profile's label).
Only four tests start an engine (about 15-40 s each here): --detach (then a second start is
refused while it runs), the foreground run stopped by SIGINT, the canary mismatch, and --debug.

The session blessing is never modified: every test that starts an engine or tampers with files
works on a copy of the store root (``cp -a``), and tampering makes the copied file writable first.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from bless.engines.base import ENGINE_HOME, ENGINE_TMP
from tests.integration.helpers import REPO, CliResult, our_containers, run_cli, serve_name, write_profile

pytestmark = pytest.mark.integration

SERVE = "bless.cli.serve"
EAGER_MARKER = "bless-reference: compile disabled (eager mode); cache not used"


# --------------------------------------------------------------------------------------------- helpers


def serve(*args: str, env: dict[str, str] | None = None) -> CliResult:
    return run_cli(*args, env=env, program=SERVE, timeout=600)


def copy_root(blessed: Any, tmp_path: Path) -> Path:
    """A private copy of the session's store root (modes, times and owners kept)."""
    target = tmp_path / "root"
    subprocess.run(["cp", "-a", str(blessed.root), str(target)], check=True)
    return target


def manifest_of(root: Path, config_hash: str) -> tuple[Path, dict[str, Any]]:
    path = root / "manifests" / f"{config_hash}.json"
    return path, json.loads(path.read_text())


def blessed_dir(root: Path, config_hash: str) -> Path:
    _, manifest = manifest_of(root, config_hash)
    return root / "blessed" / config_hash / str(manifest["cache"]["dir_id"])


def artifact(root: Path, config_hash: str, suffix: str) -> Path:
    _, manifest = manifest_of(root, config_hash)
    (path,) = [f["path"] for f in manifest["cache"]["files"] if f["path"].endswith(suffix)]
    return blessed_dir(root, config_hash) / str(path)


def writable(path: Path) -> Path:
    path.chmod(path.stat().st_mode | 0o200)
    return path


def created_since(since: float, profile_name: str) -> list[str]:
    """Containers Docker created since ``since`` carrying our profile label (its event log never forgets)."""
    out = subprocess.run(
        [
            "docker", "events",
            "--since", f"{since:.3f}", "--until", f"{time.time() + 0.5:.3f}",
            "--filter", "type=container", "--filter", "event=create",
            "--filter", f"label=org.bless.profile={profile_name}",
            "--format", "{{.Actor.Attributes.name}}",
        ],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    return out.split()


def refused(args: list[str], profile_name: str, code: int, *texts: str, env: dict[str, str] | None = None) -> CliResult:
    """Run serve-full, expect refusal ``code`` naming ``texts``, and prove nothing was created.

    Only this profile's containers count: other tests (and other users of the engine) start theirs meanwhile.
    """
    mine = f"org.bless.profile={profile_name}"
    before = set(our_containers(mine))
    since = time.time()
    result = serve(*args, env=env)
    assert result.code == code, result.stderr[-3000:]
    for text in texts:
        assert text in result.stderr, f"{text!r} not in:\n{result.stderr[-3000:]}"
    assert created_since(since, profile_name) == [], "a refusal created a container"
    new = [name for name in set(our_containers(mine)) - before if name.startswith("bless-serve-")]
    assert new == [], new
    return result


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def remove_serving(docker_client: Any, name: str) -> None:
    """What an operator does after --detach: docker stop, docker rm, and the overlay volume."""
    import docker

    try:
        container = docker_client.containers.get(name)
    except docker.errors.NotFound:
        return
    container.stop(timeout=30)
    container.remove()
    with contextlib.suppress(docker.errors.NotFound):
        docker_client.volumes.get(f"{name}-overlay").remove()


def profile_for(tmp_path: Path, name: str, port: int, **kwargs: Any) -> Path:
    return write_profile(tmp_path / f"{name}.toml", name=name, serving_port=port, **kwargs)


# --------------------------------------------------------------------------------------------- starts


def test_detach_canary_passes_and_a_second_start_is_refused(
    blessed: Any, tmp_path: Path, docker_client: Any, no_leftovers: None
) -> None:
    root = copy_root(blessed, tmp_path)
    name, port = "sf-detach", 18101
    profile = profile_for(tmp_path, name, port)
    container = serve_name(name, root)
    try:
        result = serve("--profile", str(profile), "--root", str(root), "--detach", "--json")
        assert result.code == 0, result.stderr[-4000:]
        doc = result.json()
        assert doc["ok"] is True and doc["plan"]["blessed"] is True
        assert doc["plan"]["config_hash"] == blessed.config_hash
        outcome = doc["result"]
        assert outcome["canary"]["status"] == "passed" and len(outcome["canary"]["checks"]) == 3
        assert all(check["match"] for check in outcome["canary"]["checks"])
        assert outcome["recheck"].startswith("unchanged")
        assert outcome["host_port"] == port and outcome["url"] == f"http://127.0.0.1:{port}"
        timings = outcome["timings"]
        assert {"preflight_s", "resolve_s", "verify_s", "create_s", "start_to_ready_s", "canary_s"} <= set(timings)

        info = docker_client.containers.get(container)
        assert info.status == "running"
        assert info.labels["org.bless.phase"] == "serve"
        assert info.labels["org.bless.config-hash"] == blessed.config_hash
        mounts = {mount["Destination"]: mount for mount in info.attrs["Mounts"]}
        assert set(mounts) == {"/var/cache/bless-engine", ENGINE_HOME, ENGINE_TMP}
        assert mounts["/var/cache/bless-engine"]["Type"] == "volume"
        # The engine's own HOME and temp dir: fresh binds under the serve dir, nothing of the image's HOME.
        for private in (ENGINE_HOME, ENGINE_TMP):
            assert mounts[private]["Type"] == "bind" and mounts[private]["RW"] is True
            assert Path(mounts[private]["Source"]).is_relative_to(Path(doc["plan"]["serve_dir"]))
        bindings = info.attrs["NetworkSettings"]["Ports"]["8000/tcp"]
        assert bindings == [{"HostIp": "127.0.0.1", "HostPort": str(port)}]
        assert get_json(f"http://127.0.0.1:{port}/v1/models")["data"][0]["id"] == "reference-tiny"
        assert Path(outcome["upper_dir"]).is_dir()

        # The same profile again while it runs: refused, nothing created, the running one untouched.
        again = refused(
            ["--profile", str(profile), "--root", str(root), "--detach"], name, 12, "already running", container
        )
        assert f"serve-full stop {name}" in again.stderr and "docker stop" not in again.stderr
        assert docker_client.containers.get(container).id == info.id

        # serve-full stop NAME (what --detach printed): the container, its overlay volume, the serve dir and the
        # lease are gone, and the engine stopped gracefully.
        # It names the store root: run as printed, it reaches this serve's lease and serve dir.
        assert shlex.split(outcome["stop_command"]) == ["serve-full", "stop", name, "--root", str(root)]
        serve_dir = Path(outcome["serve_dir"])
        stopped = serve(*shlex.split(outcome["stop_command"])[1:], "--json")
        assert stopped.code == 0, stopped.stderr[-3000:]
        report = stopped.json()
        # the detached serve's seal watcher first (it would report the engine's stop), then the engine
        watcher, engine = report["stopped"]
        assert watcher.startswith("seal watcher pid ") and engine == container
        assert report["serve_dirs_removed"] == [str(serve_dir)]
        assert report["leases_released"] == 1 and report["notes"] == []
        assert container not in our_containers() and not serve_dir.exists()
        assert [v.name for v in docker_client.volumes.list() if v.name.startswith(container)] == []
        assert not [p for p in (root / "leases").rglob("*.json")], "the serving lease is released"
    finally:
        remove_serving(docker_client, container)


def test_foreground_sigint_stops_gracefully_and_leaves_nothing(
    blessed: Any, tmp_path: Path, docker_client: Any, no_leftovers: None
) -> None:
    root = copy_root(blessed, tmp_path)
    name, port = "sf-foreground", 18102
    profile = profile_for(tmp_path, name, port)
    proc = subprocess.Popen(
        [sys.executable, "-m", SERVE, "--profile", str(profile), "--root", str(root)],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    serving = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "serving on" in line:
                serving.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert serving.wait(300), "".join(lines)[-4000:]
        assert get_json(f"http://127.0.0.1:{port}/v1/models")["data"][0]["id"] == "reference-tiny"
        assert docker_client.containers.get(serve_name(name, root)).status == "running"
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    text = "".join(lines)
    assert code == 0, text[-4000:]
    assert "SIGINT: stopping the engine gracefully" in text
    assert "engine stopped gracefully" in text and "container removed" in text
    assert "bless-reference: ready on port" in text, "the engine's log streams to stderr"
    assert "upper layer discarded" in text
    assert not any((root / "serve").iterdir()), "the upper layer is discarded"
    assert serve_name(name, root) not in our_containers()


def test_canary_mismatch_stops_the_container_and_keeps_the_upper_layer(
    blessed: Any, tmp_path: Path, no_leftovers: None
) -> None:
    root = copy_root(blessed, tmp_path)
    path, manifest = manifest_of(root, blessed.config_hash)
    # The golden outputs are not part of the config hash nor of the tree digest: a manifest with
    # other golden token ids stays valid, and only the canary can tell.
    golden = manifest["golden"][1]
    golden["token_ids"] = [(golden["token_ids"][0] + 1) % 256, *golden["token_ids"][1:]]
    writable(path).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    name, port = "sf-canary", 18103
    profile = profile_for(tmp_path, name, port)
    result = serve("--profile", str(profile), "--root", str(root), "--detach", "--json")
    assert result.code == 42, result.stderr[-4000:]
    error = result.json()["error"]
    assert error["title"] == "canary failed"
    assert "expected [" in error["message"] and "got [" in error["message"]
    assert golden["prompt"] in error["message"]
    details = error["details"]
    assert details["upper_kept"] is True and Path(details["upper_dir"]).is_dir()
    serve_dir = Path(details["serve_dir"])
    assert (serve_dir / "canary.json").is_file() and (serve_dir / "engine.log").is_file()
    assert "upper layer kept" in result.stderr
    assert serve_name(name, root) not in our_containers()


def test_debug_starts_without_the_cache_and_leaves_the_blessing_byte_identical(
    blessed: Any, tmp_path: Path, docker_client: Any, no_leftovers: None
) -> None:
    root = copy_root(blessed, tmp_path)
    tree = blessed_dir(root, blessed.config_hash)

    def stamps() -> dict[str, tuple[int, int, int]]:
        return {
            str(p.relative_to(tree)): (p.lstat().st_mtime_ns, p.lstat().st_size, p.lstat().st_mode)
            for p in [tree, *tree.rglob("*")]
        }

    before = stamps()
    # A profile that drifted (no blessing would match): --debug needs none.
    name, port = "sf-debug", 18104
    profile = profile_for(tmp_path, name, port, env={"BLESS_TEST_DEBUG_DRIFT": "1"})
    container = serve_name(name, root)
    try:
        result = serve("--profile", str(profile), "--root", str(root), "--debug", "--detach", "--json")
        assert result.code == 0, result.stderr[-4000:]
        doc = result.json()
        assert doc["plan"]["blessed"] is False and doc["plan"]["mount"] is None
        assert doc["plan"]["manifest_path"] is None and doc["plan"]["verification"] is None
        assert "--no-compile" in doc["plan"]["container"]["command"]
        assert doc["result"]["canary"]["status"] == "skipped"
        assert "NOT BLESSED" in result.stderr and "DEBUG START" in result.stderr
        info = docker_client.containers.get(container)
        destinations = sorted(mount["Destination"] for mount in info.attrs["Mounts"])
        assert destinations == sorted([ENGINE_HOME, ENGINE_TMP]), "a debug start mounts no cache, only its own dirs"
        assert EAGER_MARKER in info.logs().decode()
    finally:
        remove_serving(docker_client, container)
    assert stamps() == before
    verify = run_cli("--root", str(root), "verify", blessed.config_hash)
    assert verify.code == 0, verify.stderr


# --------------------------------------------------------------------------------------------- dry run


def test_dry_run_json_prints_the_plan_and_starts_nothing(blessed: Any, tmp_path: Path) -> None:
    name = "sf-dry"
    profile = profile_for(tmp_path, name, 18105, env={"HF_TOKEN": "hf_secret_value"})
    # HF_TOKEN is a secret: not hashed, so the profile still matches the blessing.
    since = time.time()
    result = serve("--profile", str(profile), "--root", str(blessed.root), "--dry-run", "--json")
    assert result.code == 0, result.stderr
    doc = result.json()
    assert doc["dry_run"] is True
    plan = doc["plan"]
    assert plan["config_hash"] == blessed.config_hash and plan["blessed"] is True
    assert plan["manifest_path"].endswith(f"{blessed.config_hash}.json")
    assert plan["mount"]["kind"] == "overlay" and plan["mount"]["target"] == "/var/cache/bless-engine"
    assert plan["container"]["name"] == serve_name(name, blessed.root)
    assert plan["container"]["env"]["HF_TOKEN"] == "<redacted>" and "hf_secret_value" not in result.stdout
    assert plan["container"]["host_port"] == 18105 and plan["verification"]["ok"] is True
    assert created_since(since, name) == []
    assert not Path(plan["serve_dir"]).exists()


# --------------------------------------------------------------------------------------------- refusals


def test_refuses_a_changed_env_var_naming_it(blessed: Any, tmp_path: Path) -> None:
    name = "sf-drift"
    profile = profile_for(tmp_path, name, 18106, env={"BLESS_TEST_DRIFT_VAR": "1"})
    refused(
        ["--profile", str(profile), "--root", str(blessed.root)],
        name,
        20,
        "no blessed manifest",
        'env.BLESS_TEST_DRIFT_VAR: (absent) -> "1"',
    )


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    writable(path).write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    with writable(path).open("r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def _extra(path: Path) -> None:
    writable(path.parent)
    (path.parent / "extra.bin").write_bytes(b"not blessed")


def _missing(path: Path) -> None:
    writable(path.parent)
    path.unlink()


def _symlink(path: Path) -> None:
    writable(path.parent)
    content = path.read_bytes()
    path.unlink()
    (path.parent / "elsewhere.bin").write_bytes(content)  # same bytes, reached through a link
    path.symlink_to("elsewhere.bin")


@pytest.mark.parametrize(
    ("tamper", "target", "expected"),
    [
        (_flip, "megacache.bin", "(sha256: expected sha256"),
        (_truncate, "megacache.bin", "(size:"),
        (_extra, "meta.json", "extra.bin (extra"),
        (_missing, "meta.json", "meta.json (missing"),
        (_symlink, "megacache.bin", "megacache.bin (symlink"),
    ],
    ids=["byte-flip", "truncation", "extra-file", "missing-file", "symlink"],
)
def test_refuses_a_drifted_blessed_tree(blessed: Any, tmp_path: Path, tamper: Any, target: str, expected: str) -> None:
    root = copy_root(blessed, tmp_path)
    tamper(artifact(root, blessed.config_hash, target))
    name = "sf-tamper"
    profile = profile_for(tmp_path, name, 18107)
    result = refused(["--profile", str(profile), "--root", str(root)], name, 21, "verification failed", expected)
    assert "re-bless" in result.stderr
    # The session's blessing itself is untouched.
    assert run_cli("--root", str(blessed.root), "verify", blessed.config_hash).code == 0


def test_refuses_an_invalid_manifest(blessed: Any, tmp_path: Path) -> None:
    root = copy_root(blessed, tmp_path)
    path, _ = manifest_of(root, blessed.config_hash)
    text = path.read_text()
    writable(path).write_text(text[: len(text) // 2])
    name = "sf-invalid"
    refused(
        ["--profile", str(profile_for(tmp_path, name, 18108)), "--root", str(root)],
        name,
        22,
        "invalid manifest",
        "not valid JSON",
    )


def test_refuses_a_duplicate_manifest(blessed: Any, tmp_path: Path) -> None:
    root = copy_root(blessed, tmp_path)
    path, _ = manifest_of(root, blessed.config_hash)
    (path.parent / "copy-of-the-blessing.json").write_bytes(path.read_bytes())
    name = "sf-duplicate"
    refused(
        ["--profile", str(profile_for(tmp_path, name, 18109)), "--root", str(root)],
        name,
        23,
        "duplicate manifest",
        "copy-of-the-blessing.json",
    )


def test_refuses_unsafe_debug_env(blessed: Any, tmp_path: Path) -> None:
    name = "sf-unsafe"
    profile = profile_for(tmp_path, name, 18110, env={"TORCH_LOGS": "+dynamo"})
    refused(
        ["--profile", str(profile), "--root", str(blessed.root)],
        name,
        30,
        "unsafe environment",
        "TORCH_LOGS",
        env={"BLESS_ALLOW_UNSAFE_ENV_FOR_TESTS": "1"},  # the former override weakens nothing
    )


def test_refuses_when_the_runtime_is_unreachable(blessed: Any, tmp_path: Path) -> None:
    name = "sf-nodocker"
    refused(
        ["--profile", str(profile_for(tmp_path, name, 18111)), "--root", str(blessed.root)],
        name,
        50,
        "runtime unavailable",
        "DOCKER_HOST",
        env={"DOCKER_HOST": "unix:///nonexistent.sock"},
    )


def test_refuses_a_missing_image(blessed: Any, tmp_path: Path) -> None:
    name = "sf-noimage"
    profile = profile_for(tmp_path, name, 18112)
    profile.write_text(profile.read_text().replace("bless-reference:0.1.0", "bless-reference:does-not-exist"))
    refused(["--profile", str(profile), "--root", str(blessed.root)], name, 51, "image missing", "does-not-exist")


def test_refuses_an_image_retagged_to_another_id(
    blessed: Any, tmp_path: Path, docker_client: Any, busybox_image: str
) -> None:
    tag = f"bless-retag-test:{uuid.uuid4().hex[:8]}"
    repository, version = tag.split(":")
    docker_client.images.get(busybox_image).tag(repository, version)
    try:
        name = "sf-retag"
        profile = profile_for(tmp_path, name, 18113)
        profile.write_text(profile.read_text().replace("bless-reference:0.1.0", tag))
        result = refused(
            ["--profile", str(profile), "--root", str(blessed.root)],
            name,
            20,
            "no blessed manifest",
            "runtime.image_id",
        )
        busybox_id = docker_client.images.get(busybox_image).id
        assert re.search(rf"runtime\.image_id: \"sha256:[0-9a-f]{{64}}\" -> \"{busybox_id}\"", result.stderr)
    finally:
        docker_client.images.remove(tag)


def test_refuses_a_foreign_container_holding_the_name_and_never_touches_it(
    blessed: Any, tmp_path: Path, docker_client: Any, busybox_image: str
) -> None:
    name = "sf-foreign"
    foreign = docker_client.containers.run(
        busybox_image,
        ["sleep", "600"],
        name=serve_name(name, blessed.root),
        detach=True,
        labels={"owner": "an-operator"},
    )
    try:
        refused(
            ["--profile", str(profile_for(tmp_path, name, 18114)), "--root", str(blessed.root)],
            name,
            12,
            "without our labels",
            "never touched",
        )
        foreign.reload()
        assert foreign.status == "running" and foreign.name == serve_name(name, blessed.root)
        assert foreign.labels == {"owner": "an-operator"}
    finally:
        foreign.stop(timeout=1)
        foreign.remove()


def test_a_foreign_overlay_volume_is_refused_by_dry_run_and_start_alike(
    blessed: Any, tmp_path: Path, docker_client: Any
) -> None:
    """A volume named like the serve's overlay, without our labels, blocks a start: --dry-run must say so too."""
    name = "sf-foreign-volume"
    overlay = serve_name(name, blessed.root) + "-overlay"
    volume = docker_client.volumes.create(name=overlay, labels={"owner": "an-operator"})
    try:
        profile = str(profile_for(tmp_path, name, 18115))
        for extra in (["--dry-run"], []):
            refused(
                ["--profile", profile, "--root", str(blessed.root), *extra],
                name,
                12,
                "WITHOUT our labels",
                serve_name(name, blessed.root) + "-overlay",
            )
        volume.reload()
        assert volume.attrs["Labels"] == {"owner": "an-operator"}, "never touched"
    finally:
        volume.remove()
