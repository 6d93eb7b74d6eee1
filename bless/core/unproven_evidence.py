"""The format of a sealed serve's ``unproven-compiles.jsonl``: one line per distinct compile, and a bound.

Sealed serving (bless.flows.serve.seal) writes it; the next ``bless run`` of the profile (bless.flows.run.served)
reads it back. Both go through this module, so the line format, the identity of an event and the bound are
said once.

* **One line per distinct compile.** A Triton kernel is one compile per cache key however often the engine
  misses it; a written file is one per path. Repeats are counted by the writer, never written again.
* **Bounded.** Each line is at most :data:`LINE_MAX_BYTES` (long fields are shortened), and the file at most
  :data:`EVIDENCE_MAX_BYTES`: when the next line would not fit, the writer ends the file with one
  :data:`FULL_EVENT` line and writes nothing more. A reader that meets that line knows the list is incomplete.
* **Fail closed on read.** A file over the bound, a line that is no event, or the full marker make the evidence
  unreadable as a whole: the reader refuses (``[coverage] mode = "require"``) or warns, it never skips.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EVENT",
    "EVIDENCE_MAX_BYTES",
    "FULL_EVENT",
    "LINE_MAX_BYTES",
    "ParsedEvidence",
    "event_identity",
    "evidence_line",
    "fits",
    "full_line",
    "parse_evidence",
]

#: What an event line says it is.
EVENT = "unproven_compile"
#: The last line of a file that reached its bound: the serve met more distinct compiles than it could list.
FULL_EVENT = "unproven_compile_evidence_full"
#: The largest evidence file a serve writes (the full marker included), and the most a reader reads.
EVIDENCE_MAX_BYTES = 4 << 20
#: The longest line: a field is shortened (its end cut, marked) until the line fits.
LINE_MAX_BYTES = 2048
#: What the full marker line may take (reserved by the writer below the file bound).
_FULL_RESERVE = 512
_CUT_MARK = "...[cut]"


def event_identity(event: Mapping[str, Any]) -> str:
    """What makes two events the same compile: the kernel's cache key, else the path, else what it says.

    The time and the configuration are left out: the same kernel met again later is not new evidence.
    """
    key = event.get("key")
    if isinstance(key, str) and key:
        return f"key:{key}"
    path = event.get("path")
    if isinstance(path, str) and path:
        return f"path:{path}"
    fields = {name: event.get(name) for name in ("source", "kernel", "file", "reason")}
    return "other:" + json.dumps(fields, sort_keys=True, default=str)


def _dump(event: Mapping[str, Any]) -> bytes:
    return (json.dumps(event, sort_keys=True, separators=(",", ":"), default=str) + "\n").encode()


def evidence_line(event: Mapping[str, Any]) -> bytes:
    """``event`` as one line of at most :data:`LINE_MAX_BYTES`: its longest text field halved until it fits."""
    shortened = dict(event)
    line = _dump(shortened)
    while len(line) > LINE_MAX_BYTES:
        texts = [(len(value), name) for name, value in shortened.items() if isinstance(value, str) and value]
        if not texts:
            break
        length, name = max(texts)
        if length <= len(_CUT_MARK) + 1:
            break
        shortened[name] = str(shortened[name])[: length // 2] + _CUT_MARK
        line = _dump(shortened)
    return line[:LINE_MAX_BYTES] if len(line) > LINE_MAX_BYTES else line


def full_line(*, config_hash: str, time: float, recorded: int) -> bytes:
    """The marker that ends a file at its bound (never longer than the room the writer keeps for it)."""
    line = _dump({"event": FULL_EVENT, "config_hash": config_hash[:128], "time": time, "recorded": recorded})
    assert len(line) <= _FULL_RESERVE
    return line


def fits(size: int, line: bytes) -> bool:
    """Whether ``line`` may follow ``size`` bytes while leaving room for the full marker."""
    return size + len(line) + _FULL_RESERVE <= EVIDENCE_MAX_BYTES


@dataclass(frozen=True)
class ParsedEvidence:
    """The lines of one evidence file: its events, its full markers, and the lines that are neither."""

    events: tuple[Mapping[str, Any], ...]
    #: The :data:`FULL_EVENT` lines (each names the configuration it was written for).
    full: tuple[Mapping[str, Any], ...]
    #: How many lines are no event (not JSON, another object), and the first one's number.
    bad_lines: int
    first_bad_line: int | None


def parse_evidence(data: bytes) -> ParsedEvidence:
    """Every line of ``data`` sorted into events, full markers and lines that are neither."""
    events: list[Mapping[str, Any]] = []
    full: list[Mapping[str, Any]] = []
    bad = 0
    first_bad: int | None = None
    for number, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            event = json.loads(raw)
        except (ValueError, RecursionError):
            event = None
        if isinstance(event, dict) and event.get("event") == FULL_EVENT:
            full.append(event)
        elif isinstance(event, dict) and event.get("event") == EVENT:
            events.append(event)
        else:
            bad += 1
            first_bad = number if first_bad is None else first_bad
    return ParsedEvidence(tuple(events), tuple(full), bad, first_bad)
