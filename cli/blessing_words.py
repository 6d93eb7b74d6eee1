"""A blessing in words (``bless show``): what its factors cover, group by group, and plain ``key  value`` lines."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from bless.core.untrusted_text import shown


def cell(value: object, style: str = "") -> Text:
    """A value from a document as one line of plain text: non-printables escaped
    (:func:`bless.core.untrusted_text.shown`).

    Names and fields come from disk and manifests that someone else may have written: a newline or an
    escape sequence in one must not draw a line of its own.
    """
    return Text(shown(str(value)), style=style)


def json_text(value: Any) -> str:
    """``value`` as JSON, with the characters JSON leaves raw (C1 controls, bidi, ...) as ``\\u`` escapes."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return "".join(char if char.isprintable() else json.dumps(char)[1:-1] for char in text)


def scalar(value: Any) -> str:
    """A scalar in words: a string as it is, anything else as JSON (non-printables escaped)."""
    return value if isinstance(value, str) else json_text(value)


def kv_lines(console: Console, rows: Sequence[tuple[str, str]], *, indent: str = "") -> None:
    """``key  value`` rows as plain lines: keys aligned, nothing after the value.

    Not a grid: a grid pads every row to its widest value, and on a console that is not a terminal
    (1000 columns wide) one long value pads each line with hundreds of spaces.
    """
    width = max((len(shown(key)) for key, _ in rows), default=0)
    for key, value in rows:
        console.print(Text.assemble(indent, (shown(key).ljust(width), "bold"), "  ", shown(value)))


def flat(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """A nested mapping as ``a.b = value`` pairs in key order, scalars in words (no JSON quoting)."""
    if isinstance(value, Mapping) and value:
        pairs: list[tuple[str, str]] = []
        for key in sorted(value):
            pairs += flat(value[key], f"{prefix}.{key}" if prefix else str(key))
        return pairs
    if isinstance(value, bool):
        return [(prefix, "yes" if value else "no")]
    if value is None or value == {} or value == []:
        return [(prefix, "(none)")]
    if isinstance(value, list):
        return [(prefix, ", ".join(scalar(item) for item in value))]
    return [(prefix, scalar(value))]


#: What each factor group of a blessing covers, in words (the groups the config hash is made of).
FACTOR_GROUPS = {
    "hardware": "hardware it was proven on",
    "engine": "engine",
    "model": "model",
    "runtime": "runtime and image",
    "serve": "engine settings (serve arguments)",
    "env": "environment",
    "cache": "cache location in the engine",
}


def render_coverage_in_words(console: Console, factors: Mapping[str, Any], trials: Mapping[str, Any]) -> None:
    """What a blessing covers: its factors, group by group in words, and the trials that proved it."""
    console.print(Text("what this blessing covers (its config hash is made of these factors)", style="bold"))
    groups = [key for key in FACTOR_GROUPS if key in factors]
    groups += sorted(key for key in factors if key not in FACTOR_GROUPS and isinstance(factors[key], Mapping))
    for group in groups:
        console.print(cell(f"  {FACTOR_GROUPS.get(group, group)}:"))
        kv_lines(console, flat(factors[group]) or [("", "(none)")], indent="    ")
    planned, passed = trials.get("planned"), trials.get("passed")
    line = f"  trials: {passed} of {planned} passed"
    bound = trials.get("failure_rate_bound")
    if isinstance(bound, Mapping):
        line += (
            f"; the failure rate per start is at most {bound.get('max_failure_rate')} "
            f"at confidence {bound.get('confidence')}"
        )
    console.print(cell(line))
