"""Names from disk and manifests shown safely: to a terminal as visible escapes, in JSON as valid UTF-8.

A file name or a manifest field is data that someone else may have chosen. Printed raw, a name
holding a newline and ANSI escapes can forge a "verified" line, erase the real one, or reorder text
with bidi overrides; and a file name that is not UTF-8 cannot be written into a JSON document at
all. :func:`shown` is the one rule for humans, :func:`json_safe` the one rule for ``--json``, and
:func:`xml_safe` / :func:`unicode_safe` the same for JUnit XML and CI annotations.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# surrogateescape (how Python decodes a file name that is not UTF-8) maps byte 0xNN to U+DCNN.
_ESCAPED_BYTES = range(0xDC80, 0xDD00)


#: The user-info of a reference or URL: ``user:password@`` before the host (after a scheme, if any).
_USERINFO = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.-]*://)?)[^/]*@")


def without_credentials(text: str) -> str:
    """``text`` with the ``user:password@`` of a reference or URL masked as ``***@``: never echoed back."""
    return _USERINFO.sub(r"\1***@", text, count=1)


def has_credentials(text: str) -> bool:
    """Whether ``text`` names a user (and password) before its host, as in ``user:password@registry/repo``."""
    return without_credentials(text) != text


def shown(text: str) -> str:
    """``text`` safe to print: every non-printable character (controls, bidi overrides, ...) escaped.

    ``\\x1b`` for C0 controls and DEL, ``\\u0085`` / ``\\u202e`` / ``\\U000e0001`` above; a byte of
    a file name that is not UTF-8 shows as ``\\xNN`` (always 80-ff, so it cannot be mistaken for a
    control). A backslash is doubled so an escape can always be told from the same characters in the
    text. Newlines are escaped too: one shown name is one line. Printable text (any script) stays.
    """
    out = []
    for char in text:
        code = ord(char)
        if char == "\\":
            out.append("\\\\")
        elif char.isprintable():
            out.append(char)
        elif code in _ESCAPED_BYTES:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        else:
            out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def is_unicode(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8 (no lone surrogate, e.g. from a non-UTF-8 file name)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unicode_safe(text: str) -> str:
    """``text``, or its :func:`shown` form when it is not valid Unicode (a file name that is not UTF-8)."""
    return text if is_unicode(text) else shown(text)


def _xml_char(char: str) -> bool:
    code = ord(char)
    return char in "\t\n\r" or 0x20 <= code <= 0xD7FF or 0xE000 <= code <= 0xFFFD or code >= 0x10000


def xml_safe(text: str) -> str:
    """``text``, or its :func:`shown` form when XML 1.0 cannot hold it (a control character, a lone surrogate)."""
    return text if all(_xml_char(char) for char in text) else shown(text)


def json_safe(value: Any) -> Any:
    """``value`` with every string (and key) that is not valid Unicode replaced by its :func:`shown` form.

    Valid strings pass unchanged (JSON escapes their control characters itself), so only names that
    could not be written at all change, and they change the way a human sees them. Built without
    recursion: a manifest may nest as deep as ``json.loads`` allows, deeper than Python's call stack.
    """
    result: list[Any] = [None]
    pending: list[tuple[Any, Any, Any]] = [(value, result, 0)]  # (item, container to fill, slot in it)
    while pending:
        item, container, slot = pending.pop()
        if isinstance(item, str):
            container[slot] = unicode_safe(item)
        elif isinstance(item, Mapping):
            mapping: dict[Any, Any] = {}
            container[slot] = mapping
            for key, child in item.items():
                safe_key = unicode_safe(key) if isinstance(key, str) else key
                mapping[safe_key] = None  # keeps the key order; filled when its turn comes
                pending.append((child, mapping, safe_key))
        elif isinstance(item, list | tuple):
            items: list[Any] = [None] * len(item)
            container[slot] = items
            pending.extend((child, items, index) for index, child in enumerate(item))
        else:
            container[slot] = item
    return result[0]
