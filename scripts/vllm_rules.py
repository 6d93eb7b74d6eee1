#!/usr/bin/env python3
"""Derive bless's per-version vLLM rules from each release's own source.

For every vLLM release on the package index (0.20.0 and newer) this script

1. ``fetch``: reads the release's x86-64 wheel from the package index WITHOUT downloading it whole
   (HTTP range requests on the wheel's zip central directory, then only its ``vllm/**/*.py``
   members), scans every Python file for assignments to a compile-state location's env var,
   trims each needed source file to the statements bless depends on (lines are verbatim; only
   lines are dropped) and writes them to ``tests/fixtures/vllm/source/<version>/<member>.txt`` with a
   ``SOURCE.json`` saying where they came from (wheel file name, its sha256 from the index, each
   member's sha256 and line count, a digest of every scanned file);
2. ``derive``: reads those excerpts and prints the version's rules entry (JSON);
3. ``update``: writes the derived entries into ``bless/engines/vllm/versions.json`` (the adapter's data);
4. ``check``: derives every stored version again and prints a diff; exit 1 when any entry differs
   (the unit tests run the same comparison).

Usage (from the repository root, network access to the package index needed for ``fetch`` only)::

    python3 scripts/vllm_rules.py fetch --all          # or: fetch 0.33.0
    python3 scripts/vllm_rules.py update --all
    python3 scripts/vllm_rules.py check
    python3 scripts/vllm_rules.py derive 0.26.0

What a release must still contain for an entry to be derived (a release that lacks one fails
loudly, naming what vanished: that is the signal to read the release and update bless):
the log markers of :data:`MARKERS`, the cache layout needles of :data:`LAYOUT_NEEDLES`,
``compile_factors()`` with its ``ignored_factors`` set, ``CompilationConfig.compute_hash`` with
its ``ignored_factors`` set, ``use_aot_compile`` / ``use_mega_aot_artifact``, and the evidence of
every ``always`` location of :data:`COMPILE_LOCATIONS`. An optional location whose evidence is gone
simply leaves the entry (``update`` prints that diff for review).

The excerpts double as test fixtures (``tests/unit/test_vllm_versions.py``): a stored entry that
no longer agrees with its excerpts fails the suite. No network in tests.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import re
import shutil
import sys
import textwrap
import tokenize
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "vllm" / "source"
DATA = REPO / "bless" / "engines" / "vllm" / "versions.json"
INDEX_JSON = "https://pypi.org/pypi/vllm/json"
OLDEST = (0, 20, 0)
ENTRY_VERSION = 1
# Excerpts are not importable code (dropped lines break indentation): a .txt suffix keeps linters off them.
EXCERPT_SUFFIX = ".txt"

# --- what bless reads from vLLM's logs: role -> (marker text, file that logs it) ----------------------
# The marker is a literal piece of a logger format string; a log line matches when it contains it.
MARKERS: dict[str, tuple[tuple[str, str], ...]] = {
    "load": (
        ("Directly load AOT compilation from path", "vllm/compilation/decorators.py"),
        ("Directly load the compiled graph(s) for compile range", "vllm/compilation/backends.py"),
    ),
    "compile": (
        ("saved AOT compiled function to", "vllm/compilation/decorators.py"),
        ("Compiling model again due to a load failure", "vllm/compilation/decorators.py"),
        ("Compiling a graph for compile range", "vllm/compilation/backends.py"),
        ("Cache the graph of compile range", "vllm/compilation/backends.py"),
        ("unable to save AOT compiled function", "vllm/compilation/decorators.py"),
    ),
    "fatal": (
        ("EngineCore failed to start", "vllm/v1/engine/core.py"),
        ("Engine core initialization failed", "vllm/v1/engine/utils.py"),
    ),
}
# Timings bless records (seconds): name -> (marker text, file, how repeated lines combine).
TIMINGS: dict[str, tuple[str, str, str]] = {
    "torch_compile_s": ("torch.compile took", "vllm/compilation/monitor.py", "sum"),
    "init_engine_s": ("init engine (profile, create kv cache, warmup model) took", "vllm/v1/engine/core.py", "last"),
    "dynamo_transform_s": ("Dynamo bytecode transform time:", "vllm/compilation/backends.py", "sum"),
    "graph_compile_s": ("Compiling a graph for compile range", "vllm/compilation/backends.py", "sum"),
    "graph_load_s": ("Directly load the compiled graph(s) for compile range", "vllm/compilation/backends.py", "sum"),
}
# The line that names vLLM's backbone cache dir (its 10-hex key).
CACHE_DIR_MARKER = ("Using cache directory:", "vllm/compilation/backends.py")

# --- the cache layout: what must still be in the source for bless's layout rules to hold ---------------
LAYOUT_NEEDLES: dict[str, tuple[tuple[str, str], ...]] = {
    # torch_compile_cache/<10 hex>/rank_<R>_<D>/<component>/{artifact_*, cache_key_factors.json, vllm_compile_cache.py}
    "backbone": (
        ("vllm/compilation/backends.py", 'envs.VLLM_CACHE_ROOT, "torch_compile_cache", hash_key'),
        ("vllm/compilation/backends.py", "hexdigest()[:10]"),
        ("vllm/compilation/backends.py", 'f"rank_{rank}_{dp_rank}", self.prefix'),
        ("vllm/compilation/backends.py", '"cache_key_factors.json"'),
        ("vllm/compilation/backends.py", '"vllm_compile_cache.py"'),
    ),
    # torch_compile_cache/torch_aot_compile/<64 hex>/{rank_<R>_<D>/model, inductor_cache/}
    "aot": (
        ("vllm/compilation/decorators.py", '"torch_aot_compile"'),
        ("vllm/compilation/decorators.py", "hash_key = hashlib.sha256(str(factors).encode()).hexdigest()"),
        ("vllm/compilation/decorators.py", 'f"rank_{rank}_{dp_rank}"'),
        ("vllm/compilation/decorators.py", 'aot_compilation_path = os.path.join(cache_dir, "model")'),
    ),
    # vLLM forces TORCHINDUCTOR_CACHE_DIR to <aot dir>/inductor_cache: the rewrites of a warm load land there.
    "inductor_cache_forced": (
        ("vllm/compilation/decorators.py", 'inductor_cache = os.path.join(cache_dir, "inductor_cache")'),
        ("vllm/compilation/decorators.py", 'os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache'),
    ),
    # The mega-AOT path creates VLLM_CACHE_ROOT/dummy_cache (bless pre-creates it).
    "dummy_cache": (("vllm/compilation/caching.py", 'os.path.join(envs.VLLM_CACHE_ROOT, "dummy_cache")'),),
    # VLLM_FORCE_AOT_LOAD re-raises a failed AOT load instead of recompiling.
    "force_aot_load": (("vllm/compilation/decorators.py", "if envs.VLLM_FORCE_AOT_LOAD:"),),
    # vLLM hands its compile cache dir (torch_compile_cache/<10 hex>/rank_<R>_<D>/<component>, or
    # VLLM_CACHE_ROOT/dummy_cache) to the compiler's initialize_cache: there the parameters named in
    # COMPILE_CACHE_PARAMS are that dir, which is what lets an env assignment built from them count
    # as inside the cache (see env_set_by_vllm).
    "compile_cache_param": (
        ("vllm/compilation/backends.py", "cache_dir=cache_dir, disable_cache=disable_cache, prefix=prefix"),
        ("vllm/compilation/backends.py", "local_cache_dir, disable_cache, self.prefix"),
        ("vllm/compilation/caching.py", "cache_dir=dummy_cache_dir,"),
    ),
}

# --- where the engine, or a library it loads, writes compiled state -----------------------------------------
# bless points each location's env var into the blessed tree (``<cache mount>/<subdir>``). A location
# is in a release's entry only when that release's source shows it uses the writer: the first
# (file, needle) of ``evidence`` found in the release is recorded. ``always``: every release must
# show it (a release without it fails the derivation loudly, like a moved marker). Defaults are
# those of the writer's own source (Triton's knobs.py, torch's cache_dir_utils / cpp_extension,
# FlashInfer's jit/env.py, TileLang's env.py, CUTLASS's CuTe DSL), or vLLM's where vLLM reads it.


@dataclass(frozen=True)
class LocationSpec:
    """One compile-state location: its env var, its dir in the blessed tree, who writes what there."""

    env: str
    subdir: str
    what: str
    evidence: tuple[tuple[str, str], ...]
    always: bool


COMPILE_LOCATIONS: tuple[LocationSpec, ...] = (
    LocationSpec(
        "TRITON_CACHE_DIR",
        "jit/triton",
        "Triton: JIT-compiled kernels (vLLM's Triton ops; Inductor's too while this is set), its autotune "
        "cache and the compiled launcher/driver modules; default $TRITON_HOME/.triton/cache (~/.triton/cache)",
        (("vllm/triton_utils/__init__.py", "import triton"),),
        always=True,
    ),
    LocationSpec(
        "TORCHINDUCTOR_CACHE_DIR",
        "jit/inductor",
        "Inductor (torch.compile): FX-graph, AOTAutograd and autotune caches and generated kernels of "
        "compiles outside vLLM's backend (vLLM points it into its own compile cache while it compiles); "
        "default <tmp>/torchinductor_<user>",
        (("vllm/compilation/decorators.py", 'os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache'),),
        always=True,
    ),
    LocationSpec(
        "CUDA_CACHE_PATH",
        "jit/cuda",
        "the CUDA driver's JIT cache: PTX the driver compiles for this GPU (kernels shipped as PTX only); "
        "default ~/.nv/ComputeCache",
        (("vllm/platforms/cuda.py", "import vllm._C"),),
        always=True,
    ),
    LocationSpec(
        "TORCH_EXTENSIONS_DIR",
        "jit/torch_extensions",
        "C++/CUDA extensions torch.utils.cpp_extension.load builds at run time (vLLM's hf3fs KV connector, "
        "vendored kernels); default $XDG_CACHE_HOME/torch_extensions (~/.cache/torch_extensions)",
        (
            (
                "vllm/distributed/kv_transfer/kv_connector/v1/hf3fs/hf3fs_client.py",
                "from torch.utils.cpp_extension import load",
            ),
            (
                "vllm/third_party/fmha_sm100/cute/src/sm100/build_k2q_csr/__init__.py",
                "from torch.utils.cpp_extension import load",
            ),
        ),
        always=True,
    ),
    LocationSpec(
        "FLASHINFER_WORKSPACE_BASE",
        "jit/flashinfer",
        "FlashInfer: JIT-built kernels (cached_ops), generated sources, downloaded cubins and autotune "
        "results under <base>/.cache/flashinfer; default base HOME (~/.cache/flashinfer)",
        (("vllm/utils/flashinfer.py", 'importlib.util.find_spec("flashinfer")'),),
        always=False,
    ),
    LocationSpec(
        "DG_JIT_CACHE_DIR",
        "jit/deep_gemm",
        "DeepGEMM JIT-compiled kernels; vLLM sets VLLM_CACHE_ROOT/deep_gemm when it is unset (DeepGEMM's "
        "own default ~/.deep_gemm)",
        (("vllm/utils/deep_gemm.py", 'DEEP_GEMM_JIT_CACHE_ENV_NAME = "DG_JIT_CACHE_DIR"'),),
        always=False,
    ),
    LocationSpec(
        "TILELANG_CACHE_DIR",
        "jit/tilelang",
        "TileLang JIT kernels and autotune results (its TILELANG_TMP_DIR defaults under it); default ~/.tilelang/cache",
        (
            ("vllm/model_executor/layers/mhc.py", "import tilelang"),
            ("vllm/_tilelang_ops.py", "import tilelang"),
            ("vllm/model_executor/kernels/mhc/tilelang_kernels.py", "import tilelang"),
            ("vllm/tilelang_utils/__init__.py", "import tilelang"),
        ),
        always=False,
    ),
    LocationSpec(
        "CUTE_DSL_CACHE_DIR",
        "jit/cute_dsl",
        "CUTLASS CuTe DSL compiled kernels (vLLM's CuTe DSL kernels, FlashAttention's CuTe path); "
        "default $TMPDIR/<user>/cutlass_python_cache",
        (("vllm/vllm_flash_attn/cute/cache_utils.py", "import cutlass"),),
        always=False,
    ),
    LocationSpec(
        "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR",
        "jit/flash_attention_cute",
        "vllm_flash_attn's exported CuTe DSL kernels (written only with FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1); "
        "default <tmp>/<user>/flash_attention_cute_dsl_cache",
        (("vllm/vllm_flash_attn/cute/cache_utils.py", 'os.getenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"'),),
        always=False,
    ),
    LocationSpec(
        "MINFER_FMHA_CACHE_DIR",
        "jit/minfer_fmha",
        "the vendored SM100 FMHA kernels (vllm/third_party/fmha_sm100), JIT-built; default ~/.cache/minfer/fmha_sm100",
        (("vllm/third_party/fmha_sm100/jit.py", 'os.environ.get("MINFER_FMHA_CACHE_DIR")'),),
        always=False,
    ),
    LocationSpec(
        "MM_SPARSE_ATTN_AOT_CACHE",
        "jit/mm_sparse_attn",
        "AOT-compiled sparse-attention kernels of the vendored fmha_sm100; default ~/.cache/minfer/mm_sparse_attn",
        (("vllm/third_party/fmha_sm100/cute/src/common/aot_cache.py", '"MM_SPARSE_ATTN_AOT_CACHE"'),),
        always=False,
    ),
    LocationSpec(
        "FLYDSL_RUNTIME_CACHE_DIR",
        "jit/flydsl",
        "FlyDSL kernels of the ROCm (AMD) model runners; vLLM replaces an unset or non-writable value "
        "with ~/.flydsl/cache",
        (
            ("vllm/models/deepseek_v41/amd/mono/runner.py", 'os.environ.get("FLYDSL_RUNTIME_CACHE_DIR")'),
            ("vllm/models/deepseek_v4/amd/mono/runner.py", 'os.environ.get("FLYDSL_RUNTIME_CACHE_DIR")'),
        ),
        always=False,
    ),
    LocationSpec(
        "OUTLINES_CACHE_DIR",
        "jit/outlines",
        "Outlines' compiled structured-output index cache (written only with VLLM_V1_USE_OUTLINES_CACHE=1); "
        "default $XDG_CACHE_HOME/.cache/outlines, else ~/.cache/outlines",
        (("vllm/v1/structured_output/utils.py", 'os.getenv("OUTLINES_CACHE_DIR")'),),
        always=False,
    ),
    LocationSpec(
        "XDG_CACHE_HOME",
        "jit/xdg",
        "the catch-all for libraries that follow the XDG base-dir spec (default ~/.cache): torch "
        "extensions' and PyTorch's kernel-cache defaults, and what else derives its cache from it",
        (("vllm/envs.py", '"XDG_CACHE_HOME",'),),
        always=True,
    ),
)
LOCATION_ENVS = frozenset(spec.env for spec in COMPILE_LOCATIONS)
#: Parameters of vllm/compilation/compiler_interface.py that are vLLM's compile cache dir: those of
#: ``initialize_cache(self, cache_dir, ...)`` and ``initialize_inductor_cache(base_cache_dir)``, which
#: vLLM calls with it (the ``compile_cache_param`` layout needles).
COMPILE_CACHE_PARAMS: dict[str, frozenset[str]] = {
    "vllm/compilation/compiler_interface.py": frozenset({"cache_dir", "base_cache_dir"}),
}
#: What an env assignment's value may be built from and still stay inside the blessed tree: vLLM's
#: cache root (bless pins it to the cache mount), its compile cache dir under it, or the caller's
#: own value of that env var (bless's location, already inside).
INSIDE_ROOTS = frozenset({"VLLM_CACHE_ROOT", "compile_cache_dir", "caller"})

# --- models that opt out of AOT compile ------------------------------------------------------------------------
# A model class decorated (or wrapped) with ``support_torch_compile(..., use_aot_compile=False)``
# compiles without AOT: no torch_aot_compile/<hash>/rank_<R>_<D>/model is written for it. Every
# Python file outside vllm/compilation/ is scanned for such calls. One inside the Transformers
# backend's package applies to every model vLLM serves through it: ``--model-impl transformers``,
# an architecture the registry maps to the module "transformers", and, under ``auto``, an
# architecture the registry does not know (vLLM falls back to the backend). For those releases the
# registry's architectures are kept (:data:`REGISTRY`), so the adapter can tell which one a
# model's config.json names.
TRANSFORMERS_BACKEND = "vllm/model_executor/models/transformers/"
REGISTRY = "vllm/model_executor/models/registry.py"
REGISTRY_UNION = "_VLLM_MODELS"

# --- members read from the wheel, and which statements of each are kept ----------------------------------
# Needles select statements (the innermost statement holding the needle, whole); functions and
# classes listed are kept whole (CompilationConfig: its field statements and compute_hash only).
ENVS = "vllm/envs.py"
COMPILATION_CONFIG = "vllm/config/compilation.py"
ENVS_FUNCTIONS = ("disable_compile_cache", "use_aot_compile", "use_mega_aot_artifact", "compile_factors")


def _needles_by_file() -> dict[str, set[str]]:
    needles: dict[str, set[str]] = {}
    for entries in MARKERS.values():
        for marker, path in entries:
            needles.setdefault(path, set()).add(marker)
    for marker, path, _ in TIMINGS.values():
        needles.setdefault(path, set()).add(marker)
    needles.setdefault(CACHE_DIR_MARKER[1], set()).add(CACHE_DIR_MARKER[0])
    for entries in LAYOUT_NEEDLES.values():
        for path, needle in entries:
            needles.setdefault(path, set()).add(needle)
    return needles


# =========================================================================================================
# fetch: the wheel's members over HTTP range requests
# =========================================================================================================


class _RangeReader(io.RawIOBase):
    """A seekable read-only file over HTTP range requests (enough for zipfile to read the central directory)."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self.pos = url, size, 0
        self._start, self._data = 0, b""

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = base + offset
        return self.pos

    def readinto(self, buffer: Any) -> int:
        count = min(len(buffer), self.size - self.pos)
        if count <= 0:
            return 0
        if not (self._start <= self.pos and self.pos + count <= self._start + len(self._data)):
            end = min(self.size, self.pos + max(count, 1 << 18)) - 1
            request = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end}"})
            with urllib.request.urlopen(request, timeout=120) as response:
                if response.status != 206:
                    raise RuntimeError(f"{self.url}: the server ignored the range request (HTTP {response.status})")
                self._start, self._data = self.pos, response.read()
        offset = self.pos - self._start
        buffer[:count] = self._data[offset : offset + count]
        self.pos += count
        return count


