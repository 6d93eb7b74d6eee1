"""The JSON form of result types, defined once: a frozen dataclass's fields, in declaration order, as JSON-ready data.

Result types (what ``--json`` prints, what refusals carry in ``details``) inherit :class:`JsonForm` and
get ``to_dict()`` from their fields. What the JSON does differently from the fields is declared where
it applies:

- on a field, ``field(metadata=as_json(...))``: another key (``name=``), a converter (``to_json=``,
  given the value, None too; :func:`rounded` is the common one), left out when None (``omit_if_none=``);
  ``field(metadata=OMIT)`` leaves the field out of the JSON altogether (a handle, not a result);
- on the class, :meth:`JsonForm.json_extra` gives computed keys (a verdict implied by other fields, a
  count), and ``json_keys`` the order of every key when it is not the fields' order followed by those.

Values are made JSON-ready by :func:`json_form`: a nested value with its own ``to_dict()`` gives that,
other dataclasses their fields, tuples and lists lists, mappings dicts, paths strings. A result type
whose JSON is another shape than the type (a nested record flattened into it, keys that exist only
under a condition, a file format read back) keeps a hand-written ``to_dict()`` that says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import PurePath
from typing import Any, ClassVar

__all__ = ["OMIT", "JsonForm", "as_json", "json_form", "rounded"]

#: ``field(metadata=OMIT)``: the field is not part of the JSON form (a handle, not a result).
OMIT: Mapping[str, bool] = {"json_omit": True}


def as_json(
    *, name: str | None = None, to_json: Callable[[Any], Any] | None = None, omit_if_none: bool = False
) -> Mapping[str, Any]:
    """A field's metadata for its JSON form: its key (``name``, default the field's name), a converter
    applied to its value first (``to_json``; its result is made JSON-ready too), and whether the key is
    left out when the value is None (``omit_if_none``; else it is ``null``)."""
    return {"json_name": name, "json_to": to_json, "json_omit_if_none": omit_if_none}


def rounded(digits: int) -> Callable[[float | None], float | None]:
    """A ``to_json`` converter: the number rounded to ``digits`` decimals (None stays None)."""

    def round_(value: float | None) -> float | None:
        return None if value is None else round(value, digits)

    return round_


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


_ABSENT = object()


def _field_entries(instance: Any) -> dict[str, Any]:
    """Each field's JSON key and value (``_ABSENT`` where it is None and left out then), in field order."""
    entries: dict[str, Any] = {}
    for field in dataclasses.fields(instance):
        meta = field.metadata
        if meta.get("json_omit", False):
            continue
        value = getattr(instance, field.name)
        convert = meta.get("json_to")
        if meta.get("json_omit_if_none", False) and value is None:
            value = _ABSENT
        elif convert is not None:
            value = convert(value)
        entries[meta.get("json_name") or field.name] = value
    return entries


def _fields_form(instance: Any) -> dict[str, Any]:
    entries = _field_entries(instance)
    if isinstance(instance, JsonForm):
        extra = instance.json_extra()
        clash = entries.keys() & extra.keys()
        if clash:
            raise TypeError(f"{type(instance).__name__}.json_extra() repeats field keys: {sorted(clash)}")
        entries |= extra
        order = type(instance).json_keys
        if order:
            if sorted(order) != sorted(entries):
                raise TypeError(
                    f"{type(instance).__name__}.json_keys {list(order)} must name each JSON key once: {list(entries)}"
                )
            entries = {key: entries[key] for key in order}
    return {key: json_form(value) for key, value in entries.items() if value is not _ABSENT}


class JsonForm:
    """A dataclass whose JSON form is its fields (as their ``as_json``/``OMIT`` metadata says), in order,
    then :meth:`json_extra`'s keys; ``json_keys``, when given, is the order of them all."""

    #: Every JSON key (fields' and :meth:`json_extra`'s), in the order printed; empty: fields' order, then the extra.
    json_keys: ClassVar[tuple[str, ...]] = ()

    def json_extra(self) -> dict[str, Any]:
        """Computed keys that are not fields (none here); their values are made JSON-ready too."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: each field by its key, its value made JSON-ready by :func:`json_form`."""
        return _fields_form(self)
