"""Coverage of production traffic in vLLM 0.26's model: block-FP8 MoE against the release's own rule and tables,
structured outputs and chat/tool-call routes, the FP8 GEMM backends, bounded plans for any step size, malformed
model configs refused, and the coverage requests as they go out (pure, or a loopback HTTP server of our own)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from bless.core.coverage import (
    CoverageClass,
    CoverageFamily,
    CoveragePlan,
    Drive,
    freeze_fields,
    group_token_counts,
    group_token_range,
)
from bless.engines.vllm import coverage as vllm_coverage
from bless.engines.vllm import coverage_rules
from bless.engines.vllm.coverage import (
    MoeQuant,
    MoeShape,
    config_changes,
    config_file_name,
    default_config,
    fused_moe_key,
    fused_moe_splits,
    moe,
    nearest_config,
    tuned_table,
)
from bless.errors import InputInvalidError
from bless.replay.engine_client import EngineClient
from bless.replay.trials import drive_coverage
from tests.unit.test_coverage import _source_default_config as source_default_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / "coverage" / "0.26.0"
FP8 = MoeQuant("fp8_w8a8", (128, 128))
H200_FP8_FILE = "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
QWEN3_MOE: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
    "hidden_size": 2048,
}
QWEN3_MOE_FP8: dict[str, Any] = {
    **QWEN3_MOE,
    "quantization_config": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    },
}
LLAMA_8B: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}
SERVE: dict[str, Any] = {
    "extra_args": ["--load-format", "dummy", "--tool-call-parser", "hermes"],
    "dtype": "bfloat16",
    "max_model_len": 4096,
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 8,
    "compilation_config": {"mode": 3, "cudagraph_mode": "FULL_AND_PIECEWISE"},
}
FP8_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER": "0", "VLLM_USE_DEEP_GEMM": "0"}


def plan(
    config: Mapping[str, Any] | None = QWEN3_MOE_FP8,
    serve: Mapping[str, Any] = SERVE,
    env: Mapping[str, str] = FP8_ENV,
    gpu: str = "NVIDIA H100 80GB HBM3",
    capability: str | None = "9.0",
    chat_template: bool | None = True,
) -> CoveragePlan:
    return vllm_coverage.coverage_plan(
        "0.26.0", config, serve, env, gpu, "m", 151936, capability=capability, chat_template=chat_template
    )


def family(coverage: CoveragePlan, name: str) -> CoverageFamily:
    return next(f for f in coverage.families if f.name == name)


# --- block-FP8 fused MoE ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [(128, 128), (64, 128), (96, 64)])
def test_the_block_fp8_default_rule_is_vllms_own_for_every_token_count(block: tuple[int, int]) -> None:
    source = source_default_config()
    quant = MoeQuant("fp8_w8a8", block)
    for m in range(1, 20000, 3):
        assert default_config(m, 128, quant) == source(m, 128, 768, 2048, 8, "fp8_w8a8", list(block)), (m, block)


def test_the_fp8_tuned_file_is_named_as_vllm_names_it_and_stored_verbatim() -> None:
    assert config_file_name(128, 768, "NVIDIA H200", FP8) == H200_FP8_FILE
    shipped = json.loads((FIXTURES / H200_FP8_FILE).read_text(encoding="utf-8"))
    shipped.pop("triton_version", None)
    table = tuned_table("0.26.0", H200_FP8_FILE)
    assert table is not None and list(table) == [int(k) for k in shipped]
    assert {str(k): v for k, v in table.items()} == shipped


def test_fp8_moe_on_an_h200_reads_the_fp8_file_and_on_an_h100_the_default_rule() -> None:
    h200 = family(plan(gpu="NVIDIA H200"), "fused_moe")
    h100 = family(plan(), "fused_moe")
    assert h200.modeled and H200_FP8_FILE in h200.reason and "fp8_w8a8" in h200.reason
    assert h100.modeled and "default rule" in h100.reason and "ships no" in h100.reason
    assert sum(c.members for c in h100.classes) == 2048 == sum(c.members for c in h200.classes)
    # the FP8 classes differ from the bf16 ones: another rule picks the tiles
    bf16 = family(plan(config=QWEN3_MOE), "fused_moe")
    assert {c.key for c in bf16.classes} != {c.key for c in h100.classes}


@pytest.mark.parametrize(
    ("serve", "env", "capability", "needle"),
    [
        (SERVE, FP8_ENV, "10.0", "compute capability 10.0"),
        (SERVE, FP8_ENV, None, "compute capability unknown"),
        ({**SERVE, "enable_expert_parallel": True}, FP8_ENV, "9.0", "expert parallelism"),
        ({**SERVE, "extra_args": ["--moe-backend", "cutlass"]}, FP8_ENV, "9.0", "moe_backend cutlass"),
        ({**SERVE, "kernel_config": {"moe_backend": "deep_gemm"}}, FP8_ENV, "9.0", "moe_backend deep_gemm"),
        (SERVE, {**FP8_ENV, "VLLM_USE_DEEP_GEMM": "1"}, "9.0", "force the DeepGEMM MoE"),
        (SERVE, {**FP8_ENV, "VLLM_TEST_FORCE_FP8_MARLIN": "1"}, "9.0", "Marlin"),
    ],
)
def test_fp8_moe_backends_other_than_triton_are_named_gaps(
    serve: Mapping[str, Any], env: Mapping[str, str], capability: str | None, needle: str
) -> None:
    fused = family(plan(serve=serve, env=env, capability=capability), "fused_moe")
    assert fused.gap and needle in fused.reason, fused.reason


def test_an_explicit_triton_moe_backend_is_modeled() -> None:
    assert family(plan(serve={**SERVE, "extra_args": ["--moe-backend=triton"]}), "fused_moe").modeled


# --- the FP8 GEMM of the linear layers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "modeled", "needle"),
    [
        (FP8_ENV, True, "CUTLASS"),
        ({**FP8_ENV, "VLLM_USE_DEEP_GEMM": "1"}, False, "VLLM_DEEP_GEMM_WARMUP=relax"),
        ({**FP8_ENV, "VLLM_USE_DEEP_GEMM": "1", "VLLM_DEEP_GEMM_WARMUP": "skip"}, False, "VLLM_DEEP_GEMM_WARMUP=skip"),
        ({**FP8_ENV, "VLLM_USE_DEEP_GEMM": "1", "VLLM_DEEP_GEMM_WARMUP": "full"}, True, "every M"),
        ({k: v for k, v in FP8_ENV.items() if k != "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER"}, False, "FlashInfer"),
    ],
)
def test_the_fp8_gemm_backend_decides_whether_anything_compiles_lazily(
    env: Mapping[str, str], modeled: bool, needle: str
) -> None:
    linear = family(plan(env=env), "fp8_linear")
    assert linear.reachable and linear.modeled is modeled and needle in linear.reason
    assert not linear.classes  # CUTLASS is precompiled, DeepGEMM's full warm-up runs at every start


def test_unquantized_weights_reach_no_fp8_gemm() -> None:
    assert not family(plan(config=QWEN3_MOE, env={"VLLM_USE_FLASHINFER_SAMPLER": "0"}), "fp8_linear").reachable


def test_the_fp8_moe_profile_plan_has_no_gap() -> None:
    coverage = plan()
    assert not coverage.gaps, [f.reason for f in coverage.gaps]


# --- bounded plans --------------------------------------------------------------------------------------------------


SHAPES = [MoeShape(128, 8, 768, 2048), MoeShape(64, 6, 1408, 2048), MoeShape(8, 2, 14336, 4096)]


@pytest.mark.parametrize("quant", [None, FP8])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("table_file", [None, "E=128,N=768,device_name=NVIDIA_H200.json", H200_FP8_FILE])
def test_the_bounded_grouping_equals_visiting_every_token_count(
    quant: MoeQuant | None, shape: MoeShape, table_file: str | None
) -> None:
    table = tuned_table("0.26.0", table_file) if table_file else None

    def pick(m: int) -> Mapping[str, int]:
        return nearest_config(table, m) if table else default_config(m, shape.experts, quant)

    def key(m: int) -> Any:
        return fused_moe_key(m, shape, pick(m), quant)

    last = 6000
    changes = config_changes(pick, 1, last)
    assert changes == [m for m in range(2, last + 1) if pick(m) != pick(m - 1)]
    used = [pick(m) for m in (1, *changes)]
    splits = fused_moe_splits(shape, used, changes) | {513}
    bounded = group_token_range(1, last, key, repr, splits=splits, prefer_above=512)
    visited = group_token_counts(range(1, last + 1), key, repr, prefer_above=512)
    assert bounded == visited


def test_a_huge_step_size_is_planned_in_bounded_work_and_past_the_limit_is_a_gap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = 0
    real = moe.fused_moe_key

    def counting(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args)

    monkeypatch.setattr(moe, "fused_moe_key", counting)
    fused = family(plan(serve={**SERVE, "max_num_batched_tokens": 10**7, "max_model_len": 10**7 + 1}), "fused_moe")
    monkeypatch.undo()
    assert fused.modeled and sum(c.members for c in fused.classes) == 10**7
    assert calls < 20000  # visiting every count would be 10 million
    huge = family(plan(serve={**SERVE, "max_num_batched_tokens": 10**9, "max_model_len": 10**9 + 1}), "fused_moe")
    assert huge.gap and "outside 1..16777216" in huge.reason


def test_a_rule_that_is_not_periodic_where_the_model_assumes_is_refused() -> None:
    with pytest.raises(ValueError, match="not periodic"):
        group_token_range(1, 500, lambda m: m % 17 == 0, repr)


# --- structured outputs and chat ------------------------------------------------------------------------------------


def test_structured_outputs_drive_every_batch_class_of_the_bitmask_kernel_within_max_num_seqs() -> None:
    small = family(plan(config=QWEN3_MOE), "structured_outputs")
    assert small.modeled and "V1 runner" in small.reason and "apply_token_bitmask_inplace_kernel" in small.reason
    shapes = {(c.burst, c.companions or 0) for c in small.classes}
    # max_num_seqs 8: 16 structured rows cannot share a step
    assert {(1, 0), (2, 0), (1, 1), (2, 1)} <= shapes and (16, 0) not in shapes
    wide = family(plan(config=QWEN3_MOE, serve={**SERVE, "max_num_seqs": 64}), "structured_outputs")
    assert {(16, 0), (16, 1)} <= {(c.burst, c.companions or 0) for c in wide.classes}
    kinds = {next(iter(c.sampling)) for c in wide.classes}
    assert kinds == {"structured_outputs", "response_format"}
    assert all(c.max_tokens >= 2 for c in wide.classes)


def test_the_runner_decides_which_kernel_is_named_and_both_are_driven() -> None:
    dense = family(plan(config=LLAMA_8B), "structured_outputs")
    assert "V2 runner" in dense.reason and "warm-up" in dense.reason
    moe = family(plan(config=QWEN3_MOE), "structured_outputs")
    assert [c.drive for c in dense.classes] == [c.drive for c in moe.classes]
    assert vllm_coverage.model_runner({"architectures": ["Qwen2MoeForCausalLM"], "num_experts": 60}, SERVE, {}) == "v2"
    assert vllm_coverage.model_runner(LLAMA_8B, SERVE, {"VLLM_USE_V2_MODEL_RUNNER": "0"}) == "v1"
    assert vllm_coverage.model_runner(LLAMA_8B, {**SERVE, "speculative_config": {"method": "ngram"}}, {}) == "v1"


def test_an_outlines_disk_cache_is_a_gap() -> None:
    outlines = family(plan(env={**FP8_ENV, "VLLM_V1_USE_OUTLINES_CACHE": "1"}), "structured_outputs")
    assert outlines.gap and "disk cache" in outlines.reason


@pytest.mark.parametrize(
    ("template", "reachable", "gap"), [(True, True, False), (False, False, False), (None, True, True)]
)
def test_chat_routes_follow_the_chat_template(template: bool | None, reachable: bool, gap: bool) -> None:
    chat = family(plan(chat_template=template), "chat")
    assert chat.reachable is reachable and chat.gap is gap
    if template:
        assert all(c.endpoint == "chat" for c in chat.classes)
        assert {json.dumps(c.sampling.get("tool_choice"), sort_keys=True) for c in chat.classes} == {
            "null",
            '"required"',
            '{"function": {"name": "get_weather"}, "type": "function"}',
        }


def test_auto_tool_choice_adds_its_route_and_no_parser_no_tool_routes() -> None:
    auto = {**SERVE, "extra_args": ["--enable-auto-tool-choice", "--tool-call-parser=hermes"]}
    chat = family(plan(serve=auto), "chat")
    assert any(c.sampling.get("tool_choice") == "auto" for c in chat.classes) and "parser hermes" in chat.reason
    bare = family(plan(serve={**SERVE, "extra_args": ["--load-format", "dummy"]}), "chat")
    assert bare.modeled and not any("tools" in c.sampling for c in bare.classes)
    assert "without --tool-call-parser" in bare.reason


def test_the_chat_template_is_read_from_the_model_directory(tmp_path: Path) -> None:
    model = {"source": "local", "path": str(tmp_path)}
    assert vllm_coverage.read_chat_template(model, {}) is False
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert vllm_coverage.read_chat_template(model, {}) is True
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert vllm_coverage.read_chat_template(model, {}) is False
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    assert vllm_coverage.read_chat_template(model, {}) is True
    assert vllm_coverage.read_chat_template({"source": "hf", "id": "x"}, {}) is None
    assert vllm_coverage.read_chat_template({"source": "hf"}, {"chat_template": "/t.jinja"}) is True


# --- malformed model configs ----------------------------------------------------------------------------------------


def _deep(levels: int) -> dict[str, Any]:
    inner: dict[str, Any] = {"architectures": ["X"]}
    for _ in range(levels):
        inner = {"architectures": ["X"], "text_config": inner}
    return inner


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"architectures": [{}]}', "architectures is not a list of names"),
        ('{"architectures": "LlamaForCausalLM"}', "architectures is not a list of names"),
        ('{"text_config": {"architectures": [1]}}', "text_config.architectures"),
        ('{"text_config": [1, 2]}', "text_config is not an object"),
        ("[1, 2, 3]", "not an object"),
        ("{not json", "not JSON"),
        (json.dumps(_deep(40)), "nested deeper than 32"),
        ("[" * 100000 + "]" * 100000, "not JSON"),
    ],
)
def test_a_malformed_config_json_is_refused_clearly(tmp_path: Path, text: str, needle: str) -> None:
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(InputInvalidError, match=r"config\.json") as refused:
        vllm_coverage.read_model_config({"source": "local", "path": str(tmp_path)})
    assert needle in str(refused.value)


def test_a_well_formed_config_is_read(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_MOE_FP8, "text_config": {"architectures": ["X"]}}))
    assert vllm_coverage.read_model_config({"source": "local", "path": str(tmp_path)}) is not None


# --- the requests as they go out ------------------------------------------------------------------------------------


def test_classes_keep_their_old_json_and_round_trip_the_new_fields() -> None:
    plain = CoverageClass("k", 17, 2, 17, 18, {"top_k": 2}, 4)
    assert "endpoint" not in plain.to_dict() and "companions" not in plain.to_dict()
    chat = CoverageClass("c", 16, 1, 16, 16, {"tools": [{"a": [1, 2]}]}, 1, 8, "chat", 2)
    assert CoverageClass.from_dict(json.loads(json.dumps(chat.to_dict()))) == chat
    assert chat.drive.fields == {"tools": [{"a": [1, 2]}]} and chat.drive.describe().startswith("chat")
    assert hash(chat.drive) == hash(CoverageClass.from_dict(chat.to_dict()).drive)
    assert dict(freeze_fields({"regex": "[a-z]{4}"}))["regex"] == "[a-z]{4}"  # a string stays a string
    assert Drive(16, 8, freeze_fields({"regex": "[a"}), 1).fields == {"regex": "[a"}


class _Recorder(BaseHTTPRequestHandler):
    """A loopback engine of our own: records each request's path, body and arrival time, answers at once."""

    seen: ClassVar[list[tuple[str, dict[str, Any], float]]] = []
    lock: ClassVar[threading.Lock] = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            self.seen.append((self.path, body, time.monotonic()))
        time.sleep(0.05)  # long enough that a burst sent one after another could not overlap
        if self.path == "/v1/chat/completions":
            reply: dict[str, Any] = {"choices": [{"message": {"role": "assistant", "content": "x"}}]}
        else:
            reply = {"choices": [{"text": "x", "token_ids": [1]}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def engine() -> Iterator[EngineClient]:
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield EngineClient("127.0.0.1", server.server_address[1], timeout_s=10, model="m")
    finally:
        server.shutdown()
        server.server_close()


def test_structured_and_chat_classes_go_out_as_the_plan_says(engine: EngineClient) -> None:
    coverage = plan(config=QWEN3_MOE, env={"VLLM_USE_FLASHINFER_SAMPLER": "0"})
    structured = family(coverage, "structured_outputs")
    chat = family(coverage, "chat")
    only = CoveragePlan("vllm", "m", (structured, chat), (1, 1), coverage.prompt_tokens)
    run = drive_coverage(engine, only, "require")
    expected = sum(c.burst + (c.companions or 0) for c in structured.classes + chat.classes)
    assert len(_Recorder.seen) == expected == run.to_dict()["requests"]
    chats = [body for path, body, _ in _Recorder.seen if path == "/v1/chat/completions"]
    assert len(chats) == len(chat.classes) and all(body["messages"][0]["role"] == "user" for body in chats)
    assert any(body.get("tool_choice") == "required" for body in chats)
    mixed = [body for _, body, _ in _Recorder.seen if "structured_outputs" not in body and "messages" not in body]
    assert mixed and all(body["temperature"] == 0 for body in mixed)  # the plain companions are greedy
    regex = [body for _, body, _ in _Recorder.seen if body.get("structured_outputs") == {"regex": "[a-z]{64}"}]
    assert len(regex) == sum(c.burst for c in structured.classes if "regex" in json.dumps(c.sampling))


def test_a_burst_and_its_companions_arrive_together(engine: EngineClient) -> None:
    burst = CoverageClass("b", 16, 1, 16, 16, {"structured_outputs": {"regex": "[a-z]{64}"}}, 2, 8, None, 1)
    only = CoveragePlan("vllm", "m", (CoverageFamily("f", True, True, "r", "s", (burst,)),), (1, 1), (1000, 2000))
    drive_coverage(engine, only, "require")
    times = [t for _, _, t in _Recorder.seen]
    assert len(times) == 3 and max(times) - min(times) < 0.05  # all three in flight at once


# --- vLLM 0.33's model (derived from the wheel's source, not GPU-proven) -------------------------------------------


def plan_033(
    config: Mapping[str, Any] = QWEN3_MOE,
    serve: Mapping[str, Any] = SERVE,
    env: Mapping[str, str] = FP8_ENV,
    gpu: str = "NVIDIA H100 80GB HBM3",
) -> CoveragePlan:
    return vllm_coverage.coverage_plan(
        "0.33.0", config, serve, env, gpu, "m", 151936, capability="9.0", chat_template=True
    )


def test_033_keeps_026s_default_rule_and_reads_its_own_tables() -> None:
    for m in range(1, 5000, 7):
        for quant in (None, FP8):
            dtype, block = (quant.dtype, list(quant.block_shape or ())) if quant else (None, None)
            assert default_config(m, 128, quant) == coverage_rules.default_config_033(
                m, 128, 768, 2048, 8, dtype, block or None
            )
    fused = family(plan_033(gpu="NVIDIA H200"), "fused_moe")
    assert fused.modeled and "tuned file E=128,N=768,device_name=NVIDIA_H200.json" in fused.reason
    assert tuned_table("0.33.0", "E=128,N=768,device_name=NVIDIA_H200.json") is not None


def test_033_runs_every_model_on_v2_and_says_so() -> None:
    assert vllm_coverage.model_runner(QWEN3_MOE, SERVE, {}, "0.33.0") == "v2"
    assert vllm_coverage.model_runner(QWEN3_MOE, SERVE, {}, "0.26.0") == "v1"
    assert "V2 runner" in family(plan_033(), "structured_outputs").reason


def test_033_sampler_drives_what_its_warm_up_leaves() -> None:
    sampler = family(plan_033(), "sampler")
    assert sampler.modeled and "vLLM 0.33" in sampler.reason
    keys = [c.key for c in sampler.classes]
    # 21 logprobs values (0..max_logprobs 20) x padded column classes up to 128 ids
    assert sum(k.startswith("logprob_token_ids") for k in keys) == 99
    mixed = [c for c in sampler.classes if c.companion_sampling]
    assert mixed and all(c.sampling.get("top_k") and (c.companion_sampling or {}).get("top_p") for c in mixed)
    assert any(k.startswith("top-k/top-p top_p, 1 request") for k in keys)


@pytest.mark.parametrize(
    ("serve", "gpu", "needle"),
    [
        ({**SERVE, "extra_args": ["--kernel-config", '{"enable_jit_warmup": false}']}, "NVIDIA H200", "warmup is off"),
        (SERVE, "NVIDIA L4", "SM count"),
    ],
)
def test_033_sampler_gaps(serve: Mapping[str, Any], gpu: str, needle: str) -> None:
    sampler = family(plan_033(serve=serve, gpu=gpu), "sampler")
    assert sampler.gap and needle in sampler.reason.replace("warm-up", "warmup")


@pytest.mark.parametrize(
    ("serve", "env", "needle"),
    [
        ({**SERVE, "extra_args": ["--offload-backend", "uva"]}, FP8_ENV, "offloaded to host memory"),
        (SERVE, {**FP8_ENV, "VLLM_TRITON_USE_TD": "1"}, "tensor-descriptor"),
    ],
)
def test_033_moe_selections_the_classes_do_not_follow_are_gaps(
    serve: Mapping[str, Any], env: Mapping[str, str], needle: str
) -> None:
    fused = family(plan_033(serve=serve, env=env), "fused_moe")
    assert fused.gap and needle in fused.reason


def test_033_fp8_gemm_is_a_named_gap_until_derived() -> None:
    linear = family(plan_033(config=QWEN3_MOE_FP8), "fp8_linear")
    assert linear.gap and "no FP8 GEMM coverage model for vLLM 0.33.0" in linear.reason
    assert family(plan_033(config=QWEN3_MOE_FP8), "fused_moe").modeled


def test_a_mixed_sampling_burst_goes_out_with_its_companions_fields(engine: EngineClient) -> None:
    mixed = CoverageClass("m", 16, 1, 16, 16, {"top_k": 20}, 2, 8, None, 1, {"top_p": 0.9})
    only = CoveragePlan("vllm", "m", (CoverageFamily("f", True, True, "r", "s", (mixed,)),), (1, 1), (1000, 2000))
    drive_coverage(engine, only, "require")
    bodies = [body for _, body, _ in _Recorder.seen]
    assert sorted(("top_k" in b, "top_p" in b) for b in bodies) == [(False, True), (True, False), (True, False)]
