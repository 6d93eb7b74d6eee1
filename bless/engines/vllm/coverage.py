"""vLLM's lazily compiled kernel families and the classes of compile keys a configuration can reach.

Derived from vLLM 0.26.0's source (``vllm/model_executor/layers/fused_moe/fused_moe.py`` and
``experts/triton_moe.py``, ``config/vllm.py``, ``envs.py``) and Triton 3.6's specialization rule:

* **fused_moe** (Triton ``fused_moe_kernel``, unquantized weights). Per forward step vLLM picks a tile
  configuration for the step's token count M: the nearest key of the release's tuned file
  ``configs/E={E},N={N},device_name={device}.json`` (N = the MoE intermediate size per tensor-parallel
  rank; an H200-family device reads the H200 file), else ``get_default_config``. It runs two GEMMs
  (w13: A = M rows, top_k; w2: A = M*top_k rows, top_k 1), each a Triton compile specialized on its
  integer arguments: ``EM`` (the padded row count) and ``num_valid_tokens`` = M*top_k, each ``== 1``,
  divisible by 16, or neither. ``M*top_k*4 <= E`` takes the naive block assignment (no sorted ids,
  ``EM = M*top_k*BLOCK_SIZE_M``), a constexpr of its own. Every M with the same (config, naive,
  specializations of both GEMMs) compiles the same binaries: that is one class.
* Every other family the release holds, each with the condition under which a profile reaches it
  (:data:`OTHER_FAMILIES`): reached and not modeled is a gap.

Token counts M range over 1..``max_num_batched_tokens`` (one scheduler step, chunked prefill or not).
Up to the largest CUDA-graph capture size a step may run padded to a captured size (compiled at
startup), so each class's representative is its smallest M above that size where it has one.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from bless.core.coverage import CoverageClass, CoverageFamily, CoveragePlan, group_token_counts
from bless.system.user_files import read_input

#: The releases whose fused-MoE rule this module implements (their tuned tables are in moe_configs.json).
MODELED_RELEASES = ("0.26.0",)
FUSED_MOE_SOURCE = (
    "vllm/model_executor/layers/fused_moe/fused_moe.py (try_get_optimal_moe_config, get_default_config, "
    "invoke_fused_moe_triton_kernel, _prepare_expert_assignment)"
)
_DATA_FILE = "moe_configs.json"
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


def _flashinfer_selectors(env: Mapping[str, str]) -> list[str]:
    """The env settings that select FlashInfer (vLLM 0.26 envs.py: the sampler is on unless set to 0)."""
    selected = {
        "VLLM_ATTENTION_BACKEND": "FLASHINFER" in env.get("VLLM_ATTENTION_BACKEND", "").upper(),
        "VLLM_USE_FLASHINFER_SAMPLER": env.get("VLLM_USE_FLASHINFER_SAMPLER", "1") not in ("0", ""),
        "VLLM_USE_FLASHINFER_MOE_FP16": env.get("VLLM_USE_FLASHINFER_MOE_FP16", "") not in ("0", ""),
    }
    return [name for name, on in selected.items() if on]


@dataclass(frozen=True)
class MoeShape:
    """What the fused-MoE kernel of one rank sees: experts, top-k, N per rank, hidden size K."""

    experts: int
    top_k: int
    n_per_rank: int
    hidden: int


@dataclass(frozen=True)
class ServeShape:
    """The serve arguments the token-count range and the CUDA-graph padding depend on."""

    max_batched_tokens: int | None
    max_model_len: int | None
    capture_max: int


@functools.cache
def _tables() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(resources.files(__package__).joinpath(_DATA_FILE).read_text(encoding="utf-8"))
    return data


def tuned_table(release: str, file_name: str) -> dict[int, dict[str, int]] | None:
    """The release's tuned table for ``file_name`` (keys in file order), or None when it ships none."""
    entry = _tables().get(release)
    table = entry["tables"].get(file_name) if isinstance(entry, Mapping) else None
    if table is None:
        return None
    return {int(key): dict(value) for key, value in table.items()}


def device_file_name(gpu_name: str) -> str:
    """``torch.cuda.get_device_name()`` as vLLM writes it into config file names (H200 family: NVIDIA_H200)."""
    name = gpu_name.replace(" ", "_")
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def config_file_name(experts: int, n: int, gpu_name: str) -> str:
    """``get_config_file_name`` for unquantized weights."""
    return f"E={experts},N={n},device_name={device_file_name(gpu_name)}.json"


