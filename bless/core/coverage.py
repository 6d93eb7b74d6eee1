"""Coverage: which kernels an engine compiles lazily after startup, and how a bootstrap reaches each one.

A blessing proves what its starts and requests exercised. Some kernel families compile lazily, per
shape, while serving (vLLM's fused-MoE Triton kernel picks a tile configuration per batch token count
M, and Triton specializes each compile on its integer arguments). An engine's per-release coverage
model (the adapter's ``coverage_plan``) splits the token counts serving can schedule into *classes*:
every M of a class compiles the same kernel binaries. One request whose scheduled token count is a
class's representative compiles all of them. The bootstrap sends those requests
(:data:`CoveragePlan.requests`), the manifest records the plan and what was reached, every trial
replays the requests and must compile nothing new.

This module is pure: the data model, the grouping of token counts into classes, and the prompts.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bless.core.json_form import JsonForm, as_json

#: Prompt token ids start here: low ids are special tokens in most vocabularies (BOS, EOS, padding).
FIRST_PROMPT_TOKEN = 1000
#: The one user message of a chat coverage request (chat prompts are text: the template decides the tokens).
CHAT_MESSAGE = "Name three colours and one animal, then call the tool if one is offered."


@dataclass(frozen=True)
class CoverageClass(JsonForm):
    """Token counts that compile the same kernels; ``token_count`` is the one the bootstrap sends.

    ``key`` describes the compile key in words (the tile configuration, the specializations);
    ``members`` counts the token counts of the class (``first``..``last`` is its span, with gaps).
    """

    key: str
    token_count: int
    members: int
    first: int
    last: int
    #: Request fields beyond the prompt (sampling modes: temperature, top_k, logprobs, ...); empty: greedy.
    sampling: Mapping[str, Any] = field(default_factory=dict)
    #: How many such requests are sent at once (the engine batches them into one step).
    burst: int = 1
    #: Tokens each request generates.
    max_tokens: int = 1
    #: ``chat``: the requests go to the chat completions API (a text message); None: the completions API.
    endpoint: str | None = field(default=None, metadata=as_json(omit_if_none=True))
    #: Plain greedy completions released together with the burst (a batch mixing request kinds); None: none.
    companions: int | None = field(default=None, metadata=as_json(omit_if_none=True))
    #: The companions' request fields, when they are not plain greedy ones (a batch mixing sampling modes).
    companion_sampling: Mapping[str, Any] | None = field(default=None, metadata=as_json(omit_if_none=True))

    @property
    def drive(self) -> Drive:
        """The requests that reach this class."""
        return Drive(
            self.token_count,
            self.max_tokens,
            freeze_fields(self.sampling),
            self.burst,
            self.endpoint or "completions",
            self.companions or 0,
            freeze_fields(self.companion_sampling or {}),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CoverageClass:
        return cls(
            key=str(data["key"]),
            token_count=int(data["token_count"]),
            members=int(data["members"]),
            first=int(data["first"]),
            last=int(data["last"]),
            sampling=dict(data.get("sampling", {})),
            burst=int(data.get("burst", 1)),
            max_tokens=int(data.get("max_tokens", 1)),
            endpoint=str(data["endpoint"]) if data.get("endpoint") is not None else None,
            companions=int(data["companions"]) if data.get("companions") is not None else None,
            companion_sampling=dict(data["companion_sampling"]) if data.get("companion_sampling") is not None else None,
        )


def freeze_fields(fields: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Request fields as a hashable, ordered tuple: nested objects and lists as their canonical JSON text."""
    return tuple(
        (name, value if isinstance(value, str | int | float | bool) or value is None else _canonical(value))
        for name, value in sorted(fields.items())
    )


def _words(frozen: tuple[tuple[str, Any], ...]) -> str:
    return ", ".join(f"{name}={value}" for name, value in frozen)


