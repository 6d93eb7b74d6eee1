"""From a profile to its config hash, and from a hash to its blessing (or the nearest one, with a diff).

:func:`resolve_for_command` is the one entry point every command resolves a profile through (bless run, hash,
diff, gate, serve-full): it loads the file, resolves the factors and the config hash, and specialises the
engine adapter for them, once.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bless import runtime as runtimes
from bless.core.factors import (
    FactorChange,
    GpuInfo,
    HardwareProbe,
    ImageResolver,
    LocalModelDir,
    ResolvedConfig,
    change_to_dict,
    declared_hardware_factor,
    diff_factors,
    is_pinned_image_id,
    resolve,
)
from bless.core.manifest import Manifest, factor_field
from bless.core.profile import HardwareSpec, Profile, load_profile
from bless.engines import get_adapter
from bless.engines.base import EngineAdapter, EnvPolicy
from bless.errors import NoManifestError
from bless.probes import (
    HardwareSource,
    hardware_factor,
    judged_environment,
    judged_hardware,
    judged_model_dir,
    live_environment,
    live_model_dir,
    revision_lookup,
)
from bless.store import Store

#: Where a command takes the hardware factor from: ``probe`` this machine (bless run, serve-full: what starts
#: an engine), ``judge`` (the profile's complete ``[hardware]`` declaration on any machine, else this
#: machine's: hash, diff, gate; :func:`bless.probes.judged_hardware`), ``declared`` (the declaration only,
#: never probing: ``--declared-hardware``).
HardwareRule = Literal["probe", "judge", "declared"]

#: ``image_resolver="runtime"``: a runtime of the profile's kind resolves a Docker image tag to its ID, made
#: only when the profile needs one (:func:`image_needs_runtime`).
RUNTIME_WHEN_NEEDED: Literal["runtime"] = "runtime"


@dataclass(frozen=True)
class ProfileResolution:
    """A profile resolved for a command: factors and config hash, the adapter for them, the hardware's source."""

    resolved: ResolvedConfig
    #: The engine adapter specialised for the resolved factors (vLLM: the resolved release's rules and model).
    adapter: EngineAdapter
    #: Where the hardware factor came from: the profile's declaration, or this machine.
    hardware_source: HardwareSource
    #: The ``[hardware]`` fields the profile leaves out, filled by probing this machine (``judge`` only).
    undeclared_hardware: tuple[str, ...] = ()

    @property
    def profile(self) -> Profile:
        return self.resolved.profile

    @property
    def config_hash(self) -> str:
        return self.resolved.config_hash


def resolve_for_command(
    source: Path | Profile,
    *,
    image_resolver: ImageResolver | Literal["runtime"] | None,
    hardware: HardwareRule = "probe",
    gpus: Sequence[GpuInfo] | None = None,
    adapter: EngineAdapter | None = None,
    offline: bool = False,
) -> ProfileResolution:
    """Resolve a profile for a command: the one entry point of every command (bless run, hash, diff, gate, serve-full).

    ``source``: a profile file (read through the bounded reader of user files, :func:`load_profile`), or a
    profile the command already loaded (and adjusted: serve-full's ``--host``). ``image_resolver`` maps an
    image tag to its ID: a runtime's ``resolve_image``, serve-full's already-read ID, ``"runtime"``
    (:data:`RUNTIME_WHEN_NEEDED`), or None (only pinned ``sha256:`` IDs resolve). ``hardware``: the
    :data:`HardwareRule`; ``gpus`` are GPUs already probed for ``probe`` (serve-full probes them once for its
    memory check too). ``adapter``: the engine's adapter before specialising (default: the profile's engine's).
    ``offline`` forbids network lookups (a revision must be pinned).
    """
    profile = load_profile(source) if isinstance(source, Path) else source
    if image_resolver == RUNTIME_WHEN_NEEDED:
        # Looked up through the module when called: the runtime kind is the profile's (Docker or local).
        runtime = runtimes.get_runtime(profile.runtime_kind) if image_needs_runtime(profile) else None
        image_resolver = runtime.resolve_image if runtime is not None else None
    judged: list[tuple[HardwareSource, tuple[str, ...]]] = []

    def hardware_probe(spec: HardwareSpec) -> dict[str, Any]:
        if hardware == "declared":
            judged.append(("declared", ()))
            return declared_hardware_factor(spec)
        if hardware == "judge":
            found = judged_hardware(spec)
            judged.append((found.source, found.undeclared))
            return found.factor
        judged.append(("probed", ()))
        return hardware_factor(spec, gpus=list(gpus) if gpus is not None else None)

    generic = adapter or get_adapter(profile.engine)
    resolved = resolve_profile(
        profile,
        image_resolver=image_resolver,
        adapter=generic,
        hardware_probe=hardware_probe,
        offline=offline,
        judging=hardware != "probe",
    )
    hardware_source, undeclared = judged[0] if judged else ("declared", ())
    return ProfileResolution(resolved, generic.for_factors(resolved.factors), hardware_source, undeclared)


