"""bless's Triton cache manager for sealed starts: a miss of the blessed tree is reported at once.

This file is shipped into the engine (it is not imported by bless): bless writes it into the start's
private dir, puts that dir first on the engine's ``PYTHONPATH`` and sets
``TRITON_CACHE_MANAGER=bless_seal:SealedCacheManager``. It runs in the engine's own Python, which in a
Docker image has no bless installed, so it uses the standard library alone and never imports bless.

Triton constructs the class as ``SealedCacheManager(key, override=False, dump=False)`` for every kernel
it compiles or loads, and asks it ``get_group``/``get_file`` before compiling: an answer from the
blessed tree is a hit; ``None`` means Triton is about to compile a kernel the blessing does not hold.
On such a miss this writes one line to stderr, at once::

    bless-seal: {"event":"unproven_compile","source":"triton-cache-manager",
                 "kernel":...,"key":...,"file":...,"time":...}

(one line in the log; wrapped here)

and returns ``None`` as Triton's own manager would, so the engine compiles and keeps answering;
serve-full reads the line from the engine's log and applies its policy (refuse, record, stop).

The on-disk layout is Triton's ``FileCacheManager``'s, exactly: ``<TRITON_CACHE_DIR>/<key>/<filename>``,
a group in ``__grp__<filename>`` (JSON ``{"child_paths": {name: path}}``). Where Triton is importable
and the key's directory exists, lookups and writes are delegated to Triton's own ``FileCacheManager``,
so blessed files are found byte for byte as Triton finds them. A lookup never creates anything: Triton's
``FileCacheManager.__init__`` makes the key's directory, which in a read-only blessed tree (or an
overlay's lower layer) must not happen on a read, so it is constructed only for a key whose directory
exists, or for a write. A write the tree refuses (a read-only bind) lands in ``$TMPDIR/bless-seal-spill``
instead, so that the engine keeps serving; the write is itself a compile the blessing does not hold.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import time
import uuid
from typing import Any

#: The prefix of every line this module writes (bless.seal reads them back; a unit test holds the two equal).
LINE_PREFIX = "bless-seal: "
SOURCE = "triton-cache-manager"
_GROUP_PREFIX = "__grp__"
_SPILL_DIR = "bless-seal-spill"


def _triton_file_manager() -> Any:
    """Triton's ``FileCacheManager`` class, or None where Triton is not importable (the reference engine)."""
    try:
        return importlib.import_module("triton.runtime.cache").FileCacheManager
    except Exception:
        return None


def _default_cache_dir() -> str:
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return os.path.join(home, ".triton", "cache")


def cache_base() -> str:
    """Where Triton's cache lives: ``TRITON_CACHE_DIR`` (stripped, as Triton reads it), else ``~/.triton/cache``."""
    return os.environ.get("TRITON_CACHE_DIR", "").strip() or _default_cache_dir()


def kernel_name(filename: str) -> str:
    """The kernel a cache file belongs to: ``__grp__fused_moe_kernel.json`` -> ``fused_moe_kernel``."""
    name = filename[len(_GROUP_PREFIX) :] if filename.startswith(_GROUP_PREFIX) else filename
    stem, _dot, _suffix = name.partition(".")
    return stem or name


