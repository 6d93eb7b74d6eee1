"""bless k8s render: the documents (fields, digest pinning, affinity, probes) and their schemas, and the flow
reading the blessing from a registry (the in-memory one, ``tests/support/registry_simulator.py``).

Every rendered document is validated against the Kubernetes OpenAPI schemas of 1.30 to 1.37,
strict (unknown fields refused), with ``kubernetes-validate`` (the schemas ship inside it: offline).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from bless.core.factors import resolve
from bless.core.profile import Profile, load_profile
from bless.engines import get_adapter
from bless.errors import DigestMismatchError, InputInvalidError, RegistryUnavailableError
from bless.flows.k8s import render_blessing
from bless.flows.push import push_blessing
from bless.k8s import documents as k8s
from bless.oci.artifact import digest_of
from bless.oci.client import parse_reference
from bless.store import Store
from tests.support.registry_simulator import RegistrySimulator
from tests.unit.store_helpers import make_factors, make_manifest, write_tree

KUBERNETES_VERSIONS = [f"1.{minor}.0" for minor in range(30, 38)]
DIGEST = "sha256:" + "ab" * 32
ARTIFACT = f"registry.example.com/blessings/tiny@{DIGEST}"
H100 = {"accelerator": "cuda", "gpu_count": 2, "gpu_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
CPU = {"accelerator": "cpu", "isa": "x86-64-v3"}

PROFILE = """\
profile_version = 1
name = "tiny-test"

[engine]
name = "reference"

[runtime]
kind = "local"
python = "python3"
{runtime_extra}

[model]
source = "builtin"
id = "reference-tiny"

[hardware]
accelerator = "{accelerator}"
{hardware_extra}

[trials]
ready_timeout_s = 600
stop_timeout_s = 45
"""


def profile_text(*, accelerator: str = "cuda", runtime_extra: str = "", hardware_extra: str = "gpu_count = 2") -> str:
    return PROFILE.format(accelerator=accelerator, runtime_extra=runtime_extra, hardware_extra=hardware_extra)


def load(tmp_path: Path, text: str) -> Profile:
    path = tmp_path / "profile.toml"
    path.write_text(text)
    return load_profile(path)


def blessing(tmp_path: Path, hardware: Mapping[str, Any]) -> k8s.Blessing:
    factors = {**make_factors(), "hardware": dict(hardware)}
    return k8s.Blessing.of(make_manifest(write_tree(tmp_path / "tree"), factors))


def resolved_factors(text: str, tmp_path: Path, hardware: Mapping[str, Any] = H100) -> dict[str, Any]:
    """The factors ``text`` resolves to in a pod on ``hardware`` (the engine image's environment made up)."""
    profile = load(tmp_path, text)
    resolved = resolve(
        profile,
        get_adapter(profile.engine),
        image_resolver=None,
        hardware_probe=lambda _spec: dict(hardware),
        environment_probe=lambda _python, _packages: {"python": "3.11.7", "packages": {"bless": "0.1.0"}},
    )
    return dict(resolved.factors)


def options(**changes: Any) -> k8s.K8sOptions:
    base = k8s.K8sOptions(
        artifact=ARTIFACT,
        engine_image=f"registry.example.com/engine@{DIGEST}",
        bless_image=f"registry.example.com/bless@{DIGEST}",
        name="tiny",
    )
    return dataclasses.replace(base, **changes)


def rendered(
    tmp_path: Path, *, hardware: Mapping[str, Any] = H100, text: str | None = None, **changes: Any
) -> k8s.K8sRendered:
    text = text if text is not None else profile_text()
    return k8s.render(
        load(tmp_path, text), text, blessing(tmp_path, hardware), options(**changes), cache_path="/var/cache/engine"
    )


def deployment(result: k8s.K8sRendered) -> Mapping[str, Any]:
    (found,) = [doc for doc in result.documents if doc["kind"] == "Deployment"]
    return found


def pod(result: k8s.K8sRendered) -> Mapping[str, Any]:
    spec: Mapping[str, Any] = deployment(result)["spec"]["template"]["spec"]
    return spec


# -- schemas ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_document_validates_strictly_against_the_openapi_schema(tmp_path: Path, version: str) -> None:
    text = profile_text(runtime_extra='shm_size = "16g"\nipc_host = true')
    result = rendered(tmp_path, text=text, trust_root_json='{"signed": {}}', pull_secret="regcred", namespace="ml")
    kinds = [doc["kind"] for doc in result.documents]
    assert kinds == ["ConfigMap", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget"]
    for document in result.documents:
        kubernetes_validate.validate(dict(document), version, strict=True)


def test_the_strict_validation_refuses_an_unknown_field() -> None:
    """The check above can fail: a field Kubernetes does not know is refused."""
    bad = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}, "dta": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSIONS[-1], strict=True)


