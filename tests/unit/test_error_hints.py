"""The library's hints are neutral; the command line words each remedy as the flag to pass (cli/error_hints.py)."""

from __future__ import annotations

import ast
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


#: A command-line option (``--rebless``), a bless command (``bless run``) or the serving command (``serve-full``).
NAMES_THE_COMMAND_LINE = re.compile(
    r"(?<![\w-])--[a-z][a-z0-9-]*"
    r"|\bbless (?:run|verify|sign|push|pull|gc|show|diff|hash|trust|engines|list|gate|k8s|exit-codes|serve)\b"
    r"|\bserve-full\b"
)
#: Other programs' command lines a hint may quote: their options are not bless's to word.
OTHER_PROGRAMS = re.compile(
    r"docker image inspect --format|nvidia-smi --query-gpu=\S+ --format=\S+|huggingface-cli download ID --revision"
    r"|kubectl create secret generic NAME --from-literal="
)
#: The hints still worded for the command line, each with why (empty is the goal).
ALLOWED = {
    # `bless gate` gates a checkout's profiles in CI: its hint is about the command's arguments.
    "bless/flows/gate/check.py": "bless gate profiles/a.toml",
}


def _literal_text(node: ast.expr) -> str:
    """The text of a string expression (an f-string's values as {}), empty for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            _literal_text(value) if not isinstance(value, ast.FormattedValue) else "{}" for value in node.values
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal_text(node.left) + _literal_text(node.right)
    if isinstance(node, ast.IfExp):
        return _literal_text(node.body) + " " + _literal_text(node.orelse)
    return ""


def _library_hints() -> list[tuple[str, int, str]]:
    """Every hint the library writes as a literal: ``hint=`` arguments and names holding a hint."""
    found = []
    for path in sorted((REPO / "bless").rglob("*.py")):
        if "cli" in path.relative_to(REPO / "bless").parts:
            continue
        where = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.keyword) and node.arg == "hint":
                found.append((where, node.value.lineno, _literal_text(node.value)))
            elif isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and "hint" in target.id.lower() for target in node.targets
            ):
                found.append((where, node.lineno, _literal_text(node.value)))
    return found


def test_no_library_hint_names_a_command_line_option_or_command() -> None:
    hints = _library_hints()
    assert len(hints) > 200, "the scan finds the library's hints"
    offending = [
        f"{where}:{line}: {text}"
        for where, line, text in hints
        if NAMES_THE_COMMAND_LINE.search(OTHER_PROGRAMS.sub("", text))
        and not (where in ALLOWED and ALLOWED[where] in text)
    ]
    assert not offending, "\n".join(offending)