def image_needs_runtime(profile: Profile) -> bool:
    """Whether resolving ``profile`` needs a runtime: a Docker image given by tag must be resolved to its ID.

    A pinned ``sha256:`` image ID, or the local runtime, resolves without one (and without Docker).
    """
    return profile.runtime_kind == "docker" and not is_pinned_image_id(profile.image)


def resolve_profile(
    profile: Profile,
    *,
    image_resolver: ImageResolver | None,
    adapter: EngineAdapter | None = None,
    hardware_probe: HardwareProbe = hardware_factor,
    offline: bool = False,
    judging: bool = False,
) -> ResolvedConfig:
    """Resolve ``profile`` to its factors and config hash with the real probes wired in.

    Commands call :func:`resolve_for_command`, which calls this. ``image_resolver`` maps an image tag to
    its ID (a runtime's ``resolve_image``, or the ID serve-full already read); without one, only pinned
    ``sha256:`` IDs resolve. ``hardware_probe`` gives the hardware factor: this machine's by default,
    ``declared_hardware_factor`` for the profile's declaration only. ``offline`` forbids network lookups
    (a revision must be pinned).

    The local runtime's environment and a local model directory: ``judging`` (hash, diff, gate) takes the
    profile's ``[runtime]`` and ``[model]`` declarations as they are, without probing; otherwise (an engine
    start) the live ones are read and must equal any declaration (:func:`bless.probes.live_environment`,
    :func:`bless.probes.live_model_dir`). Either way an engine package that is not installed is refused.
    """
    adapter = adapter or get_adapter(profile.engine)

    def environment(python: str, packages: tuple[str, ...]) -> dict[str, Any]:
        return (judged_environment if judging else live_environment)(profile, python, packages)

    return resolve(
        secrets_from_environment(profile, adapter.env_policy),
        adapter,
        image_resolver=image_resolver,
        hardware_probe=hardware_probe,
        environment_probe=environment,
        revision_lookup=revision_lookup(offline=offline),
        model_dir_probe=judged_model_dir(profile) if judging else live_model_dir(profile),
    )


def secrets_from_environment(profile: Profile, policy: EnvPolicy) -> Profile:
    """``profile`` with each secret env name it leaves empty taken from bless's own environment.

    A profile rendered for Kubernetes never holds a secret's value (``bless k8s render --env-secret``):
    it names the secret with an empty value, and the pod's environment carries it from a Kubernetes
    Secret. Secrets are never hashed, so the config hash is the same either way.
    """
    filled = {
        name: os.environ[name]
        for name, value in profile.env.items()
        if value == "" and policy.is_secret(name) and os.environ.get(name)
    }
    return dataclasses.replace(profile, env={**profile.env, **filled}) if filled else profile


@dataclass(frozen=True)
class Nearest:
    """The blessing closest to a factor set among those of the same engine and model."""

    manifest: Manifest
    changes: tuple[FactorChange, ...]

    def to_dict(self) -> dict[str, Any]:
        # By hand (not JsonForm): the manifest reduced to its hash and profile name.
        return {
            "config_hash": self.manifest.config_hash,
            "profile_name": self.manifest.profile_name,
            "changes": [change_to_dict(change) for change in self.changes],
        }


