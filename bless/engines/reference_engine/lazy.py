"""Shape-bucket kernels: what a real engine compiles lazily, per request shape, after startup.

With ``--shape-buckets 8,16,32`` a prompt of length L needs the kernel of the smallest bucket >= L
(else the largest). A bucket's kernel is looked up on its first use in a process through a Triton-style
cache manager (Triton's interface: ``Cls(key)``, ``get_group``, ``get_file``, ``put``, ``put_group``),
the class named by ``TRITON_CACHE_MANAGER=module:Class`` when set (as Triton does), else
:class:`FileCacheManager` here, which keeps Triton's on-disk layout under ``TRITON_CACHE_DIR``:
``<dir>/<key>/<file>`` and a group file ``__grp__<name>.json`` holding ``{"child_paths": {...}}``.
A hit loads it; a miss "compiles" (the kernel is a deterministic blob derived from the model's
artifact key and the bucket: this engine exists to test bless, the shape logic is the point) and
saves it, printing a compile marker; a save that fails (a read-only cache) is said and serving goes on.

Standard library only (the engine imports it before torch is needed).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from . import markers

MANAGER_ENV = "TRITON_CACHE_MANAGER"
CACHE_DIR_ENV = "TRITON_CACHE_DIR"


class CacheManager(Protocol):
    """The part of Triton's ``CacheManager`` interface the engine uses."""

    def get_group(self, filename: str) -> dict[str, str] | None: ...

    def put(self, data: bytes | str, filename: str, binary: bool = True) -> str: ...

    def put_group(self, filename: str, group: dict[str, str]) -> str: ...


class FileCacheManager:
    """Triton's file layout, standard library only: ``<TRITON_CACHE_DIR>/<key>/<file>``, atomic puts.

    Nothing is created on lookup (a read-only cache is looked up without a write).
    """

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        base = os.environ.get(CACHE_DIR_ENV, "").strip()
        self.key = key
        self.cache_dir = (Path(base) if base else Path.home() / ".triton" / "cache") / key

    def get_file(self, filename: str) -> str | None:
        path = self.cache_dir / filename
        return str(path) if path.exists() else None

    def get_group(self, filename: str) -> dict[str, str] | None:
        # As Triton's: the caller names the group by its metadata file, the manager adds the __grp__ prefix.
        path = self.get_file(f"__grp__{filename}")
        if path is None:
            return None
        children = json.loads(Path(path).read_text(encoding="utf-8")).get("child_paths")
        if not isinstance(children, dict) or not all(Path(str(p)).exists() for p in children.values()):
            return None
        return {str(name): str(p) for name, p in children.items()}

    def put(self, data: bytes | str, filename: str, binary: bool = True) -> str:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        payload = data if isinstance(data, bytes) else data.encode("utf-8")
        fd, tmp = tempfile.mkstemp(dir=self.cache_dir, prefix=f".{filename}.")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            path = self.cache_dir / filename
            Path(tmp).replace(path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return str(path)

    def put_group(self, filename: str, group: dict[str, str]) -> str:
        return self.put(json.dumps({"child_paths": group}), f"__grp__{filename}", binary=False)


def manager_class(env: dict[str, str] | os._Environ[str]) -> Callable[[str], CacheManager]:
    """The cache manager class ``TRITON_CACHE_MANAGER`` names (``module:Class``), else :class:`FileCacheManager`."""
    spec = env.get(MANAGER_ENV, "").strip()
    if not spec:
        return FileCacheManager
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"{MANAGER_ENV}={spec!r} is not module:Class")
    cls: Callable[[str], CacheManager] = getattr(importlib.import_module(module_name), class_name)
    return cls


def parse_buckets(text: str) -> tuple[int, ...]:
    """``8,16,32`` -> (8, 16, 32): positive, strictly ascending; ValueError otherwise."""
    buckets = tuple(int(part, 10) for part in text.split(",") if part.strip())
    if not buckets or any(b < 1 for b in buckets) or list(buckets) != sorted(set(buckets)):
        raise ValueError(f"--shape-buckets {text!r}: expected positive, strictly ascending integers")
    return buckets


class ShapeKernels:
    """The shape-bucket kernels of one process: each looked up (or compiled) on its first use."""

    def __init__(
        self, buckets: Sequence[int], artifact_key: str, manager: Callable[[str], CacheManager] | None = None
    ) -> None:
        self.buckets = tuple(buckets)
        self.artifact_key = artifact_key
        self.manager = manager or manager_class(os.environ)
        self.ready: dict[int, str] = {}

    def bucket(self, length: int) -> int:
        """The bucket a prompt of ``length`` tokens runs in."""
        return next((b for b in self.buckets if b >= length), self.buckets[-1])

    def kernel_key(self, bucket: int) -> str:
        """Triton-style cache key of a bucket's kernel: a hash of what it is compiled from."""
        return hashlib.sha256(f"{self.artifact_key}:shape-bucket:{bucket}".encode()).hexdigest()[:52]

    def ensure(self, length: int) -> str:
        """Make the kernel for a prompt of ``length`` tokens ready; returns how (``loaded``, ``compiled``, ...)."""
        bucket = self.bucket(length)
        if bucket in self.ready:
            return "ready"
        key = self.kernel_key(bucket)
        name = f"reference_bucket_{bucket}"
        manager = self.manager(key)
        # Triton's calling convention (compiler.compile: get_group(f"{name}.json")), so that any Triton cache
        # manager (bless's sealed one included) finds the group file __grp__<name>.json the bootstrap wrote.
        group_found = manager.get_group(f"{name}.json")
        if group_found is not None and f"{name}.json" in group_found:
            markers.emit(f"{markers.LAZY_LOADED}{bucket} (key {key})")
            self.ready[bucket] = "loaded"
            return "loaded"
        markers.emit(f"{markers.LAZY_COMPILING}{bucket} (key {key}, prompt of {length} tokens)")
        kernel = hashlib.sha256(f"kernel:{key}".encode()).digest() * 64
        meta: dict[str, Any] = {"name": name, "bucket": bucket, "key": key}
        try:
            group = {
                f"{name}.bin": manager.put(kernel, f"{name}.bin"),
                f"{name}.json": manager.put(json.dumps(meta, sort_keys=True), f"{name}.json", binary=False),
            }
            manager.put_group(f"{name}.json", group)
        except OSError as exc:
            markers.emit(f"{markers.LAZY_UNSAVED}{bucket}: {exc.strerror or exc}")
            self.ready[bucket] = "compiled, not saved"
            return "compiled, not saved"
        self.ready[bucket] = "compiled"
        return "compiled"
