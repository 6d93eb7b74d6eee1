"""Coverage models: vLLM 0.26's fused-MoE classes against its own source and tuned files, the reference engine's
shape buckets, and the plan's data model (pure; no engine)."""

from __future__ import annotations

import json
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from bless.core.coverage import CoveragePlan, coverage_prompt, describe_plan, group_token_counts
from bless.engines.reference import reference_coverage
from bless.engines.vllm import coverage as vllm_coverage
from bless.engines.vllm.coverage import (
    MoeShape,
    config_file_name,
    default_config,
    device_file_name,
    fused_moe_key,
    nearest_config,
    tuned_table,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / "coverage" / "0.26.0"
H200_FILE = "E=128,N=768,device_name=NVIDIA_H200.json"
QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
    "hidden_size": 2048,
    "vocab_size": 151936,
}
LLAMA_8B: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "vocab_size": 128256}
SERVE: dict[str, Any] = {
    "dtype": "bfloat16",
    "max_model_len": 4096,
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 16,
    "compilation_config": {"mode": 3, "cudagraph_mode": "FULL_AND_PIECEWISE"},
}
ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
UNBOUNDED = {k: v for k, v in SERVE.items() if k != "max_num_batched_tokens"}


def plan_for(
    config: Mapping[str, Any] | None = QWEN3_30B_A3B,
    serve: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    gpu: str | None = "NVIDIA H200",
    release: str | None = "0.26.0",
) -> CoveragePlan:
    return vllm_coverage.coverage_plan(
        release,
        config,
        SERVE if serve is None else serve,
        ENV if env is None else env,
        gpu,
        "m",
        151936,
        capability="9.0",
        chat_template=True,
    )


def family(plan: CoveragePlan, name: str) -> Any:
    return next(f for f in plan.families if f.name == name)


# --- vLLM 0.26 fused MoE: the data and rules against the release's own files --------------------------------


def test_the_tuned_table_is_the_release_file_verbatim_in_file_order() -> None:
    shipped = json.loads((FIXTURES / H200_FILE).read_text(encoding="utf-8"))
    shipped.pop("triton_version", None)
    table = tuned_table("0.26.0", H200_FILE)
    assert table is not None
    assert list(table) == [int(key) for key in shipped]  # vLLM's min() picks the first key on a tie
    assert {str(k): v for k, v in table.items()} == shipped


def _source_default_config() -> Any:
    """vLLM 0.26's own ``get_default_config`` (verbatim excerpt), run on CUDA, not batch-invariant."""
    namespace: dict[str, Any] = {
        "envs": types.SimpleNamespace(VLLM_BATCH_INVARIANT=False),
        "current_platform": types.SimpleNamespace(is_rocm=lambda: False),
        "should_moe_wna16_use_cuda": lambda *args: False,
    }
    exec((FIXTURES / "get_default_config.py.txt").read_text(encoding="utf-8"), namespace)
    return namespace["get_default_config"]


@pytest.mark.parametrize("experts", [8, 64, 128, 256])
def test_the_default_rule_is_vllms_own_for_every_token_count(experts: int) -> None:
    source = _source_default_config()
    for m in range(1, 40000, 7):
        assert default_config(m, experts) == source(m, experts, 768, 2048, 8, None, None), (m, experts)


def test_nearest_key_ties_go_to_the_first_key_as_in_vllm() -> None:
    table = {1: {"x": 1}, 3: {"x": 3}}
    assert nearest_config(table, 2) == {"x": 1}
    assert nearest_config({3: {"x": 3}, 1: {"x": 1}}, 2) == {"x": 3}


def test_device_names_follow_vllms_file_names() -> None:
    assert device_file_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"
    assert device_file_name("NVIDIA H200 NVL") == "NVIDIA_H200"  # the H200 family reads the H200 file
    assert config_file_name(128, 768, "NVIDIA H200") == H200_FILE


def test_qwen3_30b_a3b_on_an_h200_reads_the_tuned_file() -> None:
    fused = family(plan_for(), "fused_moe")
    assert fused.reachable and fused.modeled
    assert H200_FILE in fused.reason
    configs = {json.dumps(v, sort_keys=True) for v in json.loads((FIXTURES / H200_FILE).read_text()).values()}
    configs.discard(json.dumps("3.4.0"))
    # every distinct tile configuration of the file that the range reaches has at least one class
    assert len(fused.classes) >= 26


