"""Loading and applying the JSON Schemas shipped in ``bless/schema/`` (``manifests/schema/`` of the repository)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator

from bless.core.untrusted_text import shown

# Package data of bless (bless.schema), so a wheel install finds them too; in a checkout bless/schema is a
# symlink to manifests/schema/, where the schemas are kept next to the manifests documentation.
SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schema"


def _whole_pattern(
    validator: jsonschema.protocols.Validator, pattern: str, instance: Any, schema: dict[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    """``pattern`` as JSON Schema means it, ``$`` included: the end of the string, never before a final newline.

    Python's ``$`` also matches before a trailing newline, so with jsonschema's default ``re.search`` a
    dir id ending in a newline passed the schema, and gc and verify then disagreed about the manifest.
    """
    if not isinstance(instance, str):
        return
    if re.search(_anchored(pattern), instance) is None:
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _anchored(pattern: str) -> str:
    r"""A schema ``pattern`` for Python's ``re``: a final ``$`` means the very end (``\Z``)."""
    return pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith(r"\$") else pattern


def _strict_integer(checker: Any, instance: Any) -> bool:
    """An ``integer`` is an int, not a float that happens to be whole: ``gpu_count = 1.0`` is refused, not read as
    1 here and printed as ``1.0`` there."""
    return isinstance(instance, int) and not isinstance(instance, bool)


#: Draft 2020-12 with ``pattern`` anchored as the schemas mean it (see ``_whole_pattern``), and strict integers.
_Validator = jsonschema.validators.extend(
    Draft202012Validator,
    {"pattern": _whole_pattern},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _strict_integer),
)


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


# --------------------------------------------------------------------------------------------
# The manifest's file listing, fast: the same rules as the schema, read from the schema


_FILE_KEYS = frozenset({"path", "size", "sha256"})
#: Keywords that document a schema and never change what it accepts.
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment"})


@dataclass(frozen=True)
class _ListingRules:
    max_files: int
    max_dirs: int
    min_path: int
    max_path: int
    bad_path: re.Pattern[str]
    hex64: re.Pattern[str]


@cache
def _listing_rules() -> _ListingRules | None:
    """The manifest schema's rules for ``cache.files`` and ``cache.dirs`` entries, or None when it has others.

    Read from the schema itself (one source): should the schema's shape for these entries change,
    this returns None and the caller validates everything with the schema, slowly but right.
    """
    schema = validator("manifest.v1").schema
    try:
        cache_props = schema["properties"]["cache"]["properties"]
        files, dirs = cache_props["files"], cache_props["dirs"]
        item = _rules_only(files["items"])
        relpath, hex64 = _rules_only(schema["$defs"]["relpath"]), _rules_only(schema["$defs"]["hex64"])
        expected_item = {
            "type": "object",
            "additionalProperties": False,
            "required": ["path", "size", "sha256"],
            "properties": {
                "path": {"$ref": "#/$defs/relpath"},
                "size": {"type": "integer", "minimum": 0},
                "sha256": {"$ref": "#/$defs/hex64"},
            },
        }
        if (
            item != expected_item
            or _rules_only(dirs["items"]) != {"$ref": "#/$defs/relpath"}
            or set(relpath) != {"type", "minLength", "maxLength", "not"}
            or set(relpath["not"]) != {"pattern"}
            or set(hex64) != {"type", "pattern"}
        ):
            return None
        return _ListingRules(
            max_files=int(files["maxItems"]),
            max_dirs=int(dirs["maxItems"]),
            min_path=int(relpath["minLength"]),
            max_path=int(relpath["maxLength"]),
            bad_path=re.compile(_anchored(relpath["not"]["pattern"])),
            hex64=re.compile(_anchored(hex64["pattern"])),
        )
    except (KeyError, TypeError, ValueError):
        return None


def _rules_only(schema: Any) -> Any:
    """``schema`` without its annotations (descriptions and the like), in it and in the schemas it holds.

    What the listing loop compares is what the schema accepts: documenting a field must not send every
    manifest back to the slow path.
    """
    if not isinstance(schema, dict):
        return schema
    rules: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _ANNOTATIONS:
            continue
        if key == "properties" and isinstance(value, dict):
            value = {name: _rules_only(sub) for name, sub in value.items()}
        elif key in ("items", "not"):
            value = _rules_only(value)
        rules[key] = value
    return rules


def listing_over_limit(files: Any, dirs: Any) -> str | None:
    """Why ``cache.files`` or ``cache.dirs`` holds more entries than the schema's ``maxItems``; None when neither does.

    Asked before any entry is looked at: refusing a listing one entry too long must not cost what
    validating a million entries costs (the schema library takes about a minute).
    """
    cache_props = validator("manifest.v1").schema["properties"]["cache"]["properties"]
    for name, listing in (("files", files), ("dirs", dirs)):
        limit = cache_props[name].get("maxItems")
        if isinstance(listing, list) and isinstance(limit, int) and len(listing) > limit:
            return f"cache.{name}: {len(listing)} entries, more than the {limit} a manifest may list"
    return None


def listing_conforms(files: Any, dirs: Any) -> bool | None:
    """Whether every ``cache.files`` / ``cache.dirs`` entry meets the schema; None when this cannot tell.

    The schema library takes about a minute for a million entries; these loops a second. True means
    the schema would find nothing wrong with the entries (the caller still validates the rest of the
    document with the schema); False means it would, and the caller asks the schema for its words.
    """
    rules = _listing_rules()
    if rules is None or not isinstance(files, list) or not isinstance(dirs, list):
        return None
    if len(files) > rules.max_files or len(dirs) > rules.max_dirs:
        return False
    for entry in files:
        if type(entry) is not dict or entry.keys() != _FILE_KEYS:
            return False
        size, digest = entry["size"], entry["sha256"]
        if (
            isinstance(size, bool)
            or not isinstance(size, int)  # a whole float is no integer either (_strict_integer)
            or size < 0
        ):
            return False
        if not isinstance(digest, str) or rules.hex64.search(digest) is None:
            return False
        if not _relpath(entry["path"], rules):
            return False
    return all(_relpath(path, rules) for path in dirs)


def _relpath(path: Any, rules: _ListingRules) -> bool:
    return (
        isinstance(path, str) and rules.min_path <= len(path) <= rules.max_path and rules.bad_path.search(path) is None
    )
