"""Profiles: the TOML file a user writes, parsed and validated into a frozen model."""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bless.core.schemas import SCHEMA_DIR, schema_errors
from bless.core.untrusted_text import shown
from bless.errors import InputInvalidError
from bless.system.user_files import read_input, similar_files

MAX_PROFILE_BYTES = 1 << 20
DEFAULT_PROMPTS = (
    "The compiled cache is",
    "Replay coherence means",
    "A blessed artifact",
)


@dataclass(frozen=True)
class ModelSpec:
    source: Literal["builtin", "huggingface", "local"]
    id: str
    revision: str | None = None
    path: str | None = None
    hf_home: str | None = None
    #: local: the directory's content hash as declared (hash, diff and gate use it without reading the directory).
    content_sha256: str | None = None


@dataclass(frozen=True)
class HardwareSpec:
    accelerator: Literal["cpu", "cuda"]
    gpu_count: int | None = None
    gpu_name: str | None = None
    compute_capability: str | None = None
    min_gpu_memory_gib: float | None = None
    cpu_isa: str | None = None


@dataclass(frozen=True)
class TrialSettings:
    count: int = 3
    repeats: int = 3
    max_tokens: int = 16
    concurrent: bool = True
    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    ready_timeout_s: float = 600.0
    request_timeout_s: float = 120.0
    stop_timeout_s: int = 30


#: How a bootstrap drives the kernels an engine compiles lazily after startup (see bless.core.coverage).
CoverageMode = Literal["auto", "off", "require"]
#: What serve-full does when the engine compiles something the blessing does not hold.
UnprovenCompilePolicy = Literal["refuse", "record", "stop"]


@dataclass(frozen=True)
class Profile:
    """A validated profile. ``path`` is where it was read from (None for in-memory profiles)."""

    name: str
    engine: str
    runtime_kind: Literal["docker", "local"]
    model: ModelSpec
    image: str | None = None
    python: str | None = None
    shm_size: str | None = None
    ipc_host: bool = False
    #: local: the engine interpreter's Python version and package versions as declared (both or neither):
    #: hash, diff and gate use them without probing; run and serve-full refuse live values that differ.
    python_version: str | None = None
    packages: Mapping[str, str] | None = None
    serve: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    hardware: HardwareSpec = HardwareSpec(accelerator="cpu")
    cache_mount: Literal["overlay", "ro-bind"] = "overlay"
    trials: TrialSettings = TrialSettings()
    serving_host: str = "127.0.0.1"
    serving_port: int = 8000
    coverage: CoverageMode = "auto"
    unproven_compile: UnprovenCompilePolicy = "refuse"
    description: str = ""
    path: Path | None = None

    @property
    def label(self) -> str:
        """How messages name this profile: its file when known, else its name."""
        return str(self.path) if self.path else self.name


def engine_gpu_count(profile: Profile) -> int:
    """The GPUs one engine of ``profile`` uses: ``hardware.gpu_count``, which must cover the serve arguments'
    ``tensor_parallel_size`` x ``pipeline_parallel_size`` (a pod that asks for fewer could never start)."""
    if profile.hardware.accelerator != "cuda":
        return 0
    declared = profile.hardware.gpu_count or 1
    parallel = 1
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        value = profile.serve.get(key, 1)
        parallel *= value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1
    if parallel > declared:
        raise InputInvalidError(
            f"{profile.label}: serve.tensor_parallel_size x pipeline_parallel_size is {parallel} GPUs, "
            f"hardware.gpu_count is {declared}",
            hint=f"set hardware.gpu_count = {parallel} (the GPUs the blessing is proven on), then bless it",
        )
    return declared


def load_profile(path: Path) -> Profile:
    """Read, parse and validate a profile file. Errors name the file and the field."""
    return parse_profile(read_profile(path), path)


#: Where the shipped profiles are, relative to a checkout (the working directory the README's commands run in).
SHIPPED_PROFILES_DIR = Path("profiles")


def read_profile(path: Path) -> bytes:
    """A profile file's bytes, through the one bounded reader of user files
    (:func:`bless.system.user_files.read_input`).

    A FIFO, a device such as /dev/zero, a directory or a file over :data:`MAX_PROFILE_BYTES` is
    refused (3) before a byte is read. A path that does not exist is refused with the nearest names beside it
    and in ``profiles/`` ("did you mean ...?").
    """
    hint = "name a profile TOML file (see profiles/)"
    try:
        return read_input(path, what="profile", limit=MAX_PROFILE_BYTES, hint=hint, remedy="profile_file")
    except InputInvalidError as exc:
        if os.path.lexists(path):
            raise
        near = similar_files(path, directories=[SHIPPED_PROFILES_DIR], suffix=".toml")
        if not near:
            raise
        # No remedy key: the suggestion is the hint, in the same words for every caller.
        others = f" (or {', '.join(near[1:])})" if near[1:] else ""
        raise InputInvalidError(exc.message, hint=f"did you mean {near[0]}{others}? Else {hint}") from None


