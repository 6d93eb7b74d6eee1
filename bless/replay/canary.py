"""The canary: replay a blessing's golden prompts against a served engine and compare exactly.

Protocol code beside :mod:`bless.replay.trials` (which records the golden outputs): serve-full runs it
once the engine is ready, and only a pass lets a blessed start report success.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bless.core.json_form import JsonForm, as_json, rounded
from bless.replay.engine_client import EngineClient
from bless.replay.trials import golden_token_map


@dataclass(frozen=True)
class CanaryCheck(JsonForm):
    """One golden prompt replayed against the served engine."""

    json_keys = ("prompt", "max_tokens", "match", "expected_token_ids", "got_token_ids", "expected_text", "got_text")

    prompt: str
    max_tokens: int
    expected_token_ids: tuple[int, ...]
    got_token_ids: tuple[int, ...]
    expected_text: str
    got_text: str

    @property
    def match(self) -> bool:
        # Both: an engine that returns no token ids (vLLM's completions) must still match on text.
        return self.expected_token_ids == self.got_token_ids and self.expected_text == self.got_text

    def describe(self) -> str:
        """Expected vs got, in token ids when they differ, else in text."""
        if self.expected_token_ids != self.got_token_ids:
            return f"expected {list(self.expected_token_ids)} got {list(self.got_token_ids)}"
        return f"expected text {self.expected_text!r} got {self.got_text!r}"

    def json_extra(self) -> dict[str, Any]:
        """Whether the engine answered as the blessing recorded."""
        return {"match": self.match}


@dataclass(frozen=True)
class CanaryResult(JsonForm):
    """``status``: passed, failed, or skipped (with ``reason``)."""

    json_keys = ("status", "reason", "seconds", "checks")

    status: str
    checks: tuple[CanaryCheck, ...] = ()
    seconds: float = field(default=0.0, metadata=as_json(to_json=rounded(4)))
    reason: str | None = None


def run_canary(client: EngineClient, golden: Sequence[Mapping[str, Any]]) -> CanaryResult:
    """Each golden prompt with its max_tokens; passed only when every text and token id sequence is identical."""
    started = time.monotonic()
    expected = golden_token_map(golden)
    checks: list[CanaryCheck] = []
    for item in golden:
        prompt = str(item["prompt"])
        max_tokens = int(item["max_tokens"])
        completion = client.complete(prompt, max_tokens)
        checks.append(
            CanaryCheck(
                prompt=prompt,
                max_tokens=max_tokens,
                expected_token_ids=expected[prompt],
                got_token_ids=completion.token_ids,
                expected_text=str(item.get("text", "")),
                got_text=completion.text,
            )
        )
    passed = bool(checks) and all(check.match for check in checks)
    return CanaryResult("passed" if passed else "failed", tuple(checks), time.monotonic() - started)
