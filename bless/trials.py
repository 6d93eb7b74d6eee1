"""Replay coherence over the OpenAI-compatible HTTP API: readiness, the request protocol, its analysis.

The protocol, per trial: every prompt once alone; each prompt ``repeats`` times in a
row; all prompts interleaved round-robin; all prompts at once from threads (when the
plan allows concurrency). Coherent means: each prompt has exactly one distinct output
across all of these, equal to the golden output when one is given.
"""

from __future__ import annotations

import errno
import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from bless.errors import EngineHttpError, NotReadyError
from bless.profile import TrialPlan

MAX_REPLY_BYTES = 8 << 20
MAX_OTHER_ERRORS = 20


@dataclass(frozen=True)
class Completion:
    prompt: str
    text: str
    token_ids: tuple[int, ...]
    latency_s: float


class EngineClient:
    """A tiny client for ``/v1/models`` and ``/v1/completions`` on 127.0.0.1 (stdlib only)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout_s: float,
        model: str | None = None,
        fields: Mapping[str, Any] | None = None,
        require_token_ids: bool = False,
    ):
        self.base_url = f"http://{host}:{port}"
        self.timeout_s = timeout_s
        self.model = model
        #: Extra fields of every completion request (the adapter's ``completion_fields``).
        self.fields = dict(fields or {})
        #: A completion whose reply holds no token ids is an error (bless compares token ids, not only text).
        self.require_token_ids = require_token_ids

    def _request(self, path: str, body: Mapping[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 - the URL is always our loopback http URL
            self.base_url + path,
            data=data,
            method="GET" if body is None else "POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:  # noqa: S310
                raw = reply.read(MAX_REPLY_BYTES + 1)
        except urllib.error.HTTPError as exc:
            detail = exc.read(2000).decode("utf-8", "replace")
            raise EngineHttpError(f"{path}: HTTP {exc.code}: {detail}") from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            refused = isinstance(reason, ConnectionRefusedError) or (
                isinstance(reason, OSError) and reason.errno in (errno.ECONNREFUSED, errno.ECONNRESET)
            )
            raise EngineHttpError(f"{path}: {reason}", refused=refused) from None
        except (ConnectionError, TimeoutError, OSError) as exc:
            refused = isinstance(exc, ConnectionRefusedError | ConnectionResetError)
            raise EngineHttpError(f"{path}: {type(exc).__name__}: {exc}", refused=refused) from None
        if len(raw) > MAX_REPLY_BYTES:
            raise EngineHttpError(f"{path}: reply larger than {MAX_REPLY_BYTES} bytes")
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise EngineHttpError(f"{path}: reply is not JSON: {exc}") from None

    def models(self) -> list[str]:
        """Model ids served; a reply of the wrong shape is an EngineHttpError."""
        reply = self._request("/v1/models")
        try:
            return [str(item["id"]) for item in reply["data"]]
        except (KeyError, TypeError) as exc:
            raise EngineHttpError(f"/v1/models: unexpected reply shape ({exc!r})") from None

    def complete(self, prompt: str, max_tokens: int) -> Completion:
        """One greedy completion; text and token ids are both required in the reply."""
        body: dict[str, Any] = {**self.fields, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        if self.model:
            body["model"] = self.model
        started = time.monotonic()
        reply = self._request("/v1/completions", body)
        latency = time.monotonic() - started
        try:
            choice = reply["choices"][0]
            text = choice["text"]
            token_ids = choice.get("token_ids")
            if not isinstance(text, str):
                raise TypeError("text is not a string")
            if token_ids is None:
                if self.require_token_ids:
                    raise TypeError("the reply holds no token_ids (the trials and the canary compare token ids)")
                token_ids = []
            if not isinstance(token_ids, list) or not all(type(t) is int for t in token_ids):  # no bools
                raise TypeError("token_ids is not a list of integers")
        except (KeyError, IndexError, TypeError) as exc:
            raise EngineHttpError(f"/v1/completions: unexpected reply shape ({exc})") from None
        return Completion(prompt, text, tuple(token_ids), latency)


def wait_ready(
    client: EngineClient,
    *,
    timeout_s: float,
    is_alive: Callable[[], bool],
    poll_s: float = 0.5,
    max_other_errors: int = MAX_OTHER_ERRORS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Poll ``/v1/models`` until it answers; returns the seconds waited.

    A refused connection while booting is the normal state, not an error, and is never
    counted; other failures (5xx, bad replies) are retried at most ``max_other_errors``
    times. The engine exiting, or ``timeout_s`` passing, ends the wait at once.
    """
    started = clock()
    other_errors: list[str] = []
    while True:
        if not is_alive():
            raise NotReadyError("the engine exited before it became ready")
        try:
            client.models()
            return clock() - started
        except EngineHttpError as exc:
            if not exc.refused:
                other_errors.append(exc.message)
                if len(other_errors) > max_other_errors:
                    raise NotReadyError(
                        f"{len(other_errors)} failed readiness checks; last: {other_errors[-1]}"
                    ) from None
        if clock() - started > timeout_s:
            raise NotReadyError(f"not ready after {timeout_s:.0f} s")
        sleep(poll_s)


# --- the protocol -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """One completion as seen in one mode of the protocol."""

    mode: str  # alone | repeat | interleaved | concurrent | canary
    prompt: str
    text: str
    token_ids: tuple[int, ...]
    latency_s: float


@dataclass(frozen=True)
class CoherenceReport:
    """The verdict of the protocol and the outputs it saw (one per prompt when coherent)."""

    passed: bool
    reasons: tuple[str, ...]
    outputs: Mapping[str, Completion]
    unique_outputs: Mapping[str, int]
    requests: int
    request_seconds: float
    observations: tuple[Observation, ...] = field(default=(), repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "reasons": list(self.reasons),
            "unique_outputs": dict(self.unique_outputs),
            "requests": self.requests,
            "request_seconds": round(self.request_seconds, 4),
            "outputs": {p: {"text": c.text, "token_ids": list(c.token_ids)} for p, c in self.outputs.items()},
        }


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
    plan: TrialPlan,
    *,
    golden: Mapping[str, Sequence[int]] | None = None,
    golden_text: Mapping[str, str] | None = None,
) -> CoherenceReport:
    """Run the replay-coherence protocol against a ready engine and analyze it."""
    prompts = list(plan.prompts)
    observations: list[Observation] = []
    started = time.monotonic()

    def ask(mode: str, prompt: str) -> Observation:
        completion = client.complete(prompt, plan.max_tokens)
        return Observation(mode, prompt, completion.text, completion.token_ids, completion.latency_s)

    for prompt in prompts:
        observations.append(ask("alone", prompt))
    for prompt in prompts:
        observations.extend(ask("repeat", prompt) for _ in range(plan.repeats - 1))
    for _ in range(2):
        observations.extend(ask("interleaved", prompt) for prompt in prompts)
    if plan.concurrent and len(prompts) > 0:
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


def warm_up(client: EngineClient, plan: TrialPlan) -> CoherenceReport:
    """Phase 1's requests: each prompt once. They force the compile and give the golden outputs.

    Coherence is judged in the trials, not here: a bootstrap only records what it saw.
    """
    started = time.monotonic()
    outputs = {prompt: client.complete(prompt, plan.max_tokens) for prompt in plan.prompts}
    return CoherenceReport(
        passed=True,
        reasons=(),
        outputs=outputs,
        unique_outputs={prompt: 1 for prompt in outputs},
        requests=len(outputs),
        request_seconds=time.monotonic() - started,
    )


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
