"""Probes: what resolution reads from outside the profile (an I/O edge, beside ``runtime/`` and ``engines/``).

This machine's hardware (GPUs through ``nvidia-smi``, the CPU's x86-64 ISA level), a local
interpreter's package versions, a Hugging Face revision's commit, a local model directory's
content. :mod:`bless.core.factors` stays pure: it receives these as callables and results
(:func:`bless.core.factors.resolve`), and ``bless.flows.resolve.resolve_profile`` wires the ones here.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bless.core.factors import (
    GpuInfo,
    LocalModelDir,
    ModelDirProbe,
    RevisionLookup,
    declared_hardware_factor,
    model_factor,
    observed_hardware_factor,
    undeclared_hardware,
)
from bless.core.profile import HardwareSpec, ModelSpec, Profile
from bless.errors import EnvironmentMismatchError, ResolutionError

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


def probe_gpus() -> list[GpuInfo]:
    """GPUs visible through nvidia-smi (empty when there is none)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=index,uuid,name,compute_cap,memory.total,memory.free",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        raise ResolutionError(f"nvidia-smi failed: {exc}", hint="check the NVIDIA driver on this host") from None
    return parse_gpu_query(out)


def parse_gpu_query(out: str) -> list[GpuInfo]:
    """GPUs from ``nvidia-smi --query-gpu=index,uuid,name,compute_cap,memory.total,memory.free`` CSV."""
    gpus = []
    for line in out.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 6:
            raise ResolutionError(f"unexpected nvidia-smi output line: {line!r}")
        index, uuid, name, capability, total, free = parts
        try:
            gpus.append(GpuInfo(name, capability, int(float(total)), int(float(free)), int(index), uuid))
        except ValueError:
            raise ResolutionError(f"unexpected nvidia-smi output line: {line!r}") from None
    return gpus


def hardware_factor(spec: HardwareSpec, *, gpus: list[GpuInfo] | None = None) -> dict[str, Any]:
    """Probe this machine for the hardware factor and check it against the profile's declaration.

    ``gpus`` are GPUs already probed (serve-full probes them once for the memory check too).
    """
    if spec.accelerator == "cpu":
        return observed_hardware_factor(spec, isa=cpu_isa_level())
    return observed_hardware_factor(spec, gpus=probe_gpus() if gpus is None else gpus)


HardwareSource = Literal["declared", "probed"]


@dataclass(frozen=True)
class JudgedHardware:
    """The hardware factor a judging command (hash, diff, gate) uses, and where it came from.

    ``undeclared``: the ``[hardware]`` fields the profile leaves out (empty when ``source`` is "declared").
    """

    factor: dict[str, Any]
    source: HardwareSource
    undeclared: tuple[str, ...] = ()


def judged_hardware(spec: HardwareSpec, *, gpus: Callable[[], list[GpuInfo]] | None = None) -> JudgedHardware:
    """The hardware factor for commands that judge a profile without starting an engine: hash, diff, gate.

    A complete ``[hardware]`` declaration is the factor, on any machine (a CPU-only CI runner
    included): the blessing's recorded hardware is then compared with what the profile declares,
    and a live GPU that differs is refused where it matters, by ``bless run`` and ``serve-full``,
    which always probe (:func:`hardware_factor`). An incomplete declaration is completed by
    probing this machine; a CUDA profile on a machine without GPUs then fails, naming what to add.
    """
    missing = undeclared_hardware(spec)
    if not missing:
        return JudgedHardware(declared_hardware_factor(spec), "declared")
    if spec.accelerator == "cpu":
        return JudgedHardware(hardware_factor(spec), "probed", missing)
    found = (gpus or probe_gpus)()
    if not found:
        raise ResolutionError(
            f"this CUDA profile does not declare {', '.join(f'hardware.{key}' for key in missing)}, and this "
            "machine has no GPU to probe them from",
            hint="add them to the profile's [hardware] as on the serving host, e.g. "
            'gpu_name = "NVIDIA H100 80GB HBM3", compute_capability = "9.0", gpu_count = 1 '
            "(there: nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader); "
            "hashing, diffing and gating then use the declaration on any machine, and blessing and serving "
            "refuse a GPU that differs from it",
            details={"undeclared": [f"hardware.{key}" for key in missing]},
            remedy="declare_hardware",
        )
    return JudgedHardware(hardware_factor(spec, gpus=found), "probed", missing)


