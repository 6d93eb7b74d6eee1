"""vLLM's per-release coverage facts (bless/engines/vllm/coverage_rules.py) held to the releases' own source:
every citation against verbatim excerpts, 0.33's fused-MoE rules against its own functions run from their excerpts,
the tuned tables against the shipped files, and the table script on a wheel and a tree (pure; no engine)."""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import sys
import types
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from bless.engines.vllm import coverage as vllm_coverage
from bless.engines.vllm.coverage_rules import (
    FP8_BLOCK_SUFFIX,
    RELEASE_RULES,
    RULES_026,
    RULES_033,
    config_file_name_033,
    default_config_033,
    enable_swap_ab_033,
    naive_assignment_033,
    next_power_of_2,
)
from bless.engines.vllm.sampler_033 import (
    SPLIT_MAX_BATCH,
    sampler_warmup_batches_033,
    topk_topp_lazy_classes_033,
    topp_split_count_033,
)

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
COVERAGE_FIXTURES = TESTS / "fixtures" / "vllm" / "coverage"
FIXTURES_033 = COVERAGE_FIXTURES / "0.33.0"
H200_BF16 = "E=128,N=768,device_name=NVIDIA_H200.json"
H200_FP8 = f"E=128,N=768,device_name=NVIDIA_H200{FP8_BLOCK_SUFFIX}.json"
HEADER = re.compile(r"# vllm (?P<release>\S+) (?P<path>\S+), lines (?P<first>\d+)-(?P<last>\d+) verbatim")


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


TABLES = _script("vllm_moe_tables")


def _excerpt(name: str) -> str:
    """A verbatim excerpt, its header line checked and dropped."""
    text = (FIXTURES_033 / name).read_text(encoding="utf-8")
    header, _, body = text.partition("\n")
    match = HEADER.fullmatch(header)
    assert match and match["release"] == "0.33.0", header
    assert body.count("\n") == int(match["last"]) - int(match["first"]) + 1, f"{name}: line count != its range"
    return body


def _run(names: tuple[str, ...], namespace: dict[str, Any]) -> dict[str, Any]:
    for name in names:
        exec(_excerpt(name), namespace)
    return namespace


def _platform(*, rocm: bool = False, capability: int = 90, gpu: str = "NVIDIA H100 80GB HBM3") -> Any:
    return types.SimpleNamespace(
        is_rocm=lambda: rocm,
        is_cuda=lambda: not rocm,
        is_device_capability=lambda cap: cap == capability,
        get_device_name=lambda device_id=0: gpu,
    )


# --- every citation is on its line of the release's source --------------------------------------------------------


def _cited_blocks(release: str) -> list[tuple[str, int, list[str]]]:
    blocks: list[tuple[str, int, list[str]]] = []
    for line in (COVERAGE_FIXTURES / release / "cited.txt").read_text(encoding="utf-8").splitlines():
        match = HEADER.fullmatch(line)
        if match:
            assert match["release"] == release
            blocks.append((match["path"], int(match["first"]), []))
        else:
            blocks[-1][2].append(line)
    return blocks


@pytest.mark.parametrize("release", sorted(RELEASE_RULES))
def test_every_citation_is_on_its_line_of_the_release(release: str) -> None:
    blocks = _cited_blocks(release)
    cites = RELEASE_RULES[release].cites()
    assert len(cites) >= 10
    for cite in cites:
        lines = [
            body[cite.line - first]
            for path, first, body in blocks
            if path == cite.path and first <= cite.line < first + len(body)
        ]
        assert lines, f"{cite}: no excerpt holds this line (run scripts/vllm_coverage_cites.py {release})"
        assert cite.text in lines[0], f"{cite}: {cite.text!r} is not on that line"


def test_the_releases_differ_where_the_source_does() -> None:
    assert RULES_026.runner_rule == "v2_dense_and_listed_moe" and RULES_026.v2_default_moe_architectures
    assert "Qwen3MoeForCausalLM" not in RULES_026.v2_default_moe_architectures  # 0.26 runs Qwen3-MoE on V1
    assert RULES_033.runner_rule == "v2_unless_unsupported" and RULES_033.v2_default_moe_architectures is None
    assert RULES_026.jit_warmup_switch is None and RULES_033.jit_warmup_switch == "kernel_config.enable_jit_warmup"
    # the V2 grammar kernel is warmed at start-up in both; V1's xgrammar kernel never is
    for rules in (RULES_026, RULES_033):
        assert rules.grammar_bitmask["v2"].warm == "warmed" and rules.grammar_bitmask["v2"].warmed_by is not None
        assert rules.grammar_bitmask["v1"].warm == "lazy" and rules.grammar_bitmask["v1"].warmed_by is None
        assert rules.moe_backend_sm90["bf16"].backend == rules.moe_backend_sm90["fp8_block"].backend == "TRITON"
    assert (RULES_026.moe_backend_sm90["int4"].backend, RULES_033.moe_backend_sm90["int4"].backend) == (
        "MARLIN",
        "HUMMING",
    )
    lazy = {k.name for k in RULES_033.v2_sampler_kernels if k.warm != "warmed"}
    assert {"_topk_topp_kernel", "_topk_log_softmax_kernel", "_fill_logprob_token_ids_kernel"} <= lazy
    assert all(k.lazy_keys for k in RULES_033.v2_sampler_kernels if k.warm != "warmed")
    assert (COVERAGE_FIXTURES / RULES_033.default_config_excerpt).is_file()
    assert (COVERAGE_FIXTURES / RULES_026.default_config_excerpt).is_file()


