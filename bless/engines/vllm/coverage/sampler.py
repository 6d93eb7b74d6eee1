"""vLLM's sampler kernels: every sampling mode crossed with the batch classes, and 0.33's lazy top-k/top-p and
logprob_token_ids kernels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bless.core.coverage import CoverageClass, CoverageFamily
from bless.engines.vllm.coverage.base import MODELED_RELEASES
from bless.engines.vllm.sampler_033 import topk_topp_lazy_classes_033

SAMPLER_SOURCE = (
    "vllm/v1/sample/ops/topk_topp_sampler.py (Triton _topk_topp_kernel for 8 or more requests, specialized on the "
    "batch and on top-k/top-p), vllm/v1/worker/gpu/sample/logprob.py (_topk_log_softmax_kernel per logprobs width), "
    "vllm/v1/sample/ops/logprobs.py (torch.compile'd batched_count_greater_than)"
)
#: Sampling modes whose kernels compile on first use (each a request's fields beyond the prompt).
SAMPLING_MODES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("temperature", {"temperature": 0.8}),
    ("top_k", {"temperature": 0.8, "top_k": 20}),
    ("top_p", {"temperature": 0.8, "top_p": 0.9}),
    ("top_k and top_p", {"temperature": 0.8, "top_k": 20, "top_p": 0.9}),
    ("min_p", {"temperature": 0.8, "min_p": 0.1}),
    ("penalties", {"temperature": 0.8, "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1}),
    ("seeded", {"temperature": 0.8, "seed": 1}),
    ("n=2", {"temperature": 0.8, "n": 2}),
    ("prompt_logprobs", {"prompt_logprobs": 1}),
)
#: Logprobs counts that reach every width class of _topk_log_softmax_kernel (next power of two of k+1, and
#: Triton's specialization of k+1: 1, a multiple of 16, neither), up to the engine's max_logprobs.
LOGPROBS_COUNTS = (0, 1, 2, 4, 8, 15, 16, 31, 32, 63, 64)
#: The Triton top-k/top-p kernel runs for batches of 8 or more requests (apply_top_k_top_p).
TRITON_SAMPLER_BATCH = 8
SAMPLER_PROMPT_TOKENS = 16
SAMPLER_MAX_TOKENS = 8


def request_class(key: str, fields: Mapping[str, Any], burst: int = 1, **more: Any) -> CoverageClass:
    """A class reached by a request shape, not a token count: ``burst`` requests of the fixed short prompt with
    ``fields``, :data:`SAMPLER_MAX_TOKENS` tokens each (``more``: the endpoint, the companions)."""
    return CoverageClass(
        key=key,
        token_count=SAMPLER_PROMPT_TOKENS,
        members=1,
        first=SAMPLER_PROMPT_TOKENS,
        last=SAMPLER_PROMPT_TOKENS,
        sampling=dict(fields),
        burst=burst,
        max_tokens=SAMPLER_MAX_TOKENS,
        **more,
    )


def sampler_family(
    serve: Mapping[str, Any],
    release: str | None = "0.26.0",
    gpu_name: str | None = None,
    vocab_size: int | None = None,
) -> CoverageFamily:
    """Sampling modes x batch-size classes: what a batch of sampled requests compiles on its first step.

    Bursts of 1 and 2 requests (torch.compile's 1 and its dynamic shapes), of 8 or more up to max_num_seqs (the
    Triton sampler; its batch argument not divisible by 16), and of 16 (divisible) where max_num_seqs allows.
    vLLM 0.33 (Model Runner V2 for every model) adds what its start-up warm-up leaves lazy: the Triton top-k/top-p
    kernels per request mix and batch class (:mod:`bless.engines.vllm.sampler_033`) and the
    ``logprob_token_ids`` kernel per (logprobs, padded column count).
    """
    if release not in MODELED_RELEASES:
        why = f"no sampler coverage model for vLLM {release or 'of unknown version'}"
        return CoverageFamily("sampler", True, False, why, SAMPLER_SOURCE)
    seqs = serve.get("max_num_seqs")
    max_seqs = seqs if isinstance(seqs, int) and seqs > 0 else 256
    configured = serve.get("max_logprobs")
    max_logprobs = configured if isinstance(configured, int) else 20
    source = SAMPLER_SOURCE if release == "0.26.0" else SAMPLER_SOURCE_033
    if not 0 <= max_logprobs <= LOGPROBS_COUNTS[-1]:
        why = f"serve.max_logprobs {max_logprobs}: logprobs widths past {LOGPROBS_COUNTS[-1]} are not modeled"
        return CoverageFamily("sampler", True, False, why, source)
    triton_batch = min(TRITON_SAMPLER_BATCH + 1, max_seqs)  # 9: at least 8, not a multiple of 16
    bursts = sorted({1, min(2, max_seqs), triton_batch} | ({16} if max_seqs >= 16 else set()))
    modes = list(SAMPLING_MODES) + [(f"logprobs={k}", {"logprobs": k}) for k in LOGPROBS_COUNTS if k <= max_logprobs]
    classes = [
        request_class(f"{name}, {burst} request(s) at once", fields, burst)
        for name, fields in modes
        for burst in bursts
    ]
    reason = (
        f"{len(modes)} sampling modes (logprobs up to max_logprobs {max_logprobs}) x batches of "
        f"{', '.join(map(str, bursts))} request(s), {SAMPLER_MAX_TOKENS} tokens each"
    )
    if release == "0.33.0":
        if _jit_warmup_off(serve):
            why = "kernel_config.enable_jit_warmup is off: Model Runner V2's warmed sampler kernels compile lazily"
            return CoverageFamily("sampler", True, False, why, source)
        later, why = _sampler_classes_033(serve, max_seqs, max_logprobs, gpu_name, vocab_size)
        if later is None:
            return CoverageFamily("sampler", True, False, why, source)
        classes += later
        reason += f"; {why}"
    return CoverageFamily("sampler", True, True, reason, source, tuple(classes))


SAMPLER_SOURCE_033 = (
    "vllm/v1/worker/gpu/sample/ (Model Runner V2's Triton sampler: warmed by vllm/v1/worker/gpu/warmup.py), "
    "vllm/v1/sample/ops/topk_topp_triton.py (top-k/top-p per mix and split count), "
    "vllm/v1/worker/gpu/sample/logprob.py (_topk_log_softmax_kernel per width, _fill_logprob_token_ids_kernel)"
)
#: Streaming multiprocessors per GPU product (torch.cuda.get_device_name): 0.33's split top-p picks its split count
#: from them.
SM_COUNTS: Mapping[str, int] = {
    "NVIDIA H100 80GB HBM3": 132,
    "NVIDIA H200": 132,
    "NVIDIA H100 PCIe": 114,
    "NVIDIA A100-SXM4-80GB": 108,
    "NVIDIA A100-SXM4-40GB": 108,
}
#: vLLM 0.33 sampling_params.MAX_LOGPROB_TOKEN_IDS: the longest logprob_token_ids list a request may carry.
MAX_LOGPROB_TOKEN_IDS = 128
_TOP_K = {"temperature": 0.8, "top_k": 20}
_TOP_P = {"temperature": 0.8, "top_p": 0.9}


def _jit_warmup_off(serve: Mapping[str, Any]) -> bool:
    """Whether the serve arguments turn 0.33's start-up JIT warm-up off (kernel_config.enable_jit_warmup false)."""
    kernel = serve.get("kernel_config")
    if isinstance(kernel, Mapping) and kernel.get("enable_jit_warmup") is False:
        return True
    extra = serve.get("extra_args")
    words = " ".join(w for w in extra if isinstance(w, str)).lower().replace(" ", "") if isinstance(extra, list) else ""
    return (
        'enable_jit_warmup":false' in words or "enable-jit-warmup=false" in words or "enable_jit_warmup=false" in words
    )