def _index() -> dict[str, Any]:
    with urllib.request.urlopen(INDEX_JSON, timeout=60) as response:
        return json.load(response)  # type: ignore[no-any-return]


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def released_versions(index: dict[str, Any]) -> list[str]:
    """Final releases from 0.20.0 on, oldest first (pre-releases and post-releases skipped)."""
    found = [v for v in index["releases"] if re.fullmatch(r"\d+\.\d+\.\d+", v) and _version_key(v) >= OLDEST]
    return sorted((v for v in found if index["releases"][v]), key=_version_key)


def _wheel_file(index: dict[str, Any], version: str) -> dict[str, Any]:
    wheels = [f for f in index["releases"][version] if f["filename"].endswith("x86_64.whl")]
    if not wheels:
        raise SystemExit(f"vLLM {version}: no x86-64 wheel on the index")
    return wheels[0]  # type: ignore[no-any-return]


def _optional_needles_by_file() -> dict[str, set[str]]:
    """Needles in files a release may lack (a location's evidence): absent files are skipped."""
    needles: dict[str, set[str]] = {}
    for spec in COMPILE_LOCATIONS:
        for path, needle in spec.evidence:
            needles.setdefault(path, set()).add(needle)
    return needles


def fetch(version: str, index: dict[str, Any]) -> Path:
    """Read the needed members of ``version``'s wheel and write trimmed excerpts + SOURCE.json.

    Every ``vllm/**/*.py`` member is read and scanned for assignments to a location's env var
    (:func:`env_assignments`): their statements, and what their values are built from, are kept.
    """
    wheel = _wheel_file(index, version)
    url = urllib.parse.urljoin(INDEX_JSON, wheel["url"])
    reader = io.BufferedReader(_RangeReader(url, int(wheel["size"])), 1 << 16)
    return write_excerpts(version, zipfile.ZipFile(reader), wheel, FIXTURES / version)


