"""Factors: the canonical, resolved, cache-affecting inputs of a blessing, and their hash.

Canonical JSON: sorted keys, compact separators, UTF-8, ``factors_version`` explicit.
Floats never appear: they are written as their shortest decimal string, so ``0.9`` from
one TOML parser and ``0.90`` from another hash alike and no float formatting enters
the hash. The config hash is the sha256 of the canonical JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bless.engines.base import EngineAdapter
from bless.errors import HardwareMismatchError, InputInvalidError, ResolutionError
from bless.profile import HardwareSpec, ModelSpec, Profile

FACTORS_VERSION = 1
HEX40 = re.compile(r"^[0-9a-f]{40}$")
IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
CONFIG_HASH = re.compile(r"^[0-9a-f]{64}$")
REDACTED = "<redacted>"


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
class ResolvedConfig:
    """A profile resolved against a machine: the factors, their hash, and what was left out."""

    profile: Profile
    factors: Mapping[str, Any]
    config_hash: str
    recorded_env: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile.label,
            "config_hash": self.config_hash,
            "factors": canonicalize(self.factors),
            "ignored_env": dict(self.recorded_env),
        }


# --- resolution ------------------------------------------------------------------------------------

ImageResolver = Callable[[str], str]
HardwareProbe = Callable[[HardwareSpec], dict[str, Any]]
EnvironmentProbe = Callable[[str, tuple[str, ...]], dict[str, Any]]


def resolve(
    profile: Profile,
    adapter: EngineAdapter,
    *,
    image_resolver: ImageResolver | None,
    hardware_probe: HardwareProbe,
    environment_probe: EnvironmentProbe | None = None,
    offline: bool = False,
) -> ResolvedConfig:
    """Resolve every factor of ``profile`` and hash them.

    ``image_resolver`` maps an image reference to its ID (None: only pinned IDs are
    accepted). ``hardware_probe`` returns the hardware factor (the machine's, or the
    profile's declaration for offline gating). ``offline`` forbids network lookups.
    """
    where = profile.label
    serve = adapter.normalize_serve(profile.serve, where=where)
    hashed_env: dict[str, str] = {}
    recorded_env: dict[str, str] = {}
    for name in sorted(profile.env):
        value = profile.env[name]
        if adapter.env_policy.is_secret(name):
            recorded_env[name] = REDACTED
        elif adapter.env_policy.is_ignored(name):
            recorded_env[name] = value
        else:
            hashed_env[name] = value
    factors: dict[str, Any] = {
        "factors_version": FACTORS_VERSION,
        "engine": {"name": adapter.name, "adapter_version": adapter.adapter_version},
        "runtime": _runtime_factor(profile, adapter, image_resolver, environment_probe),
        "model": _model_factor(profile, where=where, offline=offline),
        "serve": serve,
        "env": hashed_env,
        "hardware": hardware_probe(profile.hardware),
        "cache": {"mount_path": adapter.cache_mount_path, "home": adapter.home},
    }
    return ResolvedConfig(profile=profile, factors=factors, config_hash=config_hash(factors), recorded_env=recorded_env)


def _runtime_factor(
    profile: Profile,
    adapter: EngineAdapter,
    image_resolver: ImageResolver | None,
    environment_probe: EnvironmentProbe | None,
) -> dict[str, Any]:
    if profile.runtime_kind == "docker":
        image = profile.image or ""
        if IMAGE_ID.match(image):
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


def _model_factor(profile: Profile, *, where: str, offline: bool) -> dict[str, Any]:
    factor = resolve_model(profile.model, where=where, offline=offline)
    if profile.runtime_kind == "local" and profile.model.source == "local" and profile.model.path:
        # The engine sees the host path itself (Docker mounts it at a fixed path), and engines
        # hash it: vLLM's ModelConfig hash includes the model path string.
        factor["path"] = str(Path(profile.model.path).resolve())
    return factor


def resolve_model(spec: ModelSpec, *, where: str, offline: bool) -> dict[str, Any]:
    """The model factor: builtin id, Hugging Face id + 40-hex commit, or a local dir's content hash."""
    if spec.source == "builtin":
        return {"source": "builtin", "id": spec.id}
    if spec.source == "local":
        assert spec.path is not None
        return {
            "source": "local",
            "id": spec.id,
            "content_sha256": hash_model_dir(Path(spec.path), where=where),
        }
    revision = spec.revision or "main"
    if HEX40.match(revision):
        return {"source": "huggingface", "id": spec.id, "revision": revision}
    if offline or os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ResolutionError(
            f"{where}: model.revision {revision!r} is not a pinned 40-hex commit and lookups are offline",
            hint="pin model.revision to the commit (huggingface_hub: HfApi().model_info(id).sha)",
        )
    try:
        from huggingface_hub import HfApi

        sha = HfApi().model_info(spec.id, revision=revision).sha
    except Exception as exc:  # the hub client raises many types; all mean "cannot resolve"
        raise ResolutionError(
            f"{where}: cannot resolve {spec.id}@{revision} to a commit: {type(exc).__name__}: {exc}",
            hint="check network access and the model id, or pin model.revision to a 40-hex commit",
        ) from None
    if not sha or not HEX40.match(sha):
        raise ResolutionError(f"{where}: the hub returned no commit for {spec.id}@{revision}")
    return {"source": "huggingface", "id": spec.id, "revision": sha}


def hash_model_dir(path: Path, *, where: str) -> str:
    """sha256 over the sorted file listing (relative path, size) and every file's sha256."""
    if not path.is_dir():
        raise ResolutionError(f"{where}: model.path {str(path)!r} is not a directory")
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        relative = file.relative_to(path).as_posix()
        file_digest = hashlib.sha256()
        with file.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                file_digest.update(chunk)
        digest.update(f"{relative}\0{file.stat().st_size}\0{file_digest.hexdigest()}\n".encode())
    return digest.hexdigest()


# --- hardware ------------------------------------------------------------------------------------------


def cpu_isa_level(flags: set[str] | None = None, machine: str | None = None) -> str:
    """The x86-64 micro-architecture level (v1..v4) from /proc/cpuinfo flags; Inductor's C++ code depends on it."""
    machine = machine or platform.machine()
    if machine in ("aarch64", "arm64"):
        return "aarch64"
    if machine not in ("x86_64", "AMD64"):
        return "other"
    if flags is None:
        flags = _cpu_flags()
    v2 = {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}
    v3 = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
    v4 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
    level = "x86-64-v1"
    if v2 <= flags:
        level = "x86-64-v2"
        if v3 <= flags:
            level = "x86-64-v3"
            if v4 <= flags:
                level = "x86-64-v4"
    return level


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: str
    memory_total_mib: int
    memory_free_mib: int


def probe_gpus() -> list[GpuInfo]:
    """GPUs visible through nvidia-smi (empty when there is none)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,compute_cap,memory.total,memory.free",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        raise ResolutionError(f"nvidia-smi failed: {exc}", hint="check the NVIDIA driver on this host") from None
    gpus = []
    for line in out.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 4:
            raise ResolutionError(f"unexpected nvidia-smi output line: {line!r}")
        name, capability, total, free = parts
        try:
            gpus.append(GpuInfo(name, capability, int(float(total)), int(float(free))))
        except ValueError:
            raise ResolutionError(f"unexpected nvidia-smi output line: {line!r}") from None
    return gpus


def hardware_factor(spec: HardwareSpec, *, gpus: list[GpuInfo] | None = None) -> dict[str, Any]:
    """Probe this machine for the hardware factor and check it against the profile's declaration."""
    if spec.accelerator == "cpu":
        isa = cpu_isa_level()
        if spec.cpu_isa and spec.cpu_isa != isa:
            raise HardwareMismatchError(
                f"the profile declares CPU ISA {spec.cpu_isa}, this machine is {isa}",
                hint="run on matching hardware, or write a profile for this machine and bless it",
            )
        return {"accelerator": "cpu", "isa": isa}
    gpus = probe_gpus() if gpus is None else gpus
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


def declared_hardware_factor(spec: HardwareSpec) -> dict[str, Any]:
    """The hardware factor from the profile's declaration alone (for offline gating in CI)."""
    if spec.accelerator == "cpu":
        if not spec.cpu_isa:
            raise ResolutionError(
                "hardware.cpu_isa is not declared, so the hardware factor cannot be resolved offline",
                hint="declare hardware.cpu_isa in the profile (bless hash prints this machine's)",
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


def probe_python_environment(python: str, packages: tuple[str, ...]) -> dict[str, Any]:
    """Python and package versions of the interpreter that runs a local engine."""
    script = (
        "import importlib.metadata as m, json, platform, sys\n"
        "def v(n):\n"
        "    try:\n        return m.version(n)\n"
        "    except m.PackageNotFoundError:\n        return None\n"
        "print(json.dumps({'python_version': platform.python_version(),"
        " 'packages': {n: v(n) for n in sys.argv[1:]}}))\n"
    )
    try:
        out = subprocess.run(
            [python, "-c", script, *packages], capture_output=True, text=True, timeout=120, check=True
        ).stdout
        data = json.loads(out)
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError) as exc:
        raise ResolutionError(
            f"cannot read package versions from {python!r}: {exc}",
            hint="set runtime.python to a working interpreter",
        ) from None
    if not isinstance(data, dict):
        raise ResolutionError(f"unexpected answer from {python!r}")
    return data


def parse_config_hash(text: str) -> str:
    """Validate a full config hash argument (64 lowercase hex)."""
    value = text.strip().lower()
    if not CONFIG_HASH.match(value):
        raise InputInvalidError(f"{text!r} is not a config hash (64 hex characters)")
    return value