# -- what the pod does -----------------------------------------------------------------------------------


def test_the_init_container_pulls_the_digest_under_trust_into_the_pod_store(tmp_path: Path) -> None:
    (init,) = pod(rendered(tmp_path))["initContainers"]
    assert init["command"] == ["bless", "--root", k8s.BLESS_ROOT, "pull", ARTIFACT, "--trust", k8s.TRUST_DIR]
    assert init["image"] == f"registry.example.com/bless@{DIGEST}"
    assert {"name": "BLESS_TERMINATION_LOG", "value": "/dev/termination-log"} in init["env"]
    assert init["terminationMessagePath"] == "/dev/termination-log"
    assert {m["mountPath"] for m in init["volumeMounts"]} == {k8s.BLESS_ROOT, k8s.TRUST_DIR}


def test_the_engine_container_runs_serve_full_behind_the_canary_gate(tmp_path: Path) -> None:
    spec = pod(rendered(tmp_path))
    (engine,) = spec["containers"]
    assert engine["command"][:2] == ["serve-full", "--profile"]
    assert engine["command"][engine["command"].index("--trust") + 1] == k8s.TRUST_DIR
    assert engine["command"][engine["command"].index("--host") + 1] == "0.0.0.0"
    ready = ["serve-full", "ready", "tiny-test", "--root", k8s.BLESS_ROOT]
    assert engine["readinessProbe"]["exec"]["command"] == ready
    assert engine["startupProbe"]["exec"]["command"] == ready
    startup = engine["startupProbe"]
    # The startup budget covers the profile's ready timeout (600 s) plus verify, copy and canary.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600 + 300
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "2"
    mounts = {m["mountPath"]: m for m in engine["volumeMounts"]}
    assert mounts["/var/cache/engine"]["name"] == "tiny-engine-cache"  # the copy's target: an emptyDir
    assert mounts[k8s.PROFILE_DIR]["readOnly"] is True
    assert spec["terminationGracePeriodSeconds"] == 45 + 30  # stop_timeout_s plus the cleanup


def test_the_profile_configmap_holds_the_profile_byte_for_byte(tmp_path: Path) -> None:
    text = profile_text() + "# a comment the operator wrote\n"
    (profile_cm, *_others) = rendered(tmp_path, text=text).documents
    assert profile_cm["data"] == {"profile.toml": text}
    assert profile_cm["metadata"]["name"] == "tiny-profile"


def test_the_artifact_and_config_hash_are_annotated(tmp_path: Path) -> None:
    result = rendered(tmp_path)
    annotations = deployment(result)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["bless.dev/artifact"] == ARTIFACT
    assert annotations["bless.dev/config-hash"] == blessing(tmp_path, H100).config_hash


def test_a_pull_secret_pulls_the_images_and_the_blessing(tmp_path: Path) -> None:
    spec = pod(rendered(tmp_path, pull_secret="regcred"))
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    (init,) = spec["initContainers"]
    assert {"name": "DOCKER_CONFIG", "value": "/etc/bless/registry-auth"} in init["env"]
    (auth,) = [v for v in spec["volumes"] if v["name"] == "registry-auth"]
    assert auth["secret"]["items"] == [{"key": ".dockerconfigjson", "path": "config.json"}]