# --- 0.33's fused-MoE functions, run from their excerpts, against the port ------------------------------------------


def _source_default_config(*, rocm: bool = False, batch_invariant: bool = False) -> Callable[..., dict[str, int]]:
    namespace = _run(
        ("next_power_of_2.py.txt", "get_default_config.py.txt"),
        {
            "envs": types.SimpleNamespace(VLLM_BATCH_INVARIANT=batch_invariant),
            "current_platform": _platform(rocm=rocm),
        },
    )
    function: Callable[..., dict[str, int]] = namespace["get_default_config"]
    return function


DTYPES: list[tuple[str | None, list[int] | None]] = [
    (None, None),  # bf16 / fp16
    ("fp8_w8a8", None),  # per-tensor FP8
    ("fp8_w8a8", [128, 128]),  # block FP8
    ("fp8_w8a8", [64, 64]),
    ("fp8_w8a8", [32, 32]),
    ("int4_w4a16", [0, 128]),
    ("int4_w4a16", [0, 256]),
    ("int8_w8a16", [0, 128]),
]


@pytest.mark.parametrize(("dtype", "block_shape"), DTYPES)
@pytest.mark.parametrize("rocm", [False, True])
def test_the_default_rule_is_vllm_033s_own(dtype: str | None, block_shape: list[int] | None, rocm: bool) -> None:
    source = _source_default_config(rocm=rocm)
    for experts in (8, 64, 128, 256):
        for m in [*range(1, 130), *range(130, 40000, 37)]:
            expected = source(m, experts, 768, 2048, 8, dtype, block_shape)
            assert default_config_033(m, experts, 768, 2048, 8, dtype, block_shape, rocm=rocm) == expected, (
                m,
                experts,
            )


def test_batch_invariance_takes_one_fixed_config() -> None:
    source = _source_default_config(batch_invariant=True)
    for dtype, block_shape in DTYPES:
        assert default_config_033(7, 8, 1, 1, 2, dtype, block_shape, batch_invariant=True) == source(
            7, 8, 1, 1, 2, dtype, block_shape
        )


def test_the_bf16_default_rule_is_unchanged_from_026() -> None:
    for experts in (8, 128):
        for m in range(1, 5000, 3):
            assert default_config_033(m, experts, 768, 2048, 8, None) == vllm_coverage.default_config(m, experts)


def test_the_bf16_and_fp8_default_rules_are_026s_line_for_line() -> None:
    """Only the int4/int8 w/a16 CUDA branch changed between 0.26 and 0.33 (0.26's own excerpt, run here)."""
    namespace: dict[str, Any] = {
        "envs": types.SimpleNamespace(VLLM_BATCH_INVARIANT=False),
        "current_platform": _platform(),
        "should_moe_wna16_use_cuda": lambda *args: False,
    }
    exec((COVERAGE_FIXTURES / RULES_026.default_config_excerpt).read_text(encoding="utf-8"), namespace)
    source_026 = namespace["get_default_config"]
    for dtype, block_shape in DTYPES[:5]:
        for m in [*range(1, 130), *range(130, 20000, 41)]:
            assert default_config_033(m, 128, 768, 2048, 8, dtype, block_shape) == source_026(
                m, 128, 768, 2048, 8, dtype, block_shape
            ), (m, dtype, block_shape)


def test_next_power_of_2_is_vllms() -> None:
    source = _run(("next_power_of_2.py.txt",), {})["next_power_of_2"]
    assert all(next_power_of_2(n) == source(n) for n in range(-3, 5000))


