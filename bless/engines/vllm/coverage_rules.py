"""Per-release facts about the kernels vLLM compiles lazily, as data the coverage model reads (pure, no I/O).

Each fact carries the source line it was read from (:class:`Cite`: the file of the release's wheel, the line, and a
piece of that line verbatim). ``tests/unit/test_coverage_rules.py`` holds every citation to the verbatim excerpts in
``tests/fixtures/vllm/coverage/<release>/cited.txt`` (written from the wheel by ``scripts/vllm_coverage_cites.py``)
and runs the release's own ``get_default_config`` excerpt against :func:`default_config_033`.

Words used below: a kernel is **warmed** when the release's start-up warm-up compiles every compile key serving can
reach, **partial** when it compiles some of them, **lazy** when serving compiles it on first use.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

Warm = Literal["warmed", "partial", "lazy"]
#: How a release picks its GPU model runner: 0.26 runs Model Runner V2 by default for dense generative models and
#: a short list of MoE architectures; 0.33 runs it for every model unless a feature it lacks is configured.
RunnerRule = Literal["v2_dense_and_listed_moe", "v2_unless_unsupported"]
Runner = Literal["v1", "v2"]


@dataclass(frozen=True)
class Cite:
    """A line of the release's source: ``path`` inside the wheel, 1-based ``line``, ``text`` found on it verbatim."""

    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class KernelRule:
    """One kernel: where it is defined, what its compile key varies with, and whether start-up compiles it."""

    name: str
    defined: Cite
    keyed_on: str
    warm: Warm
    #: The warm-up line that reaches it (None: nothing at start-up does).
    warmed_by: Cite | None = None
    #: What serving can reach that the warm-up does not ("" when warmed).
    lazy_keys: str = ""


@dataclass(frozen=True)
class BackendRule:
    """The MoE experts backend a release chooses by default on Hopper (sm90) for one weight format."""

    backend: str
    cite: Cite
    when: str


@dataclass(frozen=True)
class ReleaseRules:
    """What one vLLM release compiles lazily after start-up, and how it chooses it."""

    release: str
    runner_rule: RunnerRule
    runner_cite: Cite
    #: MoE architectures that still get Model Runner V2 by default (0.26); None: every architecture (0.33).
    v2_default_moe_architectures: frozenset[str] | None
    #: The switch that turns the V2 start-up warm-up off (None: the warm-up always runs).
    jit_warmup_switch: str | None
    jit_warmup_cites: tuple[Cite, ...]
    #: Model Runner V2's sampler kernels (Triton), in pipeline order.
    v2_sampler_kernels: tuple[KernelRule, ...]
    #: The kernel that applies a structured-output grammar's token bitmask, per runner.
    grammar_bitmask: Mapping[Runner, KernelRule]
    #: The default fused-MoE backend on sm90 with tensor parallelism, by weight format: bf16, fp8_block, int4.
    moe_backend_sm90: Mapping[str, BackendRule]
    #: The verbatim get_default_config excerpt under tests/fixtures/vllm/coverage/.
    default_config_excerpt: str
    #: Tuned-file name parts (after ``device_name=...``) the coverage model reads.
    tuned_file_suffixes: tuple[str, ...]
    #: The naive (unsorted) block assignment rule of fused_moe, in words, with its line.
    naive_assignment: str
    naive_cite: Cite
    #: Where SWAP_AB is decided for the FP8 path (sm90, BLOCK_SIZE_M < 64, BLOCK_SIZE_N >= 64).
    swap_ab_cite: Cite
    #: Env settings of the release that change the fused-MoE kernel selection in ways not modeled.
    moe_env_not_modeled: tuple[str, ...]
    #: How one engine's ranks see the experts (coverage/ranks.py ``moe_rank_shapes``): expert parallelism takes the
    #: tensor-parallel size; all-to-all kernels only with data parallelism; E // EP experts a rank, one more for the
    #: first E % EP; the tuned file keyed on the rank's E and N; the block padding on the model's E.
    expert_parallel_cites: tuple[Cite, ...]

    def cites(self) -> tuple[Cite, ...]:
        """Every citation of the release, in order (what the fixture test checks)."""
        found: list[Cite] = [self.runner_cite, *self.jit_warmup_cites, self.naive_cite, self.swap_ab_cite]
        found.extend(self.expert_parallel_cites)
        for kernel in (*self.v2_sampler_kernels, *self.grammar_bitmask.values()):
            found.append(kernel.defined)
            if kernel.warmed_by is not None:
                found.append(kernel.warmed_by)
        found.extend(rule.cite for rule in self.moe_backend_sm90.values())
        return tuple(found)


