"""The compiled artifact: its key, its files in the mounted cache, load/save, and the compile at boot.

Layout (under ``--cache-dir``)::

    reference/<artifact_key>/megacache.bin   bytes of torch.compiler.save_cache_artifacts()
    reference/<artifact_key>/kernels/<d>/<name>.so   the C++ kernels Inductor built for it (CPU)
    reference/<artifact_key>/meta.json       what it was built from (+ sha256 of each file, + the poisoned flag)

``meta.json`` is written last and is the commit point: a ``megacache.bin`` without a matching
``meta.json`` (a save cut short) is treated as no artifact. Every file is written atomically (temp file in
the same dir, fsync, ``os.replace``, fsync of the dir). Loading never writes into the cache dir: Inductor's
own scratch files go to ``TORCHINDUCTOR_CACHE_DIR``, which the CLI keeps outside the cache dir, so the
cache may be mounted read-only.

The Mega-Cache holds Inductor's generated code but not the shared libraries its C++ kernels compile to: a
load alone rebuilds them with the compiler at every start (seconds of CPU each). So the start that compiles
also keeps the kernel libraries it loaded (``kernels/``, paths as Inductor names them under its dir, which
name them by a hash of their source and compile command), and a load copies them, checked against
``meta.json``, into the fresh Inductor dir before the compile: Inductor finds each library where it looks
and loads it instead of building it. A kernel missing or not matching is not copied and Inductor builds it.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import ENGINE_VERSION, markers
from .knobs import Knobs
from .model import Forward, ModelArgs, TinyTransformer

ENGINE_SUBDIR = "reference"
MEGACACHE_FILE = "megacache.bin"
META_FILE = "meta.json"
KERNELS_DIR = "kernels"
#: A kernel library's path under Inductor's dir, as Inductor names it (``<2 chars>/<hash>.main.so``).
KERNEL_PATH = re.compile(r"^[A-Za-z0-9_]+/[A-Za-z0-9_.-]+\.so$")
#: Where Linux lists what this process has mapped, the kernel libraries it loaded included.
PROC_MAPS = Path("/proc/self/maps")
META_VERSION = 1
# Forwards run at boot: one triggers the compile; with CUDA graphs (reduce-overhead) the first call
# warms up and a later one records the graph, so a few calls make serving start fully warm.
WARMUP_CALLS = 3


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace: the same value always gives the same bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def artifact_key(args: ModelArgs, device: str, torch_version: str, engine_version: str = ENGINE_VERSION) -> str:
    """First 16 hex chars of sha256 over the canonical JSON of everything the compiled graph depends on."""
    factors = {
        "device": device,
        "engine_version": engine_version,
        "model": args.to_dict(),
        "torch_version": torch_version,
    }
    return hashlib.sha256(canonical_json(factors).encode("ascii")).hexdigest()[:16]


def device_kind(device: str) -> str:
    """``cuda:1`` -> ``cuda``: the key depends on the kind of device, not on which GPU index serves."""
    return device.split(":", 1)[0]


@dataclass(frozen=True)
class ArtifactPaths:
    """Where one artifact lives inside the cache dir."""

    directory: Path
    megacache: Path
    meta: Path

    @classmethod
    def under(cls, cache_dir: Path, key: str) -> ArtifactPaths:
        """The paths for ``key`` under ``cache_dir`` (nothing is created)."""
        directory = cache_dir / ENGINE_SUBDIR / key
        return cls(directory, directory / MEGACACHE_FILE, directory / META_FILE)


@dataclass(frozen=True)
class FoundArtifact:
    """An artifact read from the cache dir and checked against its meta.json."""

    data: bytes
    meta: dict[str, Any]

    @property
    def poisoned(self) -> bool:
        """Saved by a candidate listed in BLESS_REFERENCE_POISON_CANDIDATES (test knob)."""
        return self.meta.get("poisoned") is True


def read_artifact(paths: ArtifactPaths, key: str) -> FoundArtifact | str:
    """The artifact, or a short reason why there is no usable one (never raises for a bad cache)."""
    try:
        data = paths.megacache.read_bytes()
    except FileNotFoundError:
        return "no compiled artifact"
    except OSError as exc:
        # ENOTDIR (a file in the way), EACCES...: nothing usable, but it is not fatal.
        return f"artifact unreadable ({exc.strerror or exc})"
    try:
        meta = json.loads(paths.meta.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"artifact incomplete ({META_FILE} missing)"
    except (OSError, ValueError) as exc:
        return f"artifact metadata unreadable ({exc})"
    if not isinstance(meta, dict):
        return "artifact metadata is not a JSON object"
    if meta.get("artifact_key") != key:
        return f"artifact metadata is for key {meta.get('artifact_key')!r}, not {key}"
    digest = hashlib.sha256(data).hexdigest()
    if meta.get("megacache_sha256") != digest or meta.get("megacache_size") != len(data):
        return f"artifact corrupt ({MEGACACHE_FILE} does not match the sha256/size in {META_FILE})"
    return FoundArtifact(data, meta)


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader sees either the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        Path(tmp).chmod(0o644)  # mkstemp makes 0600; other users (a trial's uid) must read it
        Path(tmp).replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            Path(tmp).unlink()
        raise


def _fsync_dir(directory: Path) -> None:
    # Makes the renames durable; some filesystems refuse fsync on a directory, which is not an error.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def build_meta(
    key: str,
    args: ModelArgs,
    device: str,
    torch_version: str,
    data: bytes,
    poisoned: bool,
    kernels: Mapping[str, bytes] | None = None,
) -> dict[str, Any]:
    """The meta.json content for a freshly saved artifact (``kernels``: relative path -> the library's bytes)."""
    return {
        "meta_version": META_VERSION,
        "artifact_key": key,
        "engine_version": ENGINE_VERSION,
        "torch_version": torch_version,
        "device": device,
        "model": args.to_dict(),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "megacache_sha256": hashlib.sha256(data).hexdigest(),
        "megacache_size": len(data),
        "kernels": {
            path: {"sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob)}
            for path, blob in sorted((kernels or {}).items())
        },
        "poisoned": poisoned,
    }


def write_artifact(
    paths: ArtifactPaths, data: bytes, meta: Mapping[str, Any], kernels: Mapping[str, bytes] | None = None
) -> None:
    """Create the artifact dir and write the kernels and megacache.bin, then meta.json (the commit point).

    Raises OSError.
    """
    paths.directory.mkdir(parents=True, exist_ok=True)
    for relative, blob in sorted((kernels or {}).items()):
        target = paths.directory / KERNELS_DIR / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(target, blob)
        _fsync_dir(target.parent)
    _write_atomic(paths.megacache, data)
    _write_atomic(paths.meta, (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    _fsync_dir(paths.directory)


def loaded_kernels(inductor_dir: Path, maps: Path = PROC_MAPS) -> dict[str, bytes]:
    """The kernel libraries this process loaded from Inductor's dir: relative path -> bytes.

    Read from the process's own memory map, so it names exactly what this compile loaded, whatever else the
    dir holds (an operator's ``TORCHINDUCTOR_CACHE_DIR`` may be shared). Nothing where there is no map.
    """
    try:
        text = maps.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    root = inductor_dir.resolve()
    found: dict[str, bytes] = {}
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        path = Path(fields[5])
        if not path.is_relative_to(root):
            continue
        relative = path.relative_to(root).as_posix()
        if KERNEL_PATH.fullmatch(relative) and relative not in found:
            try:
                found[relative] = path.read_bytes()
            except OSError:
                continue  # gone since (a " (deleted)" mapping): not kept, a load builds it again
    return found


def restore_kernels(paths: ArtifactPaths, meta: Mapping[str, Any], inductor_dir: Path) -> int | str:
    """Copy the artifact's kernel libraries into Inductor's dir; how many, or why none was copied.

    All or none: every listed library must be where the artifact keeps it, with the sha256 and size of
    ``meta.json``. A library already in Inductor's dir is left as it is (Inductor names it by its source).
    """
    listed = meta.get("kernels") or {}
    if not isinstance(listed, dict):
        return "its kernel list is not a JSON object"
    kernels: dict[str, bytes] = {}
    for relative, expected in sorted(listed.items()):
        if not KERNEL_PATH.fullmatch(relative) or not isinstance(expected, dict):
            return f"kernel entry {relative!r} is malformed"
        try:
            blob = (paths.directory / KERNELS_DIR / relative).read_bytes()
        except OSError as exc:
            return f"kernel {relative} unreadable ({exc.strerror or exc})"
        if expected.get("sha256") != hashlib.sha256(blob).hexdigest() or expected.get("size") != len(blob):
            return f"kernel {relative} does not match the sha256/size in {META_FILE}"
        kernels[relative] = blob
    for relative, blob in kernels.items():
        target = inductor_dir / relative
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(target, blob)
    return len(kernels)


def counters_snapshot() -> dict[str, dict[str, int]]:
    """The inductor and aot_autograd counters of this process (what proves a load vs a recompile)."""
    from torch._dynamo.utils import counters

    return {group: dict(sorted(counters[group].items())) for group in ("inductor", "aot_autograd")}


def load_hit(snapshot: Mapping[str, Mapping[str, int]]) -> bool:
    """True when every compiled graph came from the cache: an fxgraph hit and no fxgraph/autograd miss."""
    inductor = snapshot.get("inductor", {})
    aot = snapshot.get("aot_autograd", {})
    return (
        inductor.get("fxgraph_cache_hit", 0) >= 1
        and inductor.get("fxgraph_cache_miss", 0) == 0
        and aot.get("autograd_cache_miss", 0) == 0
    )


def _brief_counters(snapshot: Mapping[str, Mapping[str, int]]) -> str:
    inductor = snapshot.get("inductor", {})
    aot = snapshot.get("aot_autograd", {})
    return (
        f"fxgraph_cache_hit={inductor.get('fxgraph_cache_hit', 0)} "
        f"fxgraph_cache_miss={inductor.get('fxgraph_cache_miss', 0)} "
        f"autograd_cache_hit={aot.get('autograd_cache_hit', 0)} "
        f"autograd_cache_miss={aot.get('autograd_cache_miss', 0)}"
    )


@dataclass(frozen=True)
class BootResult:
    """What the boot-time compile did; ``forward`` is what serving calls."""

    forward: Forward
    loaded: bool
    saved: bool
    loaded_poisoned: bool
    compile_seconds: float
    counters: dict[str, dict[str, int]]


def compile_model(model: TinyTransformer, device: str) -> Forward:
    """Wrap ``model`` with torch.compile: Inductor C++ on CPU, CUDA graphs (reduce-overhead) on CUDA."""
    if device_kind(device) == "cuda":
        compiled = torch.compile(model, fullgraph=True, dynamic=False, mode="reduce-overhead")

        def forward(ids: torch.Tensor) -> torch.Tensor:
            # Each call is a new step for CUDA graph trees; the output lives in the graph's static pool and
            # is overwritten by the next replay, so hand out a copy.
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
            return compiled(ids).clone()  # type: ignore[no-any-return]

        return forward
    # Scalar (non-vectorized) C++ kernels: probing the CPU's SIMD ISAs and compiling at::vec templates
    # doubles the compile on a small CPU (measured with torch 2.13 on 2 cores: ~21 s -> ~9-11 s cold), and
    # this engine runs dozens of times in CI. It also keeps the generated code independent of the host's
    # AVX2/AVX-512 support. Inductor hashes its config into its own cache key, so it is set the same way on
    # every boot (save and load alike).
    import torch._inductor.config as inductor_config

    inductor_config.cpp.vec_isa_ok = False
    # No precompiled header: Inductor would build one of ATen's headers (~130 MB, seconds of CPU) into a
    # fresh temp dir at every start, even a start whose kernels all come from the artifact, and it does
    # not make the few kernels of a cold compile cheaper here.
    inductor_config.cpp_cache_precompile_headers = False
    return torch.compile(model, fullgraph=True, dynamic=False)


def boot_compiled(
    model: TinyTransformer,
    args: ModelArgs,
    device: str,
    cache_dir: Path,
    knobs: Knobs,
    emit: Callable[[str], None] = markers.emit,
    inductor_dir: Path | None = None,
) -> BootResult:
    """Load the artifact if there is one, compile + warm up, save when it compiled; print the markers.

    ``inductor_dir``: Inductor's scratch dir (default: ``TORCHINDUCTOR_CACHE_DIR``), where a load puts the
    artifact's kernel libraries and a save takes them from. Must run on the thread that will serve every
    later call (CUDA graph trees are per thread).
    """
    if inductor_dir is None:
        from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

        inductor_dir = Path(inductor_cache_dir())
    torch_version = str(torch.__version__)
    key = artifact_key(args, device_kind(device), torch_version)
    paths = ArtifactPaths.under(cache_dir, key)
    emit(markers.using_cache_dir(str(cache_dir)))
    emit(f"{markers.ARTIFACT_KEY}{key} (engine {ENGINE_VERSION}, torch {torch_version}, device {device})")

    started = time.monotonic()
    found: FoundArtifact | None = None
    reason: str | None = None
    if knobs.ignore_cache:
        reason = "BLESS_REFERENCE_IGNORE_CACHE is set; artifact not loaded"
    else:
        read = read_artifact(paths, key)
        if isinstance(read, str):
            reason = f"{read} at {paths.megacache}"
        else:
            try:
                # Must happen before the first compiled call: it pre-populates Inductor's and AOTAutograd's
                # caches, which the compile below then hits.
                if torch.compiler.load_cache_artifacts(read.data) is None:
                    # Seen with garbage bytes: torch swallows the error and loads nothing.
                    reason = f"load failed from {paths.megacache}: torch loaded no cache entries from it"
                else:
                    found = read
            except Exception as exc:  # a corrupt or incompatible artifact is a recompile, not a crash
                detail = " ".join(str(exc).split())[:300]  # a marker is one line
                reason = f"load failed from {paths.megacache}: {type(exc).__name__}: {detail}"
    if reason is not None:
        emit(markers.compiling(reason))
    if found is not None:
        try:
            restored: int | str = restore_kernels(paths, found.meta, inductor_dir)
        except OSError as exc:  # Inductor's dir unwritable: it fails on its own, or builds the kernels
            restored = f"cannot write into {inductor_dir} ({exc.strerror or exc})"
        if isinstance(restored, str):
            emit(f"{markers.KERNELS_NOT_RESTORED}{restored}; Inductor builds them")
        else:
            emit(f"{markers.KERNELS_RESTORED}{restored}")

    forward = compile_model(model, device)
    with torch.no_grad():
        ids = torch.zeros((1, args.max_seq_len), dtype=torch.int64, device=device)
        for _ in range(WARMUP_CALLS):
            forward(ids)
    if device_kind(device) == "cuda":
        torch.cuda.synchronize()
    compile_seconds = time.monotonic() - started

    snapshot = counters_snapshot()
    loaded = found is not None and load_hit(snapshot)
    if found is not None and not loaded:
        emit(markers.compiling(f"artifact at {paths.megacache} did not hit the cache: {_brief_counters(snapshot)}"))
    elif loaded:
        emit(markers.loaded(str(paths.megacache)))
    emit(markers.counters(canonical_json(snapshot)))
    emit(markers.compile_time(compile_seconds))

    saved = False
    if not loaded:
        saved = _save(paths, key, args, device_kind(device), torch_version, knobs, emit, inductor_dir)
    return BootResult(
        forward=forward,
        loaded=loaded,
        saved=saved,
        loaded_poisoned=found is not None and found.poisoned,
        compile_seconds=compile_seconds,
        counters=snapshot,
    )


def _save(
    paths: ArtifactPaths,
    key: str,
    args: ModelArgs,
    device: str,
    torch_version: str,
    knobs: Knobs,
    emit: Callable[[str], None],
    inductor_dir: Path,
) -> bool:
    # Any failure here (EROFS on a read-only mount, ENOTDIR, ENOSPC, nothing recorded) is reported and the
    # engine keeps serving from the in-memory compile, like vLLM does.
    try:
        artifacts = torch.compiler.save_cache_artifacts()
        if artifacts is None:
            raise RuntimeError("torch recorded no cache artifacts")
        data = artifacts[0]
        kernels = loaded_kernels(inductor_dir)
        meta = build_meta(key, args, device, torch_version, data, poisoned=knobs.poison_on_save, kernels=kernels)
        write_artifact(paths, data, meta, kernels)
    except Exception as exc:
        emit(markers.unable_to_save(str(paths.megacache), f"{type(exc).__name__}: {exc}"))
        return False
    emit(markers.saved(str(paths.megacache)))
    return True
