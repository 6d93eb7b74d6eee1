"""The vLLM adapter: the engine policy specialized to one vLLM release (see the package docstring)."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from bless.core.coverage import CoveragePlan
from bless.core.factors import ResolvedConfig
from bless.core.profile import Profile
from bless.core.verify import TreeListing
from bless.engines.base import (
    ENGINE_HOME,
    CompileLocation,
    EngineLaunch,
    EnvPolicy,
    ModelMount,
    UnsafeSetting,
    argv_value,
    classify_outside,
    relocating_settings,
)
from bless.engines.vllm import coverage, evidence, serve_args, versions
from bless.engines.vllm.env import ENV_POLICY, PINNED_ENV, unsafe_env_settings
from bless.engines.vllm.paths import CACHE_MOUNT_PATH, HF_HOME_MOUNT_PATH, MODEL_MOUNT_PATH
from bless.engines.vllm.versions import ModelAot, VllmVersionRules
from bless.errors import InputInvalidError, UnknownEngineVersionError
from bless.evidence_types import ArtifactSummary, LogSignals, OutsideEntry, OutsideVerdict, UpperEntry, UpperVerdict

_HEX40 = re.compile(r"^[0-9a-f]{40}$")


class VllmAdapter:
    """Policy for vLLM, specialized to one release by its entry in :mod:`bless.engines.vllm.versions`.

    ``vllm_version`` selects the entry (markers, timings, force-AOT-load switch, AOT defaults,
    expected rewrites). A version without an entry uses the nearest older entry (or the newest,
    when the version is not known at all, e.g. inside a Docker image) and ``rules_known`` is False:
    :meth:`require_known_version` refuses it unless the caller allows unknown versions. Build one
    for a resolved environment with :meth:`for_environment` / :meth:`for_factors`.

    ``serve``, ``model`` and ``env`` (the resolved factors) specialize it to one model: whether
    vLLM compiles that model AOT (:meth:`VllmVersionRules.model_aot`, from ``serve.model_impl`` and a
    local model's ``config.json``) decides whether the AOT artifact is required and the force-load
    switch set. Without them (no model known) the release's own AOT switch alone decides.
    """

    name = "vllm"
    # 2: per-version rules from each release's source; the effective AOT switches are factors.
    # 3: a private HOME and temp dir per start, every compile location in the blessed tree, Triton's
    #    autotuning results kept (and so blessed).
    # 4: completions ask for the generated token ids (return_token_ids): golden outputs and trials compare
    #    them; before, vLLM's replies held none and only the text was compared.
    adapter_version = "4"
    cache_mount_path = CACHE_MOUNT_PATH
    # HOME enters vLLM's own key through VLLM_CONFIG_ROOT / VLLM_XLA_CACHE_PATH up to 0.26: a fixed path,
    # fresh and empty at every start (bless owns it).
    home = ENGINE_HOME
    # vLLM rewrites inductor_cache entries while loading: a read-only bind dies with EROFS.
    readonly_bind_ok = False
    env_policy: EnvPolicy = ENV_POLICY
    environment_packages: tuple[str, ...] = ("vllm", "torch", "triton", "transformers")
    # vLLM's completions (0.10.2 and later, every version with rules here) hold "token_ids" only when asked.
    completion_fields: Mapping[str, Any] = MappingProxyType({"return_token_ids": True})

    def __init__(
        self,
        vllm_version: str | None = None,
        *,
        torch_version: str | None = None,
        serve: Mapping[str, Any] | None = None,
        model: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.vllm_version = vllm_version
        self.torch_version = torch_version
        exact = versions.rules_for(vllm_version)
        self.rules_known = exact is not None
        nearest = exact or versions.nearest_older(vllm_version)
        #: True when no entry is older than the version (older than every supported release).
        self.too_old = nearest is None
        self.version_rules: VllmVersionRules = nearest or versions.all_rules()[versions.known_versions()[0]]
        self.rules = evidence.upper_rules_for(self.version_rules)
        self.env: Mapping[str, str] = dict(env or {})
        #: Whether vLLM compiles this model AOT as far as the model decides (always True without one).
        self.model_aot: ModelAot = ModelAot(True)
        if serve is not None or model is not None:
            impl = (serve or {}).get("model_impl")
            self.model_aot = self.version_rules.model_aot(
                impl if isinstance(impl, str) else None, model_architectures(model or {})
            )

    @classmethod
    def for_environment(
        cls,
        runtime_factor: Mapping[str, Any],
        *,
        serve: Mapping[str, Any] | None = None,
        model: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> VllmAdapter:
        """An adapter for the vLLM version in a resolved ``runtime`` factor (local runtime: ``packages.vllm``)."""
        packages = runtime_factor.get("packages")
        packages = packages if isinstance(packages, Mapping) else {}
        version, torch = packages.get("vllm"), packages.get("torch")
        return cls(
            version if isinstance(version, str) else None,
            torch_version=torch if isinstance(torch, str) else None,
            serve=serve,
            model=model,
            env=env,
        )

    def for_factors(self, factors: Mapping[str, Any]) -> VllmAdapter:
        """The adapter for the vLLM version (unknown under Docker) and the model in the resolved factors."""

        def part(name: str) -> Mapping[str, Any]:
            value = factors.get(name)
            return value if isinstance(value, Mapping) else {}

        env = {name: value for name, value in part("env").items() if isinstance(value, str)}
        return self.for_environment(part("runtime"), serve=part("serve"), model=part("model"), env=env)

    def notes(self) -> tuple[str, ...]:
        return (self.version_note, self.rules_note) + ((self.aot_note,) if self.aot_note else ())

    @property
    def aot_expected(self) -> bool | None:
        """Whether the bootstrap writes vLLM's AOT-compiled model: the release's switch (torch and the
        env) and the model's implementation both say so; None when the model's part cannot be known."""
        if not self.version_rules.aot_switches(self.torch_version, self.env).aot_compile:
            return False
        return self.model_aot.uses_aot

    @property
    def aot_note(self) -> str | None:
        """Why AOT is not required for this model, when the model's implementation is what decides it."""
        reason = self.model_aot.reason
        if reason is None or not self.version_rules.aot_switches(self.torch_version, self.env).aot_compile:
            return None
        if self.model_aot.uses_aot is False:
            return (
                f"{reason}: no AOT artifact is expected and {self.version_rules.force_load_env} is not set; "
                "without AOT vLLM has no direct load of its compiled graphs (it logs 'Compiling a graph' "
                "at every start), so trials fail on compile markers"
            )
        return (
            f"{reason}: the AOT artifact is not required, {self.version_rules.force_load_env} is still set "
            "(it acts only when vLLM loads one), and every trial must still log a load marker"
        )

    @property
    def version_note(self) -> str:
        """Which per-version entry applies, where it comes from, and whether it is the installed version's own."""
        entry = self.version_rules
        if self.rules_known:
            return f"vLLM {self.vllm_version}: rules of vLLM {entry.version} from {entry.provenance}"
        shown = self.vllm_version or "unknown (not probed)"
        return (
            f"vLLM {shown} has no entry; using the rules of vLLM {entry.version}, the nearest older known "
            f"release ({entry.provenance}), as allowed by --allow-unknown-engine-version"
        )

    @property
    def rules_note(self) -> str:
        """One sentence saying which expected-rewrite rules apply and why."""
        if self.rules_known:
            return f"expected rewrites of vLLM {self.rules.vllm_version} ({self.rules.evidence})"
        shown = self.vllm_version or "unknown"
        return (
            f"vLLM {shown} has no recorded rewrite set; using vLLM {self.rules.vllm_version}'s, "
            "conservatively (any other write fails the trial)"
        )

    def require_known_version(self, *, allow_unknown: bool) -> None:
        """Refuse a vLLM version without an entry (exit 33) unless ``allow_unknown``; never one older than all."""
        if self.rules_known:
            return
        known = versions.known_versions()
        listed = f"{known[0]} ... {known[-1]} ({len(known)} releases; bless engines lists them)"
        how = (
            "add an entry: python3 scripts/vllm_rules.py fetch VERSION && python3 scripts/vllm_rules.py update "
            "VERSION (reads that release's source; review the diff it prints), then run the unit tests"
        )
        if self.too_old:
            raise UnknownEngineVersionError(
                f"vLLM {self.vllm_version} is older than every release bless has rules for: {listed}",
                hint=f"use vLLM {known[0]} or newer",
                details={"installed": self.vllm_version, "known": list(known)},
            )
        if allow_unknown:
            return
        if self.vllm_version is None:
            what = (
                "the vLLM version cannot be read before the start (Docker: the image is not probed), so "
                "bless cannot tell which release's markers, hashed env and layout apply"
            )
        else:
            what = f"vLLM {self.vllm_version} has no entry in bless's per-version rules"
        raise UnknownEngineVersionError(
            f"{what}; known: {listed}",
            hint=f"{how}; or allow an unknown engine version (allow_unknown_engine_version) to use the nearest "
            f"older entry (vLLM {self.version_rules.version}; recorded in the manifest)",
            details={
                "installed": self.vllm_version,
                "nearest": self.version_rules.version,
                "known": list(known),
                "how": how,
            },
            remedy="allow_unknown_engine_version",
        )

    def engine_factors(
        self,
        runtime: Mapping[str, Any],
        env: Mapping[str, str],
        *,
        serve: Mapping[str, Any] | None = None,
        model: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The effective AOT-compile and mega-artifact switches: they change what vLLM writes to disk.

        Computed as the release's ``envs.py`` does, from the probed torch version and the env, and off
        where the model is known to compile without AOT (:meth:`VllmVersionRules.model_aot`; a model
        whose implementation cannot be known keeps the release's switch). Under Docker the versions
        are not probed: the image ID (a factor) fixes them, so no switch is added. The compile
        locations (of the release's entry, the nearest one when it is not known) always are: every
        start's env points them into the blessed tree.
        """
        adapter = self.for_environment(runtime, serve=serve, model=model, env=env)
        if adapter.vllm_version is None or adapter.torch_version is None:
            return adapter.compile_location_factor()
        switches = adapter.version_rules.aot_switches(adapter.torch_version, env)
        if adapter.model_aot.uses_aot is False:
            switches = versions.AotSwitches(aot_compile=False, mega_artifact=False, force_load_env=None)
        return {"aot": switches.to_factor(), **adapter.compile_location_factor()}

    def compile_locations(self) -> tuple[CompileLocation, ...]:
        """Every compile-state location this vLLM release's source shows (Triton, Inductor, CUDA, JIT libraries)."""
        return self.version_rules.compile_locations

    def compile_location_factor(self) -> dict[str, Any]:
        """``{"compile_locations": {ENV: dir under the cache root}}``: the factor every start's env is built from."""
        return {"compile_locations": {loc.env: loc.subdir for loc in self.compile_locations()}}

    def classify_outside(self, entries: Sequence[OutsideEntry], *, serving: bool = False) -> OutsideVerdict:
        """By :data:`evidence.OUTSIDE_RULES`: named noise, else compiled state the blessing does not hold."""
        return classify_outside(evidence.OUTSIDE_RULES, entries, serving=serving)

    def replay_env(self) -> dict[str, str]:
        """``VLLM_FORCE_AOT_LOAD=1`` where the release has it, AOT compile is on and the model uses it.

        A replay must load the blessed AOT artifact: with the switch a failed load raises (the
        engine fails to start) instead of logging a warning and recompiling. vLLM excludes it from
        its own key, so it changes no key. A bootstrap never sets it (there is nothing to load yet).
        Not set for a model vLLM compiles without AOT; set when that cannot be known, since vLLM
        reads it only on the load of an AOT artifact.
        """
        switches = self.version_rules.aot_switches(self.torch_version, self.env)
        if not switches.force_load_env or self.aot_expected is False:
            return {}
        return {switches.force_load_env: "1"}

    # --- serve arguments ---------------------------------------------------------------------------

    def normalize_serve(self, serve: Mapping[str, Any], *, where: str) -> dict[str, Any]:
        """Validate vLLM engine arguments and return their canonical form (:func:`serve_args.normalize_serve`)."""
        return serve_args.normalize_serve(serve, where=where)

    def unsafe_settings(self, resolved: ResolvedConfig) -> list[UnsafeSetting]:
        """Debug, cache-disabling and eager settings, and env that moves a compile location: a blessed start must
        compile and load for real, where bless blesses and watches.

        Read from the hashed serve arguments and the env the start gets (what :meth:`launch` uses).
        """
        env = resolved.engine_env()
        found = unsafe_env_settings(env) + serve_args.unsafe_serve_settings(_serve_factor(resolved))
        return found + relocating_settings(env, self.compile_locations(), already=found)

    # --- launching ---------------------------------------------------------------------------------

    def launch(
        self, resolved: ResolvedConfig, *, port: int, debug: bool = False, host: str = "127.0.0.1"
    ) -> EngineLaunch:
        """argv + env of ``python3 -m vllm.entrypoints.cli.main serve <model> ...``.

        That module is what the ``vllm serve`` console script runs (the documented entry point;
        ``vllm.entrypoints.openai.api_server``'s ``__main__`` is a copy kept "in sync" by hand), it
        is exactly what the recorded vLLM 0.20 run used, and it needs no console script on PATH
        (a PYTHONPATH install like the recorded one has none). The runtime replaces the image's
        ENTRYPOINT with argv[0], so the same argv works in ``vllm/vllm-openai`` images.

        Weights are never part of the blessed cache and never downloaded: a Hugging Face model is
        read offline from ``HF_HOME`` (Docker: ``model.hf_home`` mounted read-only at
        :data:`HF_HOME_MOUNT_PATH`; local: ``model.hf_home`` itself, or ``HF_HOME`` from the
        profile's env); a local model directory is mounted read-only at :data:`MODEL_MOUNT_PATH`
        under Docker (see :meth:`model_mounts`). ``debug`` starts eager with the cache disabled.

        Serve arguments, model id, revision (the resolved commit) and local model path come from
        ``resolved.factors``, the env from ``resolved.engine_env()``: what runs is what was hashed.
        Only what is not a factor (where the weights are read from, the interpreter) is the profile's.
        """
        profile = resolved.profile
        serve = _serve_factor(resolved)
        docker = _runtime_kind(resolved) == "docker"
        env = resolved.engine_env()
        model_args = _model_argv(resolved, env, docker=docker)
        if debug:
            serve["enforce_eager"] = True
        python = "python3" if docker else (profile.python or "python3")
        command = [
            python, "-m", "vllm.entrypoints.cli.main", "serve", *model_args,
            "--host", "0.0.0.0" if docker else host,
            "--port", str(port),
        ]  # fmt: skip
        command.extend(serve_args.serve_argv(serve))
        # Pinned values last: the profile cannot move the cache or HOME (both are vLLM key inputs).
        env.update(PINNED_ENV)
        env["VLLM_CACHE_ROOT"] = self.cache_mount_path
        env["HOME"] = self.home
        if debug:
            env["VLLM_DISABLE_COMPILE_CACHE"] = "1"  # a debug start never reads or writes the cache
        return EngineLaunch(command=tuple(command), env=env, port=port)

    def model_mounts(self, profile: Profile) -> tuple[ModelMount, ...]:
        """Read-only mounts a Docker start needs for the weights (none for the local runtime)."""
        if profile.runtime_kind != "docker":
            return ()
        model = profile.model
        if model.source == "local" and model.path is not None:
            return (ModelMount(model.path, MODEL_MOUNT_PATH, "the local model directory"),)
        if model.source == "huggingface" and model.hf_home is not None:
            return (ModelMount(model.hf_home, HF_HOME_MOUNT_PATH, "the Hugging Face cache (HF_HOME)"),)
        return ()

    def prepare_cache_dir(self, staged: Path) -> None:
        """Pre-create ``dummy_cache/``: vLLM's mega-AOT load path calls ``os.makedirs(VLLM_CACHE_ROOT/dummy_cache)``.

        Off with torch 2.11 (vLLM 0.20 never created it in the recorded runs), on with torch >= 2.12;
        on a read-only lower layer the makedirs would fail (seen in the seed). It is then listed
        in the manifest's dirs like any other directory.
        """
        (staged / "dummy_cache").mkdir(exist_ok=True)

    # --- evidence ----------------------------------------------------------------------------------

    def summarize_artifacts(self, listing: TreeListing) -> ArtifactSummary:
        """Require the AOT model and the backbone artifacts where vLLM compiles this model AOT, and
        ``cache_key_factors.json`` for the same ranks (:func:`evidence.summarize_artifacts`)."""
        return evidence.summarize_artifacts(listing, require_aot=self.aot_expected is True, why=self.aot_note)

    def read_log(self, log: str) -> LogSignals:
        """Markers (whole lines), timings (seconds) and vLLM's keys from a vLLM server log, by this release's rules."""
        return evidence.read_log(self.version_rules, log)

    def drift_reasons(self, blessed_keys: Mapping[str, Any], log_keys: Mapping[str, Any]) -> list[str]:
        """Why a trial's or a serve's log shows vLLM using other keys than the blessing (empty: none)."""
        return evidence.drift_reasons(self.cache_mount_path, blessed_keys, log_keys)

    def classify_upper(self, entries: Sequence[UpperEntry]) -> UpperVerdict:
        """Split overlay upper-layer writes by this release's rewrite rules (unknown: the nearest older's)."""
        return evidence.classify_upper(self.rules, entries)

    def coverage_plan(self, resolved: ResolvedConfig) -> CoveragePlan:
        """The release's lazily compiled families (fused MoE first) for this model, serve arguments, GPU and env."""
        factors = resolved.factors
        model = factors.get("model") if isinstance(factors.get("model"), Mapping) else {}
        hardware = factors.get("hardware") if isinstance(factors.get("hardware"), Mapping) else {}
        assert isinstance(model, Mapping) and isinstance(hardware, Mapping)
        config = coverage.read_model_config(model)
        vocab = config.get("vocab_size") if config else None
        gpu_name = hardware.get("gpu_name")
        capability = hardware.get("compute_capability")
        serve = _serve_factor(resolved)
        return coverage.coverage_plan(
            self.vllm_version if self.rules_known else None,
            config,
            serve,
            resolved.engine_env(),
            gpu_name if isinstance(gpu_name, str) else None,
            str(model.get("id", "")),
            vocab if isinstance(vocab, int) else None,
            capability=capability if isinstance(capability, str) else None,
            chat_template=coverage.read_chat_template(model, serve),
        )


def model_architectures(model: Mapping[str, Any]) -> tuple[str, ...] | None:
    """A local model's ``config.json`` ``architectures``, from the directory its factor names.

    Only the local runtime's model factor has that path (the real directory whose content is
    hashed, so what is read here is what was hashed). None when there is none or it says none.
    """
    config = coverage.read_model_config(model)
    found = config.get("architectures") if isinstance(config, dict) else None
    if not isinstance(found, list) or not found or not all(isinstance(arch, str) for arch in found):
        return None
    return tuple(found)


def _model_argv(resolved: ResolvedConfig, env: dict[str, str], *, docker: bool) -> list[str]:
    """The model's words of ``vllm serve``: the id and pinned revision, or the local directory.

    A Hugging Face model is read offline from ``HF_HOME``, which is set in ``env`` here.
    """
    profile = resolved.profile
    model_factor = resolved.factors.get("model")
    model_factor = model_factor if isinstance(model_factor, Mapping) else {}
    model = profile.model
    if model.source == "huggingface":
        revision = str(model_factor.get("revision") or "")
        if not _HEX40.fullmatch(revision):
            raise InputInvalidError(
                f"{profile.label}: model.revision: vLLM starts offline, so the revision must be a pinned "
                f"40-hex commit, not {revision or '(none)'!r}",
                hint="pin model.revision to the commit (huggingface_hub: HfApi().model_info(id).sha)",
            )
        if model.hf_home is not None:
            env["HF_HOME"] = HF_HOME_MOUNT_PATH if docker else model.hf_home
        elif "HF_HOME" not in env:
            raise InputInvalidError(
                f"{profile.label}: model.hf_home: required for a Hugging Face model (vLLM reads the "
                "weights offline from a read-only HF cache; bless never downloads)",
                hint="set model.hf_home to the host HF cache holding the pinned revision "
                "(huggingface-cli download ID --revision REV), or set HF_HOME in [env] for an image "
                "that contains the weights",
            )
        return [
            argv_value(f"{profile.label}: model.id", str(model_factor.get("id", ""))),
            "--revision",
            argv_value(f"{profile.label}: model.revision", revision),
        ]
    if model.source == "local":
        # The local runtime hashes the directory's real path (vLLM hashes the model string).
        path = MODEL_MOUNT_PATH if docker else str(model_factor.get("path", ""))
        return [argv_value(f"{profile.label}: model.path", path)]
    raise InputInvalidError(
        f"{profile.label}: model.source {model.source!r}: vLLM serves a Hugging Face id or a local directory",
        hint="use model.source = 'huggingface' (with a pinned revision) or 'local' (with model.path)",
    )


def _serve_factor(resolved: ResolvedConfig) -> dict[str, Any]:
    """A private copy of the hashed serve arguments (a debug start changes its copy, never the factors)."""
    serve = resolved.factors.get("serve")
    return copy.deepcopy(dict(serve)) if isinstance(serve, Mapping) else {}


def _runtime_kind(resolved: ResolvedConfig) -> str:
    runtime = resolved.factors.get("runtime")
    kind = runtime.get("kind") if isinstance(runtime, Mapping) else None
    return kind if isinstance(kind, str) else resolved.profile.runtime_kind
