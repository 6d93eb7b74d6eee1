"""The library's hints are neutral; the command line words each remedy as the flag to pass (cli/error_hints.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bless.cli.boundary import Report, execute
from bless.cli.error_hints import COMMAND_LINE_HINTS, command_line_hint
from bless.errors import AlreadyBlessedError, BlessError

REPO = Path(__file__).resolve().parents[2]
REMEDY = re.compile(r'remedy="(\w+)"')


def test_every_remedy_the_library_names_has_its_command_line_wording() -> None:
    named = {key for path in (REPO / "bless").rglob("*.py") for key in REMEDY.findall(path.read_text("utf-8"))}
    assert named, "the library names remedies"
    assert named <= set(COMMAND_LINE_HINTS), sorted(named - set(COMMAND_LINE_HINTS))


def test_a_refusal_without_a_remedy_keeps_its_hint() -> None:
    assert command_line_hint(BlessError("x", hint="free some space")) == "free some space"


def test_the_boundary_shows_the_command_line_wording(capsys: pytest.CaptureFixture[str]) -> None:
    refusal = AlreadyBlessedError("abc is already blessed", hint="replace it (rebless)", remedy="rebless")
    assert "--" not in (refusal.hint or "")

    def body() -> Report:
        raise refusal

    code = execute(body, json_output=True, verbose=False)
    assert code == 10
    captured = capsys.readouterr()
    assert json.loads(captured.out)["error"]["hint"].startswith("use --rebless to bless again")
    assert "use --rebless to bless again" in captured.err