def test_without_a_pull_secret_nothing_refers_to_one(tmp_path: Path) -> None:
    spec = pod(rendered(tmp_path))
    assert "imagePullSecrets" not in spec
    assert all(v["name"] != "registry-auth" for v in spec["volumes"])


# -- affinity from the hardware factor -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu_name", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("NVIDIA H200", "NVIDIA-H200"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("NVIDIA GeForce RTX 4090 (TM)", "NVIDIA-GeForce-RTX-4090--TM"),
    ],
)
def test_gpu_products_become_gfd_label_values(gpu_name: str, label: str) -> None:
    assert k8s.gpu_product_label(gpu_name) == label


def test_gpu_affinity_requires_product_and_compute_capability(tmp_path: Path) -> None:
    terms = pod(rendered(tmp_path))["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = terms["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]},
        {"key": "nvidia.com/gpu.compute.major", "operator": "In", "values": ["9"]},
        {"key": "nvidia.com/gpu.compute.minor", "operator": "In", "values": ["0"]},
        {"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["1"]},  # H100 here is a 2-GPU blessing
    ]


TP4 = {**H100, "gpu_count": 4}
TP4_PROFILE = profile_text(hardware_extra="gpu_count = 4") + "\n[serve]\ntensor_parallel_size = 4\n"


