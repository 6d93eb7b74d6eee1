"""Names and paths are checked with FULL matches: a ``$``-anchored ``re.match`` lets a trailing newline through.

``re.match(r"^[0-9a-f]{40}$", "…\\n")`` matches, so a revision, a dir id or a file name with a trailing
newline would pass a check and then name something else. This test reads every module of bless/ and
cli/ and refuses ``.match`` with a pattern ending in ``$`` (use ``fullmatch``).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _literal_ends_with_dollar(node: ast.expr) -> bool:
    """Is ``node`` a string literal (or a concatenation ending in one) whose pattern ends with ``$``?"""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.endswith("$") and not node.value.endswith("\\$")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal_ends_with_dollar(node.right)
    return False


def _is_re_call(node: ast.expr, name: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == name
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "re"
    )


def dollar_matches(source: str) -> list[int]:
    """Lines that call ``.match`` with a ``$``-anchored pattern (compiled under a name, or inline)."""
    tree = ast.parse(source)
    anchored: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        if value is not None and _is_re_call(value, "compile"):
            assert isinstance(value, ast.Call)
            if value.args and _literal_ends_with_dollar(value.args[0]):
                anchored.update(t.id for t in targets if isinstance(t, ast.Name))
    lines: list[int] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute) or node.func.attr != "match":
            continue
        owner = node.func.value
        named = isinstance(owner, ast.Name) and owner.id in anchored
        inline = _is_re_call(node, "match") and bool(node.args) and _literal_ends_with_dollar(node.args[0])
        if named or inline:
            lines.append(node.lineno)
    return lines


def test_the_checker_finds_what_it_is_meant_to_find() -> None:
    source = 'import re\nA = re.compile(r"^x$")\nB = re.compile(r"^x")\nA.match(s)\nB.match(s)\nre.match(r"^y$", s)\n'
    assert dollar_matches(source) == [4, 6]


def test_no_dollar_anchored_match_in_bless_or_cli() -> None:
    found = {
        str(path.relative_to(REPO)): lines
        for path in sorted([*REPO.glob("bless/**/*.py"), *REPO.glob("cli/**/*.py")])
        if (lines := dollar_matches(path.read_text(encoding="utf-8")))
    }
    assert found == {}, "use fullmatch (a trailing newline passes a $-anchored match): " + repr(found)
