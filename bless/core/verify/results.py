"""What recording and checking a tree produce: the listing of a tree, and the problems found in one.

Plain frozen values, no I/O: the manifest holds a :class:`TreeListing`, :func:`~bless.core.verify.verify_tree`
returns a :class:`TreeCheck`, :func:`~bless.core.verify.hash_tree` raises a :class:`TreeError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from bless.core.json_form import JsonForm

__all__ = [
    "ROOT_PATH",
    "FileEntry",
    "Notice",
    "NoticeKind",
    "Problem",
    "ProblemKind",
    "TreeCheck",
    "TreeError",
    "TreeListing",
    "sort_problems",
]

ProblemKind = Literal[
    "missing",
    "extra",
    "size",
    "sha256",
    "symlink",
    "bad_path",
    "not_regular",
    "unreadable",
    "missing_dir",
    "extra_dir",
    "root_missing",
    "writable_by_others",
    "special_mode",
    "changed_during_verify",
]
NoticeKind = Literal["writable"]

#: The path used in problems and notices that concern the root directory itself.
ROOT_PATH = "."

_HEX_DIGITS = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class FileEntry:
    """One regular file of a cache tree.

    ``path`` is POSIX, relative to the cache root and normalized. It is deliberately *not*
    validated here: a listing read from an untrusted manifest must still be representable so that
    :func:`verify_tree` can report a bad path as a ``bad_path`` problem. ``size`` and ``sha256``
    are validated (a non-negative int and 64 lowercase hex digits) because no tree can match a
    malformed value and a clear error beats a confusing mismatch.
    """

    path: str
    size: int
    sha256: str

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"{self.path!r}: size must be a non-negative integer, got {self.size!r}")
        if not isinstance(self.sha256, str) or len(self.sha256) != 64 or not _HEX_DIGITS.issuperset(self.sha256):
            raise ValueError(f"{self.path!r}: sha256 must be 64 lowercase hex digits, got {self.sha256!r}")


@dataclass(frozen=True)
class TreeListing:
    """The recorded content of a tree: every file (sorted by path) and every directory (sorted).

    ``dirs`` lists every directory below the root (not the root itself), including empty ones, so
    that an added or removed empty directory is detected.
    """

    files: tuple[FileEntry, ...]
    dirs: tuple[str, ...]
    total_size: int


@dataclass(frozen=True)
class Problem(JsonForm):
    """One reason a tree does not match its listing.

    ``path`` is the name as it is on disk or in the listing (data: escape it with
    :func:`bless.core.untrusted_text.shown` to show it); ``detail`` is a human sentence whose names are escaped.
    """

    kind: ProblemKind
    path: str
    detail: str


@dataclass(frozen=True)
class Notice(JsonForm):
    """Something worth saying that is not a failure (e.g. a blessed file is writable)."""

    kind: NoticeKind
    path: str
    detail: str


@dataclass(frozen=True)
class TreeCheck(JsonForm):
    """The outcome of :func:`verify_tree`.

    ``ok`` is true exactly when there are no problems (notices do not count).
    ``files_checked`` counts listed files found on disk as regular files and compared (by size,
    and by content when the size matched). ``bytes_hashed`` counts bytes fed to SHA-256.
    """

    ok: bool
    problems: tuple[Problem, ...]
    notices: tuple[Notice, ...]
    files_checked: int
    bytes_hashed: int
    elapsed_s: float


class TreeError(ValueError):
    """A tree cannot be recorded faithfully (symlinks, special files, unreadable entries, ...).

    ``problems`` holds every reason found, in the same form :func:`verify_tree` uses.
    """

    def __init__(self, message: str, problems: Sequence[Problem] = ()) -> None:
        super().__init__(message)
        self.problems: tuple[Problem, ...] = tuple(problems)


def sort_problems(problems: Iterable[Problem]) -> tuple[Problem, ...]:
    """Problems in the order every report uses: by path, then kind, then detail."""
    return tuple(sorted(problems, key=lambda p: (p.path, p.kind, p.detail)))
