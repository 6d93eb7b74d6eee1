"""Factors: the canonical, resolved, cache-affecting inputs of a blessing, and their hash.

Canonical JSON: sorted keys, compact separators, UTF-8, ``factors_version`` explicit.
Floats never appear: they are written as their shortest decimal string, so ``0.9`` from
one TOML parser and ``0.90`` from another hash alike and no float formatting enters
the hash. The config hash is the sha256 of the canonical JSON.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from bless.core.json_form import OMIT, JsonForm, as_json
from bless.core.profile import HardwareSpec, ModelSpec, Profile
from bless.errors import HardwareMismatchError, InputInvalidError, ResolutionError

FACTORS_VERSION = 1
_COMMIT = re.compile(r"[0-9a-f]{40}")
_IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
REDACTED = "<redacted>"

#: The one definition of the config-hash format: sha256 hex digest, 64 lowercase hex digits.
#: Always applied with ``fullmatch`` (``$`` would let a trailing newline through).
CONFIG_HASH = re.compile(r"[0-9a-f]{64}")
#: A config-hash prefix a user may type: at least 8 of those digits.
CONFIG_HASH_PREFIX = re.compile(r"[0-9a-f]{8,64}")


def is_config_hash(value: object) -> bool:
    """Whether ``value`` is a config hash exactly as bless writes it (no case folding, no spaces)."""
    return isinstance(value, str) and CONFIG_HASH.fullmatch(value) is not None


def is_commit(value: object) -> bool:
    """Whether ``value`` is a pinned git commit (40 lowercase hex), as model revisions must resolve to."""
    return isinstance(value, str) and _COMMIT.fullmatch(value) is not None


def is_pinned_image_id(value: object) -> bool:
    """Whether ``value`` is a Docker image ID (``sha256:`` + 64 lowercase hex), not a tag."""
    return isinstance(value, str) and _IMAGE_ID.fullmatch(value) is not None


def canonicalize(value: Any) -> Any:
    """Return ``value`` with floats as decimal strings and tuples as lists; reject other types."""
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("NaN and infinity are not valid factor values")
        return int(value) if value.is_integer() else repr(value)
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"factor keys must be strings, not {type(key).__name__}")
            out[key] = canonicalize(item)
        return out
    if isinstance(value, list | tuple):
        return [canonicalize(item) for item in value]
    raise ValueError(f"unsupported factor value type {type(value).__name__}")


def canonical_json(factors: Mapping[str, Any]) -> bytes:
    """The canonical byte form of a factor set; the input of the config hash."""
    return json.dumps(
        canonicalize(factors), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def config_hash(factors: Mapping[str, Any]) -> str:
    """sha256 (64 lowercase hex) of the canonical JSON of ``factors``."""
    return hashlib.sha256(canonical_json(factors)).hexdigest()


@dataclass(frozen=True)
class FactorChange:
    """One leaf that differs between two factor sets (``None`` side = absent)."""

    field: str
    before: Any
    after: Any

    def describe(self) -> str:
        """``serve.max_num_seqs: 1 -> 2`` style text."""
        return f"{self.field}: {_show(self.before)} -> {_show(self.after)}"


def _show(value: Any) -> str:
    if value is _ABSENT:
        return "(absent)"
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


_ABSENT: Any = object()


def _segment(key: str) -> str:
    """A dotted-path segment; keys that would make the path ambiguous ("a.b", "", '"x') are JSON-quoted."""
    return json.dumps(key, ensure_ascii=False) if not key or "." in key or key.startswith('"') else key


def _leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping) and value:
        for key in sorted(value):
            yield from _leaves(value[key], f"{prefix}.{_segment(key)}" if prefix else _segment(key))
    else:
        yield prefix, value


def diff_factors(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[FactorChange]:
    """Field-by-field differences (dotted paths; lists compared whole), sorted by field."""
    left = dict(_leaves(canonicalize(before)))
    right = dict(_leaves(canonicalize(after)))
    changes = [
        FactorChange(name, left.get(name, _ABSENT), right.get(name, _ABSENT))
        for name in sorted(left.keys() | right.keys())
        if left.get(name, _ABSENT) != right.get(name, _ABSENT)
    ]
    return changes


def change_to_dict(change: FactorChange) -> dict[str, Any]:
    """JSON form of a change; an absent side is ``null`` with a flag."""
    return {
        "field": change.field,
        "before": None if change.before is _ABSENT else change.before,
        "after": None if change.after is _ABSENT else change.after,
        "before_absent": change.before is _ABSENT,
        "after_absent": change.after is _ABSENT,
    }


@dataclass(frozen=True)
class ResolvedConfig(JsonForm):
    """A profile resolved against a machine: the factors, their hash, and what was left out."""

    json_keys = ("profile", "config_hash", "factors", "ignored_env")

    profile: Profile = field(metadata=as_json(to_json=lambda profile: profile.label))
    factors: Mapping[str, Any] = field(metadata=as_json(to_json=canonicalize))
    config_hash: str
    recorded_env: Mapping[str, str] = field(default_factory=dict, metadata=as_json(name="ignored_env"))
    #: Secret values, kept only to be passed to the engine: never hashed, never in :meth:`to_dict`.
    secret_env: Mapping[str, str] = field(default_factory=dict, repr=False, metadata=OMIT)

    def engine_env(self) -> dict[str, str]:
        """The env an engine start gets: the hashed env, the recorded-but-ignored env, and the secrets.

        Built from what resolution captured, never from the profile again, so a start sees exactly
        the env that was hashed and recorded.
        """
        hashed = self.factors.get("env")
        return {**self.recorded_env, **self.secret_env, **(dict(hashed) if isinstance(hashed, Mapping) else {})}


# --- resolution ------------------------------------------------------------------------------------


class EnvNamePolicy(Protocol):
    """How an engine sorts profile env names (``bless.engines.base.EnvPolicy`` satisfies it)."""

    def is_secret(self, name: str) -> bool:
        """Never hashed, never written anywhere."""
        ...

    def is_ignored(self, name: str) -> bool:
        """Recorded, but not hashed."""
        ...


class FactorSource(Protocol):
    """What resolution needs from an engine adapter; every ``bless.engines`` adapter satisfies it.

    Declared here so that this pure module does not depend on the engines package.
    """

    @property
    def name(self) -> str: ...

    @property
    def adapter_version(self) -> str: ...

    @property
    def cache_mount_path(self) -> str: ...

    @property
    def home(self) -> str: ...

    @property
    def environment_packages(self) -> tuple[str, ...]: ...

    @property
    def env_policy(self) -> EnvNamePolicy: ...

    def normalize_serve(self, serve: Mapping[str, Any], *, where: str) -> dict[str, Any]:
        """Validated, canonical serve arguments."""
        ...

    def engine_factors(
        self,
        runtime: Mapping[str, Any],
        env: Mapping[str, str],
        *,
        serve: Mapping[str, Any] | None = None,
        model: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Engine switches that change what is compiled to disk, for the resolved runtime, env, serve
        arguments and model factor (the engine may compile one model differently from another)."""
        ...


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as a probe saw it (``bless.probes.probe_gpus``).

    ``index`` is nvidia-smi's (PCI order); ``uuid`` names the GPU for good (CUDA's own order may differ).
    """

    name: str
    compute_capability: str
    memory_total_mib: int
    memory_free_mib: int
    index: int = 0
    uuid: str = ""

    @property
    def label(self) -> str:
        """How messages name this GPU: ``GPU 1 (GPU-8f2c...)``."""
        return f"GPU {self.index} ({self.uuid})" if self.uuid else f"GPU {self.index}"


@dataclass(frozen=True)
class LocalModelDir:
    """A local model directory as a probe saw it: its real path and a digest of its content."""

    resolved_path: str
    content_sha256: str


ImageResolver = Callable[[str], str]
HardwareProbe = Callable[[HardwareSpec], dict[str, Any]]
EnvironmentProbe = Callable[[str, tuple[str, ...]], dict[str, Any]]


class RevisionLookup(Protocol):
    """Maps a model id and a revision name (branch, tag) to its 40-hex commit; raises ResolutionError."""

    def __call__(self, model_id: str, revision: str, *, where: str) -> str: ...


class ModelDirProbe(Protocol):
    """Reads a local model directory; raises ResolutionError when it is not one."""

    def __call__(self, path: str, *, where: str) -> LocalModelDir: ...


def resolve(
    profile: Profile,
    adapter: FactorSource,
    *,
    image_resolver: ImageResolver | None,
    hardware_probe: HardwareProbe,
    environment_probe: EnvironmentProbe | None = None,
    revision_lookup: RevisionLookup | None = None,
    model_dir_probe: ModelDirProbe | None = None,
) -> ResolvedConfig:
    """Resolve every factor of ``profile`` and hash them; everything outside comes from the probes given.

    ``image_resolver`` maps an image reference to its ID (None: only pinned IDs are accepted).
    ``hardware_probe`` returns the hardware factor (the machine's, or the profile's declaration for
    offline gating). ``environment_probe`` reads a local interpreter's package versions.
    ``revision_lookup`` resolves a model revision name to its commit (None: offline, only pinned
    commits resolve). ``model_dir_probe`` reads a local model directory. ``bless.probes`` has the
    real ones; ``bless.flows.resolve.resolve_profile`` wires them.
    """
    where = profile.label
    serve = adapter.normalize_serve(profile.serve, where=where)
    hashed_env: dict[str, str] = {}
    recorded_env: dict[str, str] = {}
    secret_env: dict[str, str] = {}
    for name in sorted(profile.env):
        value = profile.env[name]
        if adapter.env_policy.is_secret(name):
            recorded_env[name] = REDACTED
            secret_env[name] = value
        elif adapter.env_policy.is_ignored(name):
            recorded_env[name] = value
        else:
            hashed_env[name] = value
    runtime = _runtime_factor(profile, adapter, image_resolver, environment_probe)
    model = _model_factor(profile, revision_lookup, model_dir_probe)
    factors: dict[str, Any] = {
        "factors_version": FACTORS_VERSION,
        # Engine switches that change what is compiled to disk (vLLM: effective AOT / mega-artifact).
        "engine": {
            "name": adapter.name,
            "adapter_version": adapter.adapter_version,
            **adapter.engine_factors(runtime, profile.env, serve=serve, model=model),
        },
        "runtime": runtime,
        "model": model,
        "serve": serve,
        "env": hashed_env,
        "hardware": hardware_probe(profile.hardware),
        "cache": {"mount_path": adapter.cache_mount_path, "home": adapter.home},
    }
    return ResolvedConfig(
        profile=profile,
        factors=factors,
        config_hash=config_hash(factors),
        recorded_env=recorded_env,
        secret_env=secret_env,
    )


def _runtime_factor(
    profile: Profile,
    adapter: FactorSource,
    image_resolver: ImageResolver | None,
    environment_probe: EnvironmentProbe | None,
) -> dict[str, Any]:
    if profile.runtime_kind == "docker":
        image = profile.image or ""
        if is_pinned_image_id(image):
            return {"kind": "docker", "image_id": image}
        if image_resolver is None:
            raise ResolutionError(
                f"{profile.label}: image {image!r} is a tag, and no runtime is available to resolve its ID",
                hint="pin runtime.image to its ID (docker image inspect --format '{{.Id}}' IMAGE)",
            )
        image_id = image_resolver(image)
        return {"kind": "docker", "image_id": image_id}
    python = profile.python or "python3"
    if environment_probe is None:
        raise ResolutionError(f"{profile.label}: the local runtime needs an environment probe")
    return {"kind": "local", **environment_probe(python, adapter.environment_packages)}


def _model_factor(
    profile: Profile, revision_lookup: RevisionLookup | None, model_dir_probe: ModelDirProbe | None
) -> dict[str, Any]:
    factor, local = model_factor(
        profile.model, where=profile.label, revision_lookup=revision_lookup, model_dir_probe=model_dir_probe
    )
    if profile.runtime_kind == "local" and local is not None:
        # The engine sees the host path itself (Docker mounts it at a fixed path), and engines
        # hash it: vLLM's ModelConfig hash includes the model path string.
        factor["path"] = local.resolved_path
    return factor


def model_factor(
    spec: ModelSpec,
    *,
    where: str,
    revision_lookup: RevisionLookup | None,
    model_dir_probe: ModelDirProbe | None,
) -> tuple[dict[str, Any], LocalModelDir | None]:
    """The model factor: builtin id, Hugging Face id + 40-hex commit, or a local dir's content hash.

    Returns the factor and, for a local model, what the directory probe saw. A revision that is not
    a pinned commit needs ``revision_lookup``; without one (offline) it is a ResolutionError.
    """
    if spec.source == "builtin":
        return {"source": "builtin", "id": spec.id}, None
    if spec.source == "local":
        if spec.path is None or model_dir_probe is None:
            raise ResolutionError(f"{where}: a local model needs model.path and a model directory probe")
        local = model_dir_probe(spec.path, where=where)
        return {"source": "local", "id": spec.id, "content_sha256": local.content_sha256}, local
    revision = spec.revision or "main"
    if is_commit(revision):
        return {"source": "huggingface", "id": spec.id, "revision": revision}, None
    if revision_lookup is None:
        raise ResolutionError(
            f"{where}: model.revision {revision!r} is not a pinned 40-hex commit and lookups are offline",
            hint="pin model.revision to the commit (huggingface_hub: HfApi().model_info(id).sha)",
        )
    sha = revision_lookup(spec.id, revision, where=where)
    if not is_commit(sha):
        raise ResolutionError(f"{where}: the hub returned no commit for {spec.id}@{revision}")
    return {"source": "huggingface", "id": spec.id, "revision": sha}, None


# --- hardware ------------------------------------------------------------------------------------------


def observed_hardware_factor(
    spec: HardwareSpec, *, isa: str | None = None, gpus: Sequence[GpuInfo] = ()
) -> dict[str, Any]:
    """The hardware factor from what a probe observed (CPU ISA level, GPUs), checked against the declaration."""
    if spec.accelerator == "cpu":
        if isa is None:
            raise ResolutionError("the CPU ISA level of this machine was not probed")
        if spec.cpu_isa and spec.cpu_isa != isa:
            raise HardwareMismatchError(
                f"the profile declares CPU ISA {spec.cpu_isa}, this machine is {isa}",
                hint="run on matching hardware, or write a profile for this machine and bless it",
            )
        return {"accelerator": "cpu", "isa": isa}
    count = spec.gpu_count or 1
    if len(gpus) < count:
        raise HardwareMismatchError(
            f"the profile needs {count} CUDA GPU(s), this machine has {len(gpus)}",
            hint="run on a GPU host (the local runtime works without Docker)",
        )
    used = gpus[:count]
    names = {gpu.name for gpu in used}
    capabilities = {gpu.compute_capability for gpu in used}
    if len(names) > 1 or len(capabilities) > 1:
        raise HardwareMismatchError(f"the first {count} GPUs differ: {sorted(names)} {sorted(capabilities)}")
    factor = {
        "accelerator": "cuda",
        "gpu_count": count,
        "gpu_name": used[0].name,
        "compute_capability": used[0].compute_capability,
    }
    declared = {"gpu_name": spec.gpu_name, "compute_capability": spec.compute_capability}
    for key, value in declared.items():
        if value is not None and value != factor[key]:
            raise HardwareMismatchError(
                f"the profile declares {key}={value!r}, this machine has {factor[key]!r}",
                hint="run on matching hardware, or write a profile for this machine and bless it",
            )
    return factor


def undeclared_hardware(spec: HardwareSpec) -> tuple[str, ...]:
    """The ``[hardware]`` fields a complete declaration needs and ``spec`` leaves out.

    CPU: ``cpu_isa``. CUDA: ``gpu_name``, ``compute_capability`` and ``gpu_count`` (a declaration
    without the count would silently stand for one GPU, wrong for a tensor-parallel profile).
    """
    if spec.accelerator == "cpu":
        return () if spec.cpu_isa else ("cpu_isa",)
    return tuple(key for key in ("gpu_name", "compute_capability", "gpu_count") if getattr(spec, key) is None)


def declared_hardware_factor(spec: HardwareSpec) -> dict[str, Any]:
    """The hardware factor from the profile's declaration alone (for offline gating in CI)."""
    if spec.accelerator == "cpu":
        if not spec.cpu_isa:
            raise ResolutionError(
                "hardware.cpu_isa is not declared, so the hardware factor cannot be resolved offline",
                hint="declare hardware.cpu_isa in the profile (this machine's config hash factors show it)",
                remedy="declare_cpu_isa",
            )
        return {"accelerator": "cpu", "isa": spec.cpu_isa}
    missing = [key for key in ("gpu_name", "compute_capability") if getattr(spec, key) is None]
    if missing:
        raise ResolutionError(
            f"hardware.{', hardware.'.join(missing)} not declared, so the GPU factor cannot be resolved offline",
            hint="declare them in the profile (nvidia-smi --query-gpu=name,compute_cap --format=csv)",
        )
    return {
        "accelerator": "cuda",
        "gpu_count": spec.gpu_count or 1,
        "gpu_name": spec.gpu_name,
        "compute_capability": spec.compute_capability,
    }


def parse_config_hash(text: str) -> str:
    """A full config hash typed by a user: surrounding spaces and upper case are forgiven, then the one format."""
    value = text.strip().lower() if isinstance(text, str) else ""
    if not is_config_hash(value):
        raise InputInvalidError(f"{text!r} is not a config hash (64 hex characters)")
    return value


def parse_config_hash_prefix(text: str) -> str:
    """A config-hash prefix typed by a user (8 to 64 hex digits), normalized like :func:`parse_config_hash`."""
    value = text.strip().lower() if isinstance(text, str) else ""
    if not value or any(char not in "0123456789abcdef" for char in value):
        raise InputInvalidError(
            f"{text!r} is not a hex config hash: a config hash or prefix is written in hex digits (0-9, a-f)",
            hint="copy the config hash from the store's list of blessings (at least its first 8 characters)",
            remedy="copy_hash_from_list",
        )
    if CONFIG_HASH_PREFIX.fullmatch(value) is None:
        raise InputInvalidError(
            f"config hash prefix {text!r} must be 8 to 64 hex digits",
            hint="give at least the first 8 characters of the config hash",
        )
    return value
