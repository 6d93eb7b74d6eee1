"""The images of a Kubernetes pod, against a real Docker Engine: bless alone, and the reference engine plus bless.

``bless:<version>`` (scripts/images/build-bless-image.sh) is the init container's: bless and its dependencies in a venv
at /opt/bless, no torch. ``bless-reference-serve:0.1.0`` (scripts/images/build-engine-image.sh over
deploy/images/engine.Dockerfile) is the serving container's: the reference engine image with bless in a venv of
its own, which the engine's Python must not see. scripts/setup.sh builds both; here the scripts run again and
must find them up to date (seconds), so these tests build nothing themselves on a set-up machine.

podman (scripts/ensure-podman.sh, scripts/images/podman-load-image.sh) is what the pod tests run on: one pod with an
init container, as those tests start theirs, shows it works here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import REPO

pytestmark = pytest.mark.integration

SERVE_IMAGE = "bless-reference-serve:0.1.0"


def _project_version() -> str:
    import tomllib

    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def _script(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout
    )


def _built(*args: str) -> str:
    """Run a build script; its image ID (the one line of stdout)."""
    proc = _script(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (image_id,) = proc.stdout.split()
    return image_id


def _run(image: str, *command: str, entrypoint: str | None = None) -> subprocess.CompletedProcess[str]:
    """``docker run --rm --network none`` of ``image``: what an offline container sees."""
    options = ["--entrypoint", entrypoint] if entrypoint else []
    return subprocess.run(
        ["docker", "run", "--rm", "--network", "none", *options, image, *command],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="session")
def bless_image(docker_client: Any) -> str:
    """bless:<version>, built (or found up to date) by the real build script; its name."""
    _built("images/build-bless-image.sh")
    return f"bless:{_project_version()}"


@pytest.fixture(scope="session")
def serve_image(reference_image: str) -> str:
    """bless-reference-serve:0.1.0 = the reference image + bless, built (or found up to date); its name."""
    _built("images/build-engine-image.sh", "bless-reference:0.1.0", SERVE_IMAGE)
    return SERVE_IMAGE


# ------------------------------------------------------------------ bless alone


def test_the_bless_image_runs_bless_and_holds_no_torch(bless_image: str) -> None:
    version = _run(bless_image, "bless", "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"bless {_project_version()}"
    assert _run(bless_image, "serve-full", "--help").returncode == 0
    no_torch = _run(bless_image, "/opt/bless/bin/python", "-c", "import torch")
    assert no_torch.returncode == 1 and "No module named 'torch'" in no_torch.stderr
    links = _run(bless_image, "sh", "-c", 'readlink /usr/local/bin/bless /usr/local/bin/serve-full; echo "$PATH"')
    assert links.stdout.splitlines()[:2] == ["/opt/bless/bin/bless", "/opt/bless/bin/serve-full"]
    assert "/opt/bless" not in links.stdout.splitlines()[2], "the venv's bin (its python) must stay off PATH"


# ------------------------------------------------------------------ the engine image plus bless


def test_the_serving_image_starts_serve_full_with_the_engine_untouched(serve_image: str, docker_client: Any) -> None:
    usage = _run(serve_image, "--help")  # arguments go to the entrypoint, serve-full
    assert usage.returncode == 0, usage.stderr
    assert "Usage: serve-full" in usage.stdout
    config = docker_client.images.get(serve_image).attrs["Config"]
    assert config["Entrypoint"] == ["serve-full"]
    reference = docker_client.images.get("bless-reference:0.1.0").attrs["Config"]
    assert config["Env"] == reference["Env"], "the engine's environment (PATH, PYTHONPATH, VIRTUAL_ENV) is kept"
    version = _run(serve_image, "--version", entrypoint="bless")
    assert version.returncode == 0 and version.stdout.strip() == f"bless {_project_version()}"


@pytest.mark.parametrize("python", ["python3", "/opt/venv/bin/python3"])
def test_the_engines_python_cannot_import_bless_or_its_dependencies(serve_image: str, python: str) -> None:
    """bless's venv is its own: the engine's interpreter (torch) sees none of bless's packages."""
    engine = _run(serve_image, "-c", "import torch, bless_reference; print(torch.__version__)", entrypoint=python)
    assert engine.returncode == 0, engine.stderr
    for module in ("typer", "rich", "bless", "tuf"):
        seen = _run(serve_image, "-c", f"import {module}", entrypoint=python)
        assert seen.returncode == 1, f"{python} imports {module}"
        assert f"No module named '{module}'" in seen.stderr


def test_blesss_python_imports_bless_and_not_torch(serve_image: str) -> None:
    python = "/opt/bless/bin/python"
    ours = _run(serve_image, "-c", "import bless, typer, tuf; print(bless.__file__)", entrypoint=python)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout.startswith("/opt/bless/lib/")
    assert _run(serve_image, "-c", "import torch", entrypoint=python).returncode == 1


# ------------------------------------------------------------------ the scripts cache


@pytest.mark.parametrize(
    "args",
    [("images/build-bless-image.sh",), ("images/build-engine-image.sh", "bless-reference:0.1.0", SERVE_IMAGE)],
    ids=["bless", "engine"],
)
def test_a_second_build_is_up_to_date(args: tuple[str, ...], bless_image: str, serve_image: str) -> None:
    """Twice in a row: the second finds the first's image. (Not once against setup's image: another checkout
    with other sources on the same Docker Engine may have built the tag since, and the first run rebuilds.)"""
    first = _built(*args)
    started = time.monotonic()
    proc = _script(*args, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert " is up to date (path " in proc.stderr, proc.stderr[-3000:]
    assert time.monotonic() - started < 30, "an up-to-date check builds nothing and pulls nothing"
    assert proc.stdout.strip() == first
    image = bless_image if args[0] == "images/build-bless-image.sh" else serve_image
    inspected = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", image], capture_output=True, text=True, check=True
    )
    assert inspected.stdout.strip() == first


