"""Adapter for vLLM (the production engine): argv/env, factor policy, artifacts, log markers, upper-layer writes.

Everything here was derived from a real vLLM 0.20.0 run (torch 2.11, triton 3.6, an H200, a tiny
random Llama, offline): cold, warm, read-only, overlay and relocated starts. The facts that shape
the code, and where they were seen:

* vLLM's cache root is ``VLLM_CACHE_ROOT``. A compile writes a "backbone" dir
  ``torch_compile_cache/<10 hex>/rank_<R>_<D>/backbone/`` (Inductor standalone ``artifact_*`` files,
  ``cache_key_factors.json``, ``vllm_compile_cache.py``) and an AOT dir
  ``torch_compile_cache/torch_aot_compile/<64 hex>/`` (``rank_<R>_<D>/model`` plus an ``inductor_cache/``
  that vLLM forces ``TORCHINDUCTOR_CACHE_DIR`` to). The 10-hex and 64-hex names are vLLM's own keys.
* A warm load REWRITES existing entries of that ``inductor_cache/`` (3 aotautograd, 3 fxgraph,
  6 ``.best_config`` for the tiny model): a plain read-only mount dies with EROFS, an overlay works.
  Hence ``readonly_bind_ok = False`` and :data:`UPPER_RULES`.
* HOME is part of vLLM's key (``VLLM_CONFIG_ROOT`` / ``VLLM_XLA_CACHE_PATH`` derive from it), and the
  inductor keys depend on the cache path (a moved cache loads but writes new entries): both are pinned.
* All load/save markers are INFO or WARNING lines, so the default log level shows them. vLLM logs a
  benign ``Traceback`` at DEBUG (no chat template on the tokenizer), so a traceback is not fatal.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bless.engines import vllm_versions
from bless.engines.base import EngineLaunch, EnvPolicy, ModelMount, UnsafeSetting
from bless.engines.vllm_versions import VllmVersionRules
from bless.errors import BootstrapFailedError, InputInvalidError, UnknownEngineVersionError
from bless.evidence import ArtifactSummary, LogSignals, UpperEntry, UpperVerdict
from bless.profile import Profile
from bless.verify import TreeListing

__all__ = [
    "CACHE_MOUNT_PATH",
    "COMPILE_MARKERS",
    "FATAL_MARKERS",
    "HF_HOME_MOUNT_PATH",
    "LOAD_MARKERS",
    "MODEL_MOUNT_PATH",
    "UPPER_RULES",
    "ModelMount",
    "UpperRules",
    "VllmAdapter",
    "VllmEnvPolicy",
]

# --- fixed paths ---------------------------------------------------------------------------------

#: Where the engine sees its cache (``VLLM_CACHE_ROOT``) in bootstrap, trials and serving. Fixed,
#: because Inductor's keys depend on the cache path; the same value as the reference adapter.
CACHE_MOUNT_PATH = "/var/cache/bless-engine"
#: Docker only: where the orchestrator mounts ``model.hf_home`` (read-only) for a Hugging Face model.
HF_HOME_MOUNT_PATH = "/var/cache/bless-hf"
#: Docker only: where the orchestrator mounts ``model.path`` (read-only) for a local model. Fixed,
#: because vLLM hashes the model string (ModelConfig.compute_hash includes ``model``).
MODEL_MOUNT_PATH = "/var/lib/bless-model"

# --- log markers (exact text from the recorded vLLM 0.20 logs) -----------------------------------

#: A warm start that reused the cache logs these (INFO, compilation/decorators.py and backends.py).
LOAD_MARKERS: tuple[str, ...] = (
    "Directly load AOT compilation from path",
    "Directly load the compiled graph(s) for compile range",
)
#: Any of these means vLLM compiled (or tried to save) instead of only loading.
COMPILE_MARKERS: tuple[str, ...] = (
    "saved AOT compiled function to",
    "Compiling model again due to a load failure",
    "Compiling a graph for compile range",
    "Cache the graph of compile range",
    "unable to save AOT compiled function",
)
#: The engine did not start. The second line is the API server's RuntimeError after the first one;
#: both were recorded in the read-only failure. A bare ``Traceback`` is NOT here: vLLM logs a
#: benign one at DEBUG level on every start of a model without a chat template.
FATAL_MARKERS: tuple[str, ...] = (
    "EngineCore failed to start",
    "Engine core initialization failed",
)

_AOT_LOAD_PATH = re.compile(r"Directly load AOT compilation from path (?P<path>\S+)")
_USING_CACHE_DIR = re.compile(r"Using cache directory: (?P<path>\S+) for vLLM's torch\.compile")
_BACKBONE_IN_PATH = re.compile(r"torch_compile_cache/(?P<key>[0-9a-f]{10})/(?P<rank>rank_\d+_\d+)/")
_AOT_IN_PATH = re.compile(r"torch_compile_cache/torch_aot_compile/(?P<key>[0-9a-f]{64})/(?P<rank>rank_\d+_\d+)/model")

# --- artifact layout -------------------------------------------------------------------------------

_AOT_MODEL = re.compile(r"^torch_compile_cache/torch_aot_compile/(?P<key>[0-9a-f]{64})/(?P<rank>rank_\d+_\d+)/model$")
# ``artifact_*`` is a file in the default "binary" save format and a directory in "unpacked".
_COMPONENT_ARTIFACT = re.compile(
    r"^torch_compile_cache/(?P<key>[0-9a-f]{10})/(?P<rank>rank_\d+_\d+)/(?P<component>[^/]+)/artifact_[^/]+(/.*)?$"
)
_KEY_FACTORS = re.compile(
    r"^torch_compile_cache/(?P<key>[0-9a-f]{10})/(?P<rank>rank_\d+_\d+)/(?P<component>[^/]+)/cache_key_factors\.json$"
)
_COMPILE_INDEX = re.compile(r"^torch_compile_cache/[0-9a-f]{10}/rank_\d+_\d+/[^/]+/vllm_compile_cache\.py$")
_INDUCTOR_CACHE = r"^torch_compile_cache/torch_aot_compile/[0-9a-f]{64}/inductor_cache/"
_INDUCTOR_ANY = re.compile(_INDUCTOR_CACHE)
_TORCH_COMPILE_CACHE = re.compile(r"^torch_compile_cache/")
_CUBIN = re.compile(_INDUCTOR_CACHE + r"triton/.*\.cubin$")
_BACKBONE = "backbone"
_EXPECTED_LAYOUT = (
    "torch_compile_cache/torch_aot_compile/<64 hex>/rank_<R>_<D>/model, "
    "torch_compile_cache/<10 hex>/rank_<R>_<D>/backbone/artifact_* and "
    "torch_compile_cache/<10 hex>/rank_<R>_<D>/backbone/cache_key_factors.json"
)


# --- upper-layer rules, per vLLM version -----------------------------------------------------------


@dataclass(frozen=True)
class UpperRules:
    """What a warm load of one vLLM minor version may rewrite over the blessed tree (and nothing else)."""

    vllm_version: str
    expected_rewrites: tuple[re.Pattern[str], ...]
    evidence: str


#: Rewrites a warm load makes inside the AOT dir's ``inductor_cache/`` (which vLLM forces
#: ``TORCHINDUCTOR_CACHE_DIR`` to). Only rewrites of EXISTING paths are ever expected: a new path
#: under ``torch_compile_cache/`` is a compile or a re-keyed entry, never part of a plain load.
_INDUCTOR_REWRITES: tuple[re.Pattern[str], ...] = (
    # Loading the standalone artifacts re-populates Inductor's caches through write_atomic
    # (tmp file + rename), so each entry is rewritten in place with the same key.
    re.compile(_INDUCTOR_CACHE + r"aotautograd/[a-z0-9]+/[a-z0-9]+$"),
    re.compile(_INDUCTOR_CACHE + r"fxgraph/[a-z0-9]{2}/[a-z0-9]+/[a-z0-9]+$"),
    # Autotune results (their timings differ run to run; the chosen config is the key).
    re.compile(_INDUCTOR_CACHE + r"[a-z0-9]{2}/[0-9a-f]{64}\.best_config$"),
)
_REWRITES_SEEN = (
    "vLLM 0.20.0, torch 2.11, H200, tiny random Llama: two overlay starts (different cache paths) "
    "each wrote exactly 12 rewrites: 3 aotautograd, 3 fxgraph, 6 .best_config, no new paths"
)


def upper_rules_for(entry: VllmVersionRules) -> UpperRules:
    """The expected rewrites of one vLLM release: the observed Inductor set, where its source forces that dir.

    Every release from 0.20 on forces ``TORCHINDUCTOR_CACHE_DIR`` into the AOT dir (its entry's
    ``layout.inductor_cache_forced``, read from source), so a warm load's Inductor rewrites land at
    the same paths. The set itself was observed on GPUs (see ``gpu_proven``); any other write fails a trial.
    """
    evidence = f"observed: {_REWRITES_SEEN}"
    if entry.gpu_proven:
        evidence += f"; vLLM {entry.version} on a GPU: {entry.gpu_proven}"
    else:
        evidence += f"; vLLM {entry.version}: the same inductor_cache layout, from source only"
    return UpperRules(vllm_version=entry.version, expected_rewrites=_INDUCTOR_REWRITES, evidence=evidence)


#: Kept for callers that name a minor version: vLLM 0.20's rules.
UPPER_RULES: dict[str, UpperRules] = {
    "0.20": UpperRules(vllm_version="0.20", expected_rewrites=_INDUCTOR_REWRITES, evidence=_REWRITES_SEEN)
}


# --- serve arguments -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Arg:
    """One modeled vLLM engine argument: its flag, its type and bounds."""

    flag: str
    kind: Literal["int", "float", "bool", "str"]
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()


# Order = argv order. Only what the profile states is hashed and passed: an omitted argument means
# "vLLM's default for this vLLM version", and the version is a factor (image ID or package versions).
SERVE_ARGS: dict[str, _Arg] = {
    "served_model_name": _Arg("--served-model-name", "str"),
    "seed": _Arg("--seed", "int", 0, 2**32 - 1),
    "dtype": _Arg("--dtype", "str", choices=("auto", "half", "float16", "bfloat16", "float", "float32")),
    "max_model_len": _Arg("--max-model-len", "int", 1),
    "max_num_seqs": _Arg("--max-num-seqs", "int", 1),
    "max_num_batched_tokens": _Arg("--max-num-batched-tokens", "int", 1),
    "tensor_parallel_size": _Arg("--tensor-parallel-size", "int", 1, 1024),
    "pipeline_parallel_size": _Arg("--pipeline-parallel-size", "int", 1, 1024),
    "gpu_memory_utilization": _Arg("--gpu-memory-utilization", "float", 0.0, 1.0),
    "kv_cache_dtype": _Arg("--kv-cache-dtype", "str"),
    "quantization": _Arg("--quantization", "str"),
    "block_size": _Arg("--block-size", "int", 1),
    "enable_prefix_caching": _Arg("--enable-prefix-caching", "bool"),
    "enable_chunked_prefill": _Arg("--enable-chunked-prefill", "bool"),
    "trust_remote_code": _Arg("--trust-remote-code", "bool"),
    "enforce_eager": _Arg("--enforce-eager", "bool"),
}
COMPILATION_CONFIG = "compilation_config"
EXTRA_ARGS = "extra_args"
KNOWN_SERVE_KEYS = (*SERVE_ARGS, COMPILATION_CONFIG, EXTRA_ARGS)

COMPILATION_MODES = {"NONE": 0, "STOCK_TORCH_COMPILE": 1, "DYNAMO_TRACE_ONCE": 2, "VLLM_COMPILE": 3}
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
_CC_BOOLS = (
    "cudagraph_copy_inputs",
    "cudagraph_specialize_lora",
    "use_inductor_graph_partition",
    "compile_mm_encoder",
)
_CC_STR_LISTS = ("custom_ops", "splitting_ops")
_CC_TABLES = ("inductor_compile_config", "inductor_passes", "pass_config", "dynamic_shapes_config")

# Flags the adapter sets itself, or that a modeled key covers: in extra_args they would bypass the
# canonical form and the unsafe checks (``--enforce-eager``), or leak a secret into the manifest.
_MANAGED_FLAGS = frozenset(
    {"--host", "--port", "--model", "--revision", "--compilation-config", "-cc", "--api-key", "--hf-token"}
    | {arg.flag for arg in SERVE_ARGS.values()}
    | {"--no-" + arg.flag[2:] for arg in SERVE_ARGS.values() if arg.kind == "bool"}
)
_NO_COMPILE_OPT_LEVELS = {"0"}

# --- env -------------------------------------------------------------------------------------------

_FALSY = ("", "0")
# name -> reason; unsafe when set to anything but "" or "0".
_UNSAFE_FLAGS: dict[str, str] = {
    "VLLM_DISABLE_COMPILE_CACHE": "disables vLLM's compile cache: every start recompiles, nothing is loaded",
    "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "disables every Inductor cache: forces recompiles, nothing is loaded",
    "TORCH_COMPILE_DISABLE": "disables torch.compile: there is no compiled artifact to bless",
    "TORCHDYNAMO_DISABLE": "disables TorchDynamo: there is no compiled artifact to bless",
    "TORCH_COMPILE_DEBUG": "torch.compile debug mode (writes debug trees, slow): a debug start",
    "TORCHDYNAMO_VERBOSE": "verbose TorchDynamo diagnostics: a debug start",
    "VLLM_TRACE_FUNCTION": "traces every Python call (very slow): a debug start",
    "CUDA_LAUNCH_BLOCKING": "serializes every CUDA launch: a debug start, not what is served",
    "VLLM_PATTERN_MATCH_DEBUG": "vLLM pattern-matcher debug output: a debug start",
}
# name -> reason; unsafe when set to any non-empty value.
_UNSAFE_IF_SET: dict[str, str] = {
    "TORCH_LOGS": "torch trace logging: a debug start",
    "VLLM_DEBUG_DUMP_PATH": "vLLM compilation debug dumps: a debug start",
    "VLLM_CACHE_ROOT": f"the adapter pins the cache root at {CACHE_MOUNT_PATH}; another root puts the "
    "artifacts outside the blessed tree",
}
# The load/save markers bless reads are INFO/WARNING lines: without them reuse cannot be proven.
_QUIET_LOG_LEVELS = ("ERROR", "CRITICAL")


#: Names vLLM 0.20 hashes that the default secret patterns (``*TOKEN*``) would redact: they are
#: tuning knobs, not secrets, and redacting them would let two configs vLLM tells apart hash alike.
VLLM_NOT_SECRETS = frozenset({"VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE", "VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD"})


@dataclass(frozen=True)
class VllmEnvPolicy(EnvPolicy):
    """:class:`EnvPolicy` with exceptions for names vLLM itself hashes.

    ``not_secrets`` are never treated as secrets although a secret pattern matches them;
    ``always_hashed`` are hashed although an ignore pattern matches them.
    """

    always_hashed: frozenset[str] = frozenset()
    not_secrets: frozenset[str] = frozenset()

    def is_secret(self, name: str) -> bool:
        """The default patterns, minus the known non-secret names."""
        return name not in self.not_secrets and super().is_secret(name)

    def is_ignored(self, name: str) -> bool:
        """Secrets first (never hashed, never written), then the exceptions, then the ignore patterns."""
        if self.is_secret(name):
            return True
        if name in self.always_hashed:
            return False
        return super().is_ignored(name)


_ENV_POLICY = VllmEnvPolicy(
    ignored=(
        # Where the server listens: not in any compiled artifact (vLLM ignores VLLM_PORT/VLLM_HOST_IP too).
        "*_PORT",
        "*HOST_IP*",
        # How much is logged: vLLM ignores VLLM_LOGGING_* in its key. (A quiet level is refused as
        # unsafe instead, because it hides the markers.)
        "*LOG_LEVEL*",
        "*LOGGING_LEVEL*",
        # Which physical GPUs: their identity (name, compute capability, count) is the hardware
        # factor; the index order does not change compiled code (vLLM ignores it as well).
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        # Where the weights are read from and whether the hub may be asked: the model factor pins
        # the revision / content, and the adapter forces offline starts anyway.
        "HF_HOME",
        "HF_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HUB_DISABLE_TELEMETRY",
        # Telemetry switches (vLLM ignores both in its key).
        "VLLM_NO_USAGE_STATS",
        "VLLM_DO_NOT_TRACK",
        "DO_NOT_TRACK",
        "PYTHONUNBUFFERED",
    ),
    not_secrets=VLLM_NOT_SECRETS,
)
#: Names some known vLLM release hashes into its own compile key although one of our ignore
#: patterns matches them (side-channel ports): vLLM's key is the floor, so they stay hashed. The
#: union over every release (hashing a name a release ignores costs a spurious mismatch, never a
#: wrong hit), because the env is split before the vLLM version is resolved.
VLLM_HASHED_DESPITE_PATTERN = frozenset(
    name
    for version in vllm_versions.known_versions()
    for name in vllm_versions.all_rules()[version].hashed_env
    if _ENV_POLICY.is_ignored(name) and not _ENV_POLICY.is_secret(name)
)
_ENV_POLICY = dataclasses.replace(_ENV_POLICY, always_hashed=VLLM_HASHED_DESPITE_PATTERN)

# Env the adapter pins on every start. Not hashed as env: they are adapter constants (a change
# bumps ``adapter_version``) or already factors (``cache.mount_path``, ``cache.home``).
_PINNED_ENV = {
    "PYTHONUNBUFFERED": "1",
    # Never reach the network: weights come from a read-only mount, and a download at start would
    # make a start depend on the hub's state. vLLM usage stats would phone home.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
_HEX40 = re.compile(r"^[0-9a-f]{40}$")


class VllmAdapter:
    """Policy for vLLM, specialized to one release by its entry in :mod:`bless.engines.vllm_versions`.

    ``vllm_version`` selects the entry (markers, timings, force-AOT-load switch, AOT defaults,
    expected rewrites). A version without an entry uses the nearest older entry (or the newest,
    when the version is not known at all, e.g. inside a Docker image) and ``rules_known`` is False:
    :meth:`require_known_version` refuses it unless the caller allows unknown versions. Build one
    for a resolved environment with :meth:`for_environment` / :meth:`for_factors`.
    """

    name = "vllm"
    # 2: per-version rules from each release's source; the effective AOT switches are factors.
    adapter_version = "2"
    cache_mount_path = CACHE_MOUNT_PATH
    # HOME enters vLLM's own key through VLLM_CONFIG_ROOT / VLLM_XLA_CACHE_PATH up to 0.26: pin it.
    home = "/root"
    # vLLM rewrites inductor_cache entries while loading: a read-only bind dies with EROFS.
    readonly_bind_ok = False
    env_policy: EnvPolicy = _ENV_POLICY
    environment_packages: tuple[str, ...] = ("vllm", "torch", "triton", "transformers")

    def __init__(self, vllm_version: str | None = None, *, torch_version: str | None = None) -> None:
        self.vllm_version = vllm_version
        self.torch_version = torch_version
        exact = vllm_versions.rules_for(vllm_version)
        self.rules_known = exact is not None
        nearest = exact or vllm_versions.nearest_older(vllm_version)
        #: True when no entry is older than the version (older than every supported release).
        self.too_old = nearest is None
        self.version_rules: VllmVersionRules = nearest or vllm_versions.all_rules()[vllm_versions.known_versions()[0]]
        self.rules = upper_rules_for(self.version_rules)

    @classmethod
    def for_environment(cls, runtime_factor: Mapping[str, Any]) -> VllmAdapter:
        """An adapter for the vLLM version in a resolved ``runtime`` factor (local runtime: ``packages.vllm``)."""
        packages = runtime_factor.get("packages")
        packages = packages if isinstance(packages, Mapping) else {}
        version, torch = packages.get("vllm"), packages.get("torch")
        return cls(
            version if isinstance(version, str) else None,
            torch_version=torch if isinstance(torch, str) else None,
        )

    def for_factors(self, factors: Mapping[str, Any]) -> VllmAdapter:
        """The adapter for the vLLM version in the resolved factors (unknown under Docker)."""
        runtime = factors.get("runtime")
        return self.for_environment(runtime if isinstance(runtime, Mapping) else {})

    def notes(self) -> tuple[str, ...]:
        return (self.version_note, self.rules_note)

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
        known = vllm_versions.known_versions()
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
            hint=f"{how}; or pass --allow-unknown-engine-version to use the nearest older entry "
            f"(vLLM {self.version_rules.version}; recorded in the manifest)",
            details={"installed": self.vllm_version, "nearest": self.version_rules.version, "known": list(known)},
        )

    def engine_factors(self, runtime: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
        """The effective AOT-compile and mega-artifact switches: they change what vLLM writes to disk.

        Computed as the release's ``envs.py`` does, from the probed torch version and the env. Under
        Docker the versions are not probed: the image ID (a factor) fixes them, so nothing is added.
        """
        adapter = self.for_environment(runtime)
        if adapter.vllm_version is None or adapter.torch_version is None:
            return {}
        switches = adapter.version_rules.aot_switches(adapter.torch_version, env)
        return {"aot": switches.to_factor()}

    def replay_env(self) -> dict[str, str]:
        """``VLLM_FORCE_AOT_LOAD=1`` where the release has it and AOT compile is on.

        A replay must load the blessed AOT artifact: with the switch a failed load raises (the
        engine fails to start) instead of logging a warning and recompiling. vLLM excludes it from
        its own key, so it changes no key. A bootstrap never sets it (there is nothing to load yet).
        """
        switches = self.version_rules.aot_switches(self.torch_version, {})
        return {switches.force_load_env: "1"} if switches.force_load_env else {}

    # --- serve arguments ---------------------------------------------------------------------------

    def normalize_serve(self, serve: Mapping[str, Any], *, where: str) -> dict[str, Any]:
        """Validate vLLM engine arguments and return their canonical form.

        Only stated arguments appear (no defaults are invented: an omitted argument is vLLM's
        default for the vLLM version, which is itself a factor). ``compilation_config`` is
        canonicalized (see :func:`_normalize_compilation_config`); ``extra_args`` carries flags
        this adapter does not model and enters the hash verbatim.
        """
        unknown = sorted(set(serve) - set(KNOWN_SERVE_KEYS))
        if unknown:
            raise InputInvalidError(
                f"{where}: serve.{unknown[0]}: not a vLLM argument this adapter models",
                hint=f"known arguments: {', '.join(KNOWN_SERVE_KEYS)}; pass other vLLM flags verbatim "
                f"in serve.{EXTRA_ARGS} (a list of strings)",
            )
        normalized: dict[str, Any] = {}
        for key, spec in SERVE_ARGS.items():
            if key in serve:
                normalized[key] = _check_value(f"{where}: serve.{key}", serve[key], spec)
        if COMPILATION_CONFIG in serve:
            normalized[COMPILATION_CONFIG] = _normalize_compilation_config(
                serve[COMPILATION_CONFIG], where=f"{where}: serve.{COMPILATION_CONFIG}"
            )
        if EXTRA_ARGS in serve:
            normalized[EXTRA_ARGS] = _normalize_extra_args(serve[EXTRA_ARGS], where=f"{where}: serve.{EXTRA_ARGS}")
        return normalized

    def unsafe_settings(self, profile: Profile) -> list[UnsafeSetting]:
        """Debug, cache-disabling and eager settings: a blessed start must compile and load for real."""
        found: list[UnsafeSetting] = []
        for name, value in sorted(profile.env.items()):
            if name in _UNSAFE_FLAGS and value.strip() not in _FALSY:
                found.append(UnsafeSetting(name, value, _UNSAFE_FLAGS[name]))
            elif name in _UNSAFE_IF_SET and value.strip():
                found.append(UnsafeSetting(name, value, _UNSAFE_IF_SET[name]))
            elif name == "VLLM_LOGGING_LEVEL" and value.strip().upper() in _QUIET_LOG_LEVELS:
                found.append(UnsafeSetting(name, value, "hides the INFO load/save markers: reuse cannot be proven"))
            elif name == "VLLM_CONFIGURE_LOGGING" and value.strip() == "0":
                found.append(UnsafeSetting(name, value, "turns vLLM's logging off: reuse cannot be proven"))
        serve = profile.serve
        if serve.get("enforce_eager") is True:
            found.append(UnsafeSetting("serve.enforce_eager", "true", "eager mode compiles nothing: nothing to bless"))
        config = serve.get(COMPILATION_CONFIG)
        if isinstance(config, Mapping):
            for key in ("mode", "level"):
                if key in config and _is_mode_none(config[key]):
                    found.append(
                        UnsafeSetting(
                            f"serve.{COMPILATION_CONFIG}.{key}",
                            str(config[key]),
                            "compilation mode NONE compiles nothing: nothing to bless",
                        )
                    )
            if config.get("debug_dump_path"):
                found.append(
                    UnsafeSetting(
                        f"serve.{COMPILATION_CONFIG}.debug_dump_path",
                        str(config["debug_dump_path"]),
                        "vLLM compilation debug dumps: a debug start",
                    )
                )
        extra = serve.get(EXTRA_ARGS)
        if isinstance(extra, list) and all(isinstance(item, str) for item in extra):
            level = _optimization_level_zero(extra)
            if level is not None:
                found.append(
                    UnsafeSetting(
                        f"serve.{EXTRA_ARGS}", level, "optimization level 0 compiles nothing: nothing to bless"
                    )
                )
        return found

    # --- launching ---------------------------------------------------------------------------------

    def launch(self, profile: Profile, *, port: int, debug: bool = False) -> EngineLaunch:
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
        """
        serve = self.normalize_serve(profile.serve, where=profile.label)
        docker = profile.runtime_kind == "docker"
        env: dict[str, str] = dict(profile.env)
        model = profile.model
        if model.source == "huggingface":
            revision = model.revision or ""
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
            model_args: list[str] = [model.id, "--revision", revision]
        elif model.source == "local":
            assert model.path is not None  # profile validation guarantees it
            model_args = [MODEL_MOUNT_PATH if docker else model.path]
        else:
            raise InputInvalidError(
                f"{profile.label}: model.source {model.source!r}: vLLM serves a Hugging Face id or a local directory",
                hint="use model.source = 'huggingface' (with a pinned revision) or 'local' (with model.path)",
            )
        if debug:
            serve["enforce_eager"] = True
        python = "python3" if docker else (profile.python or "python3")
        command = [
            python, "-m", "vllm.entrypoints.cli.main", "serve", *model_args,
            "--host", "0.0.0.0" if docker else "127.0.0.1",
            "--port", str(port),
        ]  # fmt: skip
        for key, spec in SERVE_ARGS.items():
            if key in serve:
                command.extend(_render_arg(spec, serve[key]))
        if COMPILATION_CONFIG in serve:
            command.extend(["--compilation-config", compilation_config_json(serve[COMPILATION_CONFIG])])
        command.extend(serve.get(EXTRA_ARGS, []))
        # Pinned values last: the profile cannot move the cache or HOME (both are vLLM key inputs).
        env.update(_PINNED_ENV)
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
        """Require the AOT model, the backbone artifacts and ``cache_key_factors.json`` for the same ranks.

        ``engine_keys`` records vLLM's own keys: ``backbone_keys`` (10 hex), ``aot_keys`` (64 hex)
        and ``ranks`` (``rank_<R>_<D>``), in the shape :meth:`read_log` returns them.
        """
        models: dict[str, set[str]] = {}
        backbone: dict[str, set[str]] = {}
        factors: set[tuple[str, str]] = set()
        artifacts: list[str] = []
        for entry in listing.files:
            path = entry.path
            if match := _AOT_MODEL.fullmatch(path):
                models.setdefault(match["rank"], set()).add(match["key"])
                artifacts.append(path)
            elif match := _COMPONENT_ARTIFACT.fullmatch(path):
                if match["component"] == _BACKBONE:
                    backbone.setdefault(match["rank"], set()).add(match["key"])
                artifacts.append(path)
            elif match := _KEY_FACTORS.fullmatch(path):
                if match["component"] == _BACKBONE:
                    factors.add((match["key"], match["rank"]))
                artifacts.append(path)
            elif _COMPILE_INDEX.fullmatch(path):
                artifacts.append(path)
        missing: list[str] = []
        if not models:
            missing.append("torch_compile_cache/torch_aot_compile/<64 hex>/rank_<R>_<D>/model (the AOT-compiled model)")
        if not backbone:
            missing.append("torch_compile_cache/<10 hex>/rank_<R>_<D>/backbone/artifact_* (Inductor artifacts)")
        for rank, keys in sorted(backbone.items()):
            missing.extend(
                f"torch_compile_cache/{key}/{rank}/backbone/cache_key_factors.json"
                for key in sorted(keys)
                if (key, rank) not in factors
            )
        if models and backbone and set(models) != set(backbone):
            missing.append(
                f"the same ranks in both trees (AOT models for {sorted(models)}, "
                f"backbone artifacts for {sorted(backbone)})"
            )
        if missing:
            raise BootstrapFailedError(
                f"the bootstrap did not write vLLM's compile artifacts: missing {'; '.join(missing)}. "
                f"Expected {_EXPECTED_LAYOUT}; found {_describe_found(listing)}",
                hint="read the bootstrap log in the rejected evidence: vLLM must compile with "
                "compilation mode VLLM_COMPILE and VLLM_USE_AOT_COMPILE on (the default with torch >= 2.10)",
                details={"missing": missing},
            )
        engine_keys = {
            "backbone_keys": sorted(set().union(*backbone.values())),
            "aot_keys": sorted(set().union(*models.values())),
            "ranks": sorted(set(models) | set(backbone)),
        }
        return ArtifactSummary(artifacts=tuple(sorted(artifacts)), engine_keys=engine_keys)

    def read_log(self, log: str) -> LogSignals:
        """Markers (whole lines), timings (seconds) and vLLM's keys from a vLLM server log.

        ``engine_keys``: ``cache_dirs`` (every ``Using cache directory:`` path), ``backbone_keys``
        (the 10-hex dirs in them), ``aot_keys`` (64-hex dirs named by load/save lines) and ``ranks``.
        """
        load: list[str] = []
        compile_: list[str] = []
        fatal: list[str] = []
        sums: dict[str, float] = {}
        cache_dirs: list[str] = []
        backbone_keys: set[str] = set()
        aot_keys: set[str] = set()
        ranks: set[str] = set()
        aot_load_paths: list[str] = []
        rules = self.version_rules
        for line in log.splitlines():
            marked = False
            if any(marker in line for marker in rules.load_markers):
                load.append(line.strip())
                marked = True
                if aot_load := _AOT_LOAD_PATH.search(line):
                    aot_load_paths.append(aot_load["path"])
            elif any(marker in line for marker in rules.compile_markers):
                compile_.append(line.strip())
                marked = True
            elif any(marker in line for marker in rules.fatal_markers):
                fatal.append(line.strip())
            if marked:
                for match in _AOT_IN_PATH.finditer(line):
                    aot_keys.add(match["key"])
                    ranks.add(match["rank"])
            if using := _USING_CACHE_DIR.search(line):
                cache_dirs.append(using["path"])
                if backbone := _BACKBONE_IN_PATH.search(using["path"] + "/"):
                    backbone_keys.add(backbone["key"])
                    ranks.add(backbone["rank"])
            for timing_rule in rules.timings:
                if timing := next((m for p in timing_rule.patterns if (m := p.search(line))), None):
                    seconds = float(timing["s"])
                    name = timing_rule.name
                    sums[name] = sums.get(name, 0.0) + seconds if timing_rule.combine == "sum" else seconds
        timings = {name: round(value, 6) for name, value in sums.items()}
        keys: dict[str, Any] = {
            "cache_dirs": list(dict.fromkeys(cache_dirs)),
            "backbone_keys": sorted(backbone_keys),
            "aot_keys": sorted(aot_keys),
            "ranks": sorted(ranks),
            "aot_load_paths": list(dict.fromkeys(aot_load_paths)),
        }
        return LogSignals(tuple(load), tuple(compile_), tuple(fatal), timings, keys)

    def drift_reasons(self, blessed_keys: Mapping[str, Any], log_keys: Mapping[str, Any]) -> list[str]:
        """Why a trial's or a serve's log shows vLLM using other keys than the blessing (empty: none).

        ``blessed_keys``: the manifest's ``artifacts.engine_keys`` (from :meth:`summarize_artifacts`);
        ``log_keys``: :meth:`read_log`'s ``engine_keys``. A key the blessing does not hold means
        vLLM hashed something differently (env, HOME, config, code, compiler) and compiled into a
        new directory: a silent recompile under a config bless considers equal.
        """
        reasons: list[str] = []
        blessed_backbone = set(_strings(blessed_keys.get("backbone_keys")))
        logged_backbone = _strings(log_keys.get("backbone_keys"))
        cache_dirs = _strings(log_keys.get("cache_dirs"))
        if not logged_backbone:
            reasons.append(
                "the engine log has no 'Using cache directory:' line with a vLLM cache key: "
                "cannot confirm vLLM used the blessed cache"
            )
        foreign = [key for key in logged_backbone if key not in blessed_backbone]
        if foreign:
            reasons.append(
                f"vLLM used cache key(s) {', '.join(foreign)} (Using cache directory: {', '.join(cache_dirs)}), "
                f"the blessing holds {', '.join(sorted(blessed_backbone)) or 'none'}: vLLM hashed this start "
                "differently (env, HOME, config, code or compiler) and compiled into a new directory"
            )
        blessed_aot = set(_strings(blessed_keys.get("aot_keys")))
        foreign_aot = [key for key in _strings(log_keys.get("aot_keys")) if key not in blessed_aot]
        if foreign_aot:
            reasons.append(
                f"vLLM named AOT key(s) {', '.join(foreign_aot)}, the blessing holds "
                f"{', '.join(sorted(blessed_aot)) or 'none'}: a different AOT compile key"
            )
        root = self.cache_mount_path.rstrip("/") + "/"
        outside = [path for path in cache_dirs if not path.startswith(root)]
        if outside:
            reasons.append(f"vLLM's cache directory {', '.join(outside)} is not under {self.cache_mount_path}")
        # The AOT artifact is what a replay must load, from the blessed tree and nowhere else.
        aot_loads = _strings(log_keys.get("aot_load_paths"))
        foreign_loads = [path for path in aot_loads if not path.startswith(root)]
        if foreign_loads:
            reasons.append(
                f"vLLM loaded its AOT compilation from {', '.join(foreign_loads)}, outside the blessed tree "
                f"at {self.cache_mount_path}"
            )
        if blessed_aot and not aot_loads:
            reasons.append(
                "the blessing holds an AOT-compiled model but the engine log has no 'Directly load AOT "
                "compilation from path' line under the blessed tree: the AOT artifact was not loaded"
            )
        return reasons

    def classify_upper(self, entries: Sequence[UpperEntry]) -> UpperVerdict:
        """Split overlay upper-layer writes into expected rewrites, new compiled artifacts and the rest.

        * expected: a *rewrite of an existing path* matching this vLLM version's rules
          (:data:`UPPER_RULES`; unknown versions use the newest known rules, conservatively);
        * new artifacts (a recompile or a re-keyed cache): any new path under ``torch_compile_cache/``
          (inductor entries, kernels, a new key dir), any written ``artifact_*`` or ``rank_*/model``,
          any written Triton ``.cubin``;
        * unexpected: everything else (other rewrites, deletions, writes outside the compile cache).
        """
        expected: list[str] = []
        new: list[str] = []
        unexpected: list[str] = []
        for entry in entries:
            path = entry.path
            if entry.kind == "deleted":
                unexpected.append(path)
            elif entry.kind == "rewritten" and any(rule.match(path) for rule in self.rules.expected_rewrites):
                expected.append(path)
            elif (
                (entry.kind == "new" and _TORCH_COMPILE_CACHE.match(path))
                or _COMPONENT_ARTIFACT.fullmatch(path)
                or _AOT_MODEL.fullmatch(path)
                or _CUBIN.fullmatch(path)
            ):
                new.append(path)
            else:
                unexpected.append(path)
        return UpperVerdict(expected_rewrites=tuple(expected), new_artifacts=tuple(new), unexpected=tuple(unexpected))


