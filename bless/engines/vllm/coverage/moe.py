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
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from bless.core.coverage import CoverageFamily, group_token_range
from bless.engines.vllm.coverage.base import (
    MODELED_RELEASES,
    UNQUANTIZED_DTYPES,
    env_on,
    extra_flag,
    is_moe,
)
from bless.engines.vllm.coverage.ranks import MoeShape, moe_rank_shapes

FUSED_MOE_SOURCE = (
    "vllm/model_executor/layers/fused_moe/fused_moe.py (try_get_optimal_moe_config, get_default_config, "
    "invoke_fused_moe_triton_kernel, _prepare_expert_assignment)"
)
_DATA_FILE = "moe_configs.json"


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
    data: dict[str, Any] = json.loads(
        resources.files("bless.engines.vllm").joinpath(_DATA_FILE).read_text(encoding="utf-8")
    )
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
    experts = shape.padded_experts
    naive = not shape.expert_map and valid * 4 <= experts
    if naive:
        em_w13 = em_w2 = valid * block_m
    else:
        sorted_size = valid + experts * (block_m - 1)
        if valid < experts:
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
    experts = shape.padded_experts
    if not shape.expert_map:
        splits.add(experts // (4 * shape.top_k) + 1)
    splits.add((experts - 1) // shape.top_k + 1)
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


def _moe_backend(serve: Mapping[str, Any]) -> str:
    """The MoE backend the serve arguments ask for (``auto`` unless ``--moe-backend`` or kernel_config says)."""
    kernel = serve.get("kernel_config")
    asked = serve.get("moe_backend") or (kernel.get("moe_backend") if isinstance(kernel, Mapping) else None)
    return str(asked or extra_flag(serve, "--moe-backend") or "auto")


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
        env_on(env, "VLLM_USE_DEEP_GEMM", "1") and env_on(env, "VLLM_MOE_USE_DEEP_GEMM", "1")
    ):
        return "VLLM_USE_DEEP_GEMM / VLLM_MOE_USE_DEEP_GEMM set on force the DeepGEMM MoE (JIT per shape): not modeled"
    if env_on(env, "VLLM_TEST_FORCE_FP8_MARLIN", "0"):
        return "VLLM_TEST_FORCE_FP8_MARLIN forces the Marlin MoE: not modeled"
    return None


def _moe_gap_033(serve: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    """What vLLM 0.33 adds to the fused-MoE selection that the classes do not follow (docs/dev/vllm-0.33-coverage.md).

    Weights offloaded to host memory (``--offload-backend``) force the sorted assignment; ``VLLM_TRITON_USE_TD``
    turns on the kernel's tensor-descriptor variant (a constexpr of its own).
    """
    if serve.get("offload_backend") or extra_flag(serve, "--offload-backend") is not None:
        return "weights offloaded to host memory change vLLM 0.33's block assignment: not modeled"
    if env_on(env, "VLLM_TRITON_USE_TD", "0"):
        return "VLLM_TRITON_USE_TD selects the fused-MoE kernel's tensor-descriptor variant: not modeled"
    return None


@dataclass(frozen=True)
class _RankPlan:
    """One rank shape's tile configuration rule: the tuned file vLLM reads for it, else the default rule."""

    shape: MoeShape
    file_name: str
    table: Mapping[int, Mapping[str, int]] | None
    quant: MoeQuant

    @classmethod
    def of(cls, release: str, shape: MoeShape, gpu_name: str, quant: MoeQuant) -> _RankPlan:
        file_name = config_file_name(shape.experts, shape.n_per_rank, gpu_name, quant)
        return cls(shape, file_name, tuned_table(release, file_name), quant)

    def pick(self, m: int) -> Mapping[str, int]:
        return nearest_config(self.table, m) if self.table else default_config(m, self.shape.experts, self.quant)

    def words(self, release: str) -> str:
        moe = self.shape
        where = f"E={moe.experts}"
        if moe.global_experts is not None:
            where = f"E={moe.experts} of {moe.global_experts} (expert parallel)"
        source = (
            f"tuned file {self.file_name}" if self.table else f"default rule (vLLM {release} ships no {self.file_name})"
        )
        return f"{where}, top_k={moe.top_k}, N={moe.n_per_rank} per rank, {source}"


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
    later = _moe_gap_033(serve, env) if release == "0.33.0" else None
    if later is not None:
        return family(True, False, later), (1, 1)
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
    shapes, why = moe_rank_shapes(config, serve)
    if not shapes:
        return family(True, False, why), (1, shape.max_batched_tokens)
    if not gpu_name:
        return family(True, False, "the GPU product is unknown: the tuned file cannot be chosen"), (1, 1)
    ranks = [_RankPlan.of(release, moe, gpu_name, quant) for moe in shapes]
    token_range = (1, shape.max_batched_tokens)
    splits = {shape.capture_max + 1}
    for rank in ranks:
        changes = config_changes(rank.pick, *token_range)
        splits |= fused_moe_splits(rank.shape, [rank.pick(m) for m in (token_range[0], *changes)], changes)

    def key_of(m: int) -> Hashable:
        keys = tuple(fused_moe_key(m, rank.shape, rank.pick(m), quant) for rank in ranks)
        return keys[0] if len(keys) == 1 else keys  # ranks of unequal expert counts: each compiles its own

    def describe(key: Hashable) -> str:
        if len(ranks) == 1:
            return describe_key(key)
        assert isinstance(key, tuple)
        pairs = zip(ranks, key, strict=True)
        return "; ".join(f"ranks with E={rank.shape.experts}: {describe_key(one)}" for rank, one in pairs)

    classes = group_token_range(*token_range, key_of, describe, splits=splits, prefer_above=shape.capture_max)
    weights = "bf16/fp16" if quant == UNQUANTIZED else f"{quant.dtype} blocks {quant.block_shape}, Triton backend"
    reason = (
        f"{'; '.join(rank.words(release) for rank in ranks)}, {weights}; "
        f"CUDA graphs captured up to {shape.capture_max} tokens"
    )
    return family(True, True, reason, classes), token_range