def _sampler_classes_033(
    serve: Mapping[str, Any], max_seqs: int, max_logprobs: int, gpu_name: str | None, vocab_size: int | None
) -> tuple[list[CoverageClass] | None, str]:
    """0.33's lazy sampler classes beyond 0.26's modes, or None and why they cannot be enumerated."""
    sms = SM_COUNTS.get(gpu_name or "")
    if sms is None:
        return None, f"the SM count of {gpu_name or 'an unknown GPU'} (0.33's split top-p keys on it) is not known"
    if not vocab_size:
        return None, "the vocabulary size is unknown (0.33's split top-p keys on it)"
    batched = serve.get("max_num_batched_tokens")
    tokens = batched if isinstance(batched, int) and batched > 0 else 8192
    classes: list[CoverageClass] = []
    for mix, batch, keys in topk_topp_lazy_classes_033(max_seqs, tokens, vocab_size, sms):
        key = f"top-k/top-p {mix}, {batch} request(s) at once ({len(keys)} kernel key(s))"
        if mix == "top_k rows with top_p-only rows":
            classes.append(request_class(key, _TOP_K, batch - 1, companions=1, companion_sampling=dict(_TOP_P)))
        else:
            mode = {"top_k": _TOP_K, "top_p": _TOP_P}.get(mix, {**_TOP_K, **_TOP_P})
            classes.append(request_class(key, mode, batch))
    widths = 0
    for logprobs in range(max_logprobs + 1):
        padded = 1
        while padded < max(logprobs, 1):
            padded *= 2
        while padded <= MAX_LOGPROB_TOKEN_IDS:
            ids = [FIRST_LOGPROB_ID + index for index in range(padded)]
            asked = {"logprobs": logprobs, "logprob_token_ids": ids}
            classes.append(request_class(f"logprob_token_ids: logprobs={logprobs}, {padded} columns", asked, 1))
            widths += 1
            padded *= 2
    why = (
        f"vLLM 0.33: {len(classes) - widths} top-k/top-p classes its warm-up leaves (SMs {sms}, vocabulary "
        f"{vocab_size}), {widths} logprob_token_ids (logprobs, columns) classes"
    )
    return classes, why


#: The token ids a logprob_token_ids coverage request asks about (inside every vocabulary the plan prompts in).
FIRST_LOGPROB_ID = 1000
