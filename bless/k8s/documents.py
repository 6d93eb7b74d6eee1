"""Kubernetes manifests for serving one blessing: a Deployment and the ConfigMaps it needs (pure).

The pod has two halves, each failing closed with bless's exit code (and its reason in the
container's termination message, ``kubectl describe pod``):

* an **init container** (the ``bless`` image) runs ``bless pull REF@sha256:... --trust`` into an
  ``emptyDir`` store: every blob checked while it streams, the signature checked against the trusted
  root of a ConfigMap, registry credentials from the pod's image-pull secret;
* the **engine container** (the user's engine image plus bless) runs ``serve-full`` as its entrypoint:
  the profile (a ConfigMap) must hash to the pulled blessing, every file is verified, the tree is
  presented at the pinned cache path (a verified copy on an ``emptyDir``: a pod cannot mount an
  overlay without CAP_SYS_ADMIN), the engine is its child with a fresh HOME, SIGTERM is forwarded,
  and the canary gates readiness: the probes run ``serve-full ready NAME``.

Pods land only on nodes whose GPU the blessing was proven on: node affinity on the GPU product and
compute capability labels of NVIDIA's GPU feature discovery (or on the CPU architecture), and, for a
tensor-parallel blessing, on at least as many GPUs per node as it uses; such a pod requests that many
GPUs and gets a memory-backed ``/dev/shm`` for NCCL. serve-full
would refuse anywhere else anyway (the hardware factor is hashed); the affinity keeps pods from being
scheduled where they can only fail.

Everything here is plain data: the caller supplies the profile text, the blessing's manifest and the
engine's pinned paths, and writes the documents out (YAML). Documents are plain dicts so that they
validate against the Kubernetes OpenAPI schemas as they are (``kubernetes-validate``, in the tests).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bless.core.json_form import JsonForm
from bless.core.manifest import Manifest
from bless.core.profile import Profile, engine_gpu_count
from bless.core.untrusted_text import shown, without_credentials
from bless.errors import InputInvalidError

__all__ = [
    "BLESS_ROOT",
    "Blessing",
    "K8sOptions",
    "K8sRendered",
    "default_name",
    "gpu_product_label",
    "node_affinity",
    "render",
    "require_digest",
]

#: The pod's store (an emptyDir the init container fills) and where its inputs are mounted.
BLESS_ROOT = "/var/lib/bless"
PROFILE_DIR = "/etc/bless/profile"
PROFILE_FILE = "profile.toml"
TRUST_DIR = "/etc/bless/trust"
REGISTRY_AUTH_DIR = "/etc/bless/registry-auth"
TERMINATION_LOG = "/dev/termination-log"
#: The engine's own HOME and temp dir live here (bless.engines.base.ENGINE_HOME / ENGINE_TMP).
ENGINE_STATE_DIR = "/var/lib/bless-engine"
SERVING_PORT = 8000

#: The uid and gid both containers run as (Pod Security "restricted": never root). The images need no user of
#: that id: serve-full gives the engine its own HOME and temp dir, and emptyDirs are writable by the pod's fsGroup.
RUN_AS_ID = 65532
#: The init container's share: ``bless pull`` streams and hashes blobs (no engine, no torch).
INIT_RESOURCES = {"cpu": "1", "memory": "1Gi"}
#: The engine container's defaults (``--cpu``, ``--memory`` set others): per GPU for a CUDA blessing, else one
#: CPU engine. A memory-backed /dev/shm is charged to the pod's memory, so its size is added to the limit.
ENGINE_CPU_PER_GPU = 4
ENGINE_MEMORY_GIB_PER_GPU = 16
CPU_ENGINE_CPU = "2"
CPU_ENGINE_MEMORY_GIB = 8
#: An emptyDir for a blessed tree whose size is not known (the dry form): vLLM's trees are tens to hundreds of MB.
UNKNOWN_TREE_SIZE = "10Gi"
#: The engine's HOME and temp dir (Inductor's scratch, Triton's own files): not the blessed tree.
ENGINE_STATE_SIZE = "8Gi"
#: Registries on the node's own loopback: a pod reaches its own network namespace there, not the node's.
LOOPBACK_HOSTS = ("127.", "localhost", "[::1]", "::1")

#: NVIDIA GPU feature discovery's node labels (the GPU operator installs it).
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MAJOR_LABEL = "nvidia.com/gpu.compute.major"
GPU_MINOR_LABEL = "nvidia.com/gpu.compute.minor"
GPU_RESOURCE = "nvidia.com/gpu"
#: GPU feature discovery's count of GPUs on a node: a tensor-parallel pod needs that many on one node.
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
#: /dev/shm per GPU of a multi-GPU pod when the profile sets no runtime.shm_size: NCCL's shared-memory
#: transport and vLLM's worker processes exchange through it, and a container's default is 64 MiB.
NCCL_SHM_GIB_PER_GPU = 2
ARCH_LABEL = "kubernetes.io/arch"

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
#: An image reference as Kubernetes takes it: not empty, no whitespace or control characters.
_IMAGE = re.compile(r"[^\s\x00-\x1f\x7f]{1,1024}")
#: A registry reference as text: no blank, no control character (a Python ``\s`` covers Unicode blanks too).
_REFERENCE_TEXT = re.compile(r"[^\s\x00-\x1f\x7f-\x9f]{1,2048}")
#: Replicas is an int32.
_MAX_REPLICAS = 2**31 - 1
_QUANTITY = re.compile(r"(\d+(\.\d+)?|\.\d+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?")
_LABEL_VALUE_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
#: Seconds on top of the engine's own ready timeout for the start: verify, copy, canary.
_START_SLACK_S = 300
_PROBE_PERIOD_S = 10


@dataclass(frozen=True)
class K8sOptions:
    """What the operator chooses: names, images, replicas, secrets."""

    #: ``REPO@sha256:...`` of the blessing in its registry: never a tag.
    artifact: str
    #: The engine image (the user's engine image plus bless: deploy/images/engine.Dockerfile).
    engine_image: str
    #: The init container's image (scripts/images/build-bless-image.sh).
    bless_image: str
    #: The Deployment's name; empty: :func:`default_name` of the profile's name.
    name: str = ""
    replicas: int = 1
    namespace: str | None = None
    #: The ConfigMap holding the trusted ``root.json``.
    trust_configmap: str = "bless-trust"
    #: The trusted root.json to render as that ConfigMap (None: it exists already).
    trust_root_json: str | None = None
    #: An image-pull secret (kubernetes.io/dockerconfigjson): pulls both images and the blessing.
    pull_secret: str | None = None
    #: The Secret that holds the profile's secret env values, one key per name (never rendered inline).
    env_secret: str | None = None
    port: int = SERVING_PORT
    #: The engine container's CPU and memory (requests = limits: the Guaranteed QoS class); None: the defaults.
    cpu: str | None = None
    memory: str | None = None
    #: A PersistentVolumeClaim holding a local model (``model.path``), mounted read-only there; None: a hostPath.
    model_claim: str | None = None


@dataclass(frozen=True)
class Blessing:
    """What the manifests need of a blessing: whose profile, which version, and the hardware it was proven on."""

    profile_name: str
    config_hash: str
    dir_id: str
    hardware: Mapping[str, Any]
    #: The blessed tree's size in bytes: the store and the cache copy are sized from it (0: unknown, the dry form).
    cache_bytes: int = 0

    @classmethod
    def of(cls, manifest: Manifest) -> Blessing:
        hardware = manifest.factors.get("hardware")
        return cls(
            profile_name=manifest.profile_name,
            config_hash=manifest.config_hash,
            dir_id=manifest.cache.dir_id,
            hardware=hardware if isinstance(hardware, Mapping) else {},
            cache_bytes=manifest.cache.total_size,
        )


@dataclass(frozen=True)
class K8sRendered(JsonForm):
    """The documents, in apply order, and what the operator should know about them."""

    documents: tuple[Mapping[str, Any], ...]
    warnings: tuple[str, ...] = field(default=())
    #: Where the blessing's manifest was read (the local store or the registry), for the operator.
    blessing_read_from: str = ""


def default_name(profile_name: str) -> str:
    """A Kubernetes name from a profile name, one per profile name.

    A profile name that is a DNS-1123 label already is the name. Any other is made one (lowercase,
    anything but letters and digits as ``-``) and keeps 8 hex digits of its SHA-256 as a suffix: ``A_B``
    and ``a-b`` are two profiles, and must not render the same Deployment (one apply would replace the
    other's pods).
    """
    if _DNS_LABEL.fullmatch(profile_name) is not None:
        return profile_name
    suffix = hashlib.sha256(profile_name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    name = re.sub(r"[^a-z0-9]+", "-", profile_name.lower()).strip("-")[: 63 - 1 - len(suffix)].strip("-")
    return f"{name or 'bless-serve'}-{suffix}"


def gpu_product_label(gpu_name: str) -> str:
    """The value GPU feature discovery gives ``nvidia.com/gpu.product`` for an ``nvidia-smi`` name.

    GFD writes the name with spaces as ``-`` (``NVIDIA H100 80GB HBM3`` -> ``NVIDIA-H100-80GB-HBM3``);
    anything else a label value cannot hold becomes ``-`` too, and it is cut to 63 characters.
    """
    value = _LABEL_VALUE_UNSAFE.sub("-", gpu_name.strip())[:63].strip("-_.")
    if not value:
        raise InputInvalidError(f"GPU name {gpu_name!r} gives no usable node label value")
    return value


def node_affinity(hardware: Mapping[str, Any]) -> dict[str, Any]:
    """Required node affinity from a blessing's hardware factor: only where it was proven.

    CUDA: the GPU product and the compute capability (GFD labels), and for a blessing over several
    GPUs at least that many on the node (``nvidia.com/gpu.count``, Gt count-1). CPU: the architecture; the ISA
    level has no standard node label, and serve-full refuses another one at start (it is hashed).
    """
    accelerator = hardware.get("accelerator")
    if accelerator == "cuda":
        name, capability = hardware.get("gpu_name"), hardware.get("compute_capability")
        if not isinstance(name, str) or not isinstance(capability, str) or "." not in capability:
            raise InputInvalidError(
                f"the blessing's hardware factor names no GPU product and compute capability: {dict(hardware)}",
                hint="render from a blessing made on a GPU (its manifest lists its factors)",
                remedy="blessing_made_on_gpu",
            )
        major, minor = capability.split(".", 1)
        expressions = [
            {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": [gpu_product_label(name)]},
            {"key": GPU_MAJOR_LABEL, "operator": "In", "values": [major]},
            {"key": GPU_MINOR_LABEL, "operator": "In", "values": [minor]},
        ]
        count = hardware.get("gpu_count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise InputInvalidError(f"the blessing's hardware factor has no usable gpu_count: {count!r}")
        if count > 1:  # one engine over `count` GPUs of one node (tensor parallelism)
            expressions.append({"key": GPU_COUNT_LABEL, "operator": "Gt", "values": [str(count - 1)]})
    elif accelerator == "cpu":
        isa = hardware.get("isa")
        if not isinstance(isa, str) or not isa.startswith("x86-64"):
            raise InputInvalidError(
                f"the blessing's CPU ISA {isa!r} maps to no Kubernetes architecture (x86-64 levels are supported)"
            )
        expressions = [{"key": ARCH_LABEL, "operator": "In", "values": ["amd64"]}]
    else:
        raise InputInvalidError(f"the blessing's hardware factor has an unknown accelerator: {accelerator!r}")
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": expressions}]}
        }
    }


def require_digest(artifact: str) -> None:
    """Refuse (3) an artifact reference that is not pinned by digest: a tag can be moved to another blessing.

    Also one with blanks or control characters (a newline read from a file along with it): the reference
    is written verbatim into the Deployment's annotation and the init container's ``bless pull``.
    """
    quoted = shown(without_credentials(artifact)[:300])
    if _REFERENCE_TEXT.fullmatch(artifact) is None:
        raise InputInvalidError(
            f"--from {quoted} holds blanks or control characters (a newline at its end?)",
            hint="pass the reference alone, REGISTRY/REPO@sha256:... (strip what came along from a file or a copy)",
        )
    if "@sha256:" not in artifact:
        raise InputInvalidError(
            f"--from {quoted} is not pinned by digest: a tag can be moved to another blessing",
            hint="use REPO@sha256:... (a push reports the digest)",
            remedy="pin_by_digest",
        )


def _check_inputs(profile: Profile, blessing: Blessing, options: K8sOptions, secret_env: Sequence[str]) -> None:
    if _DNS_LABEL.fullmatch(options.name) is None:
        raise InputInvalidError(
            f"{options.name!r} is not a Kubernetes name (lowercase letters, digits and '-', at most 63)",
            hint="name it with a DNS-1123 label",
            remedy="k8s_name",
        )
    subdomain = "a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', at most 253"
    for option, value, rule, what in (
        ("--trust-configmap", options.trust_configmap, _DNS_SUBDOMAIN, subdomain),
        ("--pull-secret", options.pull_secret, _DNS_SUBDOMAIN, subdomain),
        ("--namespace", options.namespace, _DNS_LABEL, "a DNS-1123 label: lowercase letters, digits, '-', at most 63"),
    ):
        if value is not None and rule.fullmatch(value) is None:
            raise InputInvalidError(
                f"{option} {shown(value[:300])} is not a name Kubernetes accepts", hint=f"pass {what}"
            )
    for option, image in (("--image", options.engine_image), ("--bless-image", options.bless_image)):
        if _IMAGE.fullmatch(image) is None:
            raise InputInvalidError(
                f"{option} {shown(image[:300])} is not an image reference (empty, blank or with spaces)",
                hint="pass REGISTRY/REPOSITORY@sha256:DIGEST",
            )
    if not 0 <= options.replicas <= _MAX_REPLICAS:
        raise InputInvalidError(f"--replicas {options.replicas} is out of range (0 to {_MAX_REPLICAS})")
    require_digest(options.artifact)
    if profile.runtime_kind != "local":
        raise InputInvalidError(
            f"{profile.label}: runtime.kind is {profile.runtime_kind!r}; in a pod serve-full starts the engine "
            "as its own child process, which is the 'local' runtime",
            hint="bless a profile with [runtime] kind = 'local' inside the engine image (docs/guides/kubernetes.md)",
        )
    if blessing.profile_name != profile.name:
        raise InputInvalidError(
            f"the blessing at {shown(without_credentials(options.artifact))} was made from profile "
            f"{blessing.profile_name!r}, not {profile.name!r}",
            hint="render with the profile that blessing was made from",
        )
    check_secret_env(profile, options, secret_env)
    engine_gpu_count(profile)  # the GPUs asked for cover the engine's parallelism
    for option, value in (("--cpu", options.cpu), ("--memory", options.memory)):
        if value is not None and _QUANTITY.fullmatch(value) is None:
            raise InputInvalidError(
                f"{option} {shown(value[:300])} is not a Kubernetes quantity", hint="pass e.g. 4, 500m, 32Gi"
            )
    if options.model_claim is not None and _DNS_SUBDOMAIN.fullmatch(options.model_claim) is None:
        raise InputInvalidError(
            f"--model-claim {shown(options.model_claim[:300])} is not a claim name Kubernetes accepts"
        )


def check_secret_env(profile: Profile, options: K8sOptions, secret_env: Sequence[str]) -> None:
    """Secrets are never written: the profile leaves them empty, and ``--env-secret`` names the Secret with them."""
    inline = [name for name in secret_env if profile.env[name] != ""]
    if inline:
        raise InputInvalidError(
            f"{profile.label}: [env] holds the value of secret {', '.join(inline)}: rendering would write it into the "
            "profile ConfigMap and on stdout",
            hint=f'leave it empty in the profile ({inline[0]} = ""), put the value in a Kubernetes Secret '
            f"(kubectl create secret generic NAME --from-literal={inline[0]}=...) and name that Secret (env_secret)",
            details={"secret_env": inline[0]},
            remedy="k8s_env_secret_inline",
        )
    if secret_env and not options.env_secret:
        raise InputInvalidError(
            f"{profile.label}: [env] names secret {', '.join(secret_env)} (empty): the pod needs its value",
            hint="name a Kubernetes Secret with one key per secret env name (env_secret)",
            remedy="k8s_env_secret",
        )
    if options.env_secret and _DNS_SUBDOMAIN.fullmatch(options.env_secret) is None:
        raise InputInvalidError(
            f"--env-secret {shown(options.env_secret)} is not a Kubernetes Secret name",
            hint="a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', at most 253",
        )


def _labels(options: K8sOptions) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "bless-serve",
        "app.kubernetes.io/instance": options.name,
        "app.kubernetes.io/managed-by": "bless",
    }


def _metadata(name: str, options: K8sOptions, **extra: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": _labels(options), **extra}
    if options.namespace:
        metadata["namespace"] = options.namespace
    return metadata


def _probe(command: list[str], *, failure_threshold: int, timeout_s: int) -> dict[str, Any]:
    return {
        "exec": {"command": command},
        "periodSeconds": _PROBE_PERIOD_S,
        "timeoutSeconds": timeout_s,
        "failureThreshold": failure_threshold,
    }


def render(
    profile: Profile,
    profile_text: str,
    blessing: Blessing,
    options: K8sOptions,
    *,
    cache_path: str,
    secret_env: Sequence[str] = (),
) -> K8sRendered:
    """The ConfigMaps and the Deployment that serve ``blessing`` (pulled from ``options.artifact``).

    ``profile_text``: the profile file as written (it becomes the profile ConfigMap, byte for byte).
    ``cache_path``: the engine's pinned cache path (the adapter's ``cache_mount_path``).
    ``secret_env``: the names of the profile's env that the engine's policy keeps secret: never
    rendered; the profile leaves them empty and the engine container takes them from
    ``options.env_secret`` (``valueFrom.secretKeyRef``), which serve-full passes on to the engine.

    Raises:
        InputInvalidError: a name Kubernetes refuses, an artifact not pinned by digest, a profile that
            is not the blessing's or not for the local runtime.
    """
    if not options.name:
        options = dataclasses.replace(options, name=default_name(profile.name))
    secret_env = sorted(secret_env)
    _check_inputs(profile, blessing, options, secret_env)
    warnings = [*_image_warnings(options), *_security_warnings(profile, options)]
    profile_cm = f"{options.name}-profile"
    documents = _config_maps(profile_text, options, profile_cm=profile_cm)
    pod_spec = _pod_spec(profile, blessing, options, profile_cm=profile_cm, cache_path=cache_path)
    engine_env = pod_spec["containers"][0]["env"]
    for name in secret_env:
        engine_env.append({"name": name, "valueFrom": {"secretKeyRef": {"name": options.env_secret, "key": name}}})
    documents.append(_deployment(blessing, options, pod_spec))
    documents += [_service(options), _disruption_budget(options)]
    return K8sRendered(documents=tuple(documents), warnings=tuple(warnings))


def _security_warnings(profile: Profile, options: K8sOptions) -> list[str]:
    """Where the pod cannot meet Pod Security "restricted", and a registry the pods cannot reach."""
    warnings: list[str] = []
    registry = options.artifact.split("/", 1)[0].lower()
    if registry.startswith(LOOPBACK_HOSTS):
        warnings.append(
            f"--from names the registry {registry}, a loopback address: in a pod that is the pod's own network "
            "namespace, not the node's, and the init container cannot pull (push to a registry the nodes reach)"
        )
    if profile.ipc_host:
        warnings.append(
            "runtime.ipc_host renders hostIPC: true, which Pod Security 'baseline' and 'restricted' refuse: the "
            "namespace must allow 'privileged' (size /dev/shm with runtime.shm_size instead)"
        )
    if profile.model.source == "local" and options.model_claim is None:
        warnings.append(
            f"the local model {profile.model.path} is mounted from the node (hostPath), which Pod Security "
            "'baseline' and 'restricted' refuse, and every node must hold it: name a PersistentVolumeClaim that "
            "holds it (model_claim) to keep the pod 'restricted'"
        )
    return warnings


def _image_warnings(options: K8sOptions) -> tuple[str, ...]:
    warnings: list[str] = []
    for what, image in (("--image", options.engine_image), ("--bless-image", options.bless_image)):
        if "@sha256:" not in image:
            warnings.append(f"{what} {image} is a tag, not a digest: what runs can change under the Deployment")
    return tuple(warnings)


def _config_maps(profile_text: str, options: K8sOptions, *, profile_cm: str) -> list[Mapping[str, Any]]:
    """The profile's ConfigMap, and the trusted root's when the operator gave one to render."""
    documents: list[Mapping[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata(profile_cm, options),
            "data": {PROFILE_FILE: profile_text},
        }
    ]
    if options.trust_root_json is not None:
        documents.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": _metadata(options.trust_configmap, options),
                "data": {"root.json": options.trust_root_json},
            }
        )
    return documents


def _pod_spec(
    profile: Profile, blessing: Blessing, options: K8sOptions, *, profile_cm: str, cache_path: str
) -> dict[str, Any]:
    volumes = _volumes(profile, blessing, options, profile_cm=profile_cm)
    pod_spec: dict[str, Any] = {
        "affinity": node_affinity(blessing.hardware),
        # serve-full talks to no API server: no token in the pod.
        "automountServiceAccountToken": False,
        # Pod Security "restricted": never root, the runtime's default seccomp profile; the emptyDirs and the
        # ConfigMaps are the pod's fsGroup's.
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_ID,
            "runAsGroup": RUN_AS_ID,
            "fsGroup": RUN_AS_ID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # serve-full stops the engine gracefully within the profile's stop timeout, then cleans up.
        "terminationGracePeriodSeconds": profile.trials.stop_timeout_s + 30,
        "initContainers": [_init_container(options)],
        "containers": [_engine_container(profile, blessing, options, cache_path=cache_path)],
        "volumes": volumes,
    }
    if profile.ipc_host:
        pod_spec["hostIPC"] = True
    if options.pull_secret:
        pod_spec["imagePullSecrets"] = [{"name": options.pull_secret}]
    return pod_spec


def _env() -> list[dict[str, str]]:
    return [{"name": "BLESS_TERMINATION_LOG", "value": TERMINATION_LOG}, {"name": "BLESS_ROOT", "value": BLESS_ROOT}]


def volume_name(options: K8sOptions, what: str) -> str:
    """A pod volume's name, ``NAME-what``: unique per Deployment name (podman shares same-named emptyDirs between
    pods), cut with 8 hex digits of the whole when longer than a DNS label."""
    name = f"{options.name}-{what}"
    if len(name) <= 63:
        return name
    suffix = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{options.name[: 63 - len(what) - len(suffix) - 2].rstrip('-')}-{suffix}-{what}"


def _store_and_trust_mounts(options: K8sOptions) -> list[dict[str, Any]]:
    """What both containers mount: the pulled store and the trusted root."""
    return [
        {"name": volume_name(options, "store"), "mountPath": BLESS_ROOT},
        {"name": "bless-trust", "mountPath": TRUST_DIR, "readOnly": True},
    ]


def _tree_limit(blessing: Blessing) -> str:
    """An emptyDir that holds one blessed tree: its size and half again (a pull's staging, the engine's writes
    over the copy), and 1 GiB, in whole GiB; :data:`UNKNOWN_TREE_SIZE` when the size is not known (the dry form)."""
    if blessing.cache_bytes <= 0:
        return UNKNOWN_TREE_SIZE
    return f"{math.ceil(blessing.cache_bytes * 1.5 / 2**30) + 1}Gi"


def _volumes(profile: Profile, blessing: Blessing, options: K8sOptions, *, profile_cm: str) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": volume_name(options, "store"), "emptyDir": {"sizeLimit": _tree_limit(blessing)}},
        {"name": "bless-trust", "configMap": {"name": options.trust_configmap}},
        {"name": "bless-profile", "configMap": {"name": profile_cm}},
        {"name": volume_name(options, "engine-cache"), "emptyDir": {"sizeLimit": _tree_limit(blessing)}},
        {"name": volume_name(options, "engine-state"), "emptyDir": {"sizeLimit": ENGINE_STATE_SIZE}},
    ]
    if profile.model.source == "local" and profile.model.path is not None:
        source: dict[str, Any] = (
            {"persistentVolumeClaim": {"claimName": options.model_claim, "readOnly": True}}
            if options.model_claim
            else {"hostPath": {"path": profile.model.path, "type": "Directory"}}
        )
        volumes.append({"name": "model", **source})
    if options.pull_secret:
        volumes.append(
            {
                "name": "registry-auth",
                "secret": {
                    "secretName": options.pull_secret,
                    "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
                },
            }
        )
    shm = _shm_limit(profile)
    if shm is not None:
        volumes.append({"name": volume_name(options, "dshm"), "emptyDir": {"medium": "Memory", "sizeLimit": shm}})
    return volumes


def _shm_limit(profile: Profile) -> str | None:
    """``/dev/shm``'s size: the profile's runtime.shm_size, else NCCL's need for a multi-GPU engine, else none."""
    if profile.shm_size:
        return _quantity(profile.shm_size)
    gpus = engine_gpu_count(profile)
    return f"{NCCL_SHM_GIB_PER_GPU * gpus}Gi" if gpus > 1 else None


