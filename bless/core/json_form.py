"""The JSON form of result types, defined once: a frozen dataclass's fields, in declaration order, as JSON-ready data.

Result types (what ``--json`` prints, what refusals carry in ``details``) inherit :class:`JsonForm` and
get ``to_dict()`` from their fields; a field that the JSON leaves out says so where it is declared
(``field(metadata=OMIT)``). Values are made JSON-ready by :func:`json_form`: a nested value with its
own ``to_dict()`` gives that, other dataclasses their fields, tuples and lists lists, mappings dicts,
paths strings. A result type whose JSON is not its fields (computed keys, another order, nested
records flattened) keeps a hand-written ``to_dict()`` that says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

__all__ = ["OMIT", "JsonForm", "json_form"]

#: ``field(metadata=OMIT)``: the field is not part of the JSON form (a handle, not a result).
OMIT: Mapping[str, bool] = {"json_omit": True}


def json_form(value: Any) -> Any:
    """``value`` as JSON-ready data (see the module docstring for each kind of value)."""
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict) and not isinstance(value, type):
        return to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _fields_form(value)
    if isinstance(value, Mapping):
        return {key: json_form(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_form(item) for item in value]
    if isinstance(value, PurePath):
        return str(value)
    return value


def _fields_form(instance: Any) -> dict[str, Any]:
    return {
        field.name: json_form(getattr(instance, field.name))
        for field in dataclasses.fields(instance)
        if not field.metadata.get("json_omit", False)
    }


class JsonForm:
    """A dataclass whose JSON form is its fields (less those declared with ``metadata=OMIT``), in order."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: each field by name, its value made JSON-ready by :func:`json_form`."""
        return _fields_form(self)