FP8_BLOCK_SUFFIX = ",dtype=fp8_w8a8,block_shape=[128,128]"
_MOE = "vllm/model_executor/layers/fused_moe/"


def _expert_parallel_cites(
    use_ep: int, ep_size: int, all2all: int, local_experts: int, padding: int, tuned_shape: int
) -> tuple[Cite, ...]:
    """The lines of one release that coverage/ranks.py follows for expert parallelism, by their line numbers."""
    return (
        Cite(_MOE + "config.py", use_ep, "and vllm_parallel_config.enable_expert_parallel"),
        Cite(_MOE + "config.py", ep_size, "ep_size = tp_size"),
        Cite(_MOE + "config.py", all2all, "self.dp_size > 1 or self.pcp_size > 1 or self.is_sequence_parallel"),
        Cite(
            _MOE + "expert_map_manager.py", local_experts, "local_num_experts = base_experts + 1 if ep_rank < remainder"
        ),
        Cite(_MOE + "moe_align_block_size.py", padding, "max_num_tokens_padded = topk_ids.numel() + num_experts"),
        Cite(_MOE + "fused_moe.py", tuned_shape, "E, _, N = w2_shape"),
    )


# --- vLLM 0.26.0 -------------------------------------------------------------------------------------------------

_W26_WARMUP = Cite("vllm/v1/worker/gpu/warmup.py", 231, "sampling_params = SamplingParams.for_sampler_warmup()")
_W26_GRAMMAR = Cite("vllm/v1/worker/gpu/warmup.py", 283, "worker_sample_tokens(grammar_output)")