def _engine(result: k8s.K8sRendered) -> Mapping[str, Any]:
    (engine,) = [c for c in pod(result)["containers"] if c["name"] == "engine"]
    found: Mapping[str, Any] = engine
    return found


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_a_tensor_parallel_blessing_asks_for_its_gpus_shm_and_a_node_with_as_many(tmp_path: Path, version: str) -> None:
    """Issue 26, item 5: TP=4 requests 4 GPUs, a memory-backed /dev/shm for NCCL, and a node with >= 4 GPUs."""
    result = rendered(tmp_path, hardware=TP4, text=TP4_PROFILE)
    engine = _engine(result)
    # 16 GiB per GPU and the memory-backed /dev/shm, which the pod's memory is charged for; requests = limits.
    amounts = {"cpu": "16", "memory": f"{(16 * 4 + 8) * 1024}Mi", "nvidia.com/gpu": "4"}
    assert engine["resources"] == {"limits": amounts, "requests": amounts}
    assert {"name": "tiny-dshm", "mountPath": "/dev/shm"} in engine["volumeMounts"]
    assert {"name": "tiny-dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in pod(result)["volumes"]
    (term,) = pod(result)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]} in term[
        "matchExpressions"
    ]
    assert {"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["3"]} in term["matchExpressions"]
    for document in result.documents:
        kubernetes_validate.validate(dict(document), version, strict=True)


def test_one_gpu_asks_for_no_count_label_and_no_shm(tmp_path: Path) -> None:
    result = rendered(tmp_path, hardware={**H100, "gpu_count": 1}, text=profile_text(hardware_extra="gpu_count = 1"))
    expressions = pod(result)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"]
    assert "nvidia.com/gpu.count" not in [expression["key"] for expression in expressions]
    assert "tiny-dshm" not in [volume["name"] for volume in pod(result)["volumes"]]
    assert _engine(result)["resources"]["limits"] == {"cpu": "4", "memory": "16384Mi", "nvidia.com/gpu": "1"}


def test_the_profiles_shm_size_wins_over_the_nccl_default(tmp_path: Path) -> None:
    text = profile_text(hardware_extra="gpu_count = 4", runtime_extra='shm_size = "32g"')
    volumes = pod(rendered(tmp_path, hardware=TP4, text=text))["volumes"]
    assert {"name": "tiny-dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in volumes


def test_more_ranks_than_declared_gpus_is_refused(tmp_path: Path) -> None:
    text = profile_text(hardware_extra="gpu_count = 2") + "\n[serve]\ntensor_parallel_size = 4\n"
    with pytest.raises(InputInvalidError, match="tensor_parallel_size x pipeline_parallel_size is 4 GPUs"):
        rendered(tmp_path, text=text)


def test_cpu_affinity_pins_the_architecture_and_requests_no_gpu(tmp_path: Path) -> None:
    text = profile_text(accelerator="cpu", hardware_extra="")
    spec = pod(rendered(tmp_path, hardware=CPU, text=text))
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]
    amounts = {"cpu": "2", "memory": "8192Mi"}
    assert spec["containers"][0]["resources"] == {"requests": amounts, "limits": amounts}  # no GPU


@pytest.mark.parametrize(
    "hardware",
    [
        {"accelerator": "cuda", "gpu_name": "NVIDIA H100"},  # no compute capability
        {"accelerator": "tpu"},
        {"accelerator": "cpu", "isa": "armv8"},
    ],
)
def test_a_hardware_factor_without_a_placement_is_refused(hardware: Mapping[str, Any]) -> None:
    with pytest.raises(InputInvalidError):
        k8s.node_affinity(hardware)


# -- refusals -----------------------------------------------------------------------------------------


def test_a_tag_is_refused_never_rendered(tmp_path: Path) -> None:
    with pytest.raises(InputInvalidError, match="not pinned by digest"):
        rendered(tmp_path, artifact="registry.example.com/blessings/tiny:latest")


def test_image_tags_are_warned_about(tmp_path: Path) -> None:
    result = rendered(tmp_path, engine_image="engine:1.0")
    assert result.warnings == ("--image engine:1.0 is a tag, not a digest: what runs can change under the Deployment",)


def test_a_docker_runtime_profile_is_refused(tmp_path: Path) -> None:
    text = profile_text().replace('kind = "local"\npython = "python3"', 'kind = "docker"\nimage = "engine:1"')
    with pytest.raises(InputInvalidError, match=r"runtime\.kind is 'docker'"):
        rendered(tmp_path, text=text)


def test_a_profile_that_is_not_the_blessings_is_refused(tmp_path: Path) -> None:
    text = profile_text().replace('name = "tiny-test"', 'name = "another"')
    with pytest.raises(InputInvalidError, match="made from profile 'tiny-test'"):
        rendered(tmp_path, text=text)


@pytest.mark.parametrize("name", ["Tiny", "tiny_test", "-tiny", "x" * 64])
def test_names_kubernetes_refuses_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InputInvalidError, match="not a Kubernetes name"):
        rendered(tmp_path, name=name)


@pytest.mark.parametrize(
    ("profile_name", "name"),
    [
        ("reference-cpu-pod", "reference-cpu-pod"),
        ("vllm-0.26-tiny-llama-local", "vllm-0-26-tiny-llama-local-"),
        ("Reference_CPU", "reference-cpu-"),
        ("__", "bless-serve-"),
        ("x" * 64, "x" * 54 + "-"),
    ],
)
def test_default_names_are_kubernetes_names(profile_name: str, name: str) -> None:
    """A name that is a DNS label already is kept; any other is made one and keeps a digest suffix of the original."""
    found = k8s.default_name(profile_name)
    assert found.startswith(name) and len(found) <= 63 and k8s._DNS_LABEL.fullmatch(found)
    assert (found == name) == (profile_name == name)