def test_every_token_count_falls_in_exactly_one_class_whose_representative_compiles_the_same() -> None:
    plan = plan_for()
    fused = family(plan, "fused_moe")
    table = tuned_table("0.26.0", H200_FILE)
    assert table is not None
    shape = MoeShape(128, 8, 768, 2048)
    by_key = {c.key: c for c in fused.classes}
    assert sum(c.members for c in fused.classes) == 2048
    for m in range(1, 2049):
        key = vllm_coverage.describe_key(fused_moe_key(m, shape, nearest_config(table, m)))
        representative = by_key[key].token_count
        assert fused_moe_key(representative, shape, nearest_config(table, representative)) == fused_moe_key(
            m, shape, nearest_config(table, m)
        )
    # representatives avoid the CUDA-graph sizes where the class has members above them (padding)
    capture = min(16 * 2, 512)
    for c in fused.classes:
        assert c.token_count > capture or c.last <= capture or c.token_count == c.first


def test_parity_and_the_naive_path_split_classes() -> None:
    shape = MoeShape(128, 8, 768, 2048)
    config = default_config(600, 128)
    odd, even = fused_moe_key(601, shape, config), fused_moe_key(602, shape, config)
    assert odd != even  # num_valid_tokens = 8*M is divisible by 16 only for even M
    assert fused_moe_key(4, shape, default_config(4, 128))[1] is True  # 4*8*4 <= 128: naive assignment
    assert fused_moe_key(5, shape, default_config(5, 128))[1] is False


def test_h100_has_no_tuned_file_for_this_shape_and_takes_the_default_rule() -> None:
    fused = family(plan_for(gpu="NVIDIA H100 80GB HBM3"), "fused_moe")
    assert fused.modeled and "default rule" in fused.reason
    assert len(fused.classes) > 4


def test_tensor_parallelism_splits_the_intermediate_size() -> None:
    fused = family(plan_for(serve={**SERVE, "tensor_parallel_size": 2}), "fused_moe")
    assert "N=384 per rank" in fused.reason


