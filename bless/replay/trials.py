"""Replay coherence: the request protocol over the engine's HTTP API (:mod:`bless.replay.engine_client`), its analysis.

The protocol, per trial: every prompt once alone; each prompt ``repeats`` times in a
row; all prompts interleaved round-robin; all prompts at once from threads (when the
settings allow concurrency). Coherent means: each prompt has exactly one distinct output
across all of these, equal to the golden output when one is given.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from bless.core.coverage import CHAT_MESSAGE, CoveragePlan, CoverageRun, Drive
from bless.core.json_form import OMIT, JsonForm, as_json, rounded
from bless.core.profile import TrialSettings
from bless.replay.engine_client import Completion, EngineClient

# --- the protocol -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """One completion as seen in one mode of the protocol."""

    mode: str  # alone | repeat | interleaved | concurrent | canary
    prompt: str
    text: str
    token_ids: tuple[int, ...]
    latency_s: float


def _outputs_form(outputs: Mapping[str, Completion]) -> dict[str, dict[str, Any]]:
    """Each prompt's output as its text and token ids."""
    return {prompt: {"text": c.text, "token_ids": list(c.token_ids)} for prompt, c in outputs.items()}


@dataclass(frozen=True)
class CoherenceReport(JsonForm):
    """The verdict of the protocol and the outputs it saw (one per prompt when coherent)."""

    json_keys = ("passed", "reasons", "unique_outputs", "requests", "request_seconds", "outputs")

    passed: bool
    reasons: tuple[str, ...]
    outputs: Mapping[str, Completion] = field(metadata=as_json(to_json=_outputs_form))
    unique_outputs: Mapping[str, int]
    requests: int
    request_seconds: float = field(metadata=as_json(to_json=rounded(4)))
    #: Every completion seen, for comparing across devices: the JSON holds the distinct outputs only.
    observations: tuple[Observation, ...] = field(default=(), repr=False, metadata=OMIT)


def golden_from(report: CoherenceReport, max_tokens: int) -> list[dict[str, Any]]:
    """Golden outputs (manifest form) from a coherent bootstrap report."""
    return [
        {"prompt": prompt, "max_tokens": max_tokens, "text": c.text, "token_ids": list(c.token_ids)}
        for prompt, c in report.outputs.items()
    ]


def analyze(
    observations: Sequence[Observation],
    prompts: Sequence[str],
    golden: Mapping[str, Sequence[int]] | None = None,
    golden_text: Mapping[str, str] | None = None,
) -> tuple[bool, list[str], dict[str, int]]:
    """Pure verdict: one distinct output per prompt across all modes, equal to golden when given.

    An output is its text AND its token ids: engines that return no token ids (vLLM does not
    by default) are still compared on text, so an empty id list never makes outputs look alike.
    """
    reasons: list[str] = []
    unique: dict[str, int] = {}
    for prompt in prompts:
        seen = [o for o in observations if o.prompt == prompt]
        if not seen:
            reasons.append(f"{prompt!r}: no output observed")
            unique[prompt] = 0
            continue
        distinct = {(o.text, o.token_ids) for o in seen}
        unique[prompt] = len(distinct)
        if len(distinct) > 1:
            first = next((o for o in seen if o.mode == "alone"), seen[0])
            alone = (first.text, first.token_ids)
            differing = sorted({o.mode for o in seen if (o.text, o.token_ids) != alone})
            reasons.append(
                f"{prompt!r}: {len(distinct)} distinct outputs over {len(seen)} requests "
                f"(modes differing from 'alone': {', '.join(differing)})"
            )
        if golden is not None:
            expected = tuple(golden.get(prompt, ()))
            if prompt not in golden:
                reasons.append(f"{prompt!r}: no golden output recorded")
            elif any(o.token_ids != expected for o in seen):
                reasons.append(f"{prompt!r}: output differs from the golden output")
            elif golden_text is not None and any(o.text != golden_text.get(prompt) for o in seen):
                reasons.append(f"{prompt!r}: output text differs from the golden text")
    return not reasons, reasons, unique