@pytest.mark.parametrize("names", [("A_B", "a-b"), ("a.b", "a-b"), ("A_B", "a_b"), ("X" * 63, "x" * 63)])
def test_two_profile_names_never_render_the_same_deployment(tmp_path: Path, names: tuple[str, str]) -> None:
    """``A_B`` and ``a-b`` both rendered Deployment ``a-b``: applying one replaced the other's pods (issue 25,
    item 11). The names, and every name derived from them (the profile ConfigMap), are kept apart."""
    found = []
    for profile_name in names:
        text = profile_text().replace('name = "tiny-test"', f'name = "{profile_name}"')
        result = k8s.render(
            load(tmp_path, text),
            text,
            dataclasses.replace(blessing(tmp_path, H100), profile_name=profile_name),
            options(name=""),
            cache_path="/var/cache/engine",
        )
        found.append({doc["metadata"]["name"] for doc in result.documents})
    assert found[0].isdisjoint(found[1]), found


# -- the command --------------------------------------------------------------------------------------


def _render_cli(*args: str) -> Any:
    from typer.testing import CliRunner

    from bless.cli.main import app

    return CliRunner().invoke(app, ["k8s", "render", "--image", "e@" + DIGEST, "--bless-image", "b@" + DIGEST, *args])


def test_the_command_refuses_a_tag_before_any_request(tmp_path: Path) -> None:
    path = tmp_path / "profile.toml"
    path.write_text(profile_text())
    # Port 9 on loopback: nothing answers there; a request would be a registry error (70), not 3.
    result = _render_cli("--profile", str(path), "--from", "127.0.0.1:9/blessings/tiny:v1", "--json")
    assert result.exit_code == 3, result.stdout
    assert "not pinned by digest" in result.stdout


def test_the_command_refuses_a_trust_dir_without_root_json(tmp_path: Path) -> None:
    path = tmp_path / "profile.toml"
    path.write_text(profile_text())
    empty = tmp_path / "trust"
    empty.mkdir()
    result = _render_cli("--profile", str(path), "--from", f"127.0.0.1:9/b@{DIGEST}", "--trust", str(empty), "--json")
    assert result.exit_code == 3, result.stdout
    assert "root.json: no such trusted root file" in result.stdout


def test_without_a_name_the_deployment_is_named_after_the_profile(tmp_path: Path) -> None:
    result = rendered(tmp_path, name="")
    assert deployment(result)["metadata"]["name"] == "tiny-test"
    assert result.documents[0]["metadata"]["name"] == "tiny-test-profile"


def test_the_flow_renders_the_blessing_it_reads_from_the_registry(tmp_path: Path) -> None:
    """render_blessing reads the pushed blessing back by digest (from the in-memory registry) and renders what
    render does with it; its manifest altered in the registry is refused while it streams (72), nothing rendered."""
    registry = RegistrySimulator()
    store = Store(tmp_path / "root")
    tree = write_tree(tmp_path / "tree")
    manifest = make_manifest(tree, resolved_factors(profile_text(), tmp_path))
    store.publish(tree, manifest)
    pushed = push_blessing(store, manifest, parse_reference(registry.ref("blessings/tiny:v1")), transport=registry)
    path = tmp_path / "profile.toml"
    path.write_text(profile_text())
    result = render_blessing(path, options(artifact=pushed.pinned), transport=registry)
    profile = load(tmp_path, profile_text())
    cache_path = get_adapter(profile.engine).cache_mount_path
    direct = k8s.render(
        profile, profile_text(), k8s.Blessing.of(manifest), options(artifact=pushed.pinned), cache_path=cache_path
    )
    assert dataclasses.replace(result, blessing_read_from="") == direct
    assert result.blessing_read_from == f"the registry {registry.host}"
    config = digest_of(manifest.to_json_bytes())
    registry.tamper(config, registry.stored(config).replace(b"H100", b"H200"))
    with pytest.raises(DigestMismatchError):
        render_blessing(path, options(artifact=pushed.pinned), transport=registry)


# -- rendering without the registry -----------------------------------------------------------------


