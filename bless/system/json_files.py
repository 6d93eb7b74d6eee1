"""The store's JSON side files (leases, owner records, caches): bounded reads of one JSON object."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bless.system.bounded_read import UnreadableFileError, read_bounded

__all__ = ["JSON_SIDE_FILE_MAX", "UnreadableJsonError", "load_json_object", "read_json_object"]

#: The largest side file (lease, owner record, claims cache, manifests-dirs record) read. These are a
#: few hundred bytes to a few MiB (a claims cache of a very large manifests dir); anything bigger is
#: not one of ours, and reading it whole could exhaust memory (a symlink to /dev/zero, say).
JSON_SIDE_FILE_MAX = 16 * 1024 * 1024


class UnreadableJsonError(UnreadableFileError):
    """A JSON side file exists but cannot be used; ``str()`` says why."""


def load_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is missing.

    Read through :func:`read_bounded` (no symlink, no FIFO, a regular file of at most
    :data:`JSON_SIDE_FILE_MAX` bytes). Deeply nested JSON (RecursionError) is invalid like any other
    bad document.

    Raises:
        UnreadableJsonError: anything else (unreadable, not a regular file, too big, not a JSON object).
    """
    try:
        data = read_bounded(path, JSON_SIDE_FILE_MAX)
    except UnreadableFileError as exc:
        raise UnreadableJsonError(str(exc)) from exc
    if data is None:
        return None
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise UnreadableJsonError("is not valid JSON") from exc
    if not isinstance(document, dict):
        raise UnreadableJsonError("is not a JSON object")
    return document


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is missing, unreadable or not an object.

    For hints and records whose absence the caller already handles: see :func:`load_json_object`
    for what is refused (symlinks, FIFOs, huge or deeply nested files).
    """
    try:
        return load_json_object(path)
    except UnreadableJsonError:
        return None
