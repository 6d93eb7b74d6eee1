"""The reference pages derived from code and schemas (docs/reference/: cli.md, the exit-code table, profile.md,
manifest.md) are regenerated and compared."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

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


@pytest.mark.parametrize(
    "page",
    [
        "docs/reference/cli.md",
        "docs/reference/exit-codes.md",
        "docs/reference/profile.md",
        "docs/reference/manifest.md",
    ],
)
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


def test_check_names_a_stale_schema_page(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    stale = tmp_path / "profile.md"
    stale.write_text("# Profile reference\n\nedited by hand\n", encoding="utf-8")
    pages = (dataclasses.replace(GEN_DOCS.PROFILE_REFERENCE, page=stale), GEN_DOCS.MANIFEST_REFERENCE)
    monkeypatch.setattr(GEN_DOCS, "SCHEMA_PAGES", pages)
    assert GEN_DOCS.stale() == [stale]
    assert GEN_DOCS.main(["--check"]) == 1


@pytest.mark.parametrize("page", ["PROFILE_REFERENCE", "MANIFEST_REFERENCE"])
def test_every_field_of_the_schema_has_its_row(page: str) -> None:
    """Each property of every object, nested, array items and definitions included, is a row of its section."""
    reference = getattr(GEN_DOCS, page)
    text = GEN_DOCS.schema_reference(reference)
    schema = json.loads((REPO / "manifests" / "schema" / f"{reference.schema}.json").read_text(encoding="utf-8"))
    objects = [schema, *schema.get("$defs", {}).values()]
    while objects:
        current = objects.pop()
        for name, field in current.get("properties", {}).items():
            assert f"\n| `{name}` | " in text, name
            objects += [field, *([field["items"]] if isinstance(field.get("items"), dict) else [])]


def synthetic_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, schema: dict[str, Any], *, toml: bool) -> str:
    (tmp_path / "synthetic.json").write_text(json.dumps(schema), encoding="utf-8")
    monkeypatch.setattr(GEN_DOCS, "SCHEMA_DIR", tmp_path)
    page = GEN_DOCS.SchemaPage(schema="synthetic", page=tmp_path / "synthetic.md", intro="# Synthetic\n", toml=toml)
    return str(GEN_DOCS.schema_reference(page))


SYNTHETIC: dict[str, Any] = {
    "description": "A document.",
    "type": "object",
    "additionalProperties": False,
    "required": ["id"],
    "properties": {
        "id": {"$ref": "#/$defs/ident", "description": "Its id."},
        "size": {"anyOf": [{"type": "integer", "minimum": 0}, {"const": "auto"}], "description": "A size."},
        "shape": {
            "oneOf": [{"type": "string"}, {"type": "object", "properties": {"w": {}, "h": {}}}],
            "description": "A shape.",
        },
        "labels": {
            "type": "object",
            "propertyNames": {"pattern": "^(ml|ops)-[a-z]+$"},
            "additionalProperties": {"type": "string", "maxLength": 9},
            "default": {"ml-team": "x", "a.b": 1},
            "description": "Labels.",
        },
        "parts": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name"],
                "additionalProperties": {"type": "integer"},
                "properties": {"name": {"type": "string", "description": "A part's name."}},
            },
            "description": "Its parts.",
        },
    },
    "$defs": {"ident": {"type": "string", "pattern": "^[a-z|]+$", "description": "An identifier."}},
}


def test_a_schema_renders_refs_combinations_maps_and_arrays_of_objects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = synthetic_page(tmp_path, monkeypatch, SYNTHETIC, toml=True)
    assert "| `id` | [`ident`](#ident) | yes |  | Its id. |" in text
    assert '| `size` | any of: integer, ≥ 0; `"auto"` only | no |  | A size. |' in text
    assert "| `shape` | one of: string; table; fields `w`, `h` | no |  | A shape. |" in text
    labels = "table; keys: matching `^(ml\\|ops)-[a-z]+$`; values: string, at most 9 characters"  # | escaped
    assert f'| `labels` | {labels} | no | `{{ ml-team = "x", "a.b" = 1 }}` | Labels. |' in text
    assert "| `parts` | array, at least 1 item; each: [`[[parts]]`](#parts) | no |  | Its parts. |" in text
    assert "## `[[parts]]`\n\nEach item of `parts`. Any other key: integer.\n" in text
    assert "### `ident`\n\nAn identifier.\n\nType: string, matching `^[a-z|]+$`.\n" in text  # not in a table
    assert "matching `^[a-z\\|]+$`" not in text


def test_a_field_without_a_description_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    schema = {**SYNTHETIC, "properties": {**SYNTHETIC["properties"], "extra": {"type": "string"}}}
    with pytest.raises(ValueError, match="extra has no description"):
        synthetic_page(tmp_path, monkeypatch, schema, toml=False)
