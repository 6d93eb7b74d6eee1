"""The rule for a path inside a blessed tree: relative, normalized, printable, and unable to escape its root.

One rule for every place a path comes from outside: a manifest's file list, an OCI artifact's blob titles,
and the tree check (:mod:`bless.core.verify`). The manifest schema's ``relpath`` refuses the same characters.
"""

from __future__ import annotations

__all__ = ["BIDI_CONTROLS", "check_relative_path"]

#: Bidi embeddings, overrides, isolates and marks: refused in paths with the C0/C1 controls.
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_MAX_SEGMENT_BYTES = 255  # NAME_MAX on Linux and most POSIX file systems
_MAX_PATH_BYTES = 4095  # PATH_MAX - 1 (room for the NUL) on Linux


def check_relative_path(path: str) -> str:
    """Return ``path`` unchanged if it is a safe, normalized, relative POSIX path; else raise.

    Accepted paths cannot name anything outside the directory they are joined to: they are not
    absolute, contain no ``..`` (and no ``.``) segment, no empty segment (``a//b``, trailing
    ``/``), no backslash (a separator elsewhere), no NUL, C0 or C1 control character and no bidi
    control (they corrupt logs and forge terminal output), are valid UTF-8 (so a manifest can hold
    them), and respect the usual 255-byte segment / 4095-byte path limits. The manifest schema's
    ``relpath`` rejects the same characters.

    Raises:
        ValueError: with the reason, for any rejected path.
    """
    if not isinstance(path, str):
        raise ValueError(f"path must be a string, got {type(path).__name__}")
    if path == "":
        raise ValueError("empty path")
    for ch in path:
        code = ord(ch)
        if code == 0:
            raise ValueError("contains a NUL character")
        if code < 0x20 or 0x7F <= code <= 0x9F:
            raise ValueError(f"contains a control character (U+{code:04X})")
        if ch in BIDI_CONTROLS:
            raise ValueError(f"contains a bidi control character (U+{code:04X}), which reorders how names display")
    if "\\" in path:
        raise ValueError("contains a backslash (not a POSIX path)")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("not valid UTF-8 (contains a lone surrogate)") from None
    if path.startswith("/"):
        raise ValueError("absolute path (must be relative to the cache root)")
    for segment in path.split("/"):
        if segment == "":
            raise ValueError("empty segment (doubled or trailing '/')")
        if segment == "..":
            raise ValueError("'..' segment (escapes the cache root)")
        if segment == ".":
            raise ValueError("'.' segment (path is not normalized)")
        if len(segment.encode("utf-8")) > _MAX_SEGMENT_BYTES:
            raise ValueError(f"a segment is longer than {_MAX_SEGMENT_BYTES} bytes")
    if len(encoded) > _MAX_PATH_BYTES:
        raise ValueError(f"longer than {_MAX_PATH_BYTES} bytes")
    return path