def write_excerpts(version: str, archive: zipfile.ZipFile, wheel: dict[str, Any], out: Path) -> Path:
    """Trim the needed members of ``archive`` (the release's wheel) into ``out``: excerpts + SOURCE.json."""
    names = set(archive.namelist())
    metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
    # A fresh dir: an excerpt a newer rule set no longer needs must not linger and be read.
    shutil.rmtree(out, ignore_errors=True)
    members: dict[str, dict[str, Any]] = {}
    # Whole sources, read once in archive order (the range reader then reads forward).
    sources: dict[str, str] = {}
    scanned = hashlib.sha256()
    python = sorted(
        (i for i in archive.infolist() if i.filename.startswith("vllm/") and i.filename.endswith(".py")),
        key=lambda info: info.header_offset,
    )
    for info in python:
        data = archive.read(info)
        sources[info.filename] = data.decode("utf-8")
    for name in sorted(sources):
        scanned.update(f"{name} {hashlib.sha256(sources[name].encode()).hexdigest()}\n".encode())

    def read(name: str) -> str:
        text = sources[name] if name in sources else archive.read(name).decode("utf-8")
        data = text.encode("utf-8")
        members[name] = {"sha256": hashlib.sha256(data).hexdigest(), "lines": data.count(b"\n")}
        return text

    excerpts: dict[str, str] = {"METADATA": trim_metadata(read(metadata_name))}
    optional = _optional_needles_by_file()
    excerpts[ENVS] = trim_envs(read(ENVS), optional.pop(ENVS, set()))
    excerpts[COMPILATION_CONFIG] = trim_compilation_config(read(COMPILATION_CONFIG))
    needles = _needles_by_file()
    for path, extra in optional.items():
        if path in sources:
            needles.setdefault(path, set()).update(extra)
    spans: dict[str, list[tuple[int, int]]] = {}
    for path, text in sources.items():
        found = env_assignment_spans(path, text) + aot_opt_out_spans(path, text)
        if found:
            spans[path] = found
    if any(path.startswith(TRANSFORMERS_BACKEND) for path, text in sources.items() if aot_opt_out_spans(path, text)):
        spans.setdefault(REGISTRY, []).extend(registry_spans(sources[REGISTRY]))
    for path in sorted(set(needles) | set(spans)):
        if path not in sources:
            raise SystemExit(f"vLLM {version}: {path} is not in the wheel (moved?): read the release and update")
        excerpts[path] = trim_to_statements(read(path), needles.get(path, ()), spans.get(path, ()))
    for path, text in excerpts.items():
        target = out / (path + EXCERPT_SUFFIX)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    source = {
        "version": version,
        "wheel": wheel["filename"],
        "wheel_sha256": wheel["digests"]["sha256"],
        "wheel_size": int(wheel["size"]),
        "members": {("METADATA" if k == metadata_name else k): v for k, v in sorted(members.items())},
        # Every vllm/**/*.py member was scanned for env assignments: how many, and a digest of
        # their "name sha256" lines (sorted), so a re-fetch shows whether the scanned source changed.
        "scanned": {"python_files": len(sources), "sha256": scanned.hexdigest()},
        "note": "excerpts of the members above: lines are verbatim, only lines were dropped "
        "(scripts/vllm_rules.py fetch)",
    }
    (out / "SOURCE.json").write_text(json.dumps(source, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return out


# --- trimming (lines verbatim, only lines dropped) -------------------------------------------------------


def trim_metadata(text: str) -> str:
    keep = [line for line in text.splitlines() if line.startswith(("Name:", "Version:", "Requires-Dist: torch=="))]
    return "\n".join(keep) + "\n"


def _span(node: ast.AST) -> tuple[int, int]:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])  # type: ignore[attr-defined]
    return start, node.end_lineno or node.lineno  # type: ignore[attr-defined]


