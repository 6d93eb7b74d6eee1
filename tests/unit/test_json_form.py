"""The one JSON form of result types: fields in order, omitted ones left out, nested values made JSON-ready, and
what a type declares beyond that (keys renamed, converters, keys left out when None, computed keys, their order)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bless.core.json_form import OMIT, JsonForm, as_json, json_form, rounded
from bless.core.verify import Notice, Problem, TreeCheck


@dataclass(frozen=True)
class Inner:
    name: str
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class Outer(JsonForm):
    path: Path
    inner: Inner
    problems: tuple[Problem, ...]
    table: dict[str, tuple[str, ...]]
    handle: object = field(default=None, metadata=OMIT)


def test_fields_in_order_with_nested_values_made_json_ready() -> None:
    outer = Outer(Path("/a/b"), Inner("x", (1, 2)), (Problem("size", "f", "d"),), {"k": ("v",)}, handle=object())
    assert list(outer.to_dict()) == ["path", "inner", "problems", "table"]
    assert outer.to_dict() == {
        "path": "/a/b",
        "inner": {"name": "x", "sizes": [1, 2]},
        "problems": [{"kind": "size", "path": "f", "detail": "d"}],
        "table": {"k": ["v"]},
    }
    assert json_form([outer]) == [outer.to_dict()]


def test_a_verify_result_prints_as_it_always_did() -> None:
    """The byte-for-byte JSON of ``bless verify --json``'s result, written out by hand."""
    problem, notice = Problem("sha256", "a.bin", "expected x"), Notice("writable", ".", "mode")
    result = TreeCheck(False, (problem,), (notice,), 2, 10, 0.5)
    assert json.dumps(result.to_dict()) == (
        '{"ok": false, "problems": [{"kind": "sha256", "path": "a.bin", "detail": "expected x"}], '
        '"notices": [{"kind": "writable", "path": ".", "detail": "mode"}], "files_checked": 2, "bytes_hashed": 10, '
        '"elapsed_s": 0.5}'
    )


def _doubled(values: tuple[int, ...]) -> list[int]:
    return [2 * value for value in values]


@dataclass(frozen=True)
class Declared(JsonForm):
    """Every option at once: a key renamed, converters, a key left out when None, a computed key placed."""

    json_keys = ("count", "seconds", "sizes", "label", "note")

    sizes: tuple[int, ...] = field(metadata=as_json(to_json=_doubled))
    seconds: float | None = field(default=None, metadata=as_json(to_json=rounded(2)))
    name: str = field(default="x", metadata=as_json(name="label"))
    note: str | None = field(default=None, metadata=as_json(omit_if_none=True))

    def json_extra(self) -> dict[str, Any]:
        return {"count": len(self.sizes)}


def test_declared_names_converters_omissions_and_computed_keys_in_the_declared_order() -> None:
    assert json.dumps(Declared((1, 2), 1.23456, "n", "hi").to_dict()) == (
        '{"count": 2, "seconds": 1.23, "sizes": [2, 4], "label": "n", "note": "hi"}'
    )
    # A converter sees None too (rounded keeps it); an omit_if_none key is left out, not null.
    assert json.dumps(Declared(()).to_dict()) == '{"count": 0, "seconds": null, "sizes": [], "label": "x"}'


@dataclass(frozen=True)
class ExtraLast(JsonForm):
    a: int

    def json_extra(self) -> dict[str, Any]:
        return {"b": self.a + 1}


@dataclass(frozen=True)
class WrongKeys(JsonForm):
    json_keys = ("a",)

    a: int
    b: int


@dataclass(frozen=True)
class ExtraClash(JsonForm):
    a: int

    def json_extra(self) -> dict[str, Any]:
        return {"a": 2}


def test_without_json_keys_the_computed_keys_follow_the_fields() -> None:
    assert list(ExtraLast(1).to_dict().items()) == [("a", 1), ("b", 2)]


def test_json_keys_must_name_every_key_once_and_computed_keys_must_not_repeat_a_field() -> None:
    with pytest.raises(TypeError, match="must name each JSON key once"):
        WrongKeys(1, 2).to_dict()
    with pytest.raises(TypeError, match="repeats field keys"):
        ExtraClash(1).to_dict()