RULES_026 = ReleaseRules(
    release="0.26.0",
    runner_rule="v2_dense_and_listed_moe",
    runner_cite=Cite("vllm/config/vllm.py", 621, "or not model_config.is_moe"),
    v2_default_moe_architectures=frozenset(
        {
            "DeepseekV2ForCausalLM",
            "GraniteMoeForCausalLM",
            "InklingForCausalLM",
            "InklingForConditionalGeneration",
            "LongcatFlashNgramForCausalLM",
            "Qwen2MoeForCausalLM",
        }
    ),
    jit_warmup_switch=None,
    jit_warmup_cites=(
        Cite(
            "vllm/v1/worker/gpu_worker.py",
            863,
            "warmup_kernels(self.model_runner, self.execute_model, self.sample_tokens)",
        ),
    ),
    v2_sampler_kernels=(
        KernelRule(
            "_topk_topp_kernel",
            Cite("vllm/v1/sample/ops/topk_topp_triton.py", 94, "def _topk_topp_kernel("),
            "TOPK_ENABLED/TOPP_ENABLED and the batch (Triton on batches of 8 or more, torch below)",
            "partial",
            _W26_WARMUP,
            "the top-k-only and top-p-only modes; batches under 8 run torch; the warm-up's one batch size",
        ),
        KernelRule(
            "_topk_log_softmax_kernel",
            Cite("vllm/v1/worker/gpu/sample/logprob.py", 17, "def _topk_log_softmax_kernel("),
            "the logprobs width (next power of two of logprobs + 1, and Triton's specialization of it)",
            "partial",
            _W26_WARMUP,
            "every logprobs width class but the warm-up's logprobs=5",
        ),
    ),
    grammar_bitmask=MappingProxyType(
        {
            "v2": KernelRule(
                "_apply_grammar_bitmask_kernel",
                Cite("vllm/v1/worker/gpu/structured_outputs.py", 86, "def _apply_grammar_bitmask_kernel("),
                "model constants only (vocab size, strides, MASK_STRIDE)",
                "warmed",
                _W26_GRAMMAR,
            ),
            "v1": KernelRule(
                "xgrammar apply_token_bitmask_inplace (Triton)",
                Cite(
                    "vllm/v1/structured_output/utils.py",
                    161,
                    "xgr.apply_token_bitmask_inplace(logits, grammar_bitmask, indices=index_tensor)",
                ),
                "xgrammar's kernel and the logits dtype",
                "lazy",
                None,
                "the first structured-output request compiles it",
            ),
        }
    ),
    moe_backend_sm90=MappingProxyType(
        {
            "bf16": BackendRule(
                "TRITON",
                Cite(
                    "vllm/model_executor/layers/fused_moe/oracle/unquantized.py",
                    77,
                    "if current_platform.is_device_capability_family(90):",
                ),
                "FlashInfer's unquantized MoE kernels move behind Triton on sm90",
            ),
            "fp8_block": BackendRule(
                "TRITON",
                Cite(
                    "vllm/model_executor/layers/fused_moe/oracle/fp8.py",
                    122,
                    "_move_to_front(_AVAILABLE_BACKENDS, Fp8MoeBackend.TRITON)",
                ),
                "block FP8 on sm90 with ep_size 1 (FLASHINFER_CUTLASS with expert parallelism); an explicit "
                "VLLM_USE_DEEP_GEMM=1 or --moe-backend wins",
            ),
            "int4": BackendRule(
                "MARLIN",
                Cite("vllm/model_executor/layers/fused_moe/oracle/int_wna16.py", 112, "WNA16MoEBackend.MARLIN,"),
                "first supported of FLASHINFER_TRTLLM, MARLIN, BATCHED_MARLIN, HUMMING",
            ),
        }
    ),
    default_config_excerpt="0.26.0/get_default_config.py.txt",
    tuned_file_suffixes=("", FP8_BLOCK_SUFFIX),
    naive_assignment="no expert map and num_tokens * top_k * 4 <= E (not for int4/int8 w/a16 with group blocks)",
    naive_cite=Cite(
        "vllm/model_executor/layers/fused_moe/fused_moe.py",
        1500,
        "and num_tokens * top_k_num * 4 <= global_num_experts",
    ),
    swap_ab_cite=Cite(
        "vllm/model_executor/layers/fused_moe/utils.py", 576, "def enable_swap_ab(BLOCK_SIZE_M: int, BLOCK_SIZE_N: int)"
    ),
    expert_parallel_cites=_expert_parallel_cites(1206, 1236, 1054, 69, 74, 1373),
    moe_env_not_modeled=("VLLM_TUNED_CONFIG_FOLDER", "VLLM_BATCH_INVARIANT", "VLLM_USE_FLASHINFER_MOE_FP16"),
)

# --- vLLM 0.33.0 -------------------------------------------------------------------------------------------------

_W33_WARMUP = Cite("vllm/v1/worker/gpu/warmup.py", 335, "else SamplingParams.for_sampler_warmup()")
_W33_GRAMMAR = Cite("vllm/v1/worker/gpu/warmup.py", 395, "worker_sample_tokens(grammar_output)")
_W33_REGISTERED = Cite("vllm/v1/worker/gpu/model_runner.py", 479, "register_top_k_top_p_warmups()")
_W33_ONLY_WHEN = (
    "registered for the start-up JIT warm-up only on ROCm or with speculative decoding "
    "(vllm/v1/worker/gpu/model_runner.py:472); on CUDA without it the MRV2 sampler takes FlashInfer's fused "
    "sampler when eligible (VLLM_USE_FLASHINFER_SAMPLER, default on) and this kernel only as the fallback"
)