def _render(lines: list[str], spans: Iterable[tuple[int, int]]) -> str:
    """The union of 1-based inclusive line spans, in order, with a ``# [lines a-b]`` header per run."""
    keep: set[int] = set()
    for start, end in spans:
        keep.update(range(start, end + 1))
    out: list[str] = []
    previous = -1
    for number in sorted(keep):
        if number != previous + 1:
            run_end = number
            while run_end + 1 in keep:
                run_end += 1
            out.append(f"# [lines {number}-{run_end}]")
        out.append(lines[number - 1])
        previous = number
    return "\n".join(out) + "\n"


def trim_envs(text: str, needles: Iterable[str] = ()) -> str:
    """The AOT/cache functions, ``compile_factors`` whole, one line per ``environment_variables`` key,
    and the statements holding ``needles`` (a location's evidence)."""
    tree = ast.parse(text)
    lines = text.splitlines()
    spans: list[tuple[int, int]] = _needle_spans(text, tree, needles)
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in ENVS_FUNCTIONS:
            spans.append(_span(node))
            found.add(node.name)
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "environment_variables"
        ):
            assert isinstance(node.value, ast.Dict)
            spans.append((node.lineno, node.lineno))
            spans.append((node.end_lineno or node.lineno, node.end_lineno or node.lineno))
            for key in node.value.keys:
                if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                    raise SystemExit(f"{ENVS}: a non-literal environment_variables key at line {key and key.lineno}")
                if not re.match(rf'^    "{re.escape(key.value)}":', lines[key.lineno - 1]):
                    raise SystemExit(f"{ENVS}:{key.lineno}: key {key.value} is not at the start of its line")
                spans.append((key.lineno, key.lineno))
            found.add("environment_variables")
    missing = {*ENVS_FUNCTIONS, "environment_variables"} - found
    if missing:
        raise SystemExit(f"{ENVS}: {', '.join(sorted(missing))} not found: read the release and update")
    return _render(lines, spans)


def trim_compilation_config(text: str) -> str:
    """``class CompilationConfig``: its line, every field statement and ``compute_hash``; plus its imports' absence."""
    tree = ast.parse(text)
    lines = text.splitlines()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "CompilationConfig":
            spans = [(node.lineno, node.lineno)]
            spans += [_span(s) for s in node.body if isinstance(s, ast.AnnAssign)]
            spans += [_span(s) for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "compute_hash"]
            if len(spans) < 3:
                raise SystemExit(f"{COMPILATION_CONFIG}: CompilationConfig has no fields or no compute_hash")
            return _render(lines, spans)
    raise SystemExit(f"{COMPILATION_CONFIG}: class CompilationConfig not found: read the release and update")


def trim_to_statements(text: str, needles: Iterable[str], spans: Iterable[tuple[int, int]] = ()) -> str:
    """For each needle: the innermost simple statement holding it (whole), else just its line; plus ``spans``."""
    tree = ast.parse(text)
    return _render(text.splitlines(), [*_needle_spans(text, tree, needles), *spans])


def _simple_statements(tree: ast.AST) -> list[ast.stmt]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.stmt) and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]


def _needle_spans(text: str, tree: ast.AST, needles: Iterable[str]) -> list[tuple[int, int]]:
    lines = text.splitlines()
    statements = _simple_statements(tree)
    spans: list[tuple[int, int]] = []
    for needle in needles:
        hits = [i for i, line in enumerate(lines, 1) if needle in line]
        if not hits:
            # A marker split over two literals ("... took " "%.2f s"): search the joined statement text.
            hits = [
                s.lineno
                for s in statements
                if needle in "".join(_string_literals(ast.get_source_segment(text, s) or ""))
            ]
        for line in hits:
            holders = [s for s in statements if s.lineno <= line <= (s.end_lineno or s.lineno)]
            holders = [s for s in holders if not isinstance(s, ast.If | ast.For | ast.While | ast.With | ast.Try)]
            if holders:
                inner = min(holders, key=lambda s: (s.end_lineno or s.lineno) - s.lineno)
                start, end = _span(inner)
                spans.append((start, end) if end - start <= 20 else (line, line))
            else:
                spans.append((line, line))
    return spans


# --- env assignments: where a release sets a location's env var itself, and to what --------------------------


@dataclass(frozen=True)
class _Statement:
    """A simple statement of a source or an excerpt, at its line in the release's file."""

    line: int
    end: int
    node: ast.stmt


