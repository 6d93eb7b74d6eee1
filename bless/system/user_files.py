"""Files a user names (a profile, a model's config.json, a docker config, a trusted root, a report to write).

Each is read through the one bounded reader, :func:`bless.system.bounded_read.read_bounded` (no blocking open, a
regular file within a limit, never read past it), and what it refuses is invalid input (3) naming the
file and why; a report is written only over a regular file or where none is.
"""

from __future__ import annotations

import difflib
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from bless.errors import InputInvalidError
from bless.system.bounded_read import UnreadableFileError, file_kind, read_bounded
from bless.untrusted_text import shown

__all__ = ["INPUT_FILE_MAX", "check_output_target", "read_input", "similar_files"]

#: The most a file a user names may be unless its reader sets a smaller limit: a profile, a local
#: model's config.json, a docker config with its pull secrets. Bigger is not one of these.
INPUT_FILE_MAX = 4 * 1024 * 1024


def read_input(path: Path, *, what: str, hint: str, limit: int = INPUT_FILE_MAX, remedy: str | None = None) -> bytes:
    """The bytes of a file a user named (``what``: "profile", "docker config"...): the one reader of user files.

    Through :func:`read_bounded`: opened without blocking (a FIFO is refused, never waited on), a
    regular file of at most ``limit`` bytes (``/dev/zero``, a device, a directory or a huge file are
    refused before a byte is read), read never past the limit. A symlink is followed and what it leads
    to is held to the same rules: a Kubernetes ConfigMap or Secret mount is all symlinks, and a user
    who names a link could name its target.

    Raises:
        InputInvalidError: missing, unreadable, not a regular file or over ``limit`` (3), the message
            naming the file and why, the hint what to pass instead.
    """
    try:
        data = read_bounded(path, limit, follow=True)
    except UnreadableFileError as exc:
        raise InputInvalidError(f"{shown(str(path))}: the {what} {exc}", hint=hint, remedy=remedy) from None
    if data is None:
        raise InputInvalidError(f"{shown(str(path))}: no such {what} file", hint=hint, remedy=remedy)
    return data


#: At most this many entries of a directory are looked at for a suggestion (a huge directory is not listed whole).
_SUGGESTION_SCAN_MAX = 10_000


def similar_files(path: Path, *, directories: Sequence[Path] = (), suffix: str = "") -> list[str]:
    """Existing files whose names are close to ``path``'s (a typo's likely intent), best first, at most three.

    Looked for beside ``path`` and in ``directories`` (e.g. the checkout's ``profiles/``), among names ending in
    ``suffix``; each as a path to type (``path``'s directory, or the directory as given), shown safely.
    """
    found: dict[str, str] = {}
    for directory in (path.parent, *directories):
        try:
            with os.scandir(directory) as entries:
                names = [entry.name for _, entry in zip(range(_SUGGESTION_SCAN_MAX), entries, strict=False)]
        except OSError:
            continue
        for name in names:
            if name.endswith(suffix) and name != path.name:
                found.setdefault(name, str(directory / name))
    close = difflib.get_close_matches(path.name, list(found), n=3, cutoff=0.6)
    return [shown(found[name]) for name in close]


def check_output_target(path: Path, *, what: str, hint: str, remedy: str | None = None) -> None:
    """Refuse to write ``what`` (a report a user named, such as ``--junit``) over anything but a regular file.

    The write itself is atomic (a temp file renamed over ``path``): over a FIFO or a device it would
    replace the node (``/dev/null`` as root), over a symlink the link and not what it names. Missing
    is fine. ``remedy``: the refusal's remedy key, for a hint the command line words as its option.

    Raises:
        InputInvalidError: ``path`` is a FIFO, a device, a directory, a socket or a symlink (3).
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        why = exc.strerror or exc
        raise InputInvalidError(
            f"{shown(str(path))}: cannot write the {what} ({why})", hint=hint, remedy=remedy
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputInvalidError(
            f"{shown(str(path))} is {file_kind(st.st_mode)}, not a regular file: the {what} is not written there",
            hint=hint,
            remedy=remedy,
        )