def test_the_engine_image_script_wants_a_local_engine_image(docker_client: Any) -> None:
    missing = _script("images/build-engine-image.sh", "bless-test-no-such-engine:1", "bless-test-x:1", timeout=60)
    assert missing.returncode == 1
    assert "is not in the local image store; docker pull it (or build it) first" in missing.stderr


# ------------------------------------------------------------------ podman kube play


@pytest.fixture(scope="session")
def podman() -> str:
    """podman made usable by scripts/ensure-podman.sh (setup.sh ran it); skipped without podman."""
    if shutil.which("podman") is None:
        message = "podman is not installed; run scripts/ensure-podman.sh as root"
        if os.environ.get("BLESS_REQUIRE_PODMAN") == "1":
            pytest.fail(message)
        pytest.skip(message)
    proc = _script("ensure-podman.sh", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return "podman"


POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations:
    # podman 4.3's default, once, removes an init container when it ends: its exit code is gone with it
    io.podman.annotations.init.container.type: always
spec:
  hostNetwork: true
  restartPolicy: Never
  initContainers:
  - name: init
    image: {image}
    command: ["sh", "-c", "bless --version > /shared/from-init"]
    volumeMounts: [{{name: shared, mountPath: /shared}}]
  containers:
  - name: main
    image: {image}
    command: ["sh", "-c", "cat /shared/from-init; exit 3"]
    volumeMounts: [{{name: shared, mountPath: /shared, readOnly: true}}]
  volumes:
  # hostPath, not emptyDir: podman 4.3 makes an emptyDir a volume named after it, shared by every pod that
  # uses the same name
  - name: shared
    hostPath: {{path: {shared}, type: Directory}}
"""


def test_podman_runs_a_pod_with_an_init_container_from_a_loaded_image(
    podman: str, bless_image: str, tmp_path: Path
) -> None:
    loaded = _script("images/podman-load-image.sh", bless_image, timeout=600)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.split() == [f"localhost/{bless_image}"]
    again = _script("images/podman-load-image.sh", bless_image, timeout=60)
    assert again.returncode == 0 and "is in podman already" in again.stderr

    name = f"bless-test-pod-{uuid.uuid4().hex[:8]}"
    shared = tmp_path / "shared"
    shared.mkdir()
    pod = tmp_path / "pod.yaml"
    pod.write_text(POD.format(name=name, image=f"localhost/{bless_image}", shared=shared))
    try:
        played = subprocess.run([podman, "kube", "play", str(pod)], capture_output=True, text=True, timeout=120)
        assert played.returncode == 0, played.stderr
        deadline = time.monotonic() + 60
        while _state(podman, f"{name}-main") != "exited":
            assert time.monotonic() < deadline, "the pod's main container did not end"
            time.sleep(0.2)
        assert _exit_code(podman, f"{name}-init") == 0
        assert _exit_code(podman, f"{name}-main") == 3
        logs = subprocess.run([podman, "logs", f"{name}-main"], capture_output=True, text=True, check=True)
        assert logs.stdout.strip() == f"bless {_project_version()}"
    finally:
        subprocess.run([podman, "kube", "play", "--down", str(pod)], capture_output=True, timeout=120)
    left = subprocess.run([podman, "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True, check=True)
    assert not [line for line in left.stdout.split() if line.startswith(name)], "kube play --down left containers"


def test_ensure_podman_writes_its_own_config_and_leaves_anothers_alone(podman: str, tmp_path: Path) -> None:
    conf = tmp_path / "containers.conf"

    def ensure() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(REPO / "scripts" / "ensure-podman.sh")],
            env=os.environ | {"BLESS_CONTAINERS_CONF": str(conf)},
            capture_output=True,
            text=True,
            timeout=120,
        )

    first = ensure()
    assert first.returncode == 0, first.stderr
    assert f"wrote {conf}" in first.stderr
    text = conf.read_text()
    assert text.startswith("# Written by bless's scripts/ensure-podman.sh")
    assert "[containers]\n" in text
    assert 'default_ulimits = ["nofile=16384:16384", "nproc=4096:4096"]' in text
    second = ensure()
    assert second.returncode == 0 and f"{conf} is up to date" in second.stderr
    assert conf.read_text() == text

    conf.write_text('[engine]\ncgroup_manager = "cgroupfs"\n')
    foreign = ensure()
    assert foreign.returncode == 0, foreign.stderr
    assert conf.read_text() == '[engine]\ncgroup_manager = "cgroupfs"\n', "a config that is not ours is left alone"
    assert "is not ours and sets no default_ulimits" in foreign.stderr


def _state(podman: str, container: str) -> str:
    return _inspect(podman, container, "{{.State.Status}}")


def _exit_code(podman: str, container: str) -> int:
    return int(_inspect(podman, container, "{{.State.ExitCode}}"))


def _inspect(podman: str, container: str, template: str) -> str:
    proc = subprocess.run(
        [podman, "inspect", "--format", template, container], capture_output=True, text=True, check=True
    )
    return proc.stdout.strip()