@dataclass(frozen=True)
class EnvAssignment:
    """``os.environ[NAME] = value`` or ``os.environ.setdefault(NAME, value)`` for a location's ``NAME``."""

    env: str
    how: str
    statement: _Statement
    value: ast.expr
    key_line: int | None


def _shift(node: ast.AST, offset: int) -> None:
    """Move ``node``'s line numbers by ``offset`` (a chunk parsed alone, back to its lines in the file)."""
    for child in ast.walk(node):
        if isinstance(child, ast.stmt | ast.expr):
            child.lineno += offset
            child.end_lineno = (child.end_lineno or child.lineno - offset) + offset


_COMPOUND = (
    ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Match,
    ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Pass,
)  # fmt: skip


def _plain(nodes: Iterable[ast.AST]) -> list[ast.stmt]:
    """Statements that hold no other statement (an ``if`` or ``def`` is read through its body)."""
    return [node for node in nodes if isinstance(node, ast.stmt) and not isinstance(node, _COMPOUND)]


def _statements_of(text: str) -> list[_Statement]:
    """Every plain statement of a whole source file, in line order."""
    nodes = sorted(_plain(ast.walk(ast.parse(text))), key=lambda n: n.lineno)
    return [_Statement(n.lineno, n.end_lineno or n.lineno, n) for n in nodes]


def _excerpt_trees(text: str) -> list[ast.Module]:
    """The statements an excerpt holds whole, parsed, with the line numbers of the release's file.

    Each run (``# [lines a-b]``) is split into statements by parsing growing chunks of its lines;
    a compound statement's header (``if x:``, ``def f(...):``, a decorated ``class``) parses with a
    ``pass`` body added. A line that starts no statement (a piece of one kept alone) is skipped.
    """
    found: list[ast.Module] = []
    for match in re.finditer(r"^# \[lines (\d+)-(\d+)\]\n((?:(?!# \[lines ).*\n?)*)", text, flags=re.M):
        first = int(match[1])
        lines = match[3].splitlines()
        index = 0
        while index < len(lines):
            parsed = None
            for stop in range(index + 1, min(len(lines), index + 40) + 1):
                chunk = lines[index:stop]
                indent = re.match(r"\s*", chunk[0])[0]  # type: ignore[index]
                for body in ("", "\n" + indent + "    pass"):
                    try:
                        tree = ast.parse(textwrap.dedent("\n".join(chunk) + body))
                    except SyntaxError:
                        continue
                    parsed = (stop, tree)
                    break
                if parsed:
                    break
            if parsed is None:
                index += 1
                continue
            stop, tree = parsed
            for node in tree.body:
                _shift(node, first + index - 1)
            found.append(tree)
            index = stop
    return found


def _excerpt_statements(text: str) -> list[_Statement]:
    """The plain statements an excerpt holds whole (see :func:`_excerpt_trees`), in line order."""
    nodes = sorted(_plain(node for tree in _excerpt_trees(text) for node in ast.walk(tree)), key=lambda n: n.lineno)
    return [_Statement(n.lineno, n.end_lineno or n.lineno, n) for n in nodes]


def _is_environ(node: ast.AST) -> bool:
    return ast.unparse(node) == "os.environ"


def _assigned(statements: Iterable[_Statement], target: str, before: int) -> list[_Statement]:
    """The statements before line ``before`` that assign ``target`` (a name or ``self.x``), in order."""
    out: list[_Statement] = []
    for statement in statements:
        node = statement.node
        if statement.line >= before:
            continue
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        if any(ast.unparse(t) == target for t in targets) and getattr(node, "value", None) is not None:
            out.append(statement)
    return out


