"""Following a growing log from where the last read stopped, in constant memory: what the seal watcher reads.

A :class:`LogFollower` hands out what was appended since its last read, complete lines only and at most
``max_bytes`` at a time (:class:`LogChunk`). Whoever reads it never holds the whole log.

:class:`FileFollower` follows a file by path, with an open descriptor:

* **rotation** (the path renamed away and a new file made in its place): the old file is read to its end
  through the descriptor first, then the new one from its start. Nothing written before the rename is missed.
* **truncation or rewrite** (the file shorter than what was read, or its bytes before the read position no
  longer those that were read): whatever was written and not yet read may be gone. That is said
  (``lost``), never passed over silently, and the file is read again from its start.

:class:`TextFollower` does the same over a text the caller supplies each time (a runtime that can only return
the whole log); it compares, it does not keep the text.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = ["CHUNK_BYTES", "FileFollower", "LogChunk", "LogFollower", "TextFollower", "complete_lines"]

#: What one read hands out at most.
CHUNK_BYTES = 1 << 20
#: How many bytes before the read position are kept to tell a rewritten log from a grown one.
_TAIL_BYTES = 64


@dataclass(frozen=True)
class LogChunk:
    """What was appended since the last read: complete lines (or one cut line longer than a chunk)."""

    data: bytes
    #: Why lines written since the last read may be gone (the log was truncated or rewritten); None if not.
    lost: str | None = None
    #: Whether more is already there (the caller reads again at once).
    more: bool = False


class LogFollower(Protocol):
    """Hands out, in order, what an engine's log gained since the last read."""

    def read(self, max_bytes: int = CHUNK_BYTES) -> LogChunk: ...

    def close(self) -> None: ...


def complete_lines(data: bytes, max_bytes: int) -> bytes:
    """The complete lines at the start of ``data`` (all of it up to ``max_bytes`` when no line ends there)."""
    end = data.rfind(b"\n", 0, max_bytes) + 1
    if end == 0 and len(data) >= max_bytes:
        return data[:max_bytes]  # a line longer than a chunk: handed out cut, never held whole
    return data[:end]


class FileFollower:
    """Follows the log file at ``path`` (see the module docstring). A missing file is an empty log."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._offset = 0
        self._tail = b""

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> bool:
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        self._offset, self._tail = 0, b""
        return True

    def _replaced(self) -> bool:
        """Whether the path now names another file than the one open (rotated)."""
        assert self._fd is not None
        try:
            now = self.path.stat()
        except FileNotFoundError:
            return False  # renamed away, nothing new yet: keep reading the old one
        mine = os.fstat(self._fd)
        return (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino)

    def read(self, max_bytes: int = CHUNK_BYTES) -> LogChunk:
        if self._fd is None and not self._open():
            return LogChunk(b"")
        assert self._fd is not None
        lost = self._check_rewritten()
        data = os.pread(self._fd, max_bytes + 1, self._offset)
        chunk = complete_lines(data, max_bytes)
        if len(data) <= max_bytes and self._replaced():
            # All of the rotated file is here: its last bytes too (a line the rotation cut ends here), then the
            # new file from its start.
            rest = data[len(chunk) :]
            self.close()
            self._open()
            return LogChunk(chunk + rest + (b"\n" if rest else b""), lost, more=True)
        self._advance(chunk)
        return LogChunk(chunk, lost, more=len(data) > len(chunk) and len(chunk) > 0)

    def _advance(self, chunk: bytes) -> None:
        self._offset += len(chunk)
        self._tail = (self._tail + chunk)[-_TAIL_BYTES:]

    def _check_rewritten(self) -> str | None:
        """Why what was read is no longer there (truncated, rewritten): then read again from the start."""
        assert self._fd is not None
        if self._offset == 0:
            return None
        size = os.fstat(self._fd).st_size
        if size < self._offset:
            why = f"the log {self.path} was truncated ({size} bytes, {self._offset} read)"
        elif os.pread(self._fd, len(self._tail), self._offset - len(self._tail)) != self._tail:
            why = f"the log {self.path} was rewritten (its bytes before offset {self._offset} changed)"
        else:
            return None
        self._offset, self._tail = 0, b""
        return why


class TextFollower:
    """Follows a log that ``text()`` returns whole each time (see the module docstring)."""

    def __init__(self, text: Callable[[], bytes]) -> None:
        self._text = text
        self._offset = 0
        self._tail = b""

    def close(self) -> None:
        return None

    def read(self, max_bytes: int = CHUNK_BYTES) -> LogChunk:
        data = self._text()
        lost = None
        if self._offset and (
            len(data) < self._offset or data[self._offset - len(self._tail) : self._offset] != self._tail
        ):
            lost = f"the log was truncated or rewritten ({len(data)} bytes, {self._offset} read)"
            self._offset, self._tail = 0, b""
        rest = data[self._offset : self._offset + max_bytes + 1]
        chunk = complete_lines(rest, max_bytes)
        self._offset += len(chunk)
        self._tail = data[max(0, self._offset - _TAIL_BYTES) : self._offset]
        return LogChunk(chunk, lost, more=len(rest) > len(chunk) and len(chunk) > 0)