RULES_033 = ReleaseRules(
    release="0.33.0",
    runner_rule="v2_unless_unsupported",
    runner_cite=Cite("vllm/config/vllm.py", 758, "unsupported = self._get_v2_model_runner_unsupported_features()"),
    v2_default_moe_architectures=None,
    jit_warmup_switch="kernel_config.enable_jit_warmup",
    jit_warmup_cites=(
        Cite("vllm/config/kernel.py", 296, "enable_jit_warmup: bool = True"),
        Cite("vllm/config/kernel.py", 427, '"enable_jit_warmup",'),
        Cite("vllm/config/vllm.py", 1784, "self.kernel_config.enable_jit_warmup = False"),
        Cite("vllm/v1/worker/gpu_worker.py", 985, "if self.vllm_config.kernel_config.enable_jit_warmup:"),
        Cite("vllm/model_executor/warmup/kernel_warmup.py", 185, "registry.warmup()"),
    ),
    v2_sampler_kernels=(
        KernelRule(
            "_temperature_kernel, _min_p_kernel, _penalties_kernel, _bincount_kernel, _bias_kernel, _bad_words_kernel",
            Cite("vllm/v1/worker/gpu/sample/penalties.py", 108, "def _penalties_kernel("),
            "model constants only (vocab size, buffer strides); the batch is the grid",
            "warmed",
            _W33_WARMUP,
        ),
        KernelRule(
            "_gumbel_sample_kernel",
            Cite("vllm/v1/worker/gpu/sample/gumbel.py", 282, "def _gumbel_sample_kernel("),
            "the logits dtype: fp32 after logits processing, the model's dtype for a batch that needs none "
            "(greedy or temperature 1 without other sampling parameters)",
            "partial",
            _W33_WARMUP,
            "batches that skip logits processing (the greedy warm-up pass runs only with speculative decoding)",
        ),
        KernelRule(
            "_topk_topp_kernel",
            Cite("vllm/v1/sample/ops/topk_topp_triton.py", 107, "def _topk_topp_kernel("),
            "TOPK_ENABLED/TOPP_ENABLED/SPLIT_COVERS_PONLY, BATCH_SIZE == 1 or not, the logits row stride",
            "partial",
            _W33_REGISTERED,
            _W33_ONLY_WHEN + "; then the warm-up's one mode (top-k and top-p) at batches of max_num_seqs, 2 and 1",
        ),
        KernelRule(
            "_topp_sb_stats_kernel, _topp_sb_step_kernel, _topp_sb_mask_kernel",
            Cite("vllm/v1/sample/ops/topk_topp_triton.py", 998, "def _topp_split_count(batch_size: int"),
            "S (row splits) from the batch size (<= 64), the vocabulary and the SM count; HAS_K; the round",
            "partial",
            _W33_REGISTERED,
            _W33_ONLY_WHEN + "; then only the S of the warm-up's batch sizes",
        ),
        KernelRule(
            "_topk_log_softmax_kernel",
            Cite("vllm/v1/worker/gpu/sample/logprob.py", 17, "def _topk_log_softmax_kernel("),
            "TOPK_BLOCK_SIZE = next power of two of logprobs + 1 (at most 1024) and Triton's specialization of it",
            "partial",
            Cite("vllm/sampling_params.py", 1490, "logprobs=5,"),
            "every logprobs width class but the warm-up's logprobs=5",
        ),
        KernelRule(
            "_fill_logprob_token_ids_kernel",
            Cite("vllm/v1/worker/gpu/sample/logprob.py", 193, "def _fill_logprob_token_ids_kernel("),
            "NUM_TOPK (the batch's largest logprobs) and PADDED_COLS: one compile per value",
            "lazy",
            None,
            "reached only by requests with logprob_token_ids; the warm-up sends none",
        ),
    ),
    grammar_bitmask=MappingProxyType(
        {
            "v2": KernelRule(
                "_apply_grammar_bitmask_kernel",
                Cite("vllm/v1/worker/gpu/structured_outputs.py", 134, "def _apply_grammar_bitmask_kernel("),
                "model constants only (vocab size, strides, MASK_STRIDE = decode query length)",
                "warmed",
                _W33_GRAMMAR,
            ),
            "v1": KernelRule(
                "xgrammar apply_token_bitmask_inplace (Triton)",
                Cite(
                    "vllm/v1/structured_output/utils.py",
                    180,
                    "xgr.apply_token_bitmask_inplace(logits, grammar_bitmask, indices=index_tensor)",
                ),
                "xgrammar's kernel and the logits dtype",
                "lazy",
                None,
                "the first structured-output request compiles it (the V1 runner only runs where V2 lacks a feature)",
            ),
        }
    ),
    moe_backend_sm90=MappingProxyType(
        {
            "bf16": BackendRule(
                "TRITON",
                Cite(
                    "vllm/model_executor/layers/fused_moe/oracle/unquantized.py",
                    78,
                    "if current_platform.is_device_capability_family(90):",
                ),
                "FlashInfer's unquantized MoE kernels move behind Triton on sm90",
            ),
            "fp8_block": BackendRule(
                "TRITON",
                Cite(
                    "vllm/model_executor/layers/fused_moe/oracle/fp8.py",
                    132,
                    "_move_to_front(_AVAILABLE_BACKENDS, Fp8MoeBackend.TRITON)",
                ),
                "block FP8 on sm90 with ep_size 1 (FLASHINFER_CUTLASS with expert parallelism); an explicit "
                "VLLM_USE_DEEP_GEMM=1 or --moe-backend wins",
            ),
            "int4": BackendRule(
                "HUMMING",
                Cite(
                    "vllm/model_executor/layers/quantization/utils/humming/priority.py",
                    11,
                    "_HUMMING_PREFERRED_CAPABILITIES = frozenset({90})",
                ),
                "prioritize_humming moves HUMMING ahead of MARLIN on sm90 (int_wna16.py:143, fp8.py:105); Humming's "
                "kernels come from the humming-kernels package, outside the vLLM wheel",
            ),
        }
    ),
    default_config_excerpt="0.33.0/get_default_config.py.txt",
    tuned_file_suffixes=("", FP8_BLOCK_SUFFIX),
    naive_assignment=(
        "no expert map, weights not host-resident (UVA offload), and num_tokens * top_k * 4 <= E "
        "(not for int4/int8 w/a16 with group blocks)"
    ),
    naive_cite=Cite("vllm/model_executor/layers/fused_moe/fused_moe.py", 1572, "and not weights_host_resident"),
    swap_ab_cite=Cite(
        "vllm/model_executor/layers/fused_moe/fused_moe.py",
        788,
        'SWAP_AB = enable_swap_ab(config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"])',
    ),
    moe_env_not_modeled=(
        "VLLM_TUNED_CONFIG_FOLDER",
        "VLLM_BATCH_INVARIANT",
        "VLLM_USE_FLASHINFER_MOE_FP16",
        "VLLM_TRITON_USE_TD",
    ),
    expert_parallel_cites=_expert_parallel_cites(1200, 1230, 1037, 69, 137, 1436),
)