def _string_constant(statements: list[_Statement], node: ast.expr, before: int) -> tuple[str | None, int | None]:
    """A literal string, or a name bound to one earlier (``NAME = "DG_JIT_CACHE_DIR"``), with that line."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value, None
    if isinstance(node, ast.Name):
        for statement in reversed(_assigned(statements, node.id, before)):
            value = getattr(statement.node, "value", None)
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value, statement.line
    return None, None


def env_assignments(statements: list[_Statement], names: frozenset[str] = LOCATION_ENVS) -> list[EnvAssignment]:
    """Every statement that sets one of ``names`` through ``os.environ`` (by literal or constant name)."""
    found: list[EnvAssignment] = []
    for statement in statements:
        node = statement.node
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and _is_environ(target.value):
                    env, key_line = _string_constant(statements, target.slice, statement.line)
                    if env in names:
                        found.append(EnvAssignment(env, "set", statement, node.value, key_line))
        for call in ast.walk(node):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "setdefault"
                and _is_environ(call.func.value)
                and len(call.args) == 2
            ):
                env, key_line = _string_constant(statements, call.args[0], statement.line)
                if env in names:
                    found.append(EnvAssignment(env, "setdefault", statement, call.args[1], key_line))
    return found


_PATH_WRAPPERS = {"os.path.join", "Path", "pathlib.Path", "str", "os.path.abspath", "os.path.realpath"}


def value_roots(
    statements: list[_Statement],
    value: ast.expr,
    before: int,
    env: str,
    params: frozenset[str],
    used: set[int] | None = None,
    seen: frozenset[str] = frozenset(),
) -> set[str]:
    """What an assigned path is built from, read from its expression and the assignments it names.

    ``VLLM_CACHE_ROOT`` (``envs.VLLM_CACHE_ROOT``), ``compile_cache_dir`` (a name in ``params`` that
    is never assigned: vLLM's compile cache dir handed in), ``caller`` (``env``'s own value read
    back), ``HOME``, ``TMP``, ``env:X`` (another env var), or ``unknown: <expr>``. A name counts
    as every earlier assignment to it (branches included). ``used`` collects the lines read.
    """
    used = used if used is not None else set()

    def roots(node: ast.expr) -> set[str]:
        return value_roots(statements, node, before, env, params, used, seen)

    text = ast.unparse(value)
    if isinstance(value, ast.Constant):
        return set() if value.value is None else {f"unknown: {text}"}
    if text == "envs.VLLM_CACHE_ROOT":
        return {"VLLM_CACHE_ROOT"}
    if isinstance(value, ast.IfExp):
        return roots(value.body) | roots(value.orelse)
    if isinstance(value, ast.BoolOp):
        return set().union(*(roots(item) for item in value.values))
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Div):
        return roots(value.left)
    if isinstance(value, ast.Subscript):
        return roots(value.value)
    if isinstance(value, ast.Call):
        func = ast.unparse(value.func)
        if func in ("Path.home", "pathlib.Path.home"):
            return {"HOME"}
        if func in ("tempfile.gettempdir", "tempfile.mkdtemp"):
            return {"TMP"}
        if func == "os.path.expanduser" and value.args:
            first = value.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith("~"):
                return {"HOME"}
            return roots(first)
        if func in ("os.environ.get", "os.getenv") and value.args:
            name, _ = _string_constant(statements, value.args[0], before)
            read = {"caller" if name == env else f"env:{name or ast.unparse(value.args[0])}"}
            return read | (roots(value.args[1]) if len(value.args) > 1 else set())
        if func in _PATH_WRAPPERS and value.args:
            return roots(value.args[0])
        return {f"unknown: {text}"}
    if isinstance(value, ast.Name | ast.Attribute):
        if text in seen:
            return set()
        bound = _assigned(statements, text, before)
        if not bound:
            return {"compile_cache_dir"} if text in params else {f"unknown: {text}"}
        found: set[str] = set()
        for statement in bound:
            used.update(range(statement.line, statement.end + 1))
            assigned = getattr(statement.node, "value", None)
            if assigned is not None:
                found |= value_roots(statements, assigned, statement.line, env, params, used, seen | {text})
        return found
    return {f"unknown: {text}"}


def env_assignment_spans(path: str, text: str) -> list[tuple[int, int]]:
    """The lines an excerpt must keep to show each env assignment of ``text`` and what its value is built from.

    Names are followed inside the assignment's enclosing top-level function or class (the whole
    file for a module-level one), which is what the excerpt then holds for :func:`value_roots`.
    """
    if not any(name in text for name in LOCATION_ENVS):
        return []
    tree = ast.parse(text)
    statements = _statements_of(text)
    spans: list[tuple[int, int]] = []
    for assignment in env_assignments(statements):
        line = assignment.statement.line
        top = next((n for n in tree.body if n.lineno <= line <= (n.end_lineno or n.lineno)), None)
        if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            local = [s for s in statements if top.lineno <= s.line <= (top.end_lineno or top.lineno)]
        else:
            local = statements
        used: set[int] = set()
        value_roots(local, assignment.value, line, assignment.env, COMPILE_CACHE_PARAMS.get(path, frozenset()), used)
        spans.append((assignment.statement.line, assignment.statement.end))
        if assignment.key_line is not None:
            spans.append((assignment.key_line, assignment.key_line))
        spans.extend((number, number) for number in used)
    return spans


# --- AOT opt-outs and the model registry ---------------------------------------------------------------------


def _opts_out_of_aot(node: ast.AST) -> ast.keyword | None:
    """The ``use_aot_compile=False`` keyword of a ``support_torch_compile(...)`` call, if ``node`` is one."""
    if not (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("support_torch_compile")):
        return None
    return next(
        (
            keyword
            for keyword in node.keywords
            if keyword.arg == "use_aot_compile"
            and isinstance(keyword.value, ast.Constant)
            and keyword.value.value is False
        ),
        None,
    )


def _aot_opt_outs(path: str, nodes: Iterable[ast.AST]) -> list[tuple[ast.keyword, str, tuple[int, int]]]:
    """(keyword, what it applies to, span to keep) for each AOT opt-out among ``nodes`` (statements, classes)."""
    found: list[tuple[ast.keyword, str, tuple[int, int]]] = []
    for node in nodes:
        if isinstance(node, ast.ClassDef):
            for decorator in node.decorator_list:
                if keyword := _opts_out_of_aot(decorator):
                    found.append((keyword, node.name, (decorator.lineno, node.lineno)))
        elif isinstance(node, ast.stmt) and not isinstance(node, _COMPOUND):
            for call in ast.walk(node):
                if keyword := _opts_out_of_aot(call):
                    applies = "model_impl=transformers" if path.startswith(TRANSFORMERS_BACKEND) else "unknown"
                    found.append((keyword, applies, (node.lineno, node.end_lineno or node.lineno)))
    return found


def aot_opt_out_spans(path: str, text: str) -> list[tuple[int, int]]:
    """The lines an excerpt must keep to show each AOT opt-out of ``text`` (none under vllm/compilation/)."""
    if path.startswith("vllm/compilation/") or "use_aot_compile" not in text:
        return []
    return [span for _, _, span in _aot_opt_outs(path, ast.walk(ast.parse(text)))]


def registry_spans(text: str) -> list[tuple[int, int]]:
    """The registry's ``_VLLM_MODELS`` union and every dict it unpacks, whole."""
    tree = ast.parse(text)
    assigned = {
        node.targets[0].id: node
        for node in tree.body
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
    }
    union = assigned.get(REGISTRY_UNION)
    if union is None or not isinstance(union.value, ast.Dict):
        raise SystemExit(f"{REGISTRY}: {REGISTRY_UNION} = {{...}} not found: read the release and update")
    parts = [
        value.id
        for key, value in zip(union.value.keys, union.value.values, strict=True)
        if key is None and isinstance(value, ast.Name)
    ]
    return [_span(assigned[name]) for name in [*parts, REGISTRY_UNION] if name in assigned]


# =========================================================================================================
# derive: the rules entry, from the excerpts alone
# =========================================================================================================


def _string_literals(text: str) -> list[str]:
    """Every string literal of a code fragment; adjacent literals (implicit concatenation) joined."""
    out: list[str] = []
    pending: list[str] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.STRING:
                try:
                    value = ast.literal_eval(token.string)
                except (ValueError, SyntaxError):
                    value = None  # an f-string part or similar: not a format string we read
                if isinstance(value, str):
                    pending.append(value)
                continue
            if token.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT) and pending:
                continue
            if pending:
                out.append("".join(pending))
                pending = []
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    if pending:
        out.append("".join(pending))
    return out


def _blocks(text: str) -> list[str]:
    """The runs of an excerpt (split at the ``# [lines a-b]`` headers)."""
    return [block for block in re.split(r"^# \[lines \d+-\d+\]\n", text, flags=re.M) if block.strip()]


def _literals_of(text: str) -> list[str]:
    found: list[str] = []
    for block in _blocks(text):
        found.extend(_string_literals(textwrap.dedent(block)))
    return found


def _formats_with(literals: list[str], marker: str, where: str) -> list[str]:
    """Every format string holding ``marker`` (one message may have variants, e.g. with/without compile time)."""
    formats = sorted({s for s in literals if marker in s})
    if not formats:
        raise ValueError(f"{where}: no format string contains {marker!r}: vLLM changed this message")
    return formats


def _set_literal(block: str, name: str, where: str) -> list[str]:
    """The string items of ``name: set[str] = {...}`` / ``name = [...]`` inside a code excerpt."""
    match = re.search(rf"^(\s*){name}(: [^=]+)? = [{{\[]\n(.*?)^\1[}}\]]", block, flags=re.M | re.S)
    if not match:
        raise ValueError(f"{where}: {name} not found")
    return sorted(set(re.findall(r'^\s*"([A-Za-z0-9_]+)",', match[3], flags=re.M)))


def _function(text: str, name: str, where: str) -> str:
    match = re.search(rf"^def {name}\(.*?(?=^\S|\Z)", text, flags=re.M | re.S)
    if not match:
        raise ValueError(f"{where}: def {name} not found")
    return match[0]


