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
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from bless.core.coverage import CoverageClass, CoverageFamily, CoveragePlan, group_token_range
from bless.errors import InputInvalidError
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
    selected: dict[str, bool] = {
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
class MoeQuant:
    """How the experts' weights are quantized, as vLLM names it in config file names (dtype None: bf16/fp16)."""

    dtype: str | None
    block_shape: tuple[int, int] | None = None


UNQUANTIZED = MoeQuant(None)


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


def config_file_name(experts: int, n: int, gpu_name: str, quant: MoeQuant | None = None) -> str:
    """``get_config_file_name``: ``E=..,N=..,device_name=..[,dtype=..][,block_shape=[n,k]].json``."""
    dtype = f",dtype={quant.dtype}" if quant is not None and quant.dtype else ""
    block = f",block_shape=[{quant.block_shape[0]},{quant.block_shape[1]}]" if quant and quant.block_shape else ""
    return f"E={experts},N={n},device_name={device_file_name(gpu_name)}{dtype}{block}.json"


def default_config(m: int, experts: int, quant: MoeQuant | None = None) -> dict[str, int]:
    """vLLM 0.26 ``get_default_config`` on CUDA (not ROCm, not batch-invariant): bf16/fp16, or block FP8."""
    if quant is not None and quant.dtype == "fp8_w8a8" and quant.block_shape is not None:
        block_n_quant, block_k_quant = quant.block_shape
        small = m <= 8 and block_n_quant % 64 == 0
        return {
            "BLOCK_SIZE_M": 16 if m <= 64 else 64,
            "BLOCK_SIZE_N": 64 if small else block_n_quant,
            "BLOCK_SIZE_K": block_k_quant,
            "GROUP_SIZE_M": 1 if m <= 16 else 32,
            "SPLIT_K": 1,
            "num_warps": 4,
            "num_stages": (4 if m <= 4 else 3) if small else 3,
        }
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


def fused_moe_key(m: int, shape: MoeShape, config: Mapping[str, int], quant: MoeQuant | None = None) -> tuple[Any, ...]:
    """Everything a compile of both GEMMs of step size ``m`` is keyed on (besides the shape's constants).

    For block FP8 the launch clamps BLOCK_SIZE_K to the quantization block and turns on swap-AB (Hopper,
    BLOCK_SIZE_M < 64 <= BLOCK_SIZE_N): both are functions of the configuration, so the configuration keys them.
    """
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


def fused_moe_splits(shape: MoeShape, configs: Iterable[Mapping[str, int]], config_changes: Iterable[int]) -> set[int]:
    """Token counts where the compile key's regime may change (see :func:`fused_moe_key`).

    Between two of these the key depends on M modulo 16 only: the tile configuration changes at
    ``config_changes``; the naive assignment ends past ``E // (4 top_k)``; ``M * top_k < E`` and
    ``M < BLOCK_SIZE_M`` (for every block size the configurations use) switch the padded row count.
    """
    splits = set(config_changes)
    splits.add(shape.experts // (4 * shape.top_k) + 1)
    splits.add((shape.experts - 1) // shape.top_k + 1)
    for config in configs:
        block_m = int(config["BLOCK_SIZE_M"])
        splits.add(block_m)
        splits.add(-(-block_m // shape.top_k))
    return splits


def config_changes(pick: Callable[[int], Mapping[str, int]], first: int, last: int) -> list[int]:
    """The token counts in ``first..last`` where ``pick`` returns another configuration than one count before.

    Both of vLLM's rules are step functions of M whose every configuration holds over one contiguous run
    (nearest tuned key; the default rule's thresholds), so each run's end is found by a doubling then a
    binary search: a few hundred calls for any range.
    """
    changes: list[int] = []
    start = first
    while start <= last:
        current = pick(start)
        step, end = 1, start
        while end + step <= last and pick(end + step) == current:
            end += step
            step *= 2
        high = min(end + step, last + 1)  # pick(high) differs, or high is past the range
        while high - end > 1:
            middle = (end + high) // 2
            if pick(middle) == current:
                end = middle
            else:
                high = middle
        start = end + 1
        if start <= last:
            changes.append(start)
    return changes


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


def moe_quantization(config: Mapping[str, Any], serve: Mapping[str, Any]) -> tuple[MoeQuant | None, str]:
    """How a MoE model's expert weights are quantized, or None and why that form is not modeled.

    Modeled: unquantized (bf16/fp16) and block FP8 with dynamic activation scales (``quant_method`` fp8 with a
    ``weight_block_size``: Qwen3-30B-A3B-FP8, DeepSeek-V3-style), the form fleets serve most.
    """
    quantization = config.get("quantization_config")
    method = serve.get("quantization")
    dtype = str(serve.get("dtype", "auto"))
    if quantization is None and method is None:
        if dtype not in UNQUANTIZED_DTYPES:
            return None, f"serve.dtype {dtype} takes kernels that are not modeled"
        return UNQUANTIZED, ""
    if not isinstance(quantization, Mapping):
        return None, f"serve.quantization {method} without a quantization_config in config.json is not modeled"
    quant_method = quantization.get("quant_method")
    if method is not None and method != quant_method:
        return None, f"serve.quantization {method} differs from config.json's quant_method {quant_method}"
    if quant_method != "fp8":
        return None, f"{quant_method} MoE weights take kernels that are not modeled (block FP8 is)"
    block = quantization.get("weight_block_size")
    if not (
        isinstance(block, list)
        and len(block) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        return None, "FP8 MoE without a weight_block_size (per-tensor or per-channel scales) is not modeled"
    if quantization.get("activation_scheme", "dynamic") != "dynamic":
        return None, "FP8 MoE with static activation scales is not modeled"
    return MoeQuant("fp8_w8a8", (block[0], block[1])), ""


def _env_on(env: Mapping[str, str], name: str, default: str) -> bool:
    """An int-valued vLLM switch (``bool(int(os.getenv(name, default)))``); a value that is no int counts as on."""
    value = env.get(name, default).strip()
    try:
        return bool(int(value))
    except ValueError:
        return True


def _moe_backend(serve: Mapping[str, Any]) -> str:
    """The MoE backend the serve arguments ask for (``auto`` unless ``--moe-backend`` or kernel_config says)."""
    kernel = serve.get("kernel_config")
    asked = serve.get("moe_backend") or (kernel.get("moe_backend") if isinstance(kernel, Mapping) else None)
    extra = serve.get("extra_args")
    if isinstance(extra, list):
        for index, word in enumerate(extra):
            if isinstance(word, str) and word.startswith("--moe-backend"):
                value = word.partition("=")[2] or (extra[index + 1] if index + 1 < len(extra) else "")
                asked = asked or value
    return str(asked or "auto")


def fp8_moe_backend_gap(serve: Mapping[str, Any], env: Mapping[str, str], capability: str | None) -> str | None:
    """Why the block-FP8 MoE would not run on the Triton fused_moe_kernel here (None: it does).

    vLLM 0.26 ``oracle/fp8.py`` (``select_fp8_moe_backend``, ``_get_priority_backends``): on Hopper (9.0) with
    dynamic 128-group activations and 128x128 weight blocks it moves TRITON to the front for tensor parallelism
    (FLASHINFER_CUTLASS for expert parallelism); an explicit ``moe_backend``, ``VLLM_USE_DEEP_GEMM`` and
    ``VLLM_MOE_USE_DEEP_GEMM`` both set on, or ``VLLM_TEST_FORCE_FP8_MARLIN`` choose before that.
    """
    if capability != "9.0":
        where = capability or "unknown"
        return f"the block-FP8 MoE backend vLLM picks on compute capability {where} is not modeled (9.0 is)"
    backend = _moe_backend(serve)
    if backend not in ("auto", "triton"):
        return f"moe_backend {backend} is not modeled (auto and triton are)"
    if serve.get("enable_expert_parallel") is True:
        return "expert parallelism picks FlashInfer's CUTLASS MoE for block FP8 on Hopper: not modeled"
    if ("VLLM_USE_DEEP_GEMM" in env or "VLLM_MOE_USE_DEEP_GEMM" in env) and (
        _env_on(env, "VLLM_USE_DEEP_GEMM", "1") and _env_on(env, "VLLM_MOE_USE_DEEP_GEMM", "1")
    ):
        return "VLLM_USE_DEEP_GEMM / VLLM_MOE_USE_DEEP_GEMM set on force the DeepGEMM MoE (JIT per shape): not modeled"
    if _env_on(env, "VLLM_TEST_FORCE_FP8_MARLIN", "0"):
        return "VLLM_TEST_FORCE_FP8_MARLIN forces the Marlin MoE: not modeled"
    return None


#: The most token counts one engine step may schedule that the model plans for (vLLM itself accepts more; a plan
#: past this would describe steps no GPU holds the activations of).
MAX_PLANNED_TOKENS = 1 << 24


def fused_moe_family(
    release: str | None,
    config: Mapping[str, Any] | None,
    serve: Mapping[str, Any],
    env: Mapping[str, str],
    gpu_name: str | None,
    capability: str | None = None,
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
    quant, why = moe_quantization(config, serve)
    if quant is None:
        return family(True, False, why), (1, 1)
    if quant != UNQUANTIZED:
        gap = fp8_moe_backend_gap(serve, env, capability)
        if gap is not None:
            return family(True, False, gap), (1, 1)
    for name in ("VLLM_TUNED_CONFIG_FOLDER", "VLLM_BATCH_INVARIANT", "VLLM_USE_FLASHINFER_MOE_FP16"):
        if env.get(name, "") not in ("", "0"):
            return family(True, False, f"{name} is set: the kernel selection it makes is not modeled"), (1, 1)
    if serve.get("enable_lora") is True:
        return family(True, False, "LoRA adds fused_moe_lora kernels that are not modeled"), (1, 1)
    if shape.max_batched_tokens is None:
        return family(
            True, False, "serve.max_num_batched_tokens is not set: the token counts a step can reach are unbounded here"
        ), (1, 1)
    if not 1 <= shape.max_batched_tokens <= MAX_PLANNED_TOKENS:
        return family(
            True,
            False,
            f"serve.max_num_batched_tokens {shape.max_batched_tokens} is outside 1..{MAX_PLANNED_TOKENS}, "
            "the step sizes the model plans for",
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
    file_name = config_file_name(moe.experts, moe.n_per_rank, gpu_name, quant)
    table = tuned_table(release, file_name)
    pick: Callable[[int], Mapping[str, int]] = (
        (lambda m: nearest_config(table, m)) if table else (lambda m: default_config(m, moe.experts, quant))
    )
    token_range = (1, shape.max_batched_tokens)
    changes = config_changes(pick, *token_range)
    used = [pick(m) for m in (token_range[0], *changes)]
    classes = group_token_range(
        *token_range,
        lambda m: fused_moe_key(m, moe, pick(m), quant),
        describe_key,
        splits={*fused_moe_splits(moe, used, changes), shape.capture_max + 1},
        prefer_above=shape.capture_max,
    )
    source = f"tuned file {file_name}" if table else f"default rule (vLLM {release} ships no {file_name})"
    weights = "bf16/fp16" if quant == UNQUANTIZED else f"{quant.dtype} blocks {quant.block_shape}, Triton backend"
    reason = (
        f"E={moe.experts}, top_k={moe.top_k}, N={moe.n_per_rank} per rank, {weights}, {source}; "
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


#: Architectures vLLM 0.26 runs on Model Runner V2 although they are MoE (config/vllm.py
#: DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES); every other MoE runs on V1, every dense model on V2.
DEFAULT_V2_ARCHITECTURES = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "GraniteMoeForCausalLM",
        "InklingForCausalLM",
        "InklingForConditionalGeneration",
        "LongcatFlashNgramForCausalLM",
        "Qwen2MoeForCausalLM",
    }
)


def model_runner(config: Mapping[str, Any] | None, serve: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    """``v1`` or ``v2``: the model runner vLLM 0.26 picks (``VllmConfig.use_v2_model_runner``); None: unknown.

    ``VLLM_USE_V2_MODEL_RUNNER`` decides when set; else a MoE outside :data:`DEFAULT_V2_ARCHITECTURES` runs on
    V1, and so does a configuration with a feature V2 lacks (stock torch.compile, sequence parallelism over
    tensor parallelism, prefill context parallelism, a speculative method other than EAGLE/MTP/DFlash).
    """
    forced = env.get("VLLM_USE_V2_MODEL_RUNNER")
    if forced is not None and forced.strip() != "":
        return "v2" if forced.strip().lower() in ("1", "true") else "v1"
    if config is None:
        return None
    architectures = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    if is_moe(config) and not any(a in DEFAULT_V2_ARCHITECTURES for a in architectures):
        return "v1"
    compilation = serve.get("compilation_config")
    compilation = compilation if isinstance(compilation, Mapping) else {}
    passes = compilation.get("pass_config")
    sequence_parallel = isinstance(passes, Mapping) and passes.get("enable_sp") is True
    speculative = serve.get("speculative_config")
    method = speculative.get("method") if isinstance(speculative, Mapping) else None
    if (
        compilation.get("mode") == 2
        or (sequence_parallel and int(serve.get("tensor_parallel_size") or 1) > 1)
        or int(serve.get("prefill_context_parallel_size") or 1) > 1
        or (speculative is not None and method not in ("eagle", "eagle3", "mtp", "dflash", "dspark"))
    ):
        return "v1"
    return "v2"


STRUCTURED_SOURCE = (
    "vllm/v1/structured_output/utils.py (apply_grammar_bitmask: xgrammar's Triton apply_token_bitmask_inplace_kernel, "
    "V1 runner), vllm/v1/worker/gpu/structured_outputs.py (_apply_grammar_bitmask_kernel, V2 runner, warmed by "
    "vllm/v1/worker/gpu/warmup.py), xgrammar 0.2 kernels/apply_token_bitmask_inplace_triton.py"
)
#: A JSON schema, as structured outputs and tool calls send it.
ANSWER_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}, "count": {"type": "integer"}},
    "required": ["colour", "count"],
}
#: A grammar no 8-token answer finishes, so every row of a batch keeps its grammar for the whole request.
LONG_REGEX = "[a-z]{64}"
#: One request of each kind of structured output vLLM 0.26 accepts (each a different grammar on the CPU).
STRUCTURED_KINDS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("regex", {"structured_outputs": {"regex": LONG_REGEX}}),
    ("JSON schema", {"structured_outputs": {"json": ANSWER_SCHEMA}}),
    ("choice", {"structured_outputs": {"choice": ["alpha", "beta", "gamma"]}}),
    ("JSON object", {"response_format": {"type": "json_object"}}),
    ("grammar", {"structured_outputs": {"grammar": 'root ::= "yes" | "no" | "maybe"'}}),
)
STRUCTURED_MAX_TOKENS = 8


def structured_outputs_family(
    release: str | None, config: Mapping[str, Any] | None, serve: Mapping[str, Any], env: Mapping[str, str]
) -> CoverageFamily:
    """The grammar bitmask kernel: what a batch with structured-output rows compiles on its first step.

    V1 applies the grammar with xgrammar's Triton kernel, specialized on ``num_rows`` (the structured rows:
    1, a multiple of 16, or neither) and on ``indices`` (None when every row of the step is structured, a
    tensor when the step mixes kinds): up to six variants, none compiled at startup. V2 applies its own
    kernel, one variant per model, compiled by its startup warm-up. Every backend (xgrammar, guidance,
    outlines, lm-format-enforcer) fills a bitmask on the CPU that the same kernel applies, so the classes do
    not depend on the backend; both runners are driven the same way (a mistaken runner guess stays covered).
    """
    if release not in MODELED_RELEASES:
        return CoverageFamily(
            "structured_outputs",
            True,
            False,
            f"no structured-output coverage model for vLLM {release or 'of unknown version'}",
            STRUCTURED_SOURCE,
        )
    if env.get("VLLM_V1_USE_OUTLINES_CACHE", "0") == "1":
        return CoverageFamily(
            "structured_outputs",
            True,
            False,
            "VLLM_V1_USE_OUTLINES_CACHE=1 writes outlines' compiled grammars to a disk cache outside the blessed tree",
            STRUCTURED_SOURCE,
        )
    seqs = serve.get("max_num_seqs")
    max_seqs = seqs if isinstance(seqs, int) and seqs > 0 else 256
    classes: list[CoverageClass] = []

    def add(key: str, fields: Mapping[str, Any], burst: int = 1, companions: int = 0) -> None:
        if burst + companions <= max_seqs:
            classes.append(
                CoverageClass(
                    key=key,
                    token_count=SAMPLER_PROMPT_TOKENS,
                    members=1,
                    first=SAMPLER_PROMPT_TOKENS,
                    last=SAMPLER_PROMPT_TOKENS,
                    sampling=dict(fields),
                    burst=burst,
                    max_tokens=STRUCTURED_MAX_TOKENS,
                    companions=companions or None,
                )
            )

    regex = dict(STRUCTURED_KINDS[0][1])
    for rows, burst in (("1 row", 1), ("2-15 rows", 2), ("16 rows", 16)):
        add(f"every row structured (indices None), {rows}", regex, burst)
        add(f"mixed with a plain row (indices given), {rows}", regex, burst, 1)
    for name, fields in STRUCTURED_KINDS[1:]:
        add(f"{name}, alone", fields)
    runner = model_runner(config, serve, env)
    kernel = {
        "v1": "V1 runner: xgrammar's apply_token_bitmask_inplace_kernel compiles lazily per (num_rows class, indices)",
        "v2": "V2 runner: _apply_grammar_bitmask_kernel is compiled by the startup warm-up (one variant per model)",
        None: "runner unknown (no config.json): both runners' kernels",
    }[runner]
    reason = (
        f"{kernel}; driven for every runner: {len(classes)} request shape(s), batches up to max_num_seqs "
        f"{max_seqs}; backends xgrammar, guidance, outlines, lm-format-enforcer fill the bitmask on the CPU (not a "
        "GPU kernel, not blessed)"
    )
    return CoverageFamily("structured_outputs", True, True, reason, STRUCTURED_SOURCE, tuple(classes))


CHAT_SOURCE = (
    "vllm/entrypoints/openai/chat_completion/serving.py (the chat template renders text; tool_choice required or "
    "named is a JSON-schema structured output)"
)
WEATHER_TOOL: Mapping[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
CHAT_ROUTES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("chat, plain", {}),
    (
        "chat, response_format json_schema",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}}},
    ),
    ("chat, tools with tool_choice required", {"tools": [WEATHER_TOOL], "tool_choice": "required"}),
    (
        "chat, tools with a named tool_choice",
        {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    ),
)


def _tool_parser(serve: Mapping[str, Any]) -> str | None:
    """The ``--tool-call-parser`` the serve arguments name (a field or in extra_args), or None."""
    named = serve.get("tool_call_parser")
    extra = serve.get("extra_args")
    if isinstance(extra, list):
        for index, word in enumerate(extra):
            if isinstance(word, str) and word.startswith("--tool-call-parser"):
                named = named or word.partition("=")[2] or (extra[index + 1] if index + 1 < len(extra) else None)
    return str(named) if named else None


def _auto_tool_choice(serve: Mapping[str, Any]) -> bool:
    extra = serve.get("extra_args")
    return serve.get("enable_auto_tool_choice") is True or (
        isinstance(extra, list) and "--enable-auto-tool-choice" in extra
    )


def chat_family(release: str | None, serve: Mapping[str, Any], chat_template: bool | None) -> CoverageFamily:
    """Chat completions and tool calls: the same kernels as completions, reached through the chat template.

    A tool call with ``tool_choice`` required or named is a JSON-schema structured output; ``auto`` (with
    ``--enable-auto-tool-choice``) is plain generation parsed afterwards. vLLM 0.26 refuses every tool choice
    but none (HTTP 400, ``renderers/online_renderer.py``) unless ``--tool-call-parser`` is set, so the tool
    routes are driven only where one is. Each route is driven once.
    """
    if chat_template is False:
        return CoverageFamily(
            "chat",
            False,
            True,
            "the model has no chat template: vLLM refuses every chat request (HTTP 400)",
            CHAT_SOURCE,
        )
    if release not in MODELED_RELEASES:
        why = f"no chat coverage model for vLLM {release or 'of unknown version'}"
        return CoverageFamily("chat", True, False, why, CHAT_SOURCE)
    if chat_template is None:
        why = "the model's chat template cannot be read (a local model directory is needed)"
        return CoverageFamily("chat", True, False, why, CHAT_SOURCE)
    parser = _tool_parser(serve)
    routes = list(CHAT_ROUTES if parser else CHAT_ROUTES[:2])
    if parser and _auto_tool_choice(serve):
        routes.append(("chat, tools with tool_choice auto", {"tools": [WEATHER_TOOL], "tool_choice": "auto"}))
    classes = tuple(
        CoverageClass(
            key=key,
            token_count=SAMPLER_PROMPT_TOKENS,
            members=1,
            first=SAMPLER_PROMPT_TOKENS,
            last=SAMPLER_PROMPT_TOKENS,
            sampling=fields,
            max_tokens=STRUCTURED_MAX_TOKENS,
            endpoint="chat",
        )
        for key, fields in routes
    )
    tools = (
        f"tool calls through parser {parser} (required, named{', auto' if len(routes) > len(CHAT_ROUTES) else ''})"
        if parser
        else "no tool calls: without --tool-call-parser vLLM refuses every tool choice but none"
    )
    reason = f"{len(classes)} route(s): plain chat, JSON-schema response_format, {tools}"
    return CoverageFamily("chat", True, True, reason, CHAT_SOURCE, classes)


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
    if release not in MODELED_RELEASES:
        return family(True, False, f"no FP8 GEMM coverage model for vLLM {release or 'of unknown version'}")
    if capability not in ("9.0", "10.0", "10.3"):
        return family(True, False, f"the block-FP8 GEMM picked on compute capability {capability} is not modeled")
    if _env_on(env, "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER", "1") and capability == "9.0":
        return family(
            True,
            False,
            "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER is on (the default): where FlashInfer is installed its block-scale "
            "GEMM JIT-compiles; set it to 0",
        )
    if _env_on(env, "VLLM_USE_DEEP_GEMM", "1"):
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
        sampler_family(serve)
        if release in MODELED_RELEASES
        else CoverageFamily(
            "sampler",
            True,
            False,
            f"no sampler coverage model for vLLM {release or 'of unknown version'}",
            SAMPLER_SOURCE,
        ),
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