@pytest.mark.parametrize(
    "gpu",
    ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA H100 PCIe", "NVIDIA  A100/PCIe  40GB", "AMD X"],
)
@pytest.mark.parametrize(
    ("dtype", "block_shape"), [(None, None), ("fp8_w8a8", [128, 128]), ("int8_w8a16", [0, 128]), ("fp8_w8a8", None)]
)
def test_file_names_are_vllm_033s(
    gpu: str, dtype: str | None, block_shape: list[int] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # get_device_name_as_file_name imports current_platform from vllm.platforms when called
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = _platform(gpu=gpu)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    namespace = _run(("get_device_name_as_file_name.py.txt", "get_config_file_name.py.txt"), {"re": re})
    assert config_file_name_033(128, 768, gpu, dtype, block_shape) == namespace["get_config_file_name"](
        128, 768, dtype, block_shape
    )


def test_the_h200_files_the_coverage_model_needs_ship_in_033() -> None:
    assert config_file_name_033(128, 768, "NVIDIA H200 NVL") == H200_BF16
    assert config_file_name_033(128, 768, "NVIDIA H200", "fp8_w8a8", [128, 128]) == H200_FP8
    for name in (H200_BF16, H200_FP8):
        shipped = json.loads((FIXTURES_033 / name).read_text(encoding="utf-8"))
        shipped.pop("triton_version", None)
        table = vllm_coverage.tuned_table("0.33.0", name)
        assert table is not None and list(table) == [int(key) for key in shipped]
        assert {str(key): value for key, value in table.items()} == shipped


def test_every_stored_table_is_a_kind_the_model_reads() -> None:
    data = json.loads((REPO / "bless" / "engines" / "vllm" / "moe_configs.json").read_text(encoding="utf-8"))
    for release in ("0.26.0", "0.33.0"):
        names = list(data[release]["tables"])
        suffixes = RELEASE_RULES[release].tuned_file_suffixes
        assert names == sorted(names)
        assert all(re.fullmatch(r"E=\d+,N=\d+,device_name=[^,]+" + f"({'|'.join(map(re.escape, suffixes))})\\.json", n)
                   for n in names)  # fmt: skip
        assert any(n.endswith(f"{FP8_BLOCK_SUFFIX}.json") for n in names)
    # vLLM 0.33 kept every 0.26 table and changed one (an H20-3e FP8 table)
    changed = [n for n, t in data["0.26.0"]["tables"].items() if data["0.33.0"]["tables"][n] != t]
    assert changed == [f"E=256,N=256,device_name=NVIDIA_H20-3e{FP8_BLOCK_SUFFIX}.json"]


@pytest.mark.parametrize("capability", [80, 90, 100])
def test_swap_ab_is_vllm_033s(capability: int) -> None:
    namespace = _run(
        ("enable_swap_ab.py.txt",), {"functools": functools, "current_platform": _platform(capability=capability)}
    )
    for block_m in (16, 32, 64, 128):
        for block_n in (32, 64, 128):
            assert enable_swap_ab_033(block_m, block_n, capability) == namespace["enable_swap_ab"](block_m, block_n)


class _TopkIds:
    """What _prepare_expert_assignment reads of topk_ids on its naive path."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.device = "cpu"

    def view(self, *shape: int) -> str:
        return "flat"

    def numel(self) -> int:
        return self.count


@pytest.mark.parametrize("host_resident", [False, True])
@pytest.mark.parametrize("expert_map", [False, True])
def test_the_naive_assignment_is_vllm_033s(host_resident: bool, expert_map: bool) -> None:
    namespace = _run(
        ("prepare_expert_assignment.py.txt",),
        {
            "torch": types.SimpleNamespace(Tensor=object, full=lambda *a, **k: "full", int32="int32"),
            "moe_align_block_size": lambda *a, **k: ("sorted", None, None),
            "Any": Any,
        },
    )
    prepare = namespace["_prepare_expert_assignment"]
    for experts in (8, 64, 128):
        for tokens in range(1, 40):
            for block_shape, wna16 in ((None, False), ([0, 128], True)):
                naive = (
                    prepare(
                        _TopkIds(tokens * 8),
                        {"BLOCK_SIZE_M": 16},
                        tokens,
                        8,
                        experts,
                        object() if expert_map else None,
                        use_int4_w4a16=wna16,
                        block_shape=block_shape,
                        weights_host_resident=host_resident,
                    )[0]
                    is None
                )
                assert naive == naive_assignment_033(
                    tokens, 8, experts, expert_map=expert_map, host_resident=host_resident, wna16_group_blocks=wna16
                ), (tokens, experts)


# --- scripts/vllm_moe_tables.py --------------------------------------------------------------------------------------

CONFIGS = "vllm/model_executor/layers/fused_moe/configs"
SAMPLE_FILES = {
    "E=8,N=64,device_name=GPU.json": {"triton_version": "3.4.0", "4": {"a": 1}, "1": {"a": 2}},
    f"E=8,N=64,device_name=GPU{FP8_BLOCK_SUFFIX}.json": {"2": {"b": 1}},
    "E=8,N=64,device_name=GPU,dtype=int8_w8a16.json": {"2": {"c": 1}},
    "E=8,N=64,device_name=GPU,block_shape=[128,128].json": {"2": {"d": 1}},
    "README": "not a table",
}


def _write_tree(root: Path) -> None:
    configs = root / CONFIGS
    configs.mkdir(parents=True)
    for name, content in SAMPLE_FILES.items():
        (configs / name).write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")


def test_the_script_reads_a_tree_and_a_wheel_alike_keeping_file_order(tmp_path: Path) -> None:
    _write_tree(tmp_path / "tree")
    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in sorted((tmp_path / "tree").rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(tmp_path / "tree").as_posix())
    tables = TABLES.release_tables(tmp_path / "tree")
    assert tables == TABLES.release_tables(wheel) == TABLES.release_tables(tmp_path / "tree" / "vllm")
    # sorted by file name; int8, block-only and non-table files left out
    assert list(tables) == [f"E=8,N=64,device_name=GPU{FP8_BLOCK_SUFFIX}.json", "E=8,N=64,device_name=GPU.json"]
    assert list(tables["E=8,N=64,device_name=GPU.json"]) == ["4", "1"]  # file order, triton_version dropped
    assert TABLES.release_of(wheel, None) == "9.9.9"

    data = tmp_path / "moe_configs.json"
    data.write_text(json.dumps({"_about": "x", "0.1.0": {"wheel": "vllm-0.1.0", "tables": {}}}), encoding="utf-8")
    assert TABLES.main([str(wheel), "--data", str(data), "--check"]) == 1
    assert TABLES.main([str(wheel), "--data", str(data)]) == 0
    stored = json.loads(data.read_text(encoding="utf-8"))
    assert list(stored) == ["_about", "0.1.0", "9.9.9"] and stored["9.9.9"]["tables"] == tables
    assert TABLES.main([str(tmp_path / "tree"), "--release", "9.9.9", "--data", str(data), "--check"]) == 0
    assert TABLES.main([str(tmp_path / "tree"), "--data", str(data)]) == 2  # a tree needs --release


def test_the_script_refuses_what_vllm_could_not_read(tmp_path: Path) -> None:
    configs = tmp_path / CONFIGS
    configs.mkdir(parents=True)
    (configs / "E=8,N=64,device_name=GPU.json").write_text('{"x": {}}', encoding="utf-8")
    with pytest.raises(TABLES.TablesError, match="not a token count"):
        TABLES.release_tables(tmp_path)
    with pytest.raises(TABLES.TablesError, match="no vllm/model_executor"):
        TABLES.release_tables(tmp_path / "elsewhere")


# --- 0.33's Triton top-k/top-p on CUDA ---------------------------------------------------------------------------


def test_the_split_count_is_vllm_033s() -> None:
    namespace = _run(("topp_split_count.py.txt",), {"torch": types.SimpleNamespace(device=object, Tensor=object)})
    assert namespace["_SPLIT_MAX_BATCH"] == SPLIT_MAX_BATCH
    for vocab in (32000, 128256, 151936, 262144):
        for num_sm in (78, 114, 132, 144):
            for batch in range(1, SPLIT_MAX_BATCH + 1):
                assert topp_split_count_033(batch, vocab, num_sm) == namespace["_topp_split_count"](
                    batch, vocab, num_sm
                )


def test_the_warm_up_leaves_top_k_only_and_top_p_only_batches_lazy() -> None:
    """Qwen3's vocabulary on an H100 SXM (132 SMs), FlashInfer's sampler off, no speculative decoding."""
    assert sampler_warmup_batches_033(256, 2048) == [1, 2, 256]
    lazy = topk_topp_lazy_classes_033(256, 2048, 151936, 132)
    assert [(name, batch) for name, batch, _ in lazy] == [
        ("top_k", 1),
        ("top_k", 2),
        ("top_p", 1),  # split kernels, S = 32 (batch <= 4: 32 * batch <= 132)
        ("top_p", 5),  # S = 16
        ("top_p", 65),  # past 64 rows: the monolithic kernel, top-p only
        ("top_k rows with top_p-only rows", 2),
        ("top_k rows with top_p-only rows", 5),
    ]
    # the warm-up's own mix (top-k and top-p on every row) compiles everything it reaches at any batch size
    assert all(name != "top_k and top_p" for name, _, _ in lazy)
    # a smaller max_num_seqs never reaches the monolithic top-p-only kernel
    assert all(batch <= 8 for _, batch, _ in topk_topp_lazy_classes_033(8, 2048, 151936, 132))