def _pushed_and_stored(tmp_path: Path) -> tuple[Store, Path, str, k8s.K8sRendered]:
    """A blessing published in a store and pushed to an in-memory registry: the store, the profile, the pushed
    digest reference, and what render makes of the blessing."""
    registry = RegistrySimulator(host="registry.example.com")
    store = Store(tmp_path / "root")
    tree = write_tree(tmp_path / "tree")
    manifest = make_manifest(tree, resolved_factors(profile_text(), tmp_path))
    store.publish(tree, manifest)
    pushed = push_blessing(store, manifest, parse_reference(registry.ref("blessings/tiny:v1")), transport=registry)
    path = tmp_path / "profile.toml"
    path.write_text(profile_text())
    profile = load(tmp_path, profile_text())
    direct = k8s.render(
        profile,
        profile_text(),
        k8s.Blessing.of(manifest),
        options(artifact=pushed.pinned),
        cache_path=get_adapter(profile.engine).cache_mount_path,
    )
    return store, path, pushed.pinned, direct


def test_a_stored_blessing_renders_without_the_registry(tmp_path: Path) -> None:
    """The store that pushed the blessing holds the bytes the registry serves under its digest: render reads them
    there, and a registry that is down (every request refused) is never asked."""
    store, path, pinned, direct = _pushed_and_stored(tmp_path)
    down = RegistrySimulator(host="registry.example.com")
    down.kill()
    result = render_blessing(path, options(artifact=pinned), store=store, transport=down)
    assert dataclasses.replace(result, blessing_read_from="") == direct
    assert result.blessing_read_from == f"the local store {store.root} (no registry contacted)"


def test_a_blessing_the_store_does_not_hold_is_read_from_the_registry_and_its_absence_said(tmp_path: Path) -> None:
    """Another digest (a rebless pushed from elsewhere, say) is not in the store: the registry is asked, and when
    it cannot be reached the refusal says the store holds no such blessing and where one renders offline."""
    store, path, pinned, _direct = _pushed_and_stored(tmp_path)
    other = pinned.rsplit("@", 1)[0] + "@sha256:" + "cd" * 32
    down = RegistrySimulator(host="registry.example.com")
    down.kill()
    with pytest.raises(RegistryUnavailableError) as info:
        render_blessing(path, options(artifact=other), store=store, transport=down)
    assert f"the store {store.root} holds no blessing pushed as it" in info.value.message
    assert "refused the connection" in info.value.message
    assert info.value.hint and "render where the blessing is stored" in info.value.hint


def test_the_command_renders_from_the_store_under_root(tmp_path: Path) -> None:
    """bless --root R k8s render: the blessing pushed from R renders with no registry anywhere (its host does
    not even resolve here)."""
    store, path, pinned, _direct = _pushed_and_stored(tmp_path)
    offline = pinned.replace("registry.example.com", "no-such-registry.invalid")
    from typer.testing import CliRunner

    from bless.cli.main import app

    args = ["--root", str(store.root), "k8s", "render", "--profile", str(path), "--from", offline]
    args += ["--image", options().engine_image, "--bless-image", options().bless_image]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "kind: Deployment" in result.stdout
    assert f"the blessing's manifest was read from the local store {store.root}" in result.stderr


# -- the rendered pod under podman (scripts/images/podman_pod.py) ---------------------------------------------


