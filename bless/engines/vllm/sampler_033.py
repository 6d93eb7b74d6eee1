"""vLLM 0.33's Triton top-k/top-p on CUDA: the compile keys one sampler step reaches, and what the warm-up leaves.

A port of ``vllm/v1/sample/ops/topk_topp_triton.py`` (``apply_top_k_top_p_triton``, ``_topp_split_count``) and of
the batch sizes of Model Runner V2's warm-up (``vllm/v1/worker/gpu/warmup.py``); the facts around it, with their
source lines, are in :mod:`bless.engines.vllm.coverage_rules` (``RULES_033.v2_sampler_kernels``).
tests/unit/test_coverage_rules.py runs vLLM's own ``_topp_split_count`` excerpt against the port.
"""

from __future__ import annotations

SPLIT_MAX_BATCH = 64
_SPLIT_MAX_SPLITS = 32
_SPLIT_MIN_SLICE = 7168
#: The request mixes a step can hold: (name, top-k on some row, top-p on some row, a row with top-p and no top-k).
SAMPLING_MIXES: tuple[tuple[str, bool, bool, bool], ...] = (
    ("top_k", True, False, False),
    ("top_p", False, True, True),
    ("top_k and top_p", True, True, False),
    ("top_k rows with top_p-only rows", True, True, True),
)


def topp_split_count_033(batch: int, vocab_size: int, num_sm: int) -> int:
    """``_topp_split_count`` (topk_topp_triton.py:998): the constexpr ``S`` of the split top-p kernels."""
    splits = 1
    while splits < _SPLIT_MAX_SPLITS and (splits * 2 * batch <= num_sm or splits * 2 * _SPLIT_MIN_SLICE <= vocab_size):
        splits *= 2
    return splits


def topk_topp_keys_033(
    batch: int, *, top_k: bool, top_p: bool, topp_only_rows: bool, vocab_size: int, num_sm: int
) -> frozenset[tuple[object, ...]]:
    """The Triton kernels ``apply_top_k_top_p_triton`` (topk_topp_triton.py:1618) compiles for one CUDA step.

    ``("topk_topp", TOPK_ENABLED, TOPP_ENABLED, SPLIT_COVERS_PONLY, BATCH_SIZE == 1)`` for the monolithic kernel
    (its batch argument is not specialized on alignment), ``("split", HAS_K, S)`` for the split top-p kernels.
    """
    if batch <= 0 or not (top_k or top_p):
        return frozenset()
    use_split = top_p and batch <= SPLIT_MAX_BATCH
    split = ("split", top_k, topp_split_count_033(batch, vocab_size, num_sm))
    if use_split and not top_k:
        return frozenset({split})
    keys: set[tuple[object, ...]] = {("topk_topp", top_k, top_p, use_split, batch == 1)}
    if use_split and topp_only_rows:
        keys.add(split)
    return frozenset(keys)


def sampler_warmup_batches_033(max_num_seqs: int, max_num_batched_tokens: int, decode_query_len: int = 1) -> list[int]:
    """The batch sizes of V2's warm-up sampler steps (warmup.py:304-307, 448-462), before its KV-block cap."""
    prompt_len = decode_query_len + 1
    num_reqs = min(max_num_seqs, max_num_batched_tokens // max(prompt_len, decode_query_len))
    return sorted({num_reqs, *([2] if num_reqs >= 2 else []), *([1] if num_reqs > 1 else [])} - {0})


def topk_topp_lazy_classes_033(
    max_num_seqs: int, max_num_batched_tokens: int, vocab_size: int, num_sm: int
) -> tuple[tuple[str, int, frozenset[tuple[object, ...]]], ...]:
    """(mix, smallest batch, keys) for each set of top-k/top-p compile keys serving reaches and the warm-up does not.

    For CUDA without speculative decoding and with FlashInfer's sampler off (``VLLM_USE_FLASHINFER_SAMPLER=0``): no
    registered warm-up then, only the sampler warm-up's top-k and top-p requests (sampling_params.py:1477).
    """
    warmed: set[tuple[object, ...]] = set()
    for batch in sampler_warmup_batches_033(max_num_seqs, max_num_batched_tokens):
        warmed |= topk_topp_keys_033(
            batch, top_k=True, top_p=True, topp_only_rows=False, vocab_size=vocab_size, num_sm=num_sm
        )
    found: dict[frozenset[tuple[object, ...]], tuple[str, int]] = {}
    for name, top_k, top_p, topp_only in SAMPLING_MIXES:
        for batch in range(2 if (top_k and topp_only) else 1, max_num_seqs + 1):
            keys = topk_topp_keys_033(
                batch, top_k=top_k, top_p=top_p, topp_only_rows=topp_only, vocab_size=vocab_size, num_sm=num_sm
            )
            if not keys <= warmed and keys not in found:
                found[keys] = (name, batch)
    return tuple((name, batch, keys) for keys, (name, batch) in found.items())