# --- the local interpreter ----------------------------------------------------------------------------


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
    except (OSError, ValueError, subprocess.SubprocessError) as exc:  # ValueError: JSON, or a NUL in argv
        raise ResolutionError(
            f"cannot read package versions from {python!r}: {exc}",
            hint="set runtime.python to a working interpreter",
        ) from None
    if not isinstance(data, dict):
        raise ResolutionError(f"unexpected answer from {python!r}")
    return data


def declared_environment(profile: Profile, packages: tuple[str, ...]) -> dict[str, Any] | None:
    """The runtime factor's environment as ``[runtime]`` declares it (``python_version`` and ``packages``), or None.

    A declaration names exactly the engine's hashed ``packages``: one missing or extra would hash another
    factor than a probe of the serving host does, so it is refused (31), naming what to add or remove.
    """
    if profile.python_version is None or profile.packages is None:
        return None
    missing = sorted(set(packages) - set(profile.packages))
    extra = sorted(set(profile.packages) - set(packages))
    if missing or extra:
        said = "; ".join(
            part
            for part in (
                f"add {', '.join(missing)}" if missing else "",
                f"remove {', '.join(extra)} (not hashed by this engine)" if extra else "",
            )
            if part
        )
        raise ResolutionError(
            f"{profile.label}: runtime.packages must name exactly the engine's hashed packages "
            f"({', '.join(sorted(packages))}): {said}",
            hint="copy runtime.packages from the runtime factor of the profile resolved on the serving host",
            details={"missing": missing, "extra": extra},
        )
    return {"python_version": profile.python_version, "packages": {name: profile.packages[name] for name in packages}}


def _no_missing_package(found: dict[str, Any], python: str, where: str) -> dict[str, Any]:
    """``found`` (a probe's answer) when every engine package is installed; a missing one is refused (31)."""
    packages = found.get("packages")
    if not isinstance(packages, dict) or not isinstance(found.get("python_version"), str):
        raise ResolutionError(f"{where}: unexpected answer from {python!r}: {found!r}")
    missing = sorted(name for name, version in packages.items() if not isinstance(version, str) or not version)
    if missing:
        raise ResolutionError(
            f"{where}: {', '.join(missing)} not installed for {python!r}: an engine package is never hashed as "
            "missing (its blessing would be for no engine)",
            hint="on the serving host, set runtime.python to the engine's interpreter; to hash, diff or gate the "
            "profile elsewhere (a CI runner), declare runtime.python_version and runtime.packages as the serving "
            "host has them (its resolved runtime factor)",
            details={"missing": missing, "python": python},
            remedy="declare_runtime",
        )
    return found


def judged_environment(profile: Profile, python: str, packages: tuple[str, ...]) -> dict[str, Any]:
    """The environment for commands that judge a profile without starting an engine (hash, diff, gate).

    The declaration as it is when the profile has one (nothing is probed); else ``python`` probed, every
    engine package installed (31 otherwise).
    """
    declared = declared_environment(profile, packages)
    if declared is not None:
        return declared
    return _no_missing_package(probe_python_environment(python, packages), python, profile.label)


def live_environment(profile: Profile, python: str, packages: tuple[str, ...]) -> dict[str, Any]:
    """The environment an engine start runs with (bless run, serve-full): ``python`` probed, every engine
    package installed, and equal to the profile's declaration when it has one (34 otherwise, naming each)."""
    declared = declared_environment(profile, packages)
    live = probe_python_environment(python, packages)
    if declared is None:
        return _no_missing_package(live, python, profile.label)
    differences = (
        [f"python_version: declared {declared['python_version']}, {python!r} has {live.get('python_version')}"]
        if live.get("python_version") != declared["python_version"]
        else []
    )
    answered = live.get("packages")
    live_packages: dict[str, Any] = answered if isinstance(answered, dict) else {}
    for name, version in declared["packages"].items():
        found = live_packages.get(name)
        if found != version:
            differences.append(f"packages.{name}: declared {version}, {python!r} has {found or 'none (not installed)'}")
    if differences:
        raise EnvironmentMismatchError(
            f"{profile.label}: the engine environment differs from the profile's [runtime] declaration: "
            + "; ".join(differences),
            hint="run with the interpreter the profile declares (runtime.python), or declare this host's versions "
            "in the profile (a new config hash) and bless it",
            details={"differences": differences, "python": python},
        )
    return live