def nearest_blessing(manifests: Sequence[Manifest], factors: dict[str, Any] | Any) -> Nearest | None:
    """Fewest differing factor leaves, among manifests of the same engine and model id."""
    engine = factor_field(factors, "engine", "name")
    model = factor_field(factors, "model", "id")
    best: Nearest | None = None
    for manifest in manifests:
        if factor_field(manifest.factors, "engine", "name") != engine:
            continue
        if factor_field(manifest.factors, "model", "id") != model:
            continue
        changes = tuple(diff_factors(manifest.factors, factors))
        if best is None or len(changes) < len(best.changes):
            best = Nearest(manifest, changes)
    return best


def no_manifest_error(store: Store, resolved: ResolvedConfig) -> NoManifestError:
    """The refusal for a hash with no blessing in ``store``, naming what drifted against the nearest blessing."""
    manifests = [record.manifest for record in store.records() if record.manifest is not None]
    return drift_error(resolved, manifests, store.manifests_dir)


def drift_error(
    resolved: ResolvedConfig, manifests: Sequence[Manifest], manifests_dir: Path, *, subject: str | None = None
) -> NoManifestError:
    """The one drift message (serve-full, bless gate, ...): no blessing for this hash, and what differs.

    ``details["nearest"]`` holds the nearest blessing of the same engine and model and its factor
    changes (None when there is none to compare with). ``subject`` names the profile in the message
    (default: its file); a caller whose output names the profile already passes a shorter one.
    """
    nearest = nearest_blessing(manifests, dict(resolved.factors))
    message = (
        f"no blessing for {subject or resolved.profile.label}: it hashes to {resolved.config_hash}, "
        f"and no manifest in {manifests_dir} has it"
    )
    if nearest is not None:
        changes = ", ".join(change.describe() for change in nearest.changes)
        blessed = nearest.manifest
        message += f"; nearest blessing {blessed.config_hash[:16]} ({blessed.profile_name}) differs in: {changes}"
        hint, remedy = "bless this configuration, or revert the drifted factor(s)", "bless_drifted"
    else:
        engine = factor_field(resolved.factors, "engine", "name")
        model = factor_field(resolved.factors, "model", "id")
        message += f"; none of engine {engine!r} and model {model!r} to compare with"
        hint, remedy = "no blessing of this engine and model exists yet: bless this profile", "bless_first"
    return NoManifestError(
        message,
        hint=hint,
        details={
            "config_hash": resolved.config_hash,
            "nearest": nearest.to_dict() if nearest else None,
            "profile": resolved.profile.label,
        },
        remedy=remedy,
    )


def resolve_as_blessed(profile: Profile, adapter: EngineAdapter, blessed: Mapping[str, Any]) -> ResolvedConfig:
    """Resolve ``profile`` with what only a serving host can see taken from a blessing's factors ``blessed``.

    The engine image's Python environment, the hardware, a local model's directory and content, a revision
    name's commit: as the blessing recorded them. Everything the profile itself says (serve arguments, hashed
    env, model id, engine switches) is resolved as usual, so the hash differs exactly when the profile does.
    """
    runtime = blessed.get("runtime")
    model = blessed.get("model")
    hardware = blessed.get("hardware")
    runtime = runtime if isinstance(runtime, Mapping) else {}
    model = model if isinstance(model, Mapping) else {}

    def revision(model_id: str, revision: str, *, where: str) -> str:
        return str(model.get("revision", "")) if model.get("id") == model_id else ""

    def model_dir(path: str, *, where: str) -> LocalModelDir:
        return LocalModelDir(str(model.get("path", path)), str(model.get("content_sha256", "")))

    return resolve(
        profile,
        adapter,
        image_resolver=None,
        hardware_probe=lambda _spec: dict(hardware) if isinstance(hardware, Mapping) else {},
        environment_probe=lambda _python, _packages: {k: v for k, v in runtime.items() if k != "kind"},
        revision_lookup=revision,
        model_dir_probe=model_dir,
    )
