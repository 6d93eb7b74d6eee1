"""Loading and applying the JSON Schemas shipped in ``bless/schema/`` (``manifests/schema/`` of the repository)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator

from bless.text import shown

# Package data of bless (bless.schema), so a wheel install finds them too; in a checkout bless/schema is a
# symlink to manifests/schema/, where the schemas are kept next to the manifests documentation.
SCHEMA_DIR = Path(__file__).resolve().parent / "schema"


def _whole_pattern(
    validator: jsonschema.protocols.Validator, pattern: str, instance: Any, schema: dict[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    """``pattern`` as JSON Schema means it, ``$`` included: the end of the string, never before a final newline.

    Python's ``$`` also matches before a trailing newline, so with jsonschema's default ``re.search`` a
    dir id ending in a newline passed the schema, and gc and verify then disagreed about the manifest.
    """
    if not isinstance(instance, str):
        return
    anchored = pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith(r"\$") else pattern
    if re.search(anchored, instance) is None:
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


#: Draft 2020-12 with ``pattern`` anchored as the schemas mean it (see ``_whole_pattern``).
_Validator = jsonschema.validators.extend(Draft202012Validator, {"pattern": _whole_pattern})


@cache
def validator(name: str) -> jsonschema.protocols.Validator:
    """The validator for ``bless/schema/<name>.json`` (e.g. ``profile.v1``)."""
    schema = json.loads((SCHEMA_DIR / f"{name}.json").read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return _Validator(schema)


def schema_errors(name: str, document: Any, *, limit: int = 10) -> list[str]:
    """Every schema violation of ``document`` as ``field: reason`` lines (empty when valid)."""
    errors = sorted(validator(name).iter_errors(document), key=lambda e: list(e.absolute_path))
    return [describe(error) for error in errors[:limit]]


def describe(error: jsonschema.ValidationError) -> str:
    """One readable line for a schema error, naming the field by its dotted path."""
    field = ".".join(shown(str(part)) for part in error.absolute_path) or "(top level)"
    message = error.message
    if len(message) > 300:
        message = message[:300] + "..."
    return f"{field}: {message}"
