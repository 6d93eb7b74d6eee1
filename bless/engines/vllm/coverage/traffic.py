"""What production requests reach beyond token counts and sampling: structured outputs (the grammar bitmask kernel) and
chat completions with tool calls; and the model runner that decides which bitmask kernel applies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bless.core.coverage import CoverageClass, CoverageFamily
from bless.engines.vllm.coverage.base import MODELED_RELEASES, extra_flag, is_moe
from bless.engines.vllm.coverage.sampler import request_class
from bless.engines.vllm.coverage_rules import RELEASE_RULES


def model_runner(
    config: Mapping[str, Any] | None, serve: Mapping[str, Any], env: Mapping[str, str], release: str | None = "0.26.0"
) -> str | None:
    """``v1`` or ``v2``: the model runner the release picks (``VllmConfig.use_v2_model_runner``); None: unknown.

    ``VLLM_USE_V2_MODEL_RUNNER`` decides when set; else in 0.26 a MoE outside the release's
    ``v2_default_moe_architectures`` (:mod:`bless.engines.vllm.coverage_rules`) runs on V1 (0.33 runs every model
    on V2), and so does a configuration with a feature V2 lacks (stock torch.compile, sequence parallelism over
    tensor parallelism, prefill context parallelism, a speculative method other than EAGLE/MTP/DFlash).
    """
    forced = env.get("VLLM_USE_V2_MODEL_RUNNER")
    if forced is not None and forced.strip() != "":
        return "v2" if forced.strip().lower() in ("1", "true") else "v1"
    if config is None:
        return None
    architectures = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    rules = RELEASE_RULES.get(release or "", RELEASE_RULES["0.26.0"])
    listed = rules.v2_default_moe_architectures
    if listed is not None and is_moe(config) and not any(a in listed for a in architectures):
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
            classes.append(request_class(key, fields, burst, companions=companions or None))

    regex = dict(STRUCTURED_KINDS[0][1])
    for rows, burst in (("1 row", 1), ("2-15 rows", 2), ("16 rows", 16)):
        add(f"every row structured (indices None), {rows}", regex, burst)
        add(f"mixed with a plain row (indices given), {rows}", regex, burst, 1)
    for name, fields in STRUCTURED_KINDS[1:]:
        add(f"{name}, alone", fields)
    runner = model_runner(config, serve, env, release)
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
    named = serve.get("tool_call_parser") or extra_flag(serve, "--tool-call-parser")
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
    classes = tuple(request_class(key, fields, endpoint="chat") for key, fields in routes)
    tools = (
        f"tool calls through parser {parser} (required, named{', auto' if len(routes) > len(CHAT_ROUTES) else ''})"
        if parser
        else "no tool calls: without --tool-call-parser vLLM refuses every tool choice but none"
    )
    reason = f"{len(classes)} route(s): plain chat, JSON-schema response_format, {tools}"
    return CoverageFamily("chat", True, True, reason, CHAT_SOURCE, classes)
