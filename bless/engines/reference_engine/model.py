"""The reference model: a tiny decoder-only transformer over bytes, and its greedy decode loop.

Design choices, all made so there is exactly one, quick compile per process:

- byte-level vocabulary (token id = one UTF-8 byte), so there is no tokenizer to download;
- deterministic init from ``torch.Generator().manual_seed(seed)``: the same arguments give the same
  weights on every machine, so golden outputs are a property of the arguments plus the compile;
- FIXED SHAPES: ``forward`` always takes a ``[1, max_seq_len]`` int64 tensor (right-padded) and returns the
  logits of every position under a causal mask, so padding never influences the position that is read;
- no KV cache: each decode step re-runs the full fixed-shape forward (cheap at this size, one graph only).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

VOCAB_SIZE = 256
PAD_ID = 0


@dataclass(frozen=True)
class ModelArgs:
    """Architecture and init seed; every field changes the weights or the graph, so all are keyed."""

    seed: int = 0
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    max_seq_len: int = 64

    def validate(self) -> None:
        """Raise ValueError with a readable message when the combination cannot build a model."""
        if self.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {self.seed}")
        if not 1 <= self.layers <= 64:
            raise ValueError(f"--layers must be in 1..64, got {self.layers}")
        if not 1 <= self.heads <= 64:
            raise ValueError(f"--heads must be in 1..64, got {self.heads}")
        if self.d_model < 1 or self.d_model > 8192 or self.d_model % self.heads:
            raise ValueError(f"--d-model must be in 1..8192 and divisible by --heads, got {self.d_model}")
        if not 2 <= self.max_seq_len <= 8192:
            raise ValueError(f"--max-seq-len must be in 2..8192, got {self.max_seq_len}")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (for the artifact key and meta.json)."""
        # By hand (not JsonForm): the reference engine runs standalone and imports nothing of bless.
        return asdict(self)


def _normal(gen: torch.Generator, shape: tuple[int, ...], std: float) -> nn.Parameter:
    # Drawing from one explicit generator in a fixed order makes the weights a pure function of the seed.
    return nn.Parameter(torch.randn(shape, generator=gen, dtype=torch.float32) * std, requires_grad=False)


class Block(nn.Module):
    """Pre-norm block: causal self-attention then a GELU MLP, both residual, no biases, no affine norms."""

    def __init__(self, args: ModelArgs, gen: torch.Generator) -> None:
        super().__init__()
        d = args.d_model
        self.heads = args.heads
        self.head_dim = d // args.heads
        std = 1.0 / math.sqrt(d)
        self.w_qkv = _normal(gen, (d, 3 * d), std)
        self.w_out = _normal(gen, (d, d), std)
        self.w_up = _normal(gen, (d, 4 * d), std)
        self.w_down = _normal(gen, (4 * d, d), 1.0 / math.sqrt(4 * d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[batch, seq, d_model]`` -> same shape."""
        b, t, d = x.shape
        h = F.layer_norm(x, (d,))
        q, k, v = (h @ self.w_qkv).chunk(3, dim=-1)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + att.transpose(1, 2).reshape(b, t, d) @ self.w_out
        h = F.layer_norm(x, (d,))
        return x + F.gelu(h @ self.w_up) @ self.w_down


class TinyTransformer(nn.Module):
    """Decoder-only transformer: token + learned position embeddings, ``layers`` blocks, final norm, head."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        args.validate()
        self.args = args
        gen = torch.Generator().manual_seed(args.seed)
        d = args.d_model
        self.tok_emb = _normal(gen, (VOCAB_SIZE, d), 1.0)
        self.pos_emb = _normal(gen, (args.max_seq_len, d), 1.0)
        self.blocks = nn.ModuleList([Block(args, gen) for _ in range(args.layers)])
        # A head with std 1 (not 1/sqrt(d)) gives logits with std ~sqrt(d): the top logit usually wins by a
        # wide margin, so greedy picks do not flip on last-bit differences between eager and compiled code,
        # and different prompts lead to visibly different continuations.
        self.head = _normal(gen, (d, VOCAB_SIZE), 1.0)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids``: ``[1, max_seq_len]`` int64 -> logits ``[1, max_seq_len, 256]`` float32."""
        x = self.tok_emb[ids] + self.pos_emb
        for block in self.blocks:
            x = block(x)
        return F.layer_norm(x, (x.shape[-1],)) @ self.head


def build_model(args: ModelArgs, device: str) -> TinyTransformer:
    """Build the model with its seeded weights on ``device`` in eval mode (weights made on CPU first)."""
    return TinyTransformer(args).to(device).eval()


def truncate_prompt(prompt: list[int], max_tokens: int, max_seq_len: int) -> list[int]:
    """Keep the last ``max_seq_len - max_tokens`` prompt tokens, so prompt plus output fit the window."""
    if not 1 <= max_tokens < max_seq_len:
        raise ValueError(f"max_tokens must be in 1..{max_seq_len - 1}, got {max_tokens}")
    keep = max_seq_len - max_tokens
    return prompt[-keep:] if len(prompt) > keep else list(prompt)


# A forward is any callable from the padded ids to the logits: the eager model, or its compiled wrapper.
Forward = Callable[[torch.Tensor], torch.Tensor]
# Applied to the (CPU, float32) logits row before argmax; only the test knobs use one.
LogitsHook = Callable[[torch.Tensor], torch.Tensor]


def padded_input(tokens: list[int], max_seq_len: int, device: str) -> torch.Tensor:
    """The fixed-shape ``[1, max_seq_len]`` int64 input: ``tokens`` then ``PAD_ID`` up to the window."""
    if not 1 <= len(tokens) <= max_seq_len:
        raise ValueError(f"need 1..{max_seq_len} tokens, got {len(tokens)}")
    ids = torch.full((1, max_seq_len), PAD_ID, dtype=torch.int64)
    ids[0, : len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
    return ids.to(device)


def generate(
    forward: Forward,
    prompt: list[int],
    max_tokens: int,
    max_seq_len: int,
    device: str,
    logits_hook: LogitsHook | None = None,
) -> tuple[list[int], list[int]]:
    """Greedy decode: returns ``(prompt tokens actually used, generated tokens)``.

    Each step runs the fixed-shape forward and takes the argmax of the logits at the last real position.
    Ties resolve to the lowest token id (torch.argmax), which is deterministic.
    """
    context = truncate_prompt(prompt, max_tokens, max_seq_len)
    if not context:
        raise ValueError("prompt is empty")
    used = list(context)
    out: list[int] = []
    with torch.no_grad():  # grad mode is thread-local: set it here, not once at startup
        for _ in range(max_tokens):
            logits = forward(padded_input(context, max_seq_len, device))
            # Copy the row to the CPU at once: with CUDA graphs the output buffer is overwritten next call.
            row = logits[0, len(context) - 1].detach().to("cpu", dtype=torch.float32, copy=True)
            if logits_hook is not None:
                row = logits_hook(row)
            token = int(torch.argmax(row).item())
            out.append(token)
            context.append(token)
    return used, out


def random_noise_hook() -> LogitsHook:
    """A hook adding fresh noise, as large as the logits' spread, from an unseeded generator (test knobs)."""
    gen = torch.Generator()
    gen.seed()  # seeded from OS entropy: repeated identical requests get different noise

    def hook(row: torch.Tensor) -> torch.Tensor:
        scale = float(row.std().item()) * 2.0 + 1.0
        return row + torch.randn(row.shape, generator=gen) * scale

    return hook
