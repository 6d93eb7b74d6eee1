#!/usr/bin/env python3
"""Build an offline model directory for vLLM: a byte-level BPE tokenizer and a model config, no download.

``tiny`` is the recorded 2-layer random Llama (weights saved, bf16, seed 0); the production shapes
carry a config only and are served with ``--load-format dummy`` (vLLM fills seeded random weights):

    python3 scripts/gpu/make_vllm_model.py tiny /tmp/tiny-llama
    python3 scripts/gpu/make_vllm_model.py llama-3.1-8b /tmp/models/llama-3.1-8b     # dense, 32 layers
    python3 scripts/gpu/make_vllm_model.py llama-3.1-70b /tmp/models/llama-3.1-70b   # dense, 80 layers (TP=4)
    python3 scripts/gpu/make_vllm_model.py qwen3-30b-a3b /tmp/models/qwen3-30b-a3b   # MoE, 128 experts

The configs follow the published ``config.json`` of Llama-3.1-8B, Llama-3.1-70B and Qwen3-30B-A3B (layers, widths,
heads, vocabulary, RoPE); only the token ids come from the small tokenizer. Needs ``tokenizers`` and
``transformers`` (and ``torch`` for ``tiny``), as on a vLLM host.
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


def build_tokenizer(out: Path) -> tuple[int, int]:
    """Train the small byte-level BPE tokenizer into ``out``; returns its (bos, eos) ids."""
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
    bos, eos = build_tokenizer(out)
    if kind == "tiny":
        build_tiny(out, bos, eos)
    else:
        config = {**SHAPES[kind], "bos_token_id": bos, "eos_token_id": eos, "torch_dtype": "bfloat16"}
        (out / "config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    print(f"built {kind} in {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
