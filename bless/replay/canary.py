"""The canary: replay a blessing's golden prompts against a served engine and compare exactly.

Protocol code beside :mod:`bless.replay.trials` (which records the golden outputs): serve-full runs it
once the engine is ready, and only a pass lets a blessed start report success.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bless.replay.engine_client import EngineClient
from bless.replay.trials import golden_token_map


@dataclass(frozen=True)
class CanaryCheck:
    """One golden prompt replayed against the served engine."""

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

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, by hand: ``match`` is computed, not a field (:mod:`bless.core.json_form`)."""
        return {
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "match": self.match,
            "expected_token_ids": list(self.expected_token_ids),
            "got_token_ids": list(self.got_token_ids),
            "expected_text": self.expected_text,
            "got_text": self.got_text,
        }


@dataclass(frozen=True)
class CanaryResult:
    """``status``: passed, failed, or skipped (with ``reason``)."""

    status: str
    checks: tuple[CanaryCheck, ...] = ()
    seconds: float = 0.0
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, by hand: ``seconds`` is rounded (:mod:`bless.core.json_form`)."""
        return {
            "status": self.status,
            "reason": self.reason,
            "seconds": round(self.seconds, 4),
            "checks": [check.to_dict() for check in self.checks],
        }


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
