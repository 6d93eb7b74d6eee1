"""The reference pages derived from code (docs/reference/cli.md, the exit-code table) are regenerated and compared."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_docs"] = module
    spec.loader.exec_module(module)
    return module


GEN_DOCS = _gen_docs()


@pytest.mark.parametrize("page", ["docs/reference/cli.md", "docs/reference/exit-codes.md"])
def test_the_checked_in_page_is_what_the_code_generates(page: str) -> None:
    generated = {path.relative_to(REPO).as_posix(): text for path, text in GEN_DOCS.generated().items()}
    assert (REPO / page).read_text(encoding="utf-8") == generated[page], "stale: run python3 scripts/gen_docs.py"


def test_the_cli_reference_has_every_command() -> None:
    """Every command of both apps, groups' commands included, has its section with its own usage line."""
    text = GEN_DOCS.cli_reference()
    for path in ("bless run", "bless gate", "bless trust init", "bless trust rotate", "serve-full", "serve-full stop"):
        assert f"\n## {path}\n\n```text\nUsage: {path} " in text, path
    for option in ("--parallel", "--allow-downgrade", "--min-rate", "--keep-upper", "--timeout"):
        assert option in text, option


def test_the_width_does_not_depend_on_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    assert GEN_DOCS.cli_reference() == (REPO / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")


def test_check_names_a_stale_page(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stale = tmp_path / "cli.md"
    stale.write_text("# CLI reference\n\nedited by hand\n", encoding="utf-8")
    monkeypatch.setattr(GEN_DOCS, "CLI_PAGE", stale)
    assert GEN_DOCS.stale() == [stale]
    assert GEN_DOCS.main(["--check"]) == 1
