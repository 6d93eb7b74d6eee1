"""Hostile command-line values: a refusal with its documented exit code, and nothing written outside the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from bless.cli.serve import stop_app
from bless.errors import ExitCode
from tests.support.cli import cli_runner


def _everything_under(directory: Path) -> set[Path]:
    return set(directory.rglob("*"))


@pytest.mark.parametrize(
    "name",
    ["x/../../escaped/evil", "../escaped", "a/b", "..", "x" * 5000],
    ids=["traversal", "dotdot-first", "slash", "dotdot", "very-long"],
)
def test_serve_stop_refuses_a_hostile_name_before_it_creates_anything(tmp_path: Path, name: str) -> None:
    root = tmp_path / "store" / "root"
    root.mkdir(parents=True)
    before = _everything_under(tmp_path)
    result = cli_runner().invoke(stop_app, [name, "--root", str(root), "--json"])
    assert result.exit_code == ExitCode.INPUT_INVALID, result.output
    assert "invalid profile name" in result.stderr
    assert _everything_under(tmp_path) == before, "a refused name created files or dirs (the start lock)"