def _thaw(frozen: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return {name: json.loads(value) if isinstance(value, JsonText) else value for name, value in frozen}


class JsonText(str):
    """A nested request field frozen as its canonical JSON text (decoded again by :attr:`Drive.fields`)."""

    __slots__ = ()


def _canonical(value: Any) -> JsonText:
    return JsonText(json.dumps(value, sort_keys=True, separators=(",", ":")))


@dataclass(frozen=True)
class Drive:
    """One coverage request shape: ``burst`` requests at once with ``sampling`` (plus ``companions`` plain ones).

    ``sampling`` is frozen (:func:`freeze_fields`): a nested value is its canonical JSON text; :attr:`fields`
    gives the request fields back.
    """

    token_count: int
    max_tokens: int
    sampling: tuple[tuple[str, Any], ...]
    burst: int
    endpoint: str = "completions"
    companions: int = 0
    companion_sampling: tuple[tuple[str, Any], ...] = ()

    @property
    def fields(self) -> dict[str, Any]:
        """The request fields beyond the prompt, nested values decoded."""
        return _thaw(self.sampling)

    @property
    def companion_fields(self) -> dict[str, Any]:
        """The companions' request fields (empty: plain greedy)."""
        return _thaw(self.companion_sampling)

    def describe(self) -> str:
        """``17 tokens``, ``16 tokens x8 at once (top_k=20, temperature=0.8)``, ``chat (tool_choice=required)``."""
        fields = _words(self.sampling)
        head = "chat" if self.endpoint == "chat" else f"{self.token_count} tokens"
        return (
            head
            + (f" x{self.burst} at once" if self.burst > 1 else "")
            + (f" with {self.companions} {_words(self.companion_sampling) or 'plain'}" if self.companions else "")
            + (f" ({fields})" if fields else "")
        )

    @property
    def plain(self) -> bool:
        """A single greedy completion of a token-id prompt: the token-count classes."""
        return self.burst == 1 and not self.sampling and self.endpoint == "completions" and not self.companions


@dataclass(frozen=True)
class CoverageFamily(JsonForm):
    """One kernel family of the engine: whether this configuration can reach it, and its classes.

    ``reachable`` False: serving never compiles it here (``reason`` says why). ``modeled`` False: it
    may be reached but the model cannot enumerate its classes (``reason`` says what is missing): a
    gap, refused when the profile requires full coverage. ``source`` names the engine code the rule
    comes from.
    """

    name: str
    reachable: bool
    modeled: bool
    reason: str
    source: str
    classes: tuple[CoverageClass, ...] = ()

    @property
    def gap(self) -> bool:
        """Reachable but not enumerated: serving may compile kernels no request of the bootstrap reached."""
        return self.reachable and not self.modeled

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CoverageFamily:
        return cls(
            name=str(data["name"]),
            reachable=bool(data["reachable"]),
            modeled=bool(data["modeled"]),
            reason=str(data["reason"]),
            source=str(data["source"]),
            classes=tuple(CoverageClass.from_dict(c) for c in data.get("classes", ())),
        )


@dataclass(frozen=True)
class CoveragePlan(JsonForm):
    """What a configuration can compile lazily and the requests that reach every class.

    ``token_range`` is the span of token counts one engine step can schedule (1..max batched tokens);
    ``prompt_tokens`` the span of token ids prompts are drawn from (the vocabulary, less special ids).
    """

    json_keys = ("engine", "model", "token_range", "prompt_tokens", "families", "notes")

    engine: str
    model: str
    families: tuple[CoverageFamily, ...] = ()
    token_range: tuple[int, int] = (1, 1)
    prompt_tokens: tuple[int, int] = (FIRST_PROMPT_TOKEN, FIRST_PROMPT_TOKEN + 1)
    notes: tuple[str, ...] = ()

    @property
    def drives(self) -> tuple[Drive, ...]:
        """Every request shape to send, once each, in plan order: one per class of the modeled, reachable families."""
        return tuple(dict.fromkeys(c.drive for f in self.families if f.reachable and f.modeled for c in f.classes))

    @property
    def requests(self) -> tuple[int, ...]:
        """The prompt lengths of the greedy single requests to send, ascending (the token-count classes)."""
        return tuple(sorted({d.token_count for d in self.drives if d.plain}))

    @property
    def gaps(self) -> tuple[CoverageFamily, ...]:
        """Families serving may reach that the model cannot enumerate."""
        return tuple(f for f in self.families if f.gap)

    def prompt(self, token_count: int) -> list[int]:
        """The prompt of ``token_count`` token ids sent for one class (see :func:`coverage_prompt`)."""
        return coverage_prompt(token_count, self.prompt_tokens)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CoveragePlan:
        low, high = data["token_range"]
        first, last = data["prompt_tokens"]
        return cls(
            engine=str(data["engine"]),
            model=str(data["model"]),
            families=tuple(CoverageFamily.from_dict(f) for f in data.get("families", ())),
            token_range=(int(low), int(high)),
            prompt_tokens=(int(first), int(last)),
            notes=tuple(str(n) for n in data.get("notes", ())),
        )


@dataclass(frozen=True)
class CoverageRun:
    """What the coverage requests of one start did: the shapes sent and their seconds (a failed one raises)."""

    mode: str
    sent: tuple[Drive, ...] = ()
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        # By hand (not JsonForm): the shapes sent summarized (a count, greedy token counts, others described).
        return {
            "mode": self.mode,
            "requests": sum(d.burst + d.companions for d in self.sent),
            "token_counts": [d.token_count for d in self.sent if d.plain],
            "shapes": [d.describe() for d in self.sent if not d.plain],
            "seconds": round(self.seconds, 3),
        }


def group_token_counts(
    token_counts: Iterable[int],
    key_of: Callable[[int], Hashable],
    describe: Callable[[Hashable], str],
    *,
    prefer_above: int = 0,
) -> tuple[CoverageClass, ...]:
    """Group token counts by their compile key; one class per key, in order of first appearance.

    The representative is the smallest member above ``prefer_above`` (token counts up to it may be
    padded up to a captured CUDA-graph size by the engine, so a request of that length would run at
    another M), else the smallest member.
    """
    members: dict[Hashable, list[int]] = {}
    for count in token_counts:
        members.setdefault(key_of(count), []).append(count)
    classes: list[CoverageClass] = []
    for key, counts in members.items():
        above = [c for c in counts if c > prefer_above]
        chosen = above[0] if above else counts[0]
        classes.append(CoverageClass(describe(key), chosen, len(counts), counts[0], counts[-1]))
    return tuple(classes)


#: Token counts up to this are always grouped one by one (Triton's ``== 1`` specialization lives there).
SMALL_COUNTS = 64


def group_token_range(
    first: int,
    last: int,
    key_of: Callable[[int], Hashable],
    describe: Callable[[Hashable], str],
    *,
    splits: Iterable[int] = (),
    period: int = 16,
    prefer_above: int = 0,
) -> tuple[CoverageClass, ...]:
    """:func:`group_token_counts` over ``first..last`` without visiting every count (bounded in the range's size).

    ``key_of`` must be periodic with ``period`` between consecutive ``splits`` (the counts where a regime
    may change: a tile configuration, a block assignment) above :data:`SMALL_COUNTS`: each such segment is
    grouped from its first two periods, each residue an arithmetic progression to the segment's end, and a
    segment whose second period differs from its first raises ValueError (the rule is not what the model
    assumes). The result equals :func:`group_token_counts` over the same range (a unit test holds that).
    """
    if last < first:
        return ()
    bounds = sorted(b for b in {first, last + 1, SMALL_COUNTS + 1, *splits} if first <= b <= last + 1)
    progressions: dict[Hashable, list[tuple[int, int]]] = {}  # key -> [(start, end)] stepping by period
    for start, stop in itertools.pairwise(bounds):
        end = stop - 1
        if end - start < 2 * period or end <= SMALL_COUNTS:
            for count in range(start, end + 1):
                progressions.setdefault(key_of(count), []).append((count, count))
            continue
        for residue in range(period):
            head = start + residue
            key = key_of(head)
            if key_of(head + period) != key:
                raise ValueError(f"the compile key is not periodic in {period} from token count {head}")
            tail = head + period * ((end - head) // period)
            progressions.setdefault(key, []).append((head, tail))
    classes: list[CoverageClass] = []
    for key, runs in progressions.items():
        members = sum((tail - head) // period + 1 if tail > head else 1 for head, tail in runs)
        low = min(head for head, _ in runs)
        high = max(tail for _, tail in runs)
        above = [_first_above(head, tail, period, prefer_above) for head, tail in runs]
        chosen = min((a for a in above if a is not None), default=low)
        classes.append(CoverageClass(describe(key), chosen, members, low, high))
    return tuple(sorted(classes, key=lambda c: c.first))


def _first_above(head: int, tail: int, period: int, threshold: int) -> int | None:
    """The smallest member of ``head, head+period, .., tail`` above ``threshold``, or None."""
    if tail <= threshold:
        return None
    if head > threshold:
        return head
    step = period if tail > head else 1
    return head + step * ((threshold - head) // step + 1)


def coverage_prompt(token_count: int, prompt_tokens: tuple[int, int]) -> list[int]:
    """``token_count`` token ids in ``prompt_tokens`` [first, last): deterministic, distinct per length.

    The first id depends on the length, so two coverage prompts never share a prefix block and a
    prefix cache never shortens the scheduled token count below the prompt's length.
    """
    first, last = prompt_tokens
    span = max(last - first, 1)
    start = (token_count * 7919) % span
    return [first + (start + index * 31) % span for index in range(token_count)]


def describe_plan(plan: CoveragePlan) -> list[str]:
    """The plan in words, one line per family (``bless show``, the run's output)."""
    lines: list[str] = []
    for family in plan.families:
        if not family.reachable:
            lines.append(f"{family.name}: not reachable here ({family.reason})")
        elif not family.modeled:
            lines.append(f"{family.name}: GAP, reachable but not modeled ({family.reason})")
        elif family.classes and all(c.drive.plain for c in family.classes):
            counts = ", ".join(str(c.token_count) for c in family.classes)
            lines.append(
                f"{family.name}: {len(family.classes)} class(es) over token counts "
                f"{plan.token_range[0]}..{plan.token_range[1]}, reached by prompts of {counts} token(s)"
                f" ({family.reason})"
            )
        elif not family.classes:
            lines.append(f"{family.name}: nothing compiles lazily here ({family.reason})")
        else:
            lines.append(f"{family.name}: {len(family.classes)} class(es), one request shape each ({family.reason})")
    return lines