# --- helpers ---------------------------------------------------------------------------------------


def compilation_config_json(config: Mapping[str, Any]) -> str:
    """The ``--compilation-config`` value: compact JSON with sorted keys (same dict, same argv)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _strings(value: Any) -> list[str]:
    if isinstance(value, list | tuple):
        return [item for item in value if isinstance(item, str)]
    return []


def _check_value(where: str, value: Any, spec: _Arg) -> Any:
    """Type and bounds of one scalar argument; returns it unchanged."""
    if spec.kind == "bool":
        if not isinstance(value, bool):
            raise InputInvalidError(f"{where}: expected true or false, got {value!r}")
        return value
    if spec.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputInvalidError(f"{where}: expected an integer, got {value!r}")
    elif spec.kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputInvalidError(f"{where}: expected a number, got {value!r}")
    elif not isinstance(value, str) or not value:
        raise InputInvalidError(f"{where}: expected a non-empty string, got {value!r}")
    if spec.choices and value not in spec.choices:
        raise InputInvalidError(f"{where}: {value!r} is not one of {', '.join(spec.choices)}")
    if spec.kind == "float":
        # Exclusive low bound: a zero memory fraction (or any zero-sized float) is never meant.
        low = spec.minimum if spec.minimum is not None else float("-inf")
        high = spec.maximum if spec.maximum is not None else float("inf")
        if not low < value <= high:
            raise InputInvalidError(f"{where}: {value} is outside ({low:g}, {high:g}]")
    if spec.kind == "int":
        low = spec.minimum if spec.minimum is not None else float("-inf")
        high = spec.maximum if spec.maximum is not None else float("inf")
        if not low <= value <= high:
            raise InputInvalidError(f"{where}: {value} is outside {low:g}..{high:g}")
    return value


def _render_arg(spec: _Arg, value: Any) -> list[str]:
    if spec.kind == "bool":
        # vLLM's bool engine args are BooleanOptionalAction: --x / --no-x (stated false must be said).
        return [spec.flag] if value else ["--no-" + spec.flag[2:]]
    if isinstance(value, float):
        return [spec.flag, repr(value)]
    return [spec.flag, str(value)]


def _json_value(where: str, value: Any) -> Any:
    """A JSON-representable copy of a TOML value (dates and times are refused)."""
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise InputInvalidError(f"{where}: NaN and infinity are not valid")
        return value
    if isinstance(value, list):
        return [_json_value(f"{where}[{index}]", item) for index, item in enumerate(value)]
    if isinstance(value, Mapping):
        return {str(key): _json_value(f"{where}.{key}", item) for key, item in value.items()}
    raise InputInvalidError(f"{where}: {type(value).__name__} values cannot be passed to vLLM")


def _int_list(where: str, value: Any, *, allow: tuple[str, ...] = ()) -> list[Any]:
    if not isinstance(value, list):
        raise InputInvalidError(f"{where}: expected a list, got {value!r}")
    for item in value:
        if isinstance(item, str) and item in allow:
            continue
        if isinstance(item, bool) or not isinstance(item, int) or item < 1:
            extra = f" or {', '.join(repr(a) for a in allow)}" if allow else ""
            raise InputInvalidError(f"{where}: expected positive integers{extra}, got {item!r}")
    if len(set(value)) != len(value):
        raise InputInvalidError(f"{where}: {value!r} lists a size twice")
    return list(value)


def _normalize_compilation_config(value: Any, *, where: str) -> dict[str, Any]:
    """Validate the keys this adapter knows and canonicalize them; pass the others through.

    Canonical forms: ``mode`` as its integer (``"VLLM_COMPILE"`` and ``3`` hash alike),
    ``cudagraph_mode`` upper case, ``cudagraph_capture_sizes`` and ``compile_sizes`` sorted.
    vLLM treats both size lists as sets (it sorts capture sizes and de-duplicates compile sizes),
    so their order is not configuration: sorting keeps a reordered profile on the same hash.
    Other lists keep their order (``compile_ranges_split_points``, ``custom_ops`` where
    ``all,-op`` is order-sensitive): a reorder there only costs a spurious mismatch, never a wrong hit.
    Keys this adapter does not model are passed through verbatim (JSON values) and hashed; vLLM's
    CompilationConfig forbids unknown fields, so a typo fails at the bootstrap, loudly.
    """
    if not isinstance(value, Mapping):
        raise InputInvalidError(f"{where}: expected a table, got {value!r}")
    config = _json_value(where, value)
    assert isinstance(config, dict)
    if "cache_dir" in config:
        raise InputInvalidError(
            f"{where}.cache_dir: not allowed: it moves vLLM's compile cache out of VLLM_CACHE_ROOT, "
            "which bless pins and blesses",
            hint="remove it; bless mounts the blessed cache at VLLM_CACHE_ROOT",
        )
    if "level" in config:
        raise InputInvalidError(
            f"{where}.level: deprecated by vLLM; use mode", hint="mode = 'VLLM_COMPILE' (or 3) compiles and caches"
        )
    if "mode" in config:
        mode = config["mode"]
        if isinstance(mode, str) and mode.upper() in COMPILATION_MODES:
            config["mode"] = COMPILATION_MODES[mode.upper()]
        elif isinstance(mode, bool) or not isinstance(mode, int) or mode not in COMPILATION_MODES.values():
            raise InputInvalidError(
                f"{where}.mode: {mode!r} is not a compilation mode",
                hint=f"one of {', '.join(COMPILATION_MODES)} (or 0-3)",
            )
    if "cudagraph_mode" in config:
        graph_mode = config["cudagraph_mode"]
        if not isinstance(graph_mode, str) or graph_mode.upper() not in CUDAGRAPH_MODES:
            raise InputInvalidError(
                f"{where}.cudagraph_mode: {graph_mode!r} is not a CUDA graph mode",
                hint=f"one of {', '.join(CUDAGRAPH_MODES)}",
            )
        config["cudagraph_mode"] = graph_mode.upper()
    if "cudagraph_capture_sizes" in config:
        config["cudagraph_capture_sizes"] = sorted(
            _int_list(f"{where}.cudagraph_capture_sizes", config["cudagraph_capture_sizes"])
        )
    if "compile_sizes" in config:
        sizes = _int_list(f"{where}.compile_sizes", config["compile_sizes"], allow=("cudagraph_capture_sizes",))
        config["compile_sizes"] = sorted(
            sizes, key=lambda item: (isinstance(item, str), item if isinstance(item, int) else 0)
        )
    if "compile_ranges_split_points" in config:
        config["compile_ranges_split_points"] = _int_list(
            f"{where}.compile_ranges_split_points", config["compile_ranges_split_points"]
        )
    for key in ("max_cudagraph_capture_size", "cudagraph_num_of_warmups"):
        if key in config and (isinstance(config[key], bool) or not isinstance(config[key], int) or config[key] < 0):
            raise InputInvalidError(f"{where}.{key}: expected a non-negative integer, got {config[key]!r}")
    for key in _CC_BOOLS:
        if key in config and not isinstance(config[key], bool):
            raise InputInvalidError(f"{where}.{key}: expected true or false, got {config[key]!r}")
    for key in _CC_STR_LISTS:
        if key in config and (
            not isinstance(config[key], list) or not all(isinstance(item, str) for item in config[key])
        ):
            raise InputInvalidError(f"{where}.{key}: expected a list of strings, got {config[key]!r}")
    for key in _CC_TABLES:
        if key in config and not isinstance(config[key], dict):
            raise InputInvalidError(f"{where}.{key}: expected a table, got {config[key]!r}")
    for key in ("backend", "compile_cache_save_format", "debug_dump_path"):
        if key in config and not isinstance(config[key], str):
            raise InputInvalidError(f"{where}.{key}: expected a string, got {config[key]!r}")
    if config.get("compile_cache_save_format", "binary") not in ("binary", "unpacked"):
        raise InputInvalidError(f"{where}.compile_cache_save_format: expected 'binary' or 'unpacked'")
    return {key: config[key] for key in sorted(config)}


def _flag_of(token: str) -> str:
    return token.split("=", 1)[0]


def _normalize_extra_args(value: Any, *, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise InputInvalidError(f"{where}: expected a list of non-empty strings, got {value!r}")
    for token in value:
        flag = _flag_of(token)
        if flag in _MANAGED_FLAGS or flag.startswith(("--compilation-config.", "-cc.")):
            modeled = [key for key, spec in SERVE_ARGS.items() if flag in (spec.flag, "--no-" + spec.flag[2:])]
            if modeled:
                hint = f"use serve.{modeled[0]} instead"
            elif flag.startswith(("--compilation-config", "-cc")):
                hint = f"use the serve.{COMPILATION_CONFIG} table instead"
            elif flag in ("--api-key", "--hf-token"):
                hint = "secrets never go into a profile (extra_args are hashed and written to the manifest)"
            else:
                hint = "bless sets it itself (model, host, port, revision)"
            raise InputInvalidError(f"{where}: {token!r} is not allowed here", hint=hint)
    return list(value)


def _is_mode_none(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value == 0
    return isinstance(value, str) and value.strip().upper() in ("0", "NONE")


def _optimization_level_zero(args: Sequence[str]) -> str | None:
    """The spelling of an optimization level 0 in ``args`` (``-O0``, ``-O 0``, ``--optimization-level=0``, ...)."""
    for index, token in enumerate(args):
        following = args[index + 1] if index + 1 < len(args) else ""
        if token in ("-O", "--optimization-level") and following in _NO_COMPILE_OPT_LEVELS:
            return f"{token} {following}"
        for prefix in ("-O", "-O=", "--optimization-level="):
            if token.startswith(prefix) and token[len(prefix) :] in _NO_COMPILE_OPT_LEVELS:
                return token
        # Older vLLM: -O.<key>=<value> addresses the compilation config.
        if re.fullmatch(r"^-O\.(mode|level)=(0|NONE)$", token, re.IGNORECASE):
            return token
    return None


def _describe_found(listing: TreeListing) -> str:
    """A short account of what a failed bootstrap left: file count and top-level entries."""
    tops = sorted({entry.path.split("/", 1)[0] for entry in listing.files})
    compile_dirs = sorted(
        {
            "/".join(entry.path.split("/")[:3])
            for entry in listing.files
            if entry.path.startswith("torch_compile_cache/")
        }
    )
    text = f"{len(listing.files)} file(s)"
    if tops:
        text += f" under {', '.join(tops[:8])}"
    if compile_dirs:
        text += f"; compile dirs: {', '.join(compile_dirs[:8])}"
    return text