def default_config(m: int, experts: int) -> dict[str, int]:
    """vLLM 0.26 ``get_default_config`` for bf16/fp16 on CUDA (not ROCm, not batch-invariant)."""
    block_m = 16 if m <= 32 else 32 if m <= 96 else 64 if m <= 512 else 128
    return {
        "BLOCK_SIZE_M": block_m,
        "BLOCK_SIZE_N": 64 if m <= 64 else 128,
        "BLOCK_SIZE_K": 128 if m <= 64 else 64,
        "GROUP_SIZE_M": 16 if m // max(experts, 1) > 128 else 1,
        "SPLIT_K": 1,
        "num_warps": 4 if m <= 128 else 8,
        "num_stages": 4 if m <= 32 else 3,
    }


def nearest_config(table: Mapping[int, Mapping[str, int]], m: int) -> Mapping[str, int]:
    """``configs[min(configs.keys(), key=lambda x: abs(x - M))]``: the first key on a tie, as vLLM's min."""
    return table[min(table.keys(), key=lambda key: abs(key - m))]


def _specialization(value: int) -> str:
    """Triton's key for an integer argument: 1 is a constant, a multiple of 16 is 'divisible', else none."""
    return "1" if value == 1 else "D" if value % 16 == 0 else "N"


def fused_moe_key(m: int, shape: MoeShape, config: Mapping[str, int]) -> tuple[Any, ...]:
    """Everything a compile of both GEMMs of step size ``m`` is keyed on (besides the shape's constants)."""
    block_m = int(config["BLOCK_SIZE_M"])
    valid = m * shape.top_k
    naive = valid * 4 <= shape.experts
    if naive:
        em_w13 = em_w2 = valid * block_m
    else:
        sorted_size = valid + shape.experts * (block_m - 1)
        if valid < shape.experts:
            sorted_size = min(valid * block_m, sorted_size)
        em_w13 = min(sorted_size, m * shape.top_k * block_m) if m < block_m else sorted_size
        em_w2 = min(sorted_size, valid * block_m) if valid < block_m else sorted_size
    return (
        tuple(sorted(config.items())),
        naive,
        _specialization(em_w13),
        _specialization(em_w2),
        _specialization(valid),
    )


def describe_key(key: Hashable) -> str:
    """One class's compile key in words."""
    assert isinstance(key, tuple)
    config, naive, em_w13, em_w2, valid = key
    words = {"1": "== 1", "D": "divisible by 16", "N": "not divisible by 16"}
    tiles = ",".join(f"{name}={value}" for name, value in config)
    return (
        f"tiles {tiles}; {'naive' if naive else 'sorted'} block assignment; "
        f"EM(w13) {words[em_w13]}, EM(w2) {words[em_w2]}, num_valid_tokens {words[valid]}"
    )


