"""bless's Triton cache manager (bless/engines/bless_seal.py), as the engine's Python runs it.

Each test starts a fresh Python (the engine's, without bless on its path) on the module as bless ships
it into a start (``tmp/bless-seal/bless_seal.py``, first on PYTHONPATH), resolves the class from
``TRITON_CACHE_MANAGER`` as Triton does, and drives it with Triton's calls: hit, miss, a read-only tree
that a lookup never writes, and a put where the tree is writable. Triton's layout: ``<dir>/<key>/<file>``,
groups in ``__grp__<file>`` JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bless.engines import bless_seal
from bless.flows.engine_start import SEAL_DIR, SEAL_MANAGER, SEAL_MODULE_FILE, seal_hook_source
from bless.flows.serve.seal import LINE_PREFIX, parse_seal_lines

KEY = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567ABCDEFGHIJKLMNOPQRST"

# Run in the engine's Python: resolve the class as Triton's knobs do (module:Class, a class named
# CacheManager in its MRO), then run the calls given as JSON on argv and print their results as JSON.
DRIVER = r"""
import importlib, json, os, sys
module_name, class_name = os.environ["TRITON_CACHE_MANAGER"].split(":", 1)
cls = getattr(importlib.import_module(module_name), class_name)
assert any(c.__name__ == "CacheManager" for c in cls.mro()), "Triton would refuse this class"
results = []
for call in json.loads(sys.argv[1]):
    manager = cls(call["key"], **call.get("kwargs", {}))
    results.append(getattr(manager, call["method"])(*call["args"]))
results.append(sorted(name for name in sys.modules if name == "bless" or name.startswith("bless.")))
print(json.dumps(results))
"""


def ship(tmp_path: Path) -> Path:
    """The module where a sealed start has it: ``tmp/bless-seal/bless_seal.py``."""
    hook_dir = tmp_path / "private-tmp" / SEAL_DIR
    hook_dir.mkdir(parents=True)
    (hook_dir / SEAL_MODULE_FILE).write_bytes(seal_hook_source())
    return hook_dir


def engine_python(tmp_path: Path, cache_dir: Path, calls: list[dict[str, object]]) -> tuple[list[object], str]:
    """Run ``calls`` in a fresh Python with only the shipped module on its path; (results, stderr)."""
    hook_dir = ship(tmp_path) if not (tmp_path / "private-tmp").exists() else tmp_path / "private-tmp" / SEAL_DIR
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(hook_dir),
        "PYTHONDONTWRITEBYTECODE": "1",
        "TRITON_CACHE_MANAGER": SEAL_MANAGER,
        "TRITON_CACHE_DIR": str(cache_dir),
        "TMPDIR": str(tmp_path / "private-tmp"),
        "HOME": str(tmp_path / "home"),
    }
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(calls)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert results[-1] == [], "the module imported bless: the engine's Python has none"
    return results[:-1], done.stderr


def blessed_tree(root: Path, kernel: str = "fused_moe_kernel") -> Path:
    """A Triton cache holding one compiled kernel under KEY, as Triton's FileCacheManager writes it."""
    key_dir = root / KEY
    key_dir.mkdir(parents=True)
    children = {}
    for suffix in ("json", "cubin", "ptx"):
        path = key_dir / f"{kernel}.{suffix}"
        path.write_bytes(f"{kernel} {suffix}".encode())
        children[path.name] = str(path)
    (key_dir / f"__grp__{kernel}.json").write_text(json.dumps({"child_paths": children}))
    return key_dir


def listing(root: Path) -> list[tuple[str, int, int]]:
    """Every entry under ``root`` with its size and mtime (ns): a lookup must change none of it."""
    return sorted(
        (path.relative_to(root).as_posix(), path.lstat().st_size, path.lstat().st_mtime_ns)
        for path in [root, *root.rglob("*")]
    )


