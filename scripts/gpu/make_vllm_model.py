#!/usr/bin/env python3
"""Build an offline model directory for vLLM: a byte-level BPE tokenizer and a model config, no download.

``tiny`` is the recorded 2-layer random Llama (weights saved, bf16, seed 0); the production shapes
carry a config only and are served with ``--load-format dummy`` (vLLM fills seeded random weights):

    python3 scripts/gpu/make_vllm_model.py tiny /tmp/tiny-llama
    python3 scripts/gpu/make_vllm_model.py llama-3.1-8b /tmp/models/llama-3.1-8b     # dense, 32 layers
    python3 scripts/gpu/make_vllm_model.py llama-3.1-70b /tmp/models/llama-3.1-70b   # dense, 80 layers (TP=4)
    python3 scripts/gpu/make_vllm_model.py qwen3-30b-a3b /tmp/models/qwen3-30b-a3b   # MoE, 128 experts
    python3 scripts/gpu/make_vllm_model.py qwen3-30b-a3b-fp8 /tmp/models/qwen3-30b-a3b-fp8  # MoE, block FP8

The configs follow the published ``config.json`` of Llama-3.1-8B, Llama-3.1-70B, Qwen3-30B-A3B and
Qwen3-30B-A3B-FP8 (layers, widths, heads, vocabulary, RoPE, the FP8 ``quantization_config``: 128x128 weight blocks,
dynamic activation scales); only the token ids come from the small tokenizer. Each tokenizer carries its
architecture's chat template, tool-call aware (the Llama 3.1 header format with JSON function calls, Qwen3's ChatML
with ``<tools>`` and ``<tool_call>``), so chat completions and tool calls run; the builder renders it once with tools
and a tool result before it writes anything. Needs ``tokenizers`` and ``transformers`` (and ``torch`` for ``tiny``),
as on a vLLM host.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

CORPUS = [
    "Hello world. The quick brown fox jumps over the lazy dog.",
    "vLLM compiles the model with torch.compile and caches the artifacts.",
    "A cache that is blessed can be loaded read-only on another machine.",
    "Once upon a time there was a tiny language model with random weights.",
] * 50

#: The Llama 3.1 chat format: header-delimited turns, tools as JSON in the system turn, calls as JSON objects.
LLAMA3_CHAT_TEMPLATE = """{{- bos_token }}
{%- if messages[0].role == 'system' %}{%- set system = messages[0].content %}{%- set turns = messages[1:] %}
{%- else %}{%- set system = '' %}{%- set turns = messages %}{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}
{%- if tools %}{{- 'Environment: ipython\n' }}{%- endif %}
{{- system }}
{%- if tools %}
{{- '\nTo call a function, answer with {"name": function name, "parameters": its arguments} and nothing else.\n' }}
{%- for tool in tools %}{{- (tool.function if tool.function is defined else tool) | tojson }}{{- '\n' }}{%- endfor %}
{%- endif %}
{{- '<|eot_id|>' }}
{%- for message in turns %}
{%- if message.role == 'assistant' and message.tool_calls %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- for call in message.tool_calls %}
{%- set args = call.function.arguments %}{%- set arguments = args if args is string else args | tojson %}
{{- '{"name": "' + call.function.name + '", "parameters": ' + arguments + '}' }}
{%- endfor %}
{{- '<|eom_id|>' }}
{%- elif message.role == 'tool' %}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + message.content + '<|eot_id|>' }}
{%- else %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + (message.content or '') + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"""
#: Qwen3's ChatML format: tool signatures inside <tools>, calls inside <tool_call>, results as <tool_response>.
CHATML_CHAT_TEMPLATE = """{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou may call one or more functions. Their signatures, within <tools></tools>:\n<tools>' }}
{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\n</tools>\n\nFor each call, answer <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\n' + (message.content or '') }}
{%- for call in message.tool_calls or [] %}
{%- set args = call.function.arguments %}{%- set arguments = args if args is string else args | tojson %}
{{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' + arguments + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}"""
#: Each kind's chat template (tiny: the Llama one).
CHAT_TEMPLATES = {
    "tiny": LLAMA3_CHAT_TEMPLATE,
    "llama-3.1-8b": LLAMA3_CHAT_TEMPLATE,
    "llama-3.1-70b": LLAMA3_CHAT_TEMPLATE,
    "qwen3-30b-a3b": CHATML_CHAT_TEMPLATE,
    "qwen3-30b-a3b-fp8": CHATML_CHAT_TEMPLATE,
}
#: A conversation with a tool call and its result: every branch of both templates renders.
SELF_CHECK_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": '{"c": 3}'},
]
SELF_CHECK_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
]

SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
    },
    "llama-3.1-70b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
        "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
    },
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
        "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
        "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "attention_bias": False, "tie_word_embeddings": False, "router_aux_loss_coef": 0.001,
        "output_router_logits": False,
    },
}  # fmt: skip
SHAPES["qwen3-30b-a3b-fp8"] = {
    **SHAPES["qwen3-30b-a3b"],
    "quantization_config": {
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128],
    },
}  # fmt: skip


# Special tokens a shape's tool-call parser looks up in the vocabulary: vLLM's llama3_json parser refuses every
# chat request (HTTP 500) when the tokenizer lacks Llama 3's <|python_tag|>. Appended after training, so the other
# ids stay as they were.
TOOL_TOKENS: dict[str, list[str]] = {"llama-3.1-8b": ["<|python_tag|>"], "llama-3.1-70b": ["<|python_tag|>"]}


def build_tokenizer(out: Path, chat_template: str, extra_special: list[str]) -> tuple[int, int]:
    """Train the small byte-level BPE tokenizer into ``out`` with ``chat_template``; returns its (bos, eos) ids.

    The template is rendered once with tools and a tool result first: a template that cannot render is
    refused here, not met as HTTP 400 by the first chat request.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    if extra_special:
        fast.add_tokens(extra_special, special_tokens=True)
    fast.chat_template = chat_template
    rendered = fast.apply_chat_template(
        SELF_CHECK_MESSAGES, tools=SELF_CHECK_TOOLS, tokenize=False, add_generation_prompt=True
    )
    if not isinstance(rendered, str) or "get_weather" not in rendered or '{"c": 3}' not in rendered:
        raise SystemExit(f"the chat template rendered no tool call or result: {rendered!r}")
    fast.save_pretrained(str(out))
    return int(fast.bos_token_id), int(fast.eos_token_id)


def build_tiny(out: Path, bos: int, eos: int) -> None:
    """The recorded tiny random Llama, with its weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=bos, eos_token_id=eos,
        tie_word_embeddings=False,
    )  # fmt: skip
    config.dtype = "bfloat16"
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(str(out))


def main(argv: list[str]) -> int:
    """``make_vllm_model.py KIND OUT``; exit 2 on a usage error."""
    if len(argv) != 2 or argv[0] not in ("tiny", *SHAPES):
        print(f"usage: make_vllm_model.py {{tiny|{'|'.join(SHAPES)}}} OUT", file=sys.stderr)
        return 2
    kind, out = argv[0], Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    bos, eos = build_tokenizer(out, CHAT_TEMPLATES[kind], TOOL_TOKENS.get(kind, []))
    if kind == "tiny":
        build_tiny(out, bos, eos)
    else:
        config = {**SHAPES[kind], "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "bfloat16"}
        (out / "config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    print(f"built {kind} in {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
