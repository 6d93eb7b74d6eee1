"""Helpers for store tests: small real trees and valid manifests built from them.

Reusable by other tests (``from tests.unit.store_helpers import ...``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from bless.core.factors import config_hash
from bless.core.manifest import Manifest, cache_tree_from_listing, default_provenance
from bless.core.verify import hash_tree
from bless.store import Store
from bless.system.clock import utc_now

REPO_ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).resolve().parent / "store_child.py"

# Two serve seeds whose config hashes share their first 8 hex digits (found by a birthday search
# over make_factors(seed=i)); used to test an ambiguous live_prefix. The test asserts they still do.
PREFIX_TWINS = (24726, 25337)


def make_factors(name: str = "tiny", seed: int = 0) -> dict[str, Any]:
    """A complete factor set (factors_version 1 and every required section)."""
    return {
        "factors_version": 1,
        "engine": {"name": "reference", "version": "0.1.0"},
        "runtime": {"kind": "local"},
        "model": {"id": name, "revision": "0123456789abcdef0123456789abcdef01234567"},
        "serve": {"max_num_seqs": 1, "seed": seed},
        "env": {},
        "hardware": {"gpu": "cpu", "count": 0},
        "cache": {"mount_path": "/cache"},
    }


def write_tree(root: Path, variant: str = "a") -> Path:
    """Write a small cache tree: a few files, a nested dir, an empty dir. Content depends on variant."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "artifact.bin").write_bytes(b"\x00\x01compiled-" + variant.encode() * 300)
    (root / "nested" / "deep").mkdir(parents=True, exist_ok=True)
    (root / "nested" / "index.json").write_text(f'{{"variant": "{variant}"}}\n')
    (root / "nested" / "deep" / "kernel.so").write_bytes(variant.encode() * 1000)
    (root / "nested" / "zero.txt").write_bytes(b"")
    (root / "empty").mkdir(exist_ok=True)
    return root


def make_manifest(
    tree: Path,
    factors: Mapping[str, Any] | None = None,
    *,
    dir_id: str | None = None,
    created: str | None = None,
) -> Manifest:
    """A valid manifest for the tree as it is on disk now (one trial result, one golden item)."""
    factors = dict(factors) if factors is not None else make_factors()
    listing = hash_tree(tree)
    return Manifest(
        config_hash=config_hash(factors),
        factors=factors,
        created=created or utc_now(),
        tool_version="0.1.0",
        profile_name="tiny-test",
        cache=cache_tree_from_listing(listing, mount_path="/cache", dir_id=dir_id),
        artifacts={"items": ["artifact.bin"]},
        trials={"planned": 1, "passed": 1, "results": [{"index": 1, "passed": True, "reasons": []}]},
        golden=[{"prompt": "hello", "max_tokens": 4, "text": "abcd", "token_ids": [97, 98, 99, 100]}],
        provenance=default_provenance("local"),
    )


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a child Python that imports bless from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def run_child(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    """Run tests/unit/store_child.py with args and wait for it."""
    return subprocess.run(
        [sys.executable, str(CHILD), *args],
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_child(*args: str, **env: str) -> subprocess.Popen[str]:
    """Start tests/unit/store_child.py with args; stdout is a pipe the caller reads."""
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        env=child_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def paths_of(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (keys and list indexes) inside a JSON value, the value itself first: what fuzz tests mutate."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths_of(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths_of(item, (*prefix, index))
    return found


def mutate_json(document: Any, data: st.DataObject, values: st.SearchStrategy[Any]) -> None:
    """Fuzz one place of ``document`` in place: a drawn path (not the root) deleted, or set to a drawn value."""
    target = data.draw(st.sampled_from(paths_of(document)[1:]), label="path")
    parent: Any = document
    for key in target[:-1]:
        parent = parent[key]
    if data.draw(st.booleans(), label="delete"):
        del parent[target[-1]]
    else:
        parent[target[-1]] = data.draw(values, label="value")


@contextmanager
def held_lease(store: Store, manifest: Manifest, *, name: str, serve_dir: Path | None = None) -> Iterator[None]:
    """A serving lease on ``manifest``'s blessed version for the ``with`` body, this process its holder."""
    lease = store.leases.acquire(manifest.config_hash, manifest.cache.dir_id, name=name, serve_dir=serve_dir)
    try:
        yield
    finally:
        store.leases.release(lease)