def test_a_lookup_the_blessed_tree_answers_is_a_hit_and_reports_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    key_dir = blessed_tree(cache)
    results, stderr = engine_python(
        tmp_path,
        cache,
        [
            {"key": KEY, "method": "get_group", "args": ["fused_moe_kernel.json"]},
            {"key": KEY, "method": "get_file", "args": ["fused_moe_kernel.cubin"]},
        ],
    )
    group, file = results
    assert group == {name: str(key_dir / name) for name in ("fused_moe_kernel.json", "fused_moe_kernel.cubin",
                                                             "fused_moe_kernel.ptx")}  # fmt: skip
    assert file == str(key_dir / "fused_moe_kernel.cubin")
    assert LINE_PREFIX not in stderr


def test_a_miss_writes_one_line_naming_the_kernel_and_creates_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    blessed_tree(cache)
    before = listing(cache)
    t0 = time.time()
    other_key = "Z" * 52
    results, stderr = engine_python(
        tmp_path, cache, [{"key": other_key, "method": "get_group", "args": ["fused_moe_kernel.json"]}]
    )
    assert results == [None]
    lines = [line for line in stderr.splitlines() if line.startswith(LINE_PREFIX)]
    assert len(lines) == 1, stderr
    event = json.loads(lines[0][len(LINE_PREFIX) :])
    assert list(event) == ["event", "source", "kernel", "key", "file", "time"]
    assert event["event"] == "unproven_compile" and event["source"] == "triton-cache-manager"
    assert (event["kernel"], event["key"], event["file"]) == ("fused_moe_kernel", other_key, "fused_moe_kernel.json")
    assert t0 <= event["time"] <= time.time()
    assert lines[0] == LINE_PREFIX + json.dumps(event, separators=(",", ":")), "compact JSON, one line"
    assert listing(cache) == before, "a lookup created the key's directory in the blessed tree"
    parsed = parse_seal_lines(stderr)
    assert [(e.source, e.kernel, e.key) for e in parsed] == [("triton-cache-manager", "fused_moe_kernel", other_key)]


