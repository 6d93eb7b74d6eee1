"""vLLM env policy: which profile env names are hashed, recorded-only or secret, which are unsafe, which are pinned."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from bless.engines.base import EnvPolicy, UnsafeSetting
from bless.engines.vllm import versions
from bless.engines.vllm.paths import CACHE_MOUNT_PATH

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


#: Names some vLLM release hashes into its compile key that a secret word matches (``TOKEN``): tuning
#: knobs, not secrets. Treating them as secrets would drop them from the hash and let two configs vLLM
#: tells apart hash alike, so they stay hashed. A test lists every hashed name that looks secret and
#: requires it here or in :data:`VLLM_HASHED_SECRETS` (reviewed, so a new release's names are decided).
VLLM_NOT_SECRETS = frozenset(
    {
        "VLLM_COHERE2_ATTN_MOE_DUAL_STREAM_TOKEN_THRESHOLD",
        "VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD",
        "VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD",
    }
)
#: Names vLLM reads that are real secrets (credentials): never hashed, never written, although some
#: release hashes them. Their values cannot change compiled code.
VLLM_HASHED_SECRETS = frozenset({"VLLM_API_KEY", "S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY"})


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


ENV_POLICY = VllmEnvPolicy(
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
    for version in versions.known_versions()
    for name in versions.all_rules()[version].hashed_env
    if ENV_POLICY.is_ignored(name) and not ENV_POLICY.is_secret(name)
)
#: Env Triton reads into every kernel's compile options (``enable_fp_fusion``): each changes the cache key of every
#: Triton kernel and its numerics (mul+add contracted into FMA or not). ``TRITON_DEFAULT_FP_FUSION`` sets the default
#: a kernel did not choose; ``TRITON_FORCE_DISABLE_FP_FUSION=1`` turns fusion off even where a kernel asks for it
#: (Triton 3.9, which turns implicit fusion off by default: triton-lang/triton#11270). Hashed whatever an ignore
#: pattern says, like the names vLLM hashes.
TRITON_COMPILE_ENV = frozenset({"TRITON_DEFAULT_FP_FUSION", "TRITON_FORCE_DISABLE_FP_FUSION"})
ENV_POLICY = dataclasses.replace(ENV_POLICY, always_hashed=VLLM_HASHED_DESPITE_PATTERN | TRITON_COMPILE_ENV)

# Env the adapter pins on every start. Not hashed as env: they are adapter constants (a change
# bumps ``adapter_version``) or already factors (``cache.mount_path``, ``cache.home``).
PINNED_ENV = {
    "PYTHONUNBUFFERED": "1",
    # Never reach the network: weights come from a read-only mount, and a download at start would
    # make a start depend on the hub's state. vLLM usage stats would phone home.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # Triton keeps its autotuning results (a benchmark-driven, run-to-run varying choice of kernel config,
    # and so of numerics) in its cache dir, which bless points into the blessed tree: the bootstrap's
    # choice is blessed, and trials and serving replay it instead of benchmarking again.
    "TRITON_CACHE_AUTOTUNING": "1",
}


def unsafe_env_settings(env: Mapping[str, str]) -> list[UnsafeSetting]:
    """Debug, cache-disabling and quiet-logging env settings (by name, sorted)."""
    found: list[UnsafeSetting] = []
    for name, value in sorted(env.items()):
        if name in _UNSAFE_FLAGS and value.strip() not in _FALSY:
            found.append(UnsafeSetting(name, value, _UNSAFE_FLAGS[name]))
        elif name in _UNSAFE_IF_SET and value.strip():
            found.append(UnsafeSetting(name, value, _UNSAFE_IF_SET[name]))
        elif name == "VLLM_LOGGING_LEVEL" and value.strip().upper() in _QUIET_LOG_LEVELS:
            found.append(UnsafeSetting(name, value, "hides the INFO load/save markers: reuse cannot be proven"))
        elif name == "VLLM_CONFIGURE_LOGGING" and value.strip() == "0":
            found.append(UnsafeSetting(name, value, "turns vLLM's logging off: reuse cannot be proven"))
    return found
