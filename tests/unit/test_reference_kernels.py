"""The reference engine keeps the C++ kernels it compiles in its artifact, and a load uses them: no compiler runs.

Real torch.compile (Inductor's C++ backend) in child processes, with a compiler wrapper on ``CXX`` that logs
each call before running the real one: a cold boot builds kernels (the wrapper is called) and saves them
beside the Mega-Cache, listed with their sha256 in meta.json; a warm boot in a fresh Inductor dir loads the
artifact, copies the kernels in, and never calls the compiler. Kernels that do not match meta.json are not
copied (all or none): Inductor then builds them, as every load did before the kernels were kept.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    _MISSING = f"torch not installed ({exc}); scripts/setup.sh installs its CPU build into .venv"
    if os.environ.get("BLESS_REQUIRE_TORCH") == "1":
        raise ImportError(_MISSING) from exc
    pytest.skip(_MISSING, allow_module_level=True)

from bless.engines.reference_engine import markers
from bless.engines.reference_engine.artifact import (
    KERNELS_DIR,
    META_FILE,
    ArtifactPaths,
    artifact_key,
    build_meta,
    loaded_kernels,
    restore_kernels,
    write_artifact,
)
from bless.engines.reference_engine.model import ModelArgs

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("reference_boot_child.py")


def compiler_wrapper(directory: Path) -> tuple[Path, Path]:
    """A ``CXX`` that appends its arguments to a log, then runs the real compiler: (wrapper, log)."""
    real = shutil.which("g++") or shutil.which("c++")
    if real is None:
        pytest.skip("no C++ compiler on this host (Inductor's CPU backend needs one)")
    log = directory / "compiler-calls.log"
    wrapper = directory / "g++"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, log


def builds(log: Path) -> list[str]:
    """The compiler calls that built something (not ``--version`` probes)."""
    calls = log.read_text().splitlines() if log.exists() else []
    return [call for call in calls if " -o " in f" {call} "]


def boot(inductor_dir: Path, cache_dir: Path, wrapper: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "CXX": str(wrapper),
        "PYTHONPATH": str(REPO),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",  # compile in the child itself: one process tree, one log
        "TMPDIR": str(inductor_dir.parent),  # nothing of another run's temp dir (precompiled headers)
    }
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(inductor_dir), str(cache_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_a_warm_boot_loads_the_artifact_s_kernels_and_runs_no_compiler(tmp_path: Path) -> None:
    wrapper, log = compiler_wrapper(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()

    cold = boot(tmp_path / "cold" / "inductor", cache, wrapper)
    assert cold["loaded"] is False and cold["saved"] is True
    assert builds(log), "the cold boot compiled C++ kernels"
    (meta_path,) = cache.rglob(META_FILE)
    meta = json.loads(meta_path.read_text())
    kernels = meta["kernels"]
    assert kernels, "the artifact keeps the kernel libraries the compile loaded"
    for relative, entry in kernels.items():
        kept = meta_path.parent / KERNELS_DIR / relative
        assert kept.is_file() and kept.stat().st_size == entry["size"]

    log.unlink()
    warm = boot(tmp_path / "warm" / "inductor", cache, wrapper)
    assert warm["loaded"] is True and warm["saved"] is False
    assert f"{markers.KERNELS_RESTORED}{len(kernels)}" in warm["markers"]
    assert builds(log) == [], "a warm boot must load the kept kernels, not build them"
    for relative in kernels:
        assert (tmp_path / "warm" / "inductor" / relative).read_bytes() == (
            meta_path.parent / KERNELS_DIR / relative
        ).read_bytes()


def test_kernels_are_copied_all_or_none_and_only_when_they_match_meta(tmp_path: Path) -> None:
    key = artifact_key(ModelArgs(), "cpu", "t")
    paths = ArtifactPaths.under(tmp_path / "cache", key)
    kernels = {"ab/cab.main.so": b"kernel one", "cd/ccd.main.so": b"kernel two"}
    meta = build_meta(key, ModelArgs(), "cpu", "t", b"mega", poisoned=False, kernels=kernels)
    write_artifact(paths, b"mega", meta, kernels)
    assert sorted(meta["kernels"]) == sorted(kernels)

    inductor = tmp_path / "inductor"
    assert restore_kernels(paths, meta, inductor) == 2
    assert {p.relative_to(inductor).as_posix(): p.read_bytes() for p in inductor.rglob("*.so")} == kernels

    # One kept kernel altered (or gone): none is copied, the engine says why, and Inductor builds them.
    (paths.directory / KERNELS_DIR / "cd" / "ccd.main.so").write_bytes(b"kernel 2")
    elsewhere = tmp_path / "elsewhere"
    assert "cd/ccd.main.so does not match the sha256/size" in str(restore_kernels(paths, meta, elsewhere))
    (paths.directory / KERNELS_DIR / "cd" / "ccd.main.so").unlink()
    assert "unreadable" in str(restore_kernels(paths, meta, elsewhere))
    assert not elsewhere.exists()
    # A listed path that could leave Inductor's dir, or a kernel list that is not an object: refused.
    for bad in ({"../x.so": meta["kernels"]["ab/cab.main.so"]}, ["ab/cab.main.so"]):
        assert isinstance(restore_kernels(paths, {**meta, "kernels": bad}, elsewhere), str)
    assert not elsewhere.exists()
    # An artifact saved before kernels were kept lists none: nothing to copy, Inductor builds them.
    assert restore_kernels(paths, {k: v for k, v in meta.items() if k != "kernels"}, elsewhere) == 0


def test_loaded_kernels_reads_only_libraries_under_the_inductor_dir(tmp_path: Path) -> None:
    inductor = tmp_path / "inductor"
    (inductor / "ab").mkdir(parents=True)
    (inductor / "ab" / "cabc.main.so").write_bytes(b"kernel")
    (inductor / "ab" / "cabc.main.cpp").write_bytes(b"source")
    maps = tmp_path / "maps"
    maps.write_text(
        f"7f00-7f01 r-xp 00000000 08:01 1 {inductor}/ab/cabc.main.so\n"
        f"7f01-7f02 r--p 00000000 08:01 1 {inductor}/ab/cabc.main.so\n"
        f"7f02-7f03 r-xp 00000000 08:01 2 {inductor}/ab/cabc.main.cpp\n"
        "7f03-7f04 r-xp 00000000 08:01 3 /usr/lib/libc.so\n"
        f"7f04-7f05 r-xp 00000000 08:01 4 {inductor}/ab/gone.main.so (deleted)\n"
        "7f05-7f06 rw-p 00000000 00:00 0 [heap]\n"
    )
    assert loaded_kernels(inductor, maps) == {"ab/cabc.main.so": b"kernel"}
    assert loaded_kernels(inductor, tmp_path / "no-such-maps") == {}