def test_a_group_without_the_asked_child_is_a_miss(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    key_dir = blessed_tree(cache)
    (key_dir / "fused_moe_kernel.json").unlink()  # the metadata Triton needs is gone: it would compile
    _results, stderr = engine_python(
        tmp_path, cache, [{"key": KEY, "method": "get_group", "args": ["fused_moe_kernel.json"]}]
    )
    assert [e.kernel for e in parse_seal_lines(stderr)] == ["fused_moe_kernel"]


def test_a_read_only_tree_is_never_written_by_lookups(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    blessed_tree(cache)
    for path in [cache, *cache.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    before = listing(cache)
    try:
        _results, stderr = engine_python(
            tmp_path,
            cache,
            [
                {"key": "Q" * 52, "method": "get_file", "args": ["triton_red_fused_ge_sum_0.cubin"]},
                {"key": "Q" * 52, "method": "get_group", "args": ["triton_red_fused_ge_sum_0.json"]},
                {"key": KEY, "method": "get_group", "args": ["fused_moe_kernel.json"]},
            ],
        )
    finally:
        for path in [cache, *cache.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert listing(cache) == before
    assert [e.kernel for e in parse_seal_lines(stderr)] == ["triton_red_fused_ge_sum_0"] * 2


def test_put_writes_triton_s_layout_where_the_tree_is_writable(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    new_key = "N" * 52
    results, stderr = engine_python(
        tmp_path,
        cache,
        [
            {"key": new_key, "method": "get_group", "args": ["k.json"]},
            {"key": new_key, "method": "put", "args": ['{"name": "k"}', "k.json", False]},
            {"key": new_key, "method": "put", "args": ["cubin bytes", "k.cubin"]},
            {
                "key": new_key,
                "method": "put_group",
                "args": [
                    "k.json",
                    {"k.json": str(cache / new_key / "k.json"), "k.cubin": str(cache / new_key / "k.cubin")},
                ],
            },
            {"key": new_key, "method": "get_group", "args": ["k.json"]},
        ],
    )
    _miss, json_path, cubin_path, group_path, group = results
    key_dir = cache / new_key
    assert (json_path, cubin_path, group_path) == (
        str(key_dir / "k.json"),
        str(key_dir / "k.cubin"),
        str(key_dir / "__grp__k.json"),
    )
    assert json.loads((key_dir / "__grp__k.json").read_text()) == {
        "child_paths": {"k.json": str(key_dir / "k.json"), "k.cubin": str(key_dir / "k.cubin")}
    }
    assert sorted(p.name for p in key_dir.iterdir()) == ["__grp__k.json", "k.cubin", "k.json"], "no temp dir left"
    assert group == {"k.json": str(key_dir / "k.json"), "k.cubin": str(key_dir / "k.cubin")}
    assert len(parse_seal_lines(stderr)) == 1, "only the lookup before the compile is a miss"


def test_a_write_the_tree_refuses_spills_into_the_private_temp_dir(tmp_path: Path) -> None:
    cache = tmp_path / "cache-is-a-file"
    cache.write_text("not a directory")  # makedirs under it fails for root too, as a read-only bind would
    results, _stderr = engine_python(tmp_path, cache, [{"key": KEY, "method": "put", "args": ["x", "k.cubin"]}])
    spilled = tmp_path / "private-tmp" / "bless-seal-spill" / KEY / "k.cubin"
    assert results == [str(spilled)]
    assert spilled.read_text() == "x"


def test_override_and_dump_managers_pass_through_without_reporting(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _results, stderr = engine_python(
        tmp_path,
        cache,
        [{"key": KEY, "method": "get_file", "args": ["k.cubin"], "kwargs": {"override": True}}],
    )
    assert parse_seal_lines(stderr) == []


@pytest.mark.parametrize(
    ("filename", "kernel"),
    [
        ("fused_moe_kernel.json", "fused_moe_kernel"),
        ("__grp__fused_moe_kernel.json", "fused_moe_kernel"),
        ("cuda_utils.so", "cuda_utils"),
        ("triton_red_fused_ge_sum_0.cubin", "triton_red_fused_ge_sum_0"),
    ],
)
def test_the_kernel_is_named_from_the_file(filename: str, kernel: str) -> None:
    assert bless_seal.kernel_name(filename) == kernel


def test_the_prefix_the_engine_writes_is_the_one_serve_full_reads() -> None:
    assert bless_seal.LINE_PREFIX == LINE_PREFIX


def test_the_module_imports_nothing_but_the_standard_library() -> None:
    source = Path(bless_seal.__file__).read_text(encoding="utf-8")
    imported = {
        line.split()[1].split(".")[0]
        for line in source.splitlines()
        if line.startswith(("import ", "from ")) and not line.startswith("from __future__")
    }
    assert imported <= set(sys.stdlib_module_names), imported


def test_the_reference_engine_s_shape_buckets_hit_what_its_bootstrap_wrote_and_report_a_new_bucket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The reference engine's lazy kernels (Triton's calling convention): written by its own manager, as a
    bootstrap does, then looked up through bless's as a sealed serve does."""
    from bless.engines.reference_engine.lazy import FileCacheManager, ShapeKernels

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "jit" / "triton"))
    bootstrap = ShapeKernels((8, 16, 32), "artifact", manager=FileCacheManager)
    assert [bootstrap.ensure(n) for n in (3, 12)] == ["compiled", "compiled"]
    capfd.readouterr()
    serving = ShapeKernels((8, 16, 32), "artifact", manager=bless_seal.SealedCacheManager)
    assert [serving.ensure(n) for n in (5, 16)] == ["loaded", "loaded"]
    assert parse_seal_lines(capfd.readouterr().err) == []
    assert serving.ensure(30) == "compiled"  # bucket 32: never compiled by the bootstrap
    events = parse_seal_lines(capfd.readouterr().err)
    assert [(e.kernel, e.key) for e in events] == [("reference_bucket_32", serving.kernel_key(32))]