def derive(version: str, root: Path = FIXTURES) -> dict[str, Any]:
    """The rules entry of ``version`` from its excerpts under ``root/<version>/`` (no network)."""
    base = root / version

    def excerpt(path: str) -> str:
        return (base / (path + EXCERPT_SUFFIX)).read_text(encoding="utf-8")

    source = json.loads((base / "SOURCE.json").read_text(encoding="utf-8"))
    metadata = excerpt("METADATA")
    pins = re.findall(r"^Requires-Dist: torch==(\S+)$", metadata, flags=re.M)
    if len(pins) != 1:
        raise ValueError(f"vLLM {version}: expected one exact torch pin in METADATA, found {pins}")
    if f"Version: {version}" not in metadata:
        raise ValueError(f"vLLM {version}: METADATA is of another version")

    envs = excerpt(ENVS)
    known = re.findall(r'^    "([A-Z0-9_]+)":', envs, flags=re.M)
    factors_fn = _function(envs, "compile_factors", f"{version} {ENVS}")
    ignored = _set_literal(factors_fn, "ignored_factors", f"{version} {ENVS} compile_factors")
    ray = _set_literal(factors_fn, "ray_noset_env_vars", f"{version} {ENVS} compile_factors")
    hashed = sorted((set(known) - set(ignored)) | set(ray))

    def torch_threshold(function: str) -> str:
        body = _function(envs, function, f"{version} {ENVS}")
        found = re.findall(r'is_torch_equal_or_newer\("([^"]+)"\)', body)
        if len(found) != 1:
            raise ValueError(f"vLLM {version}: {function}: expected one torch threshold, found {found}")
        return str(found[0])

    literals: dict[str, list[str]] = {}

    def literals_in(path: str) -> list[str]:
        if path not in literals:
            literals[path] = _literals_of(excerpt(path))
        return literals[path]

    markers: dict[str, list[dict[str, str | list[str]]]] = {}
    for role, entries in MARKERS.items():
        markers[role] = [
            {"marker": marker, "formats": _formats_with(literals_in(path), marker, f"{version} {path}"), "file": path}
            for marker, path in entries
        ]
    timings = {
        name: {
            "formats": _formats_with(literals_in(path), marker, f"{version} {path}"),
            "file": path,
            "combine": combine,
        }
        for name, (marker, path, combine) in TIMINGS.items()
    }
    cache_dir = {
        "formats": _formats_with(literals_in(CACHE_DIR_MARKER[1]), CACHE_DIR_MARKER[0], f"{version} backends.py"),
        "file": CACHE_DIR_MARKER[1],
    }

    layout: dict[str, bool] = {}
    for feature, needles in LAYOUT_NEEDLES.items():
        layout[feature] = all(needle in excerpt(path) for path, needle in needles)
    for required in ("backbone", "aot", "inductor_cache_forced"):
        if not layout[required]:
            missing = [n for p, n in LAYOUT_NEEDLES[required] if n not in excerpt(p)]
            raise ValueError(f"vLLM {version}: the {required} cache layout changed: {missing} not found")

    config_text = excerpt(COMPILATION_CONFIG)
    fields = _compilation_fields(config_text, version)
    compute_hash = re.search(r"^    def compute_hash\(self\).*?(?=^    \S|\Z)", config_text, flags=re.M | re.S)
    if not compute_hash:
        raise ValueError(f"vLLM {version}: CompilationConfig.compute_hash not found")
    excluded = _set_literal(compute_hash[0], "ignored_factors", f"{version} CompilationConfig.compute_hash")

    force = "VLLM_FORCE_AOT_LOAD" if "VLLM_FORCE_AOT_LOAD" in known and layout["force_aot_load"] else None
    return {
        "entry_version": ENTRY_VERSION,
        "version": version,
        "source": {"wheel": source["wheel"], "wheel_sha256": source["wheel_sha256"]},
        "torch": pins[0],
        "env": {"hashed": hashed, "ignored_by_vllm": ignored},
        "aot": {
            "aot_compile_default_from_torch": torch_threshold("use_aot_compile"),
            "mega_artifact_default_from_torch": torch_threshold("use_mega_aot_artifact"),
            "force_load_env": force,
            "force_load_hashed_by_vllm": bool(force and force in hashed),
            **derive_aot_opt_outs(version, base),
        },
        "markers": markers,
        "timings": timings,
        "cache_dir_line": cache_dir,
        "layout": layout,
        "compilation_config": {
            # Fields vLLM's compute_hash folds into its key (the rest: excluded, or not init fields).
            "hashed_fields": {name: default for name, default in sorted(fields.items()) if name not in excluded},
            "excluded_from_hash": excluded,
        },
        "compile_locations": derive_compile_locations(version, base),
        "env_set_by_vllm": derive_env_set_by_vllm(base, layout),
    }


def _excerpt_files(base: Path) -> dict[str, Path]:
    """The release's files that have an excerpt under ``base``, by their path in the wheel."""
    return {
        path.relative_to(base).as_posix().removesuffix(EXCERPT_SUFFIX): path
        for path in sorted(base.rglob("*.py" + EXCERPT_SUFFIX))
    }


def derive_compile_locations(version: str, base: Path) -> list[dict[str, Any]]:
    """The locations whose evidence the release's excerpts hold (the first (file, needle) found)."""
    files = _excerpt_files(base)
    found: list[dict[str, Any]] = []
    for spec in COMPILE_LOCATIONS:
        evidence = next(
            (
                {"file": path, "needle": needle}
                for path, needle in spec.evidence
                if path in files and needle in files[path].read_text(encoding="utf-8")
            ),
            None,
        )
        if evidence is None:
            if spec.always:
                raise ValueError(
                    f"vLLM {version}: no evidence of {spec.env} ({spec.what.split(':')[0]}): "
                    f"none of {[needle for _, needle in spec.evidence]} found: read the release and update"
                )
            continue
        found.append({"env": spec.env, "subdir": spec.subdir, "what": spec.what, "evidence": evidence})
    return found


def derive_env_set_by_vllm(base: Path, layout: dict[str, bool]) -> dict[str, list[dict[str, Any]]]:
    """Every place the excerpts show the release setting a location's env var, and what the value is built from.

    ``built_from`` (see :func:`value_roots`); ``inside_cache``: every root is vLLM's cache root, its
    compile cache dir or the caller's own value, i.e. the path stays inside the blessed tree.
    """
    found: dict[str, list[dict[str, Any]]] = {}
    for path, excerpt in _excerpt_files(base).items():
        text = excerpt.read_text(encoding="utf-8")
        if not any(name in text for name in LOCATION_ENVS):
            continue
        source_lines = dict(_excerpt_lines(text))
        statements = _excerpt_statements(text)
        params = COMPILE_CACHE_PARAMS.get(path, frozenset()) if layout.get("compile_cache_param") else frozenset()
        for assignment in env_assignments(statements):
            roots = value_roots(statements, assignment.value, assignment.statement.line, assignment.env, params)
            found.setdefault(assignment.env, []).append(
                {
                    "file": path,
                    "line_no": assignment.statement.line,
                    "line": source_lines[assignment.statement.line].strip(),
                    "how": assignment.how,
                    "value": ast.unparse(assignment.value),
                    "built_from": sorted(roots),
                    "inside_cache": bool(roots) and roots <= INSIDE_ROOTS,
                }
            )
    return {
        env: sorted(items, key=lambda item: (item["file"], item["line_no"])) for env, items in sorted(found.items())
    }