RELEASE_RULES: Mapping[str, ReleaseRules] = MappingProxyType({"0.26.0": RULES_026, "0.33.0": RULES_033})


# --- vLLM 0.33's fused-MoE rules, ported (tests/unit/test_coverage_rules.py runs the release's own excerpts) --------


def next_power_of_2(n: int) -> int:
    """vllm/utils/math_utils.py:17."""
    return 1 if n < 1 else 1 << (n - 1).bit_length()


def default_config_033(
    m: int,
    experts: int,
    n: int,
    k: int,
    top_k: int,
    dtype: str | None,
    block_shape: Sequence[int] | None = None,
    *,
    rocm: bool = False,
    batch_invariant: bool = False,
) -> dict[str, int]:
    """vLLM 0.33 ``get_default_config`` (fused_moe.py:1298) on CUDA, or ROCm with ``rocm``."""
    if batch_invariant:
        return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8, "SPLIT_K": 1}
    if dtype == "fp8_w8a8" and block_shape is not None:
        if rocm:
            block_n, stages = block_shape[0], 2
        elif m <= 8 and block_shape[0] % 64 == 0:
            block_n, stages = 64, 4 if m <= 4 else 3
        else:
            block_n, stages = block_shape[0], 3
        return {
            "BLOCK_SIZE_M": 16 if m <= 64 else 64,
            "BLOCK_SIZE_N": block_n,
            "BLOCK_SIZE_K": block_shape[1],
            "GROUP_SIZE_M": 1 if m <= 16 else 32,
            "SPLIT_K": 1,
            "num_warps": 4,
            "num_stages": stages,
        }
    if dtype in ("int4_w4a16", "int8_w8a16") and block_shape is not None:
        bit = 4 if dtype == "int4_w4a16" else 8
        use_cuda = not rocm and bit == 4 and block_shape[1] in (32, 64, 128) and m * top_k / experts <= 6
        if use_cuda:
            return {"BLOCK_SIZE_M": min(16, next_power_of_2(m)), "GROUP_SIZE_M": 1, "SPLIT_K": 1}
        block_m = 16 if m <= 20 else 32 if m <= 40 else 64
        return {"BLOCK_SIZE_M": block_m, "GROUP_SIZE_M": 1, "SPLIT_K": 1}
    return {
        "BLOCK_SIZE_M": 16 if m <= 32 else 32 if m <= 96 else 64 if m <= 512 else 128,
        "BLOCK_SIZE_N": 64 if m <= 64 else 128,
        "BLOCK_SIZE_K": 128 if dtype == "fp8_w8a8" or m <= 64 else 64,
        "GROUP_SIZE_M": 16 if m // max(experts, 1) > 128 else 1,
        "SPLIT_K": 1,
        "num_warps": 4 if m <= 128 else 8,
        "num_stages": 2 if rocm else 4 if m <= 32 else 3,
    }