def run_protocol(
    client: EngineClient,
    settings: TrialSettings,
    *,
    golden: Mapping[str, Sequence[int]] | None = None,
    golden_text: Mapping[str, str] | None = None,
) -> CoherenceReport:
    """Run the replay-coherence protocol against a ready engine and analyze it."""
    prompts = list(settings.prompts)
    observations: list[Observation] = []
    started = time.monotonic()

    def ask(mode: str, prompt: str) -> Observation:
        completion = client.complete(prompt, settings.max_tokens)
        return Observation(mode, prompt, completion.text, completion.token_ids, completion.latency_s)

    for prompt in prompts:
        observations.append(ask("alone", prompt))
    for prompt in prompts:
        observations.extend(ask("repeat", prompt) for _ in range(settings.repeats - 1))
    for _ in range(2):
        observations.extend(ask("interleaved", prompt) for prompt in prompts)
    if settings.concurrent and len(prompts) > 0:
        with ThreadPoolExecutor(max_workers=min(16, len(prompts) * 2)) as pool:
            observations.extend(pool.map(lambda p: ask("concurrent", p), prompts * 2))
    elapsed = time.monotonic() - started
    passed, reasons, unique = analyze(observations, prompts, golden, golden_text)
    outputs = {
        o.prompt: Completion(o.prompt, o.text, o.token_ids, o.latency_s) for o in observations if o.mode == "alone"
    }
    return CoherenceReport(
        passed=passed,
        reasons=tuple(reasons),
        outputs=outputs,
        unique_outputs=unique,
        requests=len(observations),
        request_seconds=elapsed,
        observations=tuple(observations),
    )


def warm_up(client: EngineClient, settings: TrialSettings) -> CoherenceReport:
    """Phase 1's requests: each prompt once. They force the compile and give the golden outputs.

    Coherence is judged in the trials, not here: a bootstrap only records what it saw.
    """
    started = time.monotonic()
    outputs = {prompt: client.complete(prompt, settings.max_tokens) for prompt in settings.prompts}
    return CoherenceReport(
        passed=True,
        reasons=(),
        outputs=outputs,
        unique_outputs={prompt: 1 for prompt in outputs},
        requests=len(outputs),
        request_seconds=time.monotonic() - started,
    )


def drive_coverage(client: EngineClient, plan: CoveragePlan, mode: str) -> CoverageRun:
    """Send every request shape of the plan (:attr:`CoveragePlan.drives`), one shape at a time.

    A single greedy request's prefill is exactly one engine step of its token count; a burst sends its
    requests at once (with its plain companions, a batch mixing request kinds), so the engine batches them
    (the sampler's and the grammar bitmask's kernels specialize on the batch). Each class's kernels compile
    (bootstrap) or must load (trials). A failed request raises EngineHttpError.
    """
    started = time.monotonic()
    sent: list[Drive] = []
    for drive in plan.drives:
        plain: Callable[[], object] = partial(
            client.complete, plan.prompt(drive.token_count), drive.max_tokens, drive.companion_fields
        )
        requests: list[Callable[[], object]] = [partial(_send, client, plan, drive)] * drive.burst
        requests += [plain] * drive.companions
        if len(requests) == 1:
            requests[0]()
        else:
            # Released together, so the engine schedules them into one step (the batch the class is keyed on).
            start = threading.Barrier(len(requests))
            with ThreadPoolExecutor(max_workers=len(requests)) as pool:
                for future in [pool.submit(_at_once, start, request) for request in requests]:
                    future.result()
        sent.append(drive)
    return CoverageRun(mode, tuple(sent), time.monotonic() - started)


def _send(client: EngineClient, plan: CoveragePlan, drive: Drive) -> object:
    """One request of a drive: a chat message, or a completion of the class's token-id prompt."""
    if drive.endpoint == "chat":
        return client.chat(CHAT_MESSAGE, drive.max_tokens, drive.fields)
    return client.complete(plan.prompt(drive.token_count), drive.max_tokens, drive.fields)


def _at_once(start: threading.Barrier, request: Callable[[], object]) -> None:
    """One request of a burst, sent once every request of the burst is ready to go."""
    start.wait()
    request()


def golden_text_map(golden: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """prompt -> golden text, from a manifest's golden list."""
    return {str(item["prompt"]): str(item["text"]) for item in golden}


def golden_token_map(golden: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, ...]]:
    """prompt -> golden token ids, from a manifest's golden list."""
    return {str(item["prompt"]): tuple(int(t) for t in item["token_ids"]) for item in golden}


def failure_rate_bound(passes: int, confidence: float) -> float:
    """Upper bound on the per-start failure probability after ``passes`` of ``passes`` trials passed.

    With all K trials passing, P(K passes | p) = (1-p)^K <= 1-c gives p <= 1 - (1-c)^(1/K).
    """
    if passes < 1:
        return 1.0
    return float(1.0 - (1.0 - confidence) ** (1.0 / passes))


def trials_for(max_failure_rate: float, confidence: float) -> int:
    """The smallest K whose all-pass bound is at most ``max_failure_rate`` at ``confidence``."""
    if not 0 < max_failure_rate < 1 or not 0 < confidence < 1:
        raise ValueError("max_failure_rate and confidence must lie strictly between 0 and 1")
    k = math.ceil(math.log(1.0 - confidence) / math.log(1.0 - max_failure_rate))
    while failure_rate_bound(k, confidence) > max_failure_rate:
        k += 1
    return max(k, 1)
