"""The one JSON form of result types: fields in order, omitted ones left out, nested values made JSON-ready."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from bless.core.json_form import OMIT, JsonForm, json_form
from bless.core.verify import Notice, Problem, VerifyResult


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
    result = VerifyResult(False, (problem,), (notice,), 2, 10, 0.5)
    assert json.dumps(result.to_dict()) == (
        '{"ok": false, "problems": [{"kind": "sha256", "path": "a.bin", "detail": "expected x"}], '
        '"notices": [{"kind": "writable", "path": ".", "detail": "mode"}], "files_checked": 2, "bytes_hashed": 10, '
        '"elapsed_s": 0.5}'
    )