@pytest.mark.parametrize(
    ("config", "serve", "env", "release", "needle"),
    [
        (
            QWEN3_30B_A3B,
            {k: v for k, v in SERVE.items() if k != "max_num_batched_tokens"},
            ENV,
            "0.26.0",
            "max_num_batched_tokens",
        ),
        (QWEN3_30B_A3B, {**SERVE, "max_model_len": 2048}, ENV, "0.26.0", "max_model_len must exceed"),
        (QWEN3_30B_A3B, {**SERVE, "quantization": "fp8"}, ENV, "0.26.0", "without a quantization_config"),
        (
            {**QWEN3_30B_A3B, "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}},
            SERVE,
            ENV,
            "0.26.0",
            "without a weight_block_size",
        ),
        (
            {**QWEN3_30B_A3B, "quantization_config": {"quant_method": "awq", "bits": 4}},
            SERVE,
            ENV,
            "0.26.0",
            "awq MoE weights",
        ),
        (QWEN3_30B_A3B, SERVE, {**ENV, "VLLM_TUNED_CONFIG_FOLDER": "/x"}, "0.26.0", "VLLM_TUNED_CONFIG_FOLDER"),
        (QWEN3_30B_A3B, SERVE, ENV, "0.34.0", "no fused-MoE coverage model for vLLM 0.34.0"),
        (None, SERVE, ENV, "0.26.0", "config.json cannot be read"),
        ({"architectures": ["DeepseekV3ForCausalLM"], "n_routed_experts": 256}, SERVE, ENV, "0.26.0", "no MoE field"),
    ],
)
def test_what_the_model_cannot_enumerate_is_a_named_gap(
    config: Mapping[str, Any] | None, serve: Mapping[str, Any], env: Mapping[str, str], release: str, needle: str
) -> None:
    plan = plan_for(config=config, serve=serve, env=env, release=release)
    fused = family(plan, "fused_moe")
    assert fused.gap and needle in fused.reason
    assert fused in plan.gaps and not plan.requests


def test_a_dense_model_reaches_no_lazy_family() -> None:
    plan = plan_for(config=LLAMA_8B)
    assert not plan.gaps and not plan.requests
    assert not family(plan, "fused_moe").reachable


def test_the_sampler_family_crosses_every_sampling_mode_with_every_batch_class() -> None:
    sampler = family(plan_for(serve={**SERVE, "max_num_seqs": 8}), "sampler")
    assert sampler.reachable and sampler.modeled
    shapes = {(c.key.split(",")[0], c.burst) for c in sampler.classes}
    # 1 and 2 (torch.compile's size 1 and its dynamic shapes), 8 (the Triton sampler's smallest batch)
    assert {burst for _, burst in shapes} == {1, 2, 8}
    assert ("top_k and top_p", 8) in shapes and ("logprobs=16", 1) in shapes and ("logprobs=32", 1) not in shapes
    wide = family(plan_for(serve={**SERVE, "max_num_seqs": 64, "max_logprobs": 64}), "sampler")
    assert {c.burst for c in wide.classes} == {1, 2, 9, 16} and any(
        c.key.startswith("logprobs=64,") for c in wide.classes
    )
    drives = plan_for().drives
    assert len(drives) == len(set(drives)) and all(d.max_tokens == 8 for d in drives if d.sampling)


def test_flashinfer_left_on_is_a_gap() -> None:
    plan = plan_for(config=LLAMA_8B, env={})  # vLLM 0.26 uses FlashInfer's sampler unless told not to
    flashinfer = family(plan, "flashinfer_jit")
    assert flashinfer.gap and "VLLM_USE_FLASHINFER_SAMPLER" in flashinfer.reason


def test_every_family_the_release_names_is_in_the_plan_with_its_source() -> None:
    plan = plan_for()
    names = [f.name for f in plan.families]
    assert names == [
        "fused_moe",
        "sampler",
        "structured_outputs",
        "chat",
        "fp8_linear",
        "inductor_graph",
        "flashinfer_jit",
        "spec_decode",
        "lora",
        "model_specific",
    ]
    assert all(f.source and f.reason for f in plan.families)


# --- the reference engine's shape buckets ---------------------------------------------------------------------


def test_reference_buckets_give_one_class_per_bucket_reached_by_its_shortest_prompt() -> None:
    plan = reference_coverage({"shape_buckets": [8, 16, 32], "max_seq_len": 64}, "reference-tiny")
    (buckets,) = plan.families
    assert [(c.key, c.token_count, c.first, c.last) for c in buckets.classes] == [
        ("bucket 8", 1, 1, 8),
        ("bucket 16", 9, 9, 16),
        ("bucket 32", 17, 17, 63),  # longer prompts run in the largest bucket
    ]
    assert plan.requests == (1, 9, 17) and plan.token_range == (1, 63)
    assert all(0 <= t < 256 for t in plan.prompt(63))


def test_reference_without_buckets_compiles_nothing_lazily() -> None:
    plan = reference_coverage({"max_seq_len": 64}, "reference-tiny")
    assert plan.requests == () and not plan.gaps and not plan.families[0].reachable


# --- the data model ------------------------------------------------------------------------------------------------


def test_plan_round_trips_through_its_json_form() -> None:
    plan = plan_for()
    assert CoveragePlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def test_prompts_have_the_exact_length_and_distinct_first_tokens() -> None:
    prompts = {length: coverage_prompt(length, (1000, 150936)) for length in range(1, 2049)}
    assert all(len(p) == length for length, p in prompts.items())
    assert len({p[0] for p in prompts.values()}) == len(prompts)  # no shared prefix block between them
    assert all(1000 <= t < 150936 for p in prompts.values() for t in p)


def test_grouping_keeps_first_appearance_order_and_prefers_counts_above_padding() -> None:
    classes = group_token_counts(range(1, 11), lambda m: m % 2, lambda k: f"parity {k}", prefer_above=4)
    assert [(c.key, c.token_count, c.members) for c in classes] == [("parity 1", 5, 5), ("parity 0", 6, 5)]


def test_the_plan_in_words_names_gaps_and_unreachable_families() -> None:
    lines = describe_plan(plan_for(config=LLAMA_8B, env={}))
    assert any(line.startswith("fused_moe: not reachable here (the model has no experts)") for line in lines)
    assert any(line.startswith("flashinfer_jit: GAP") for line in lines)