def parse_profile(raw: bytes, path: Path) -> Profile:
    """The profile in ``raw`` (read from ``path``, which messages name), parsed and validated."""
    fix = "fix the file at the place named (a profile is TOML: https://toml.io; profiles/ holds examples)"
    try:
        document = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputInvalidError(
            f"{path}: profile is not UTF-8 text ({exc.reason} at byte {exc.start})",
            hint="save the profile as UTF-8 text (TOML files are UTF-8)",
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise InputInvalidError(f"{path}: not valid TOML: {_toml_problem(exc)}", hint=fix) from None
    except RecursionError:
        raise InputInvalidError(f"{path}: not valid TOML: arrays or tables nested too deeply", hint=fix) from None
    return profile_from_dict(document, source=path)


#: tomllib names a bad character by its repr; these read as words (an escape printed as ``\\n``).
_TOML_CHARACTERS = {"'\\n'": "a line break", "'\\r'": "a carriage return", "'\\t'": "a tab"}


def _toml_problem(exc: tomllib.TOMLDecodeError) -> str:
    """tomllib's message on one line, with a control character named in words, not escaped."""
    text = " ".join(str(exc).split("\n"))
    for escaped, words in _TOML_CHARACTERS.items():
        text = text.replace(f"character {escaped}", f"character: {words}")
    return text


def profile_from_dict(document: Mapping[str, Any], *, source: Path | None = None) -> Profile:
    """Validate a parsed profile document against ``profile.v1`` and build the model."""
    where = str(source) if source else "profile"
    errors = schema_errors("profile.v1", document)
    if errors:
        raise InputInvalidError(
            f"{where}: " + "; ".join(errors),
            hint=f"fix the named field(s); the schema is {SCHEMA_DIR / 'profile.v1.json'}",
            details={"file": where, "errors": errors},
        )
    _check_values(where, document)
    runtime = document["runtime"]
    model = document["model"]
    _check_runtime(where, runtime)
    _check_model(where, model)
    hardware = document.get("hardware", {"accelerator": "cpu"})
    trials = document.get("trials", {})
    serving = document.get("serving", {})
    return Profile(
        name=document["name"],
        description=document.get("description", ""),
        engine=document["engine"]["name"],
        runtime_kind=runtime["kind"],
        image=runtime.get("image"),
        python=runtime.get("python"),
        shm_size=runtime.get("shm_size"),
        ipc_host=runtime.get("ipc_host", False),
        python_version=runtime.get("python_version"),
        packages=dict(runtime["packages"]) if "packages" in runtime else None,
        model=ModelSpec(**model),
        serve=dict(document.get("serve", {})),
        env=dict(document.get("env", {})),
        hardware=HardwareSpec(**hardware),
        cache_mount=document.get("cache", {}).get("mount", "overlay"),
        trials=_trial_settings(trials),
        serving_host=serving.get("host", "127.0.0.1"),
        serving_port=serving.get("port", 8000),
        coverage=document.get("coverage", {}).get("mode", "auto"),
        unproven_compile=serving.get("unproven_compile", "refuse"),
        path=source,
    )


def _check_values(where: str, document: Mapping[str, Any]) -> None:
    """Refuse what the schema lets through but nothing downstream can take.

    NaN and infinity pass schema bounds and cannot be hashed as factors. A NUL character cannot be
    part of a command line, an environment variable or a path (the OS refuses it late, or a C
    library truncates at it), so it is refused in every string and every name, where the profile
    is read.
    """
    pending: list[tuple[str, Any]] = [(str(key), value) for key, value in document.items()]
    while pending:
        name, value = pending.pop()
        if "\0" in name or (isinstance(value, str) and "\0" in value):
            raise InputInvalidError(
                f"{where}: {shown(name)}: a NUL character is not valid in a profile",
                hint="remove the NUL character (written \\u0000 in TOML) from the name or value",
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise InputInvalidError(
                f"{where}: {name}: {value!r} is not a finite number",
                hint="give a finite number (TOML's nan and inf name no value a factor can hold)",
            )
        if isinstance(value, Mapping):
            pending += [(f"{name}.{key}", item) for key, item in value.items()]
        elif isinstance(value, list):
            pending += [(f"{name}.{index}", item) for index, item in enumerate(value)]


def _trial_settings(trials: Mapping[str, Any]) -> TrialSettings:
    fields: dict[str, Any] = dict(trials)
    if "prompts" in fields:
        fields["prompts"] = tuple(fields["prompts"])
    return TrialSettings(**fields)


def _check_runtime(where: str, runtime: Mapping[str, Any]) -> None:
    if runtime["kind"] == "docker" and "image" not in runtime:
        raise InputInvalidError(f"{where}: runtime.image: required when runtime.kind is 'docker'")
    if runtime["kind"] == "local" and "image" in runtime:
        raise InputInvalidError(f"{where}: runtime.image: not used by the local runtime; remove it")
    declared = [key for key in ("python_version", "packages") if key in runtime]
    if declared and runtime["kind"] != "local":
        raise InputInvalidError(
            f"{where}: runtime.{declared[0]}: only the local runtime declares its environment (an image ID fixes "
            "a Docker engine's); remove it"
        )
    if len(declared) == 1:
        other = "packages" if declared == ["python_version"] else "python_version"
        raise InputInvalidError(
            f"{where}: runtime.{declared[0]} is declared without runtime.{other}: declare both (the runtime "
            "factor as the serving host has it) or neither (probed from runtime.python)",
            hint="copy both from the runtime factor of the profile resolved on the serving host",
        )


def _check_model(where: str, model: Mapping[str, Any]) -> None:
    source = model["source"]
    if source == "local" and "path" not in model:
        raise InputInvalidError(f"{where}: model.path: required when model.source is 'local'")
    if source != "local" and "path" in model:
        raise InputInvalidError(f"{where}: model.path: only valid when model.source is 'local'")
    if source != "local" and "content_sha256" in model:
        raise InputInvalidError(f"{where}: model.content_sha256: only valid when model.source is 'local'")
    if source == "builtin" and "revision" in model:
        raise InputInvalidError(f"{where}: model.revision: a builtin model has no revision")