def test_the_podman_edits_change_only_what_podman_needs(tmp_path: Path) -> None:
    """What the Kubernetes guide pipes rendered YAML through before podman kube play, run as the guide runs it."""
    import subprocess
    import sys

    import yaml

    from bless.cli.k8s import to_yaml

    result = rendered(tmp_path)
    original = [dict(doc) for doc in yaml.safe_load_all(to_yaml(result.documents))]
    script = Path(__file__).resolve().parents[2] / "scripts" / "images" / "podman_pod.py"
    terminations = tmp_path / "term"
    proc = subprocess.run(
        [sys.executable, str(script), "--termination-dir", str(terminations)],
        input=to_yaml(result.documents), capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    changed = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
    assert [doc["kind"] for doc in changed] == [doc["kind"] for doc in original]
    at = [doc["kind"] for doc in original].index("Deployment")
    assert changed[:at] + changed[at + 1 :] == original[:at] + original[at + 1 :], "only the Deployment changes"
    (before, after) = (original[at], changed[at])
    annotation = "io.podman.annotations.init.container.type"
    assert after["metadata"]["annotations"][annotation] == "always"
    assert after["spec"]["template"]["metadata"]["annotations"][annotation] == "always"
    pod = after["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and "restartPolicy" not in pod
    containers = pod["initContainers"] + pod["containers"]
    assert all("ports" not in container for container in containers)
    assert {"name": "termination", "hostPath": {"path": str(terminations), "type": "Directory"}} in pod["volumes"]
    for container in containers:
        env = {variable["name"]: variable.get("value") for variable in container["env"]}
        assert env["BLESS_TERMINATION_LOG"] == f"/var/run/termination/{container['name']}"
    # Everything else is as rendered: undo the edits and the Deployment is the original.
    for metadata in (after["metadata"], after["spec"]["template"]["metadata"]):
        del metadata["annotations"][annotation]
    del pod["hostNetwork"]
    pod["volumes"].remove({"name": "termination", "hostPath": {"path": str(terminations), "type": "Directory"}})
    before_pod = before["spec"]["template"]["spec"]
    for mine, theirs in zip(containers, before_pod["initContainers"] + before_pod["containers"], strict=True):
        mine["volumeMounts"].remove({"name": "termination", "mountPath": "/var/run/termination"})
        for variable in mine["env"]:
            if variable["name"] == "BLESS_TERMINATION_LOG":
                variable["value"] = next(v for v in theirs["env"] if v["name"] == "BLESS_TERMINATION_LOG")["value"]
        theirs.pop("ports", None)
    assert after == before


# -- what an operator reads: resources, security, disruption, the model, the profile --------------------------


def test_the_pod_is_restricted_sized_and_without_a_token(tmp_path: Path) -> None:
    result = rendered(tmp_path)
    spec = pod(result)
    assert spec["automountServiceAccountToken"] is False
    security = spec["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in spec["initContainers"] + spec["containers"]:
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        resources = container["resources"]
        assert resources["requests"] == resources["limits"] and {"cpu", "memory"} <= set(resources["limits"])
    for volume in spec["volumes"]:
        if "emptyDir" in volume:
            assert volume["emptyDir"]["sizeLimit"], volume
    assert "hostIPC" not in spec and result.warnings == ()


def test_a_rollout_asks_for_no_extra_gpus_and_a_service_and_budget_select_the_pods(tmp_path: Path) -> None:
    result = rendered(tmp_path, port=8080)
    found = deployment(result)
    assert found["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    labels = found["spec"]["template"]["metadata"]["labels"]
    (service,) = [doc for doc in result.documents if doc["kind"] == "Service"]
    (budget,) = [doc for doc in result.documents if doc["kind"] == "PodDisruptionBudget"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items() and budget["spec"]["maxUnavailable"] == 1


LOCAL_MODEL = '[model]\nsource = "local"\nid = "m"\npath = "/srv/models/m"\ncontent_sha256 = "' + "c" * 64 + '"\n'


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_a_local_model_is_mounted_at_its_path(tmp_path: Path, version: str) -> None:
    text = profile_text().replace('[model]\nsource = "builtin"\nid = "reference-tiny"\n', LOCAL_MODEL)
    assert "/srv/models/m" in text
    result = rendered(tmp_path, text=text)
    engine = _engine(result)
    assert {"name": "model", "mountPath": "/srv/models/m", "readOnly": True} in engine["volumeMounts"]
    assert {"name": "model", "hostPath": {"path": "/srv/models/m", "type": "Directory"}} in pod(result)["volumes"]
    assert any("hostPath" in warning for warning in result.warnings)
    claimed = rendered(tmp_path, text=text, model_claim="models")
    volume = {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    assert volume in pod(claimed)["volumes"] and claimed.warnings == ()
    for document in result.documents + claimed.documents:
        kubernetes_validate.validate(dict(document), version, strict=True)


def test_a_loopback_registry_and_host_ipc_are_warned_about(tmp_path: Path) -> None:
    loopback = rendered(tmp_path, artifact=f"127.0.0.1:5000/blessings/tiny@{DIGEST}")
    assert any("loopback" in warning for warning in loopback.warnings)
    shared = rendered(tmp_path, text=profile_text(runtime_extra="ipc_host = true"))
    assert any("hostIPC" in warning and "restricted" in warning for warning in shared.warnings)


def test_empty_dirs_are_named_per_deployment(tmp_path: Path) -> None:
    """podman shares same-named emptyDirs between pods: two names, no volume name in common."""

    def empty_dirs(name: str) -> set[str]:
        return {v["name"] for v in pod(rendered(tmp_path, name=name))["volumes"] if "emptyDir" in v}

    assert empty_dirs("a").isdisjoint(empty_dirs("b"))
    long = "x" * 63
    assert all(len(name) <= 63 for name in empty_dirs(long)) and len(empty_dirs(long)) == 4  # dshm too (TP=2)


def test_the_profile_configmap_is_a_readable_block(tmp_path: Path) -> None:
    import yaml

    from bless.cli.k8s import to_yaml

    text = profile_text()
    out = to_yaml(rendered(tmp_path, text=text).documents)
    assert "  profile.toml: |\n" in out and "\\n" not in out.split("profile.toml")[1].split("kind:")[0]
    assert next(iter(yaml.safe_load_all(out)))["data"]["profile.toml"] == text


# -- the dry form: a TP profile whose GPU blessing is not at hand ---------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_a_tp_profile_renders_dry_from_its_declarations_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    import bless.probes as probes
    from bless.flows.inspect.profile_hash import hash_profile

    def must_not(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the dry form reads nothing of this machine, the store or a registry")

    monkeypatch.setattr(probes, "probe_gpus", list)
    monkeypatch.setattr(probes, "probe_python_environment", must_not)
    monkeypatch.setattr(probes, "read_model_dir", must_not)
    path = Path(__file__).resolve().parents[2] / "profiles" / "vllm-0.26-llama-3.1-70b-dummy-tp4-local.toml"
    store = Store(tmp_path / "root")  # empty: the GPU blessing is not here, and no registry answers
    result = render_blessing(
        path, options(artifact=f"127.0.0.1:9/blessings/tp4@{DIGEST}", model_claim="models"), store=store,
        transport=must_not, dry_run=True,  # type: ignore[arg-type]
    )  # fmt: skip
    found = deployment(result)
    assert found["metadata"]["annotations"]["bless.dev/config-hash"] == hash_profile(path).resolved.config_hash
    assert "bless.dev/dir-id" not in found["metadata"]["annotations"]
    engine = _engine(result)
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "4"
    (term,) = pod(result)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["3"]} in term["matchExpressions"]
    assert result.warnings[0].startswith("dry form: no blessing was read")
    for document in result.documents:
        kubernetes_validate.validate(dict(document), version, strict=True)


def test_the_guides_podman_block_never_restarts_and_removes_its_volumes() -> None:
    """docs/guides/kubernetes.md's podman block: without --restart-never the init container loops (each time
    contacting the registry); `podman kube play --down` alone leaves the ConfigMaps' volumes behind."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "kubernetes.md").read_text()
    block = guide.split("### Pods on one machine: podman", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    (edit,) = [line for line in lines if "podman_pod.py" in line and "<" in line]
    assert "--restart-never" in edit
    assert lines[-1].startswith("python3 scripts/images/podman_pod.py --down ")
    assert not any(line.startswith("podman kube play --down") for line in lines)
    (render,) = [line for line in lines if line.startswith("bless k8s render")]
    name = render.split("--name ", 1)[1].split()[0]
    assert f"--trust-configmap {name}-" in render  # the trust ConfigMap's podman volume is per try, like the rest
