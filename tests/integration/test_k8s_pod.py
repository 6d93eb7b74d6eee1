"""Kubernetes, for real parts: the manifests ``bless k8s render`` prints, run by ``podman kube play``.

There is no Kubernetes cluster here; podman runs the same Pod YAML (init containers, emptyDir, ConfigMap
volumes, exec probes run by hand with ``podman exec``: podman does not act on readiness probes). What
runs is real: the bless image pulls the session's blessing of ``profiles/reference-cpu-pod.toml`` from a
real loopback registry under ``--trust``; the engine image (the reference image plus bless) verifies it,
serves a verified copy (podman gives no CAP_SYS_ADMIN), runs the reference engine and the canary.

The rendered YAML is changed only where podman or this machine differ from a cluster, each said where it
is done (:func:`for_podman`): host networking (the registry and the engine are reached on 127.0.0.1), the
init-container annotation podman 4.3 needs, and the termination message written to a host directory
(podman does not read ``terminationMessagePath``) so the test reads what ``kubectl describe pod`` shows.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from bless.replay.engine_client import EngineClient
from tests.integration.helpers import REPO, run_cli
from tests.support.registry import Registry, running_registry
from tests.support.trust_keys import KEY_ENV

pytestmark = pytest.mark.integration

POD_PROFILE = REPO / "profiles" / "reference-cpu-pod.toml"
BLESS_IMAGE = "bless:0.1.0"
ENGINE_IMAGE = "bless-reference-serve:0.1.0"


def _podman() -> str:
    found = shutil.which("podman")
    if found is None:
        message = "podman is not installed (scripts/ensure-podman.sh installs it)"
        if os.environ.get("BLESS_REQUIRE_PODMAN") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


def podman(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([_podman(), *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check:
        assert proc.returncode == 0, f"podman {' '.join(args)}: {proc.stderr[-3000:]}"
    return proc


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def pod_images(docker_client: Any) -> dict[str, str]:
    """The bless image and the engine image, built (or found up to date) by their scripts, then in podman's store."""
    for script in ("build-bless-image.sh", "build-engine-image.sh"):
        args = ["bash", str(REPO / "scripts" / "images" / script)]
        if script == "build-engine-image.sh":
            args += ["bless-reference:0.1.0", ENGINE_IMAGE]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-3000:]
    _podman()
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "images" / "podman-load-image.sh"), BLESS_IMAGE, ENGINE_IMAGE],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"bless": f"localhost/{BLESS_IMAGE}", "engine": f"localhost/{ENGINE_IMAGE}"}


@dataclass(frozen=True)
class Published:
    root: Path
    config_hash: str
    reference: str  # REPO@sha256:... in the registry
    trust: Path  # a directory holding the trusted root.json
    registry: Registry
    golden: list[dict[str, Any]]


@pytest.fixture(scope="module")
def published(pod_images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Published]:
    """The pod profile blessed inside the engine image, unprivileged (as the guide says), signed, pushed."""
    base = tmp_path_factory.mktemp("pod-blessing")
    root = base / "root"
    root.mkdir()
    proc = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--entrypoint",
            "bless",
            "-v",
            f"{root}:/var/lib/bless",
            "-v",
            f"{POD_PROFILE}:/etc/bless/profile.toml:ro",
            ENGINE_IMAGE,
            "--root",
            "/var/lib/bless",
            "run",
            "--profile",
            "/etc/bless/profile.toml",
            # K=1: the pod tests prove pulling, verifying and serving a blessing, not its trial count
            "--trials",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    run = json.loads(proc.stdout)
    config_hash = run["config_hash"]
    keys = base / "signing"
    assert run_cli("trust", "init", "--keys", str(keys), env=KEY_ENV).code == 0
    signed = run_cli("--root", str(root), "sign", config_hash, "--keys", str(keys), env=KEY_ENV)
    assert signed.code == 0, signed.stderr[-3000:]
    trust = base / "trust"
    trust.mkdir()
    shutil.copy(keys / "metadata" / "root.json", trust / "root.json")
    shown = run_cli("--root", str(root), "show", config_hash, "--json")
    golden = shown.json()["golden"]
    for registry in running_registry(base / "registry"):
        repository = registry.ref("blessings/reference-cpu-pod")
        pushed = run_cli(
            "--root", str(root), "push", config_hash, f"{repository}:v1", "--metadata", str(keys / "metadata"), "--json"
        )  # fmt: skip
        assert pushed.code == 0, pushed.stderr[-3000:]
        reference = f"{repository}@{pushed.json()['digest']}"
        yield Published(root, config_hash, reference, trust, registry, golden)


# -- rendering and running a pod --------------------------------------------------------------------------


