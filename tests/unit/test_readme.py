"""docs/reference/exit-codes.md's table is generated from bless.errors.EXIT_CODES and must stay in sync."""

from __future__ import annotations

from pathlib import Path

from bless.cli.render import exit_codes_markdown
from bless.errors import EXIT_CODES, ExitCode

EXIT_CODES_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "exit-codes.md"


def test_the_exit_code_page_matches_the_code() -> None:
    text = EXIT_CODES_PAGE.read_text(encoding="utf-8")
    start = text.index("<!-- exit-codes:begin -->\n") + len("<!-- exit-codes:begin -->\n")
    end = text.index("<!-- exit-codes:end -->")
    assert text[start:end] == exit_codes_markdown(), "regenerate: bless exit-codes --markdown"


def test_every_exit_code_is_documented_once() -> None:
    documented = [code for code, _ in EXIT_CODES]
    assert sorted(documented) == sorted(ExitCode)
    assert len(set(documented)) == len(documented)


def test_each_code_is_declared_once_by_the_class_that_exits_with_it() -> None:
    # The table is derived: a class's meaning is the table's row, so a new class cannot go undocumented.
    import bless.errors as errors

    declaring = [
        cls
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.BlessError) and "exit_code" in vars(cls)
    ]
    codes = [cls.exit_code for cls in declaring]
    assert sorted(codes) == sorted(code for code in ExitCode if code != ExitCode.OK)
    assert dict(EXIT_CODES) == {ExitCode.OK: "success", **{cls.exit_code: cls.meaning for cls in declaring}}
