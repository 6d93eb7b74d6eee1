"""What every family of vLLM's coverage model shares: the releases modeled, MoE detection, switch and flag readers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The releases whose coverage model this module implements (their tuned tables are in moe_configs.json, their
#: per-release facts in :mod:`bless.engines.vllm.coverage_rules`).
MODELED_RELEASES = ("0.26.0", "0.33.0")
#: The releases whose coverage model a GPU run has confirmed; the others are derived from the release's source only
#: (``bless engines`` and the docs say so).
GPU_PROVEN_RELEASES = ("0.26.0",)
#: MoE shapes by config.json field names: architectures -> (experts, top-k, intermediate size per expert).
MOE_FIELDS: Mapping[str, tuple[str, str, str]] = {
    "Qwen3MoeForCausalLM": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "Qwen2MoeForCausalLM": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "OlmoeForCausalLM": ("num_experts", "num_experts_per_tok", "intermediate_size"),
    "MixtralForCausalLM": ("num_local_experts", "num_experts_per_tok", "intermediate_size"),
}
#: Fields of config.json that make a model MoE whatever its architecture (an architecture not in MOE_FIELDS).
MOE_HINTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
#: Dtypes whose weights take the unquantized path (config dtype None: the tuned file has no dtype part).
UNQUANTIZED_DTYPES = frozenset({"bfloat16", "float16", "half", "float32", "float", "auto"})


#: Where a multimodal model's config.json nests its language model's (Llama 4, Qwen3-VL-MoE, ...).
NESTED_CONFIGS = ("text_config", "language_config", "llm_config")


def is_moe(config: Mapping[str, Any]) -> bool:
    """Whether a model's config.json describes a mixture of experts (its nested language model's too)."""
    architectures = config.get("architectures") or []
    nested = [config[name] for name in NESTED_CONFIGS if isinstance(config.get(name), Mapping)]
    return (
        any(a in MOE_FIELDS for a in architectures)
        or any(isinstance(config.get(name), int) and config.get(name) for name in MOE_HINTS)
        or any(is_moe(inner) for inner in nested)
    )


def env_on(env: Mapping[str, str], name: str, default: str) -> bool:
    """An int-valued vLLM switch (``bool(int(os.getenv(name, default)))``); a value that is no int counts as on."""
    value = env.get(name, default).strip()
    try:
        return bool(int(value))
    except ValueError:
        return True


def extra_flag(serve: Mapping[str, Any], flag: str) -> str | None:
    """``flag``'s value in the serve arguments' extra_args (``--flag=V`` or ``--flag V``; "" when bare), or None."""
    extra = serve.get("extra_args")
    if not isinstance(extra, list):
        return None
    for index, word in enumerate(extra):
        if isinstance(word, str) and (word == flag or word.startswith(flag + "=")):
            if "=" in word:
                return word.partition("=")[2]
            following = extra[index + 1] if index + 1 < len(extra) else ""
            return following if isinstance(following, str) and not following.startswith("--") else ""
    return None