def render(published: Published, pod_images: Mapping[str, str], port: int, trust: Path | None = None) -> list[Any]:
    """The documents of one pod, named uniquely: podman names a ConfigMap's volume after the ConfigMap and keeps
    it after the pod, so fixed names would be shared by concurrent tests and collide with a user's volumes."""
    unique = uuid.uuid4().hex[:8]
    result = run_cli(
        "k8s", "render", "--profile", str(POD_PROFILE), "--from", published.reference,
        "--image", pod_images["engine"], "--bless-image", pod_images["bless"],
        "--trust", str(trust or published.trust), "--port", str(port), "--name", f"pod-e2e-{unique}",
        "--trust-configmap", f"bless-trust-{unique}",
    )  # fmt: skip
    assert result.code == 0, result.stderr[-3000:]
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _podman_pod_module() -> Any:
    """scripts/images/podman_pod.py, the edits and the tear-down the Kubernetes guide gives users."""
    spec = importlib.util.spec_from_file_location("podman_pod", REPO / "scripts" / "images" / "podman_pod.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def for_podman(documents: list[Any], termination_dir: Path) -> list[Any]:
    """The rendered documents, changed only where podman (or this machine) is not a cluster: the edits the
    Kubernetes guide gives users (scripts/images/podman_pod.py), and restartPolicy Never: a cluster restarts a
    failed container with back-off (the pod shows its last termination message); the test watches the first
    failure itself."""
    module = _podman_pod_module()
    changed: list[Any] = module.for_podman(documents, termination_dir=termination_dir, restart_never=True)
    # The pods run as a non-root user (Pod Security "restricted"): the termination directory is theirs to write.
    termination_dir.chmod(0o1777)
    return changed


@dataclass
class Pod:
    yaml_file: Path
    termination_dir: Path
    name: str  # podman's: the Deployment's name, then -pod-0
    #: The podman volumes this pod's play creates (ConfigMaps and emptyDirs, by name): removed after it.
    volumes: frozenset[str]
    play_output: str = ""

    def container(self, which: str) -> str:
        return f"{self.name}-{which}"

    def state(self, which: str) -> tuple[str, int]:
        proc = podman(
            "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", self.container(which), check=False
        )  # fmt: skip
        assert proc.returncode == 0, f"no container {self.container(which)}; podman kube play said:\n{self.play_output}"
        status, code = proc.stdout.split()
        return status, int(code)

    def logs(self, which: str) -> str:
        proc = podman("logs", self.container(which), check=False)
        return proc.stdout + proc.stderr

    def termination_message(self, which: str) -> str:
        path = self.termination_dir / which
        return path.read_text() if path.exists() else ""

    def ready(self, profile_name: str) -> int:
        proc = podman(
            "exec", self.container("engine"), "serve-full", "ready", profile_name, "--root", "/var/lib/bless",
            check=False, timeout=60,
        )  # fmt: skip
        return proc.returncode

    def refusal(self, which: str) -> tuple[int, str]:
        """Once ``which`` has ended: its exit code and its termination message (what kubectl describe shows)."""
        return self.wait_exited(which), self.termination_message(which)

    def wait_exited(self, which: str, timeout_s: float = 240) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status, code = self.state(which)
            if status in ("exited", "stopped"):
                return code
            time.sleep(1)
        raise AssertionError(f"{which} still {status} after {timeout_s} s:\n{self.logs(which)[-3000:]}")


def podman_volumes() -> set[str]:
    return set(podman("volume", "ls", "--format", "{{.Name}}").stdout.split())


@pytest.fixture
def play(tmp_path: Path) -> Iterator[Any]:
    """Run documents with podman kube play; everything is torn down after the test, the pod's volumes included.

    podman keeps a ConfigMap or an emptyDir as a volume named after it; the names are unique to the test
    (:func:`render`, :func:`for_podman`), and only volumes the play created are removed: one of those names
    there before the play is another's, and fails the test untouched.
    """
    played: list[Pod] = []

    def run(documents: list[Any]) -> Pod:
        termination = tmp_path / "termination"
        termination.mkdir(exist_ok=True)
        path = tmp_path / "pod.yaml"
        documents = for_podman(documents, termination)
        path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
        (deployment,) = [doc for doc in documents if doc["kind"] == "Deployment"]
        volumes = {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"] if "emptyDir" in v}
        volumes |= {doc["metadata"]["name"] for doc in documents if doc["kind"] == "ConfigMap"}
        taken = volumes & podman_volumes()
        assert not taken, f"podman volumes {sorted(taken)} exist already: not this test's, left alone"
        pod = Pod(path, termination, name=f"{deployment['metadata']['name']}-pod-0", volumes=frozenset(volumes))
        played.append(pod)
        # kube play runs the init containers to completion, then starts the engine container and returns.
        proc = podman("kube", "play", str(path), check=False, timeout=600)
        pod.play_output = proc.stdout + proc.stderr
        return pod

    yield run
    # Torn down as the Kubernetes guide does it: podman_pod.py --down (podman kube play --down leaves the volumes
    # of the ConfigMaps behind); whatever it left is removed here too, then the test fails naming it.
    module = _podman_pod_module()
    left: list[str] = []
    for pod in played:
        module.down(pod.yaml_file)
        created = sorted(pod.volumes & podman_volumes())
        if created:
            left += created
            podman("volume", "rm", *created)
    assert not left, f"podman volumes left behind by podman_pod.py --down: {left}"


# -- the pod serves only a verified, signed, proven blessing ------------------------------------------------


def test_the_rendered_pod_pulls_verifies_serves_behind_the_canary_and_stops_gracefully(
    published: Published, pod_images: Mapping[str, str], play: Any
) -> None:
    port = free_port()
    pod = play(render(published, pod_images, port))
    assert pod.state("bless-pull") == ("exited", 0), pod.logs("bless-pull")[-3000:]
    not_ready_seen = False
    deadline = time.monotonic() + 300
    while True:
        code = pod.ready("reference-cpu-pod")
        if code == 0:
            break
        assert code == 46, f"serve-full ready exited {code}:\n{pod.logs('engine')[-4000:]}"
        not_ready_seen = True
        status, exit_code = pod.state("engine")
        assert status == "running", f"engine exited {exit_code}:\n{pod.logs('engine')[-4000:]}"
        assert time.monotonic() < deadline, pod.logs("engine")[-4000:]
        # A probe period, as a kubelet's: each probe is a serve-full process in the pod (~0.6 CPU-s) and a podman
        # exec; the engine's boot and canary take far longer, so the first probes still see it not ready.
        time.sleep(3)
    assert not_ready_seen, "readiness must fail until the canary passed"
    log = pod.logs("engine")
    assert "verified copy" in log  # the plan says how the cache is presented: no mount in a pod
    assert "canary passed" in log
    client = EngineClient("127.0.0.1", port, timeout_s=60)
    for item in published.golden:
        assert list(client.complete(item["prompt"], item["max_tokens"]).token_ids) == item["token_ids"]

    podman("pod", "stop", "-t", "60", pod.name, timeout=120)  # SIGTERM, as the kubelet sends it
    status, code = pod.state("engine")
    assert (status, code) == ("exited", 0), pod.logs("engine")[-4000:]
    assert "stopped gracefully" in pod.logs("engine")
    assert pod.termination_message("engine") == ""  # nothing was refused


def test_an_untrusted_signature_ends_the_init_container_with_its_code(
    published: Published, pod_images: Mapping[str, str], play: Any, tmp_path: Path
) -> None:
    other_keys = tmp_path / "other-keys"
    assert run_cli("trust", "init", "--keys", str(other_keys), env=KEY_ENV).code == 0
    other_trust = tmp_path / "other-trust"
    other_trust.mkdir()
    shutil.copy(other_keys / "metadata" / "root.json", other_trust / "root.json")
    pod = play(render(published, pod_images, free_port(), trust=other_trust))
    code, message = pod.refusal("bless-pull")
    assert code == 61 and message.startswith("bless exit 61 (signature by an untrusted key)"), (code, message)


def test_a_profile_that_drifted_from_the_blessing_is_refused(
    published: Published, pod_images: Mapping[str, str], play: Any
) -> None:
    documents = render(published, pod_images, free_port())
    (profile_cm,) = [doc for doc in documents if doc["kind"] == "ConfigMap" and "profile.toml" in doc["data"]]
    text = profile_cm["data"]["profile.toml"]
    profile_cm["data"]["profile.toml"] = text.replace("max_seq_len = 64", "max_seq_len = 32")
    pod = play(documents)
    assert pod.state("bless-pull") == ("exited", 0)
    code, message = pod.refusal("engine")
    assert code == 20 and message.startswith("bless exit 20 (no blessed manifest)"), (code, message)


def test_a_file_tampered_with_in_the_pod_store_between_pull_and_start_is_refused(
    published: Published, pod_images: Mapping[str, str], play: Any
) -> None:
    documents = render(published, pod_images, free_port())
    (deployment,) = [doc for doc in documents if doc["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    pull = spec["initContainers"][0]
    # A second init container runs after the pull and before serve-full: it appends a byte to a blessed file.
    tamper = {
        "name": "tamper",
        "image": pull["image"],
        "command": [
            "sh",
            "-c",
            'f=$(find /var/lib/bless/blessed -type f | sort | head -n 1); chmod u+w "$f"; printf x >> "$f"',
        ],
        "volumeMounts": [next(m for m in pull["volumeMounts"] if m["mountPath"] == "/var/lib/bless")],
        "env": [],
    }
    spec["initContainers"].append(tamper)
    pod = play(documents)
    code, message = pod.refusal("engine")
    assert code == 21 and message.startswith("bless exit 21 (verification failed)"), (code, message)


def test_a_blob_altered_in_the_registry_ends_the_init_container_with_72(
    published: Published, pod_images: Mapping[str, str], play: Any
) -> None:
    """Last in this module: it alters the registry's copy of one cache file (and puts it back after)."""
    blobs = sorted((published.registry.storage).rglob("blobs/sha256/*/*/data"), key=lambda p: p.stat().st_size)
    target = blobs[-1]  # the largest blob: a cache file, not a manifest
    original = target.read_bytes()
    target.write_bytes(bytes([original[0] ^ 0xFF]) + original[1:])
    try:
        pod = play(render(published, pod_images, free_port()))
        code, message = pod.refusal("bless-pull")
        assert code == 72 and message.startswith("bless exit 72 (digest mismatch)"), (code, message)
        assert pod.state("engine")[0] in ("created", "configured", "initialized", "exited", "stopped")
    finally:
        target.write_bytes(original)