def _init_container(options: K8sOptions) -> dict[str, Any]:
    """``bless pull`` of the artifact into the pod's store, under the trusted root."""
    env = _env()
    mounts = _store_and_trust_mounts(options)
    if options.pull_secret:
        # The image-pull secret's .dockerconfigjson is a docker config.json: bless pull reads $DOCKER_CONFIG.
        env.append({"name": "DOCKER_CONFIG", "value": REGISTRY_AUTH_DIR})
        mounts.append({"name": "registry-auth", "mountPath": REGISTRY_AUTH_DIR, "readOnly": True})
    return {
        "name": "bless-pull",
        "image": options.bless_image,
        "command": ["bless", "--root", BLESS_ROOT, "pull", options.artifact, "--trust", TRUST_DIR],
        "env": env,
        "volumeMounts": mounts,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": {"requests": dict(INIT_RESOURCES), "limits": dict(INIT_RESOURCES)},
        "securityContext": _container_security(),
    }


def _container_security() -> dict[str, Any]:
    """Pod Security "restricted" for a container: no privilege escalation, no capability."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _mebibytes(quantity: str) -> int:
    """A binary quantity bless writes (``8Gi``, ``512Mi``, ``64Ki``) in MiB, rounded up."""
    number, unit = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", quantity).groups()  # type: ignore[union-attr]
    return math.ceil(int(number) * {None: 2**-20, "Ki": 2**-10, "Mi": 1, "Gi": 1024}[unit])


def _engine_resources(profile: Profile, options: K8sOptions) -> dict[str, Any]:
    """CPU and memory, requests = limits (the Guaranteed QoS class), the GPUs; memory covers a memory /dev/shm."""
    gpus = engine_gpu_count(profile)
    cpu = options.cpu or (str(ENGINE_CPU_PER_GPU * gpus) if gpus else CPU_ENGINE_CPU)
    memory = options.memory
    if memory is None:
        shm = _shm_limit(profile)
        base = (ENGINE_MEMORY_GIB_PER_GPU * gpus if gpus else CPU_ENGINE_MEMORY_GIB) * 1024
        memory = f"{base + (_mebibytes(shm) if shm else 0)}Mi"
    amounts: dict[str, str] = {"cpu": cpu, "memory": memory}
    if gpus:
        amounts[GPU_RESOURCE] = str(gpus)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _engine_container(profile: Profile, blessing: Blessing, options: K8sOptions, *, cache_path: str) -> dict[str, Any]:
    """``serve-full`` of the profile as the entrypoint, its readiness record behind the probes."""
    mounts = [
        *_store_and_trust_mounts(options),
        {"name": "bless-profile", "mountPath": PROFILE_DIR, "readOnly": True},
        {"name": volume_name(options, "engine-cache"), "mountPath": cache_path},
        {"name": volume_name(options, "engine-state"), "mountPath": ENGINE_STATE_DIR},
    ]
    if _shm_limit(profile) is not None:
        mounts.append({"name": volume_name(options, "dshm"), "mountPath": "/dev/shm"})
    if profile.model.source == "local" and profile.model.path is not None:
        # At the path the profile hashes (vLLM hashes the model path): the engine reads it as on the blessing host.
        mounts.append({"name": "model", "mountPath": profile.model.path, "readOnly": True})
    ready_command = ["serve-full", "ready", profile.name, "--root", BLESS_ROOT]
    start_budget_s = profile.trials.ready_timeout_s + _START_SLACK_S
    serve_command = [
        "serve-full",
        "--profile", f"{PROFILE_DIR}/{PROFILE_FILE}",
        "--root", BLESS_ROOT,
        "--trust", TRUST_DIR,
        "--host", "0.0.0.0",
        "--port", str(options.port),
    ]  # fmt: skip
    engine: dict[str, Any] = {
        "name": "engine",
        "image": options.engine_image,
        "command": serve_command,
        "env": _env(),
        "ports": [{"name": "http", "containerPort": options.port, "protocol": "TCP"}],
        "volumeMounts": mounts,
        # Generous: a cold start, the verify, the copy and the canary all come before the first success.
        "startupProbe": _probe(
            ready_command, failure_threshold=math.ceil(start_budget_s / _PROBE_PERIOD_S), timeout_s=10
        ),
        # The canary gate: no traffic before serve-full wrote its readiness record, none once it stops.
        "readinessProbe": _probe(ready_command, failure_threshold=1, timeout_s=10),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": _engine_resources(profile, options),
        "securityContext": _container_security(),
    }
    return engine


def _deployment(blessing: Blessing, options: K8sOptions, pod_spec: dict[str, Any]) -> dict[str, Any]:
    """The Deployment, annotated with the blessing it serves."""
    annotations = {
        "bless.dev/artifact": options.artifact,
        "bless.dev/config-hash": blessing.config_hash,
    }
    if blessing.dir_id:  # none in the dry form: no blessing was read
        annotations["bless.dev/dir-id"] = blessing.dir_id
    selector = {key: value for key, value in _labels(options).items() if key != "app.kubernetes.io/managed-by"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(options.name, options, annotations=annotations),
        "spec": {
            "replicas": options.replicas,
            # Replace a pod only once its GPUs are free: a rollout never asks for more GPUs than the replicas hold.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": _labels(options), "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }


def _selector(options: K8sOptions) -> dict[str, str]:
    return {key: value for key, value in _labels(options).items() if key != "app.kubernetes.io/managed-by"}


def _service(options: K8sOptions) -> dict[str, Any]:
    """A ClusterIP Service in front of the ready pods (the readiness probe is the canary gate)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(options.name, options),
        "spec": {
            "selector": _selector(options),
            "ports": [{"name": "http", "port": options.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def _disruption_budget(options: K8sOptions) -> dict[str, Any]:
    """At most one pod away at a time for a voluntary disruption (a node drain)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(options.name, options),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _selector(options)}},
    }


def _quantity(size: str) -> str:
    """Docker's shm size (``16g``, ``512m``) as a Kubernetes quantity (``16Gi``, ``512Mi``)."""
    match = re.fullmatch(r"(\d+)([kKmMgG]?)[bB]?", size.strip())
    if match is None:
        raise InputInvalidError(f"runtime.shm_size {size!r} is not a size such as 16g or 512m")
    number, unit = match.groups()
    return number + {"": "", "k": "Ki", "m": "Mi", "g": "Gi"}[unit.lower()]