def judged_model_dir(profile: Profile) -> ModelDirProbe:
    """The model directory probe for judging commands: a declared ``model.content_sha256`` and ``model.path`` as
    they are (the directory is not read, and need not exist); else the directory read and hashed."""

    def probe(path: str, *, where: str) -> LocalModelDir:
        declared = profile.model.content_sha256
        if declared is None:
            return read_model_dir(path, where=where)
        return LocalModelDir(resolved_path=path, content_sha256=declared)

    return probe


def live_model_dir(profile: Profile) -> ModelDirProbe:
    """The model directory probe for an engine start: read and hashed; with a declared ``content_sha256``, its
    content and real path must be the declared ones (34 otherwise): what judging commands hashed is what runs."""

    def probe(path: str, *, where: str) -> LocalModelDir:
        live = read_model_dir(path, where=where)
        declared = profile.model.content_sha256
        if declared is None:
            return live
        differences = []
        if live.content_sha256 != declared:
            differences.append(f"content_sha256: declared {declared}, the directory has {live.content_sha256}")
        if profile.runtime_kind == "local" and live.resolved_path != path:
            differences.append(
                f"path: declared {path!r}, whose real path is {live.resolved_path!r} (with a declared content hash "
                "the path is hashed as written, so it must be the real one)"
            )
        if differences:
            raise EnvironmentMismatchError(
                f"{where}: the model directory differs from the profile's [model] declaration: "
                + "; ".join(differences),
                hint="serve the model directory the profile declares, or declare this one's content_sha256 (the "
                "model factor resolved here holds it) and its real path, then bless it",
                details={"differences": differences},
            )
        return live

    return probe


# --- models --------------------------------------------------------------------------------------------


def hub_revision(model_id: str, revision: str, *, where: str) -> str:
    """The commit of ``model_id@revision`` on the Hugging Face Hub (network)."""
    try:
        from huggingface_hub import HfApi

        sha = HfApi().model_info(model_id, revision=revision).sha
    except Exception as exc:  # the hub client raises many types; all mean "cannot resolve"
        raise ResolutionError(
            f"{where}: cannot resolve {model_id}@{revision} to a commit: {type(exc).__name__}: {exc}",
            hint="check network access and the model id, or pin model.revision to a 40-hex commit",
        ) from None
    return sha or ""


def revision_lookup(*, offline: bool) -> RevisionLookup | None:
    """The Hub lookup, or None when lookups are offline (``offline``, or ``HF_HUB_OFFLINE=1``)."""
    if offline or os.environ.get("HF_HUB_OFFLINE") == "1":
        return None
    return hub_revision


def hash_model_dir(path: Path, *, where: str) -> str:
    """sha256 over the sorted file listing (relative path, size) and every file's sha256."""
    if not path.is_dir():
        raise ResolutionError(f"{where}: model.path {str(path)!r} is not a directory")
    digest = hashlib.sha256()
    try:
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            relative = file.relative_to(path).as_posix()
            file_digest = hashlib.sha256()
            with file.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    file_digest.update(chunk)
            digest.update(f"{relative}\0{file.stat().st_size}\0{file_digest.hexdigest()}\n".encode())
    except OSError as exc:  # a file this user cannot read, or one gone while hashing: the host's, not a bug
        where_file = f" ({exc.filename})" if exc.filename else ""
        raise ResolutionError(
            f"{where}: cannot read the model directory {str(path)!r}: {exc.strerror or exc}{where_file}",
            hint="make every file of model.path readable by this user, and leave it unchanged while bless runs",
        ) from None
    return digest.hexdigest()


def read_model_dir(path: str, *, where: str) -> LocalModelDir:
    """A local model directory: its real path (symlinks resolved) and its content hash."""
    digest = hash_model_dir(Path(path), where=where)
    return LocalModelDir(resolved_path=str(Path(path).resolve()), content_sha256=digest)


def resolve_model(spec: ModelSpec, *, where: str, offline: bool) -> dict[str, Any]:
    """The model factor of ``spec`` with the real lookups (the Hub unless ``offline``, the model directory)."""
    factor, _local = model_factor(
        spec, where=where, revision_lookup=revision_lookup(offline=offline), model_dir_probe=read_model_dir
    )
    return factor