def moe_shape(config: Mapping[str, Any], tensor_parallel: int) -> tuple[MoeShape | None, str]:
    """The fused-MoE shape of a model's config.json for one rank, or None and why it is not modeled."""
    architectures = config.get("architectures") or []
    fields = next((MOE_FIELDS[a] for a in architectures if a in MOE_FIELDS), None)
    if fields is None:
        return None, f"no MoE field layout known for {', '.join(map(str, architectures)) or 'this model'}"
    experts, top_k, intermediate = (config.get(name) for name in fields)
    hidden = config.get("hidden_size")
    values = (experts, top_k, intermediate, hidden)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        return None, f"config.json lacks positive integers for {', '.join(fields)}, hidden_size"
    assert isinstance(experts, int) and isinstance(top_k, int) and isinstance(intermediate, int)
    assert isinstance(hidden, int)
    if intermediate % tensor_parallel:
        return None, f"{fields[2]} {intermediate} does not split over tensor_parallel_size {tensor_parallel}"
    return MoeShape(experts, top_k, intermediate // tensor_parallel, hidden), ""


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


def serve_shape(serve: Mapping[str, Any]) -> ServeShape:
    """Token-count range and CUDA-graph capture limit from the canonical serve arguments (0.26's defaults)."""
    compilation = serve.get("compilation_config")
    compilation = compilation if isinstance(compilation, Mapping) else {}
    batched = serve.get("max_num_batched_tokens")
    model_len = serve.get("max_model_len")
    sizes = compilation.get("cudagraph_capture_sizes")
    mode = str(compilation.get("cudagraph_mode", "")).upper()
    if serve.get("enforce_eager") is True or mode == "NONE":
        capture = 0
    elif isinstance(sizes, list) and sizes:
        capture = max(int(s) for s in sizes)
    elif isinstance(compilation.get("max_cudagraph_capture_size"), int):
        capture = int(compilation["max_cudagraph_capture_size"])
    else:
        capture = min(int(serve.get("max_num_seqs") or 256) * 2, 512)
    return ServeShape(
        max_batched_tokens=int(batched) if isinstance(batched, int) else None,
        max_model_len=int(model_len) if isinstance(model_len, int) else None,
        capture_max=capture,
    )


def fused_moe_family(
    release: str | None,
    config: Mapping[str, Any] | None,
    serve: Mapping[str, Any],
    env: Mapping[str, str],
    gpu_name: str | None,
) -> tuple[CoverageFamily, tuple[int, int]]:
    """The fused-MoE family of one configuration, and the token-count range it spans."""

    def family(reachable: bool, modeled: bool, reason: str, classes: Any = ()) -> CoverageFamily:
        return CoverageFamily("fused_moe", reachable, modeled, reason, FUSED_MOE_SOURCE, tuple(classes))

    shape = serve_shape(serve)
    if config is None:
        return family(True, False, "the model's config.json cannot be read (a local model directory is needed)"), (1, 1)
    if not is_moe(config):
        return family(False, True, "the model has no experts"), (1, 1)
    if release not in MODELED_RELEASES:
        return family(True, False, f"no fused-MoE coverage model for vLLM {release or 'of unknown version'}"), (1, 1)
    dtype = str(serve.get("dtype", "auto"))
    if dtype not in UNQUANTIZED_DTYPES or serve.get("quantization") is not None or config.get("quantization_config"):
        return family(True, False, "quantized MoE weights take other kernels (fp8/int8/int4) not modeled yet"), (1, 1)
    for name in ("VLLM_TUNED_CONFIG_FOLDER", "VLLM_BATCH_INVARIANT", "VLLM_USE_FLASHINFER_MOE_FP16"):
        if env.get(name, "") not in ("", "0"):
            return family(True, False, f"{name} is set: the kernel selection it makes is not modeled"), (1, 1)
    if serve.get("enable_lora") is True:
        return family(True, False, "LoRA adds fused_moe_lora kernels that are not modeled"), (1, 1)
    if shape.max_batched_tokens is None:
        return family(
            True, False, "serve.max_num_batched_tokens is not set: the token counts a step can reach are unbounded here"
        ), (1, 1)
    if shape.max_model_len is None or shape.max_model_len <= shape.max_batched_tokens:
        return family(
            True,
            False,
            "serve.max_model_len must exceed serve.max_num_batched_tokens so that one prompt reaches every token count",
        ), (1, shape.max_batched_tokens)
    tensor_parallel = int(serve.get("tensor_parallel_size") or 1)
    moe, why = moe_shape(config, tensor_parallel)
    if moe is None:
        return family(True, False, why), (1, shape.max_batched_tokens)
    if not gpu_name:
        return family(True, False, "the GPU product is unknown: the tuned file cannot be chosen"), (1, 1)
    file_name = config_file_name(moe.experts, moe.n_per_rank, gpu_name)
    table = tuned_table(release, file_name)
    pick: Callable[[int], Mapping[str, int]] = (
        (lambda m: nearest_config(table, m)) if table else (lambda m: default_config(m, moe.experts))
    )
    token_range = (1, shape.max_batched_tokens)
    classes = group_token_counts(
        range(token_range[0], token_range[1] + 1),
        lambda m: fused_moe_key(m, moe, pick(m)),
        describe_key,
        prefer_above=shape.capture_max,
    )
    source = f"tuned file {file_name}" if table else f"default rule (vLLM {release} ships no {file_name})"
    reason = (
        f"E={moe.experts}, top_k={moe.top_k}, N={moe.n_per_rank} per rank, {source}; "
        f"CUDA graphs captured up to {shape.capture_max} tokens"
    )
    return family(True, True, reason, classes), token_range


SAMPLER_SOURCE = (
    "vllm/v1/sample/ops/topk_topp_sampler.py (Triton _topk_topp_kernel for 8 or more requests, specialized on the "
    "batch and on top-k/top-p), vllm/v1/worker/gpu/sample/logprob.py (_topk_log_softmax_kernel per logprobs width), "
    "vllm/v1/sample/ops/logprobs.py (torch.compile'd batched_count_greater_than)"
)
#: Sampling modes whose kernels compile on first use (each a request's fields beyond the prompt).
SAMPLING_MODES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("temperature", {"temperature": 0.8}),
    ("top_k", {"temperature": 0.8, "top_k": 20}),
    ("top_p", {"temperature": 0.8, "top_p": 0.9}),
    ("top_k and top_p", {"temperature": 0.8, "top_k": 20, "top_p": 0.9}),
    ("min_p", {"temperature": 0.8, "min_p": 0.1}),
    ("penalties", {"temperature": 0.8, "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1}),
    ("seeded", {"temperature": 0.8, "seed": 1}),
    ("n=2", {"temperature": 0.8, "n": 2}),
    ("prompt_logprobs", {"prompt_logprobs": 1}),
)
#: Logprobs counts that reach every width class of _topk_log_softmax_kernel (next power of two of k+1, and
#: Triton's specialization of k+1: 1, a multiple of 16, neither), up to the engine's max_logprobs.
LOGPROBS_COUNTS = (0, 1, 2, 4, 8, 15, 16, 31, 32, 63, 64)
#: The Triton top-k/top-p kernel runs for batches of 8 or more requests (apply_top_k_top_p).
TRITON_SAMPLER_BATCH = 8
SAMPLER_PROMPT_TOKENS = 16
SAMPLER_MAX_TOKENS = 8


def sampler_family(serve: Mapping[str, Any]) -> CoverageFamily:
    """Sampling modes x batch-size classes: what a batch of sampled requests compiles on its first step.

    Bursts of 1 and 2 requests (torch.compile's 1 and its dynamic shapes), of 8 or more up to max_num_seqs (the
    Triton sampler; its batch argument not divisible by 16), and of 16 (divisible) where max_num_seqs allows.
    """
    seqs = serve.get("max_num_seqs")
    max_seqs = seqs if isinstance(seqs, int) and seqs > 0 else 256
    configured = serve.get("max_logprobs")
    max_logprobs = configured if isinstance(configured, int) else 20
    if not 0 <= max_logprobs <= LOGPROBS_COUNTS[-1]:
        why = f"serve.max_logprobs {max_logprobs}: logprobs widths past {LOGPROBS_COUNTS[-1]} are not modeled"
        return CoverageFamily("sampler", True, False, why, SAMPLER_SOURCE)
    triton_batch = min(TRITON_SAMPLER_BATCH + 1, max_seqs)  # 9: at least 8, not a multiple of 16
    bursts = sorted({1, min(2, max_seqs), triton_batch} | ({16} if max_seqs >= 16 else set()))
    modes = list(SAMPLING_MODES) + [(f"logprobs={k}", {"logprobs": k}) for k in LOGPROBS_COUNTS if k <= max_logprobs]
    classes = tuple(
        CoverageClass(
            key=f"{name}, {burst} request(s) at once",
            token_count=SAMPLER_PROMPT_TOKENS,
            members=1,
            first=SAMPLER_PROMPT_TOKENS,
            last=SAMPLER_PROMPT_TOKENS,
            sampling=fields,
            burst=burst,
            max_tokens=SAMPLER_MAX_TOKENS,
        )
        for name, fields in modes
        for burst in bursts
    )
    reason = (
        f"{len(modes)} sampling modes (logprobs up to max_logprobs {max_logprobs}) x batches of "
        f"{', '.join(map(str, bursts))} request(s), {SAMPLER_MAX_TOKENS} tokens each"
    )
    return CoverageFamily("sampler", True, True, reason, SAMPLER_SOURCE, classes)


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
        "deep_gemm",
        "vllm/model_executor/layers/quantization/utils/fp8_utils.py, fused_moe/deep_gemm_moe.py (JIT per M)",
        "DeepGEMM runs only for fp8 block-quantized weights",
        lambda serve, env, config: (
            "fp8 block-quantized weights with VLLM_USE_DEEP_GEMM"
            if (serve.get("quantization") == "fp8" or "quantization_config" in config)
            and env.get("VLLM_USE_DEEP_GEMM", "1") != "0"
            else None
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
) -> CoveragePlan:
    """The coverage plan of one vLLM configuration (pure: everything it reads is passed in)."""
    fused, token_range = fused_moe_family(release, model_config, serve, env, gpu_name)
    families = [
        fused,
        sampler_family(serve)
        if release in MODELED_RELEASES
        else CoverageFamily(
            "sampler",
            True,
            False,
            f"no sampler coverage model for vLLM {release or 'of unknown version'}",
            SAMPLER_SOURCE,
        ),
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


def read_model_config(model: Mapping[str, Any]) -> dict[str, Any] | None:
    """A local model's ``config.json``, from the directory its factor names; None when there is none.

    Only the local runtime's model factor has that path (the real directory whose content is hashed, so
    what is read here is what was hashed). Read through the one bounded reader of user files (a FIFO or a
    device there is refused); a file that is not a JSON object counts as none.
    """
    path = model.get("path")
    if model.get("source") != "local" or not isinstance(path, str):
        return None
    config_path = Path(path) / "config.json"
    if not os.path.lexists(config_path):
        return None
    data = read_input(config_path, what="model config", hint="a model directory's config.json is a regular JSON file")
    try:
        config = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return config if isinstance(config, dict) else None