def derive_aot_opt_outs(version: str, base: Path) -> dict[str, Any]:
    """``disabled_for``: every ``use_aot_compile=False`` of the release's models (file, the verbatim
    line, what it applies to); and, where one applies to the Transformers backend, ``architectures``:
    the registry's, split into those vLLM implements itself and those it serves through the backend."""
    opt_outs: list[dict[str, str]] = []
    for path, excerpt in _excerpt_files(base).items():
        text = excerpt.read_text(encoding="utf-8")
        if path.startswith("vllm/compilation/") or "use_aot_compile" not in text:
            continue
        lines = dict(_excerpt_lines(text))
        nodes = [node for tree in _excerpt_trees(text) for node in ast.walk(tree)]
        for keyword, applies, _ in _aot_opt_outs(path, nodes):
            line = lines[keyword.value.lineno].strip()
            opt_outs.append({"file": path, "line": line, "applies_to": applies})
    found: dict[str, Any] = {"disabled_for": sorted(opt_outs, key=lambda item: (item["file"], item["line"]))}
    if any(item["applies_to"] == "model_impl=transformers" for item in opt_outs):
        found["architectures"] = _registry_architectures(version, base)
    return found


def _registry_architectures(version: str, base: Path) -> dict[str, list[str]]:
    """The registry's architectures, as ``_VLLM_MODELS`` merges them: by the module each maps to."""
    path = base / (REGISTRY + EXCERPT_SUFFIX)
    if not path.exists():
        raise ValueError(f"vLLM {version}: the Transformers backend opts out of AOT but {REGISTRY} was not kept")
    dicts: dict[str, ast.Dict] = {}
    for block in _blocks(path.read_text(encoding="utf-8")):
        for node in ast.parse(block).body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Dict)
            ):
                dicts[node.targets[0].id] = node.value
    union = dicts.get(REGISTRY_UNION)
    if union is None:
        raise ValueError(f"vLLM {version}: {REGISTRY_UNION} not found in the {REGISTRY} excerpt")
    module_of: dict[str, str] = {}
    for key, value in zip(union.keys, union.values, strict=True):
        if key is not None or not isinstance(value, ast.Name) or value.id not in dicts:
            raise ValueError(f"vLLM {version}: {REGISTRY_UNION} holds {ast.unparse(value)}, not a registry dict")
        part = dicts[value.id]
        for arch, target in zip(part.keys, part.values, strict=True):
            # ``**{k: ... for k in ...}`` re-keys names already in another dict: nothing new.
            if isinstance(arch, ast.Constant) and isinstance(target, ast.Tuple):
                module_of[str(arch.value)] = str(ast.literal_eval(target)[0])
    return {
        "native": sorted(arch for arch, module in module_of.items() if module != "transformers"),
        "transformers": sorted(arch for arch, module in module_of.items() if module == "transformers"),
    }


def _excerpt_lines(text: str) -> Iterable[tuple[int, str]]:
    """(line number in the release's file, line) for every line an excerpt keeps."""
    number = 0
    for line in text.splitlines():
        if header := re.fullmatch(r"# \[lines (\d+)-\d+\]", line):
            number = int(header[1])
            continue
        yield number, line
        number += 1


def _compilation_fields(text: str, version: str) -> dict[str, str]:
    """Init fields of CompilationConfig (name -> default as written), from the excerpt's field statements."""
    body = text.split("    def compute_hash", 1)[0]
    source = "\n".join(line for line in body.splitlines() if not line.startswith("# [lines"))
    tree = ast.parse(source)
    fields: dict[str, str] = {}
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            name = node.target.id
            default = ast.unparse(node.value) if node.value is not None else "<required>"
            if name.startswith("_") or "init=False" in default:
                continue
            fields[name] = default
    if not fields:
        raise ValueError(f"vLLM {version}: no CompilationConfig fields found")
    return fields


# =========================================================================================================
# update / check
# =========================================================================================================


def load_stored() -> dict[str, Any]:
    if not DATA.exists():
        return {"versions": {}}
    return json.loads(DATA.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def write_stored(data: dict[str, Any]) -> None:
    versions = dict(sorted(data["versions"].items(), key=lambda item: _version_key(item[0])))
    text = _compact_json({**data, "versions": versions}) + "\n"
    temp = DATA.with_suffix(".json.tmp")
    temp.write_text(text, encoding="utf-8")
    temp.replace(DATA)


def _compact_json(value: Any, indent: str = "") -> str:
    """JSON with one key per line and every list of scalars on one line (a reviewable diff, a small file)."""
    if isinstance(value, dict) and value:
        inner = indent + " "
        items = [f"{inner}{json.dumps(key)}: {_compact_json(item, inner)}" for key, item in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and any(isinstance(item, dict | list) for item in value):
        inner = indent + " "
        return "[\n" + ",\n".join(inner + _compact_json(item, inner) for item in value) + "\n" + indent + "]"
    return json.dumps(value, ensure_ascii=False)


def diff_entries(stored: Any, derived: Any, where: str = "") -> list[str]:
    """Leaf-level differences between two JSON values (``path: stored -> derived``)."""
    if isinstance(stored, dict) and isinstance(derived, dict):
        out: list[str] = []
        for key in sorted(set(stored) | set(derived)):
            out += diff_entries(stored.get(key, "<absent>"), derived.get(key, "<absent>"), f"{where}.{key}")
        return out
    if isinstance(stored, list) and isinstance(derived, list) and all(isinstance(x, str) for x in stored + derived):
        gone, new = sorted(set(stored) - set(derived)), sorted(set(derived) - set(stored))
        return [f"{where}: -{gone} +{new}"] if gone or new else []
    return [] if stored == derived else [f"{where}: {stored!r} -> {derived!r}"]


def stored_fields(entry: dict[str, Any]) -> dict[str, Any]:
    """The derived part of a stored entry (GPU evidence fields are added by hand and not derived)."""
    return {key: value for key, value in entry.items() if key not in ("gpu_proven", "upper_rewrites")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("fetch", "update", "derive"):
        command = sub.add_parser(name)
        command.add_argument("versions", nargs="*")
        command.add_argument("--all", action="store_true", help="every release from 0.20.0 on")
    sub.add_parser("check")
    args = parser.parse_args(argv)
    if args.command == "check":
        stored = load_stored()["versions"]
        problems = 0
        for version, entry in stored.items():
            for line in diff_entries(stored_fields(entry), derive(version)):
                print(f"{version}{line}")
                problems += 1
        print(f"{len(stored)} stored entries, {problems} difference(s)", file=sys.stderr)
        return 1 if problems else 0
    versions = list(args.versions)
    if args.all:
        versions = (
            released_versions(_index())
            if args.command == "fetch"
            else sorted((p.name for p in FIXTURES.iterdir() if p.is_dir()), key=_version_key)
        )
    if not versions:
        parser.error("name versions or pass --all")
    if args.command == "fetch":
        index = _index()
        for version in versions:
            print(f"vLLM {version}: {fetch(version, index).relative_to(REPO)}", file=sys.stderr)
        return 0
    if args.command == "derive":
        for version in versions:
            print(json.dumps(derive(version), indent=1))
        return 0
    data = load_stored()
    for version in versions:
        entry = derive(version)
        old = data["versions"].get(version)
        if old is not None:
            for line in diff_entries(stored_fields(old), entry):
                print(f"{version}{line}", file=sys.stderr)
            entry.update({k: v for k, v in old.items() if k in ("gpu_proven", "upper_rewrites")})
        else:
            print(f"{version}: new entry", file=sys.stderr)
        data["versions"][version] = entry
    write_stored(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
