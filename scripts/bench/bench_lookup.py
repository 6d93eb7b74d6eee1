#!/usr/bin/env python3
"""Benchmark a manifest lookup next to one huge unrelated manifest (not a test).

Builds a store under --dir (default: a temp dir, removed at the end) with one small blessing and
one legal manifest of --entries file entries (default 100,000) for another config hash, written
straight into the manifests dir (its tree is never read: only the manifest matters here). Then, in
one run and side by side, median of --repeat:

* ``validate every manifest``: what every lookup did before the index (``Store.index()``: parse
  and schema-validate each file), the baseline;
* ``find, cold``: ``Store.find(small)`` with the claim cache removed first (the big file's claim is
  read, not schema-validated);
* ``find, warm``: ``Store.find(small)`` again (the big file is not opened);
* ``list, first`` / ``list, again``: ``Store.listing()`` (``bless list``) with the claim cache
  removed first (every file validated once) and then again (a file validated before and unchanged
  is not opened);
* ``find the big one``: ``Store.find(big)``, what show, verify and gc do before their own work
  (the big file read and validated).

Usage:
    python3 scripts/bench/bench_lookup.py                  # 100k entries
    python3 scripts/bench/bench_lookup.py --entries 1000000
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bless.core.factors import config_hash
from bless.core.manifest import Manifest, cache_tree_from_listing, default_provenance
from bless.core.verify import FileEntry, TreeListing, hash_tree
from bless.store import Store
from bless.system.clock import utc_now


def factors(name: str) -> dict[str, object]:
    return {
        "factors_version": 1,
        "engine": {"name": "reference", "version": "0.1.0"},
        "runtime": {"kind": "local"},
        "model": {"id": name, "revision": "0123456789abcdef0123456789abcdef01234567"},
        "serve": {"max_num_seqs": 1},
        "env": {},
        "hardware": {"gpu": "cpu", "count": 0},
        "cache": {"mount_path": "/cache"},
    }


def manifest_for(listing: TreeListing, name: str) -> Manifest:
    chosen = factors(name)
    return Manifest(
        config_hash=config_hash(chosen),
        factors=chosen,
        created=utc_now(),
        tool_version="0.1.0",
        profile_name=name,
        cache=cache_tree_from_listing(listing, mount_path="/cache"),
        artifacts={"items": []},
        trials={"planned": 1, "passed": 1, "results": [{"index": 1, "passed": True, "reasons": []}]},
        golden=[{"prompt": "hi", "max_tokens": 1, "text": "a", "token_ids": [97]}],
        provenance=default_provenance("local"),
    )


def median_s(action: Callable[[], object], repeat: int, before: Callable[[], None] = lambda: None) -> float:
    times = []
    for _ in range(repeat):
        before()
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path)
    args = parser.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="bless-bench-lookup-"))
    try:
        store = Store(base / "root")
        tree = store.new_staging_dir("small") / "cache"
        tree.mkdir()
        (tree / "a.bin").write_bytes(b"a")
        small = manifest_for(hash_tree(tree), "small")
        store.publish(tree, small)
        digest = hashlib.sha256(b"x").hexdigest()
        files = tuple(
            sorted((FileEntry(f"d{i % 1000}/f{i}.bin", 1, digest) for i in range(args.entries)), key=lambda f: f.path)
        )
        dirs = tuple(sorted({f"d{i % 1000}" for i in range(args.entries)}))
        big = manifest_for(TreeListing(files=files, dirs=dirs, total_size=args.entries), "big")
        big_path = store.manifests_dir / f"{big.config_hash}.json"
        big_path.write_bytes(big.to_json_bytes())
        print(f"big manifest: {args.entries} entries, {big_path.stat().st_size / 1e6:.1f} MB", file=sys.stderr)

        def drop_cache() -> None:
            for cache in (store.root / "state").glob("claims-*.json"):
                cache.unlink()

        baseline = median_s(lambda: Store(store.root).index().require_all_valid(), args.repeat)
        cold = median_s(lambda: Store(store.root).find(small.config_hash), args.repeat, before=drop_cache)
        Store(store.root).find(small.config_hash)
        warm = median_s(lambda: Store(store.root).find(small.config_hash), args.repeat)
        list_first = median_s(lambda: Store(store.root).listing(), args.repeat, before=drop_cache)
        Store(store.root).listing()
        list_again = median_s(lambda: Store(store.root).listing(), args.repeat)
        find_big = median_s(lambda: Store(store.root).find(big.config_hash), args.repeat)
        cpu = platform.processor() or platform.machine()
        print(f"machine: {os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}")
        print(f"validate every manifest (before): {baseline:8.3f} s")
        print(f"find, cold claim cache:           {cold:8.3f} s  ({baseline / cold:6.0f}x faster)")
        print(f"find, warm claim cache:           {warm:8.3f} s  ({baseline / warm:6.0f}x faster)")
        print(f"list, first (validates all):      {list_first:8.3f} s")
        print(f"list, again (claim cache):        {list_again:8.3f} s  ({baseline / list_again:6.0f}x faster)")
        print(f"find the big one (show/verify):   {find_big:8.3f} s")
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