def device_file_name_033(gpu_name: str) -> str:
    """``get_device_name_as_file_name`` (platform_utils.py:69) plus the H200-family rule of get_config_file_name."""
    name = re.sub(r"[\s/]+", "_", gpu_name)
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def config_file_name_033(
    experts: int, n: int, gpu_name: str, dtype: str | None = None, block_shape: Sequence[int] | None = None
) -> str:
    """``get_config_file_name`` (fused_moe.py:1095): ``N`` is w2's last dimension (doubled for int4_w4a16)."""
    dtype_part = f",dtype={dtype}" if dtype else ""
    block_part = f",block_shape=[{','.join(map(str, block_shape))}]" if block_shape and all(block_shape) else ""
    return f"E={experts},N={n},device_name={device_file_name_033(gpu_name)}{dtype_part}{block_part}.json"


def enable_swap_ab_033(block_m: int, block_n: int, capability: int) -> bool:
    """``enable_swap_ab`` (utils.py:706), applied only on the FP8 w8a8 path (fused_moe.py:788)."""
    return capability == 90 and block_m < 64 and block_n >= 64


def naive_assignment_033(
    num_tokens: int,
    top_k: int,
    experts: int,
    *,
    expert_map: bool = False,
    host_resident: bool = False,
    wna16_group_blocks: bool = False,
) -> bool:
    """``_prepare_expert_assignment``'s choice (fused_moe.py:1569): True takes the naive block assignment."""
    return not expert_map and not host_resident and num_tokens * top_k * 4 <= experts and not wna16_group_blocks
