"""The fused-MoE coverage model per rank: tensor parallelism splits N, expert parallelism splits the experts.

vLLM 0.26 and 0.33 (``FusedMoEParallelConfig.make``, ``determine_expert_map``, ``moe_align_block_size``,
``try_get_optimal_moe_config``; the lines are cited in ``coverage_rules.py`` and checked against the releases by
test_coverage_rules.py): with ``enable_expert_parallel`` and one engine, the MoE layers' tensor parallelism becomes
expert parallelism of the same size; a rank holds E // EP experts (one more for the first E % EP ranks) and N whole;
the tuned file and the default rule read the rank's E, the block padding the model's E, and an expert map rules out
the naive block assignment.
"""

from __future__ import annotations

import importlib.util
import tomllib
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import pytest

from bless.core.coverage import CoverageFamily, group_token_counts
from bless.engines.vllm import coverage as vllm_coverage
from bless.engines.vllm.coverage import (
    MoeShape,
    default_config,
    fused_moe_key,
    moe_rank_shapes,
    tuned_table,
)
from bless.engines.vllm.serve_args import normalize_serve
from bless.errors import InputInvalidError

REPO = Path(__file__).resolve().parents[2]
H100 = "NVIDIA H100 80GB HBM3"


def _shapes() -> dict[str, dict[str, Any]]:
    spec = importlib.util.spec_from_file_location("make_vllm_model", REPO / "scripts" / "gpu" / "make_vllm_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shapes: dict[str, dict[str, Any]] = module.SHAPES
    return shapes


QWEN3 = _shapes()["qwen3-30b-a3b"]


def fused(
    serve: Mapping[str, Any], config: Mapping[str, Any] = QWEN3, gpu: str = H100, release: str = "0.26.0"
) -> CoverageFamily:
    plan = vllm_coverage.coverage_plan(
        release, config, serve, {"VLLM_USE_FLASHINFER_SAMPLER": "0"}, gpu, "m", 151936, capability="9.0"
    )
    return next(f for f in plan.families if f.name == "fused_moe")


def profile_serve(name: str) -> dict[str, Any]:
    with (REPO / "profiles" / name).open("rb") as handle:
        document = tomllib.load(handle)
    return normalize_serve(document["serve"], where=name)


BASE = {"max_model_len": 4096, "max_num_batched_tokens": 2048, "max_num_seqs": 8, "dtype": "bfloat16"}


def test_tensor_parallel_splits_n_and_reads_the_per_rank_tuned_file() -> None:
    (shape,), why = moe_rank_shapes(QWEN3, {"tensor_parallel_size": 2})
    assert why == "" and shape == MoeShape(128, 8, 384, 2048)
    family = fused(profile_serve("vllm-0.26-qwen3-30b-a3b-dummy-tp2-local.toml"))
    assert family.modeled and not family.gap
    assert "tuned file E=128,N=384,device_name=NVIDIA_H100_80GB_HBM3.json" in family.reason
    single = fused(profile_serve("vllm-0.26-qwen3-30b-a3b-dummy-local.toml"))
    assert "E=128,N=768" in single.reason and family.classes != single.classes


def test_expert_parallel_gives_each_rank_whole_experts_of_its_share() -> None:
    serve = profile_serve("vllm-0.26-qwen3-30b-a3b-dummy-ep2-local.toml")
    assert serve["enable_expert_parallel"] is True and serve["tensor_parallel_size"] == 2
    (shape,), why = moe_rank_shapes(QWEN3, serve)
    assert why == "" and shape == MoeShape(64, 8, 768, 2048, global_experts=128)
    family = fused(serve)
    assert family.modeled and not family.gap, family.reason
    # vLLM ships no E=64,N=768 table for the H100: the default rule, read with the rank's 64 experts.
    assert "E=64 of 128 (expert parallel)" in family.reason
    assert "default rule (vLLM 0.26.0 ships no E=64,N=768,device_name=NVIDIA_H100_80GB_HBM3.json)" in family.reason
    assert tuned_table("0.26.0", "E=64,N=768,device_name=NVIDIA_H100_80GB_HBM3.json") is None
    tensor = fused(profile_serve("vllm-0.26-qwen3-30b-a3b-dummy-tp2-local.toml"))
    assert {c.key for c in family.classes} != {c.key for c in tensor.classes}


def test_expert_parallel_needs_more_than_one_rank_and_the_033_model_follows_it_too() -> None:
    (alone,), _ = moe_rank_shapes(QWEN3, {"enable_expert_parallel": True})  # EP of one rank: vLLM's use_ep is off
    assert alone == MoeShape(128, 8, 768, 2048)
    serve = {**BASE, "tensor_parallel_size": 4, "enable_expert_parallel": True}
    later = fused(serve, release="0.33.0")
    assert later.modeled and "E=32 of 128 (expert parallel)" in later.reason


def test_an_expert_map_never_takes_the_naive_assignment_and_pads_for_every_expert() -> None:
    whole = MoeShape(128, 8, 768, 2048)
    shard = MoeShape(64, 8, 768, 2048, global_experts=128)
    for m in (1, 2, 3, 4):  # m * top_k * 4 <= 128: naive without an expert map
        assert fused_moe_key(m, whole, default_config(m, 128))[1] is True
        assert fused_moe_key(m, shard, default_config(m, 64))[1] is False
    # moe_align_block_size pads for the model's experts: a rank of 43 (128 over 3) pads as a rank of all 128 would,
    # 40 * 8 + 128 * 31 rows (divisible by 16), not 40 * 8 + 43 * 31 (not).
    odd = MoeShape(43, 8, 768, 2048, global_experts=128)
    config = default_config(40, 43)
    assert fused_moe_key(40, odd, config)[2:] == fused_moe_key(40, whole, config)[2:] == ("D", "D", "D")
    assert fused_moe_key(40, MoeShape(43, 8, 768, 2048), config)[2:] == ("N", "N", "D")


def test_experts_that_do_not_divide_give_two_rank_shapes_and_a_class_per_pair_of_keys() -> None:
    serve = {**BASE, "max_num_batched_tokens": 700, "tensor_parallel_size": 3, "enable_expert_parallel": True}
    shapes, why = moe_rank_shapes(QWEN3, serve)
    assert why == "" and [s.experts for s in shapes] == [42, 43]  # 128 = 43 + 43 + 42
    family = fused(serve)
    assert family.modeled and "E=42 of 128" in family.reason and "E=43 of 128" in family.reason
    assert all("ranks with E=42" in c.key and "ranks with E=43" in c.key for c in family.classes)

    def key(m: int) -> Hashable:
        return tuple(fused_moe_key(m, s, default_config(m, s.experts)) for s in shapes)

    visited = group_token_counts(range(1, 701), key, repr, prefer_above=16)
    assert len(family.classes) == len(visited)
    assert sum(c.members for c in family.classes) == 700


@pytest.mark.parametrize(
    ("serve", "needle"),
    [
        ({"tensor_parallel_size": 2, "extra_args": ["--data-parallel-size", "2"]}, "data_parallel_size 2"),
        ({"tensor_parallel_size": 2, "enable_expert_parallel": True, "extra_args": ["--enable-eplb"]}, "EPLB"),
        ({"tensor_parallel_size": 5}, "moe_intermediate_size 768 does not split over tensor_parallel_size 5"),
    ],
)
def test_parallel_layouts_the_model_does_not_follow_are_named_gaps(serve: dict[str, Any], needle: str) -> None:
    family = fused({**BASE, **serve})
    assert family.gap and needle in family.reason


def test_few_experts_over_many_ranks_are_refused_by_name() -> None:
    config = {**QWEN3, "num_experts": 2, "num_experts_per_tok": 1}
    shapes, why = moe_rank_shapes(config, {"tensor_parallel_size": 4, "enable_expert_parallel": True})
    assert shapes == () and "2 experts do not spread over expert_parallel_size 4" in why


@pytest.mark.parametrize("flag", ["-ep", "-tp", "-pp", "--enable-expert-parallel", "--no-enable-expert-parallel"])
def test_parallel_flags_belong_to_their_hashed_keys_not_extra_args(flag: str) -> None:
    with pytest.raises(InputInvalidError) as refused:
        normalize_serve({"extra_args": [flag, "2"] if flag in ("-tp", "-pp") else [flag]}, where="serve")
    assert refused.value.hint is not None and "use serve." in refused.value.hint