def report_miss(key: str, filename: str) -> None:
    """One line on stderr, flushed at once: the compile that follows is one the blessing does not hold."""
    event = {
        "event": "unproven_compile",
        "source": SOURCE,
        "kernel": kernel_name(filename),
        "key": key,
        "file": filename,
        "time": time.time(),
    }
    try:
        sys.stderr.write(LINE_PREFIX + json.dumps(event, separators=(",", ":")) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed stderr must not break the engine's compile
        pass


class _LayoutManager:
    """Triton's ``FileCacheManager`` layout without Triton (the same paths, the same atomic writes)."""

    def __init__(self, cache_dir: str) -> None:
        self.cache_dir = cache_dir

    def _path(self, filename: str) -> str:
        return os.path.join(self.cache_dir, filename)

    def get_file(self, filename: str) -> str | None:
        path = self._path(filename)
        return path if os.path.exists(path) else None

    def get_group(self, filename: str) -> dict[str, str] | None:
        group_path = self.get_file(_GROUP_PREFIX + filename)
        if group_path is None:
            return None
        with open(group_path, encoding="utf-8") as handle:
            data = json.load(handle)
        children = data.get("child_paths") if isinstance(data, dict) else None
        if not isinstance(children, dict):
            return None
        return {str(name): str(path) for name, path in children.items() if os.path.exists(str(path))}

    def put(self, data: bytes | str, filename: str, binary: bool = True) -> str:
        os.makedirs(self.cache_dir, exist_ok=True)
        binary = isinstance(data, bytes)
        temp_dir = os.path.join(self.cache_dir, f"tmp.pid_{os.getpid()}_{uuid.uuid4()}")
        os.makedirs(temp_dir, exist_ok=True)
        temp_path = os.path.join(temp_dir, filename)
        if binary:
            with open(temp_path, "wb") as out:
                out.write(data if isinstance(data, bytes) else data.encode())
        else:
            with open(temp_path, "w", encoding="utf-8") as text_out:
                text_out.write(str(data))
        final = self._path(filename)
        os.replace(temp_path, final)
        os.removedirs(temp_dir)
        return final

    def put_group(self, filename: str, group: dict[str, str]) -> str:
        return self.put(json.dumps({"child_paths": group}), _GROUP_PREFIX + filename, binary=False)


class CacheManager:
    """Named as Triton's base class on purpose: Triton (3.3 on) accepts a ``TRITON_CACHE_MANAGER`` class only
    when a class named ``CacheManager`` is in its MRO, and this module cannot import Triton's."""


class SealedCacheManager(CacheManager):
    """Triton's cache-manager interface over the blessed tree; a miss is reported (see the module docstring)."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        # Override and dump managers read the user's override/dump dirs, never the blessed tree:
        # Triton's own manager handles them, and their misses are no compiles.
        self._passthrough = override or dump
        self._triton = _triton_file_manager()
        self.cache_dir = os.path.join(cache_base(), key)
        self._delegate: Any = None
        if self._passthrough:
            self._delegate = (
                self._triton(key, override=override, dump=dump)
                if self._triton is not None
                else _LayoutManager(self.cache_dir)
            )

    def _reader(self) -> Any:
        """What answers lookups: Triton's manager once the key's dir exists (its init would create it)."""
        if self._delegate is not None:
            return self._delegate
        if not os.path.isdir(self.cache_dir):
            return None  # nothing blessed under this key: a certain miss, and nothing is created
        self._delegate = self._triton(self.key) if self._triton is not None else _LayoutManager(self.cache_dir)
        return self._delegate

    def _writer(self) -> Any:
        if self._delegate is not None:
            return self._delegate
        self._delegate = self._triton(self.key) if self._triton is not None else _LayoutManager(self.cache_dir)
        return self._delegate

    def get_file(self, filename: str) -> str | None:
        reader = self._reader()
        found = reader.get_file(filename) if reader is not None else None
        if found is None and not self._passthrough:
            report_miss(self.key, filename)
        return None if found is None else str(found)

    def get_group(self, filename: str) -> dict[str, str] | None:
        reader = self._reader()
        group = reader.get_group(filename) if reader is not None else None
        # Triton asks for the group of its metadata file and compiles unless that file is in it.
        if not self._passthrough and (group is None or filename.removeprefix(_GROUP_PREFIX) not in group):
            report_miss(self.key, filename)
        return None if group is None else dict(group)

    def put(self, data: bytes | str, filename: str, binary: bool = True) -> str:
        try:
            return str(self._writer().put(data, filename, binary=binary))
        except OSError:
            if self._passthrough:
                raise
            return self._spill().put(data, filename, binary=binary)

    def put_group(self, filename: str, group: dict[str, str]) -> str:
        try:
            return str(self._writer().put_group(filename, group))
        except OSError:
            if self._passthrough:
                raise
            return self._spill().put_group(filename, group)

    def _spill(self) -> _LayoutManager:
        """Where a write goes that the tree refused (read-only): the private temp dir, so the engine keeps serving."""
        spill = _LayoutManager(os.path.join(tempfile.gettempdir(), _SPILL_DIR, self.key))
        self._delegate = spill
        return spill
