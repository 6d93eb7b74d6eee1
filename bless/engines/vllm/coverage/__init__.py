"""vLLM's lazily compiled kernel families and the classes of compile keys a configuration can reach.

One module per concern: :mod:`.moe` (the fused-MoE kernel per token count, bf16 and block FP8), :mod:`.sampler`
(sampling modes x batches), :mod:`.traffic` (structured outputs, chat and tool calls), this module the FP8 GEMM
backends, the release's other families, the plan and the model directory's files it reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bless.core.coverage import CoverageFamily, CoveragePlan
from bless.engines.vllm.coverage.base import (
    GPU_PROVEN_RELEASES,
    MODELED_RELEASES,
    NESTED_CONFIGS,
    env_on,
    is_moe,
)
from bless.engines.vllm.coverage.moe import (
    MoeQuant,
    config_changes,
    config_file_name,
    default_config,
    describe_key,
    device_file_name,
    fused_moe_family,
    fused_moe_key,
    fused_moe_splits,
    moe_quantization,
    nearest_config,
    tuned_table,
)
from bless.engines.vllm.coverage.ranks import MoeShape, moe_rank_shapes
from bless.engines.vllm.coverage.sampler import sampler_family
from bless.engines.vllm.coverage.traffic import chat_family, model_runner, structured_outputs_family
from bless.errors import InputInvalidError
from bless.system.user_files import read_input

__all__ = [
    "GPU_PROVEN_RELEASES",
    "MODELED_RELEASES",
    "MoeQuant",
    "MoeShape",
    "config_changes",
    "config_file_name",
    "config_problem",
    "coverage_plan",
    "default_config",
    "describe_key",
    "device_file_name",
    "fused_moe_key",
    "fused_moe_splits",
    "is_moe",
    "model_runner",
    "moe_quantization",
    "moe_rank_shapes",
    "nearest_config",
    "read_chat_template",
    "read_model_config",
    "tuned_table",
]


def _flashinfer_selectors(env: Mapping[str, str]) -> list[str]:
    """The env settings that select FlashInfer (vLLM 0.26 envs.py: the sampler is on unless set to 0)."""
    selected: dict[str, bool] = {
        "VLLM_ATTENTION_BACKEND": "FLASHINFER" in env.get("VLLM_ATTENTION_BACKEND", "").upper(),
        "VLLM_USE_FLASHINFER_SAMPLER": env.get("VLLM_USE_FLASHINFER_SAMPLER", "1") not in ("0", ""),
        "VLLM_USE_FLASHINFER_MOE_FP16": env.get("VLLM_USE_FLASHINFER_MOE_FP16", "") not in ("0", ""),
    }
    return [name for name, on in selected.items() if on]


FP8_LINEAR_SOURCE = (
    "vllm/model_executor/kernels/linear/__init__.py (_POSSIBLE_FP8_BLOCK_KERNELS: FlashInfer+DeepGEMM, DeepGEMM, "
    "CUTLASS, Marlin, Triton), vllm/utils/deep_gemm.py (is_deep_gemm_supported: the vendored "
    "vllm.third_party.deep_gemm), vllm/model_executor/warmup/deep_gemm_warmup.py (VLLM_DEEP_GEMM_WARMUP)"
)


def block_fp8(config: Mapping[str, Any] | None, serve: Mapping[str, Any]) -> bool:
    """Whether the weights are block-quantized FP8 (config.json's quantization_config), MoE or dense."""
    quantization = (config or {}).get("quantization_config")
    return (
        isinstance(quantization, Mapping)
        and quantization.get("quant_method") == "fp8"
        and isinstance(quantization.get("weight_block_size"), list)
        and serve.get("quantization") in (None, "fp8")
    )


def fp8_linear_family(
    release: str | None,
    config: Mapping[str, Any] | None,
    serve: Mapping[str, Any],
    env: Mapping[str, str],
    capability: str | None,
) -> CoverageFamily:
    """The block-FP8 GEMM of every linear layer: CUTLASS (precompiled) or DeepGEMM (JIT per shape)."""

    def family(reachable: bool, modeled: bool, reason: str) -> CoverageFamily:
        return CoverageFamily("fp8_linear", reachable, modeled, reason, FP8_LINEAR_SOURCE)

    if not block_fp8(config, serve):
        return family(False, True, "the weights are not block-quantized FP8")
    if release != "0.26.0":
        return family(True, False, f"no FP8 GEMM coverage model for vLLM {release or 'of unknown version'}")
    if capability not in ("9.0", "10.0", "10.3"):
        return family(True, False, f"the block-FP8 GEMM picked on compute capability {capability} is not modeled")
    if env_on(env, "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER", "1") and capability == "9.0":
        return family(
            True,
            False,
            "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER is on (the default): where FlashInfer is installed its block-scale "
            "GEMM JIT-compiles; set it to 0",
        )
    if env_on(env, "VLLM_USE_DEEP_GEMM", "1"):
        warmup = env.get("VLLM_DEEP_GEMM_WARMUP", "relax")
        if warmup == "full":
            return family(
                True,
                True,
                "DeepGEMM (vendored in vLLM's wheel) JIT-compiles per M; VLLM_DEEP_GEMM_WARMUP=full compiles every M "
                "up to max_num_batched_tokens at every start, so nothing compiles lazily",
            )
        return family(
            True,
            False,
            f"DeepGEMM JIT-compiles per M and VLLM_DEEP_GEMM_WARMUP={warmup} warms a heuristic subset (vLLM: "
            "'no guarantees'): set VLLM_DEEP_GEMM_WARMUP=full, or VLLM_USE_DEEP_GEMM=0 for CUTLASS",
        )
    return family(
        True,
        True,
        "VLLM_USE_DEEP_GEMM=0: CUTLASS's block-scaled GEMM, precompiled in vLLM's _C (nothing compiles); "
        "activations quantized per 128-group by the _C op or the compiled graph",
    )


#: The release's other lazily compiled families: name, source, and when a configuration reaches them.
#: Each predicate gets (serve, env, config) and returns None (not reachable, with the default reason)
#: or the reason it is reached (then a gap: not modeled).
Reach = Callable[[Mapping[str, Any], Mapping[str, str], Mapping[str, Any]], str | None]
OTHER_FAMILIES: tuple[tuple[str, str, str, Reach], ...] = (
    (
        "inductor_graph",
        "vllm/compilation (the model's torch.compile graph, AOT)",
        "compiled for the configured compile ranges at startup and loaded AOT by every later start; a start "
        "that compiles it again fails its trial",
        lambda serve, env, config: None,
    ),
    (
        "flashinfer_jit",
        "flashinfer (JIT modules, autotune): vllm/v1/attention/backends/flashinfer.py, "
        "vllm/v1/sample/ops/topk_topp_sampler.py",
        "FlashInfer is not selected (attention backend and sampler; set VLLM_USE_FLASHINFER_SAMPLER=0 "
        "where FlashInfer is installed)",
        lambda serve, env, config: (
            f"FlashInfer selected by {', '.join(_flashinfer_selectors(env))}" if _flashinfer_selectors(env) else None
        ),
    ),
    (
        "spec_decode",
        "vllm/v1/spec_decode/utils.py, vllm/v1/sample/rejection_sampler.py (Triton)",
        "no speculative decoding configured",
        lambda serve, env, config: "speculative decoding" if serve.get("speculative_config") else None,
    ),
    (
        "lora",
        "vllm/lora/ops/triton_ops (Triton, per shape)",
        "LoRA is not enabled",
        lambda serve, env, config: "LoRA enabled" if serve.get("enable_lora") is True else None,
    ),
    (
        "model_specific",
        "vllm/model_executor/layers/mamba, lightning_attn.py, vllm/models/deepseek_v32, deepseek_v4, "
        "minimax_m3 (Triton)",
        "the architecture uses none of the model-specific Triton kernels (Mamba, lightning attention, "
        "DeepSeek V3.2/V4 indexers, MiniMax M3)",
        lambda serve, env, config: (
            "the architecture has model-specific Triton kernels"
            if any(
                word in str(arch).lower()
                for arch in config.get("architectures") or []
                for word in ("mamba", "minimax", "deepseekv32", "deepseekv4", "jamba", "nemotronh", "lightning")
            )
            else None
        ),
    ),
)


def coverage_plan(
    release: str | None,
    model_config: Mapping[str, Any] | None,
    serve: Mapping[str, Any],
    env: Mapping[str, str],
    gpu_name: str | None,
    model_id: str,
    vocab_size: int | None,
    *,
    capability: str | None = None,
    chat_template: bool | None = None,
) -> CoveragePlan:
    """The coverage plan of one vLLM configuration (pure: everything it reads is passed in).

    ``capability`` is the GPU's compute capability (``9.0``); ``chat_template`` whether the model has one
    (None: unknown).
    """
    fused, token_range = fused_moe_family(release, model_config, serve, env, gpu_name, capability)
    families = [
        fused,
        sampler_family(serve, release, gpu_name, vocab_size),
        structured_outputs_family(release, model_config, serve, env),
        chat_family(release, serve, chat_template),
        fp8_linear_family(release, model_config, serve, env, capability),
    ]
    config = model_config or {}
    for name, source, unreachable, reached in OTHER_FAMILIES:
        why = reached(serve, env, config)
        if why is None:
            families.append(CoverageFamily(name, False, True, unreachable, source))
        else:
            families.append(CoverageFamily(name, True, False, f"{why}: not modeled", source))
    vocab = vocab_size if vocab_size and vocab_size > 3000 else None
    notes = () if vocab else ("the vocabulary size is unknown: coverage prompts use token ids 1000..1999",)
    return CoveragePlan(
        engine="vllm",
        model=model_id,
        families=tuple(families),
        token_range=token_range,
        prompt_tokens=(1000, (vocab - 1000) if vocab else 2000),
        notes=notes,
    )


#: How deep config.json may nest (a real one nests three or four levels: text_config, rope_scaling, ...).
MAX_CONFIG_DEPTH = 32
_CONFIG_HINT = "a model directory's config.json is the model's own JSON object (architectures: a list of names)"


def _local_model_dir(model: Mapping[str, Any]) -> Path | None:
    path = model.get("path")
    if model.get("source") != "local" or not isinstance(path, str):
        return None
    return Path(path)


def read_model_config(model: Mapping[str, Any]) -> dict[str, Any] | None:
    """A local model's ``config.json``, from the directory its factor names; None when there is none.

    Only the local runtime's model factor has that path (the real directory whose content is hashed, so
    what is read here is what was hashed). Read through the one bounded reader of user files (a FIFO or a
    device there is refused). A file that is not JSON, not an object, nested past :data:`MAX_CONFIG_DEPTH`,
    or whose ``architectures`` or nested language-model config has the wrong type is refused
    (InputInvalidError): the coverage plan must never be guessed from a config it cannot read.
    """
    directory = _local_model_dir(model)
    if directory is None:
        return None
    config_path = directory / "config.json"
    if not os.path.lexists(config_path):
        return None
    data = read_input(config_path, what="model config", hint=_CONFIG_HINT)
    try:
        config = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise InputInvalidError(
            f"{config_path}: not JSON ({str(exc)[:200] if isinstance(exc, ValueError) else 'nested too deep'})",
            hint=_CONFIG_HINT,
        ) from None
    problem = config_problem(config)
    if problem:
        raise InputInvalidError(f"{config_path}: {problem}", hint=_CONFIG_HINT)
    assert isinstance(config, dict)
    return config


def config_problem(config: Any) -> str | None:
    """What makes a parsed config.json unusable for the coverage model, or None."""
    if not isinstance(config, dict):
        return f"a JSON {type(config).__name__}, not an object"
    stack: list[tuple[Any, int]] = [(config, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_CONFIG_DEPTH:
            return f"nested deeper than {MAX_CONFIG_DEPTH} levels"
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((child, depth + 1) for child in children)
    levels: list[tuple[str, dict[str, Any]]] = [("", config)]
    while levels:
        where, level = levels.pop()
        architectures = level.get("architectures")
        if architectures is not None and not (
            isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)
        ):
            return f"{where}architectures is not a list of names"
        for name in NESTED_CONFIGS:
            nested = level.get(name)
            if nested is None:
                continue
            if not isinstance(nested, dict):
                return f"{where}{name} is not an object"
            levels.append((f"{where}{name}.", nested))
    return None


#: Where a model directory keeps its chat template (transformers: in tokenizer_config.json, or a file beside it).
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def read_chat_template(model: Mapping[str, Any], serve: Mapping[str, Any]) -> bool | None:
    """Whether the model has a chat template (``--chat-template`` counts); None when it cannot be known."""
    if serve.get("chat_template"):
        return True
    directory = _local_model_dir(model)
    if directory is None:
        return None
    if any(os.path.lexists(directory / name) for name in CHAT_TEMPLATE_FILES):
        return True
    tokenizer_config = directory / "tokenizer_config.json"
    if not os.path.lexists(tokenizer_config):
        return False
    data = read_input(tokenizer_config, what="tokenizer config", hint="tokenizer_config.json is a JSON object")
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):
        hint = "tokenizer_config.json is a JSON object"
        raise InputInvalidError(f"{tokenizer_config}: not JSON", hint=hint) from None
    return isinstance(parsed, dict) and bool(parsed.get("chat_template"))
