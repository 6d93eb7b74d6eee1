#!/usr/bin/env python3
"""Benchmark the fleet path (not a test): bless pull vs skopeo copy, rebless transfer, sign/verify cost.

Side by side, in one run, against a real loopback registry (Debian's docker-registry, started here on
a free port with a temp storage dir; ``skopeo`` is Debian's too; scripts/setup.sh installs both):

1. **pull**: a synthetic blessing of ``--size-gib`` (one file of half the size, the rest over
   ``--files`` files of varied sizes in nested dirs) is pushed once, then pulled ``--repeat`` times,
   alternating which goes first, by ``bless pull`` (the same code as the CLI: every blob hashed while it
   streams, then the store's atomic publish, which hashes the tree again to commit exactly what it
   checked) into an empty store, and by ``skopeo copy docker://... oci:DIR`` (a local OCI layout, no
   bless-level verification). Median wall time, MB/s, and the ratio bless/skopeo throughput.
2. **rebless**: ``--changed`` (default 5%) of the files get new bytes; the rebless is pushed, then
   pulled by a host holding the first version. Bytes uploaded and downloaded, against a full transfer
   (what a one-archive layout would move).
3. **sign / verify with trust** of a ``--sign-files``-file blessing (default 2,000): ``bless sign``'s
   work (targets, snapshot, timestamp) and the TUF check ``--trust`` adds (python-tuf's client over the
   host's trusted metadata), median of ``--repeat``; the byte verification itself is not included.

Usage:
    python3 scripts/bench/bench_fleet.py                    # 1 GiB
    python3 scripts/bench/bench_fleet.py --size-gib 0.25    # quicker
    python3 scripts/bench/bench_fleet.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Runnable from a checkout without installing the package.
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bless.core.factors import config_hash  # noqa: E402
from bless.core.manifest import Manifest, cache_tree_from_listing, default_provenance  # noqa: E402
from bless.core.verify import hash_tree  # noqa: E402
from bless.flows.pull import pull_blessing  # noqa: E402
from bless.flows.push import push_blessing  # noqa: E402
from bless.oci.client import parse_reference  # noqa: E402
from bless.store import Store  # noqa: E402
from bless.system.clock import utc_now  # noqa: E402
from bless.trust import KeySources, check_blessing, init_repository, sign_blessing  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30

#: The benchmark's file keys, encrypted as bless trust init writes them (their load is part of a signing).
BENCH_KEYS = KeySources(passphrase=b"bench passphrase")


def factors() -> dict[str, Any]:
    return {
        "factors_version": 1,
        "engine": {"name": "reference", "version": "0.1.0"},
        "runtime": {"kind": "local"},
        "model": {"id": "bench", "revision": "0" * 40},
        "serve": {"max_num_seqs": 1},
        "env": {},
        "hardware": {"gpu": "cpu", "count": 0},
        "cache": {"mount_path": "/cache"},
    }


def manifest_for(tree: Path, dir_id: str) -> Manifest:
    chosen = factors()
    listing = hash_tree(tree)
    return Manifest(
        config_hash=config_hash(chosen),
        factors=chosen,
        created=utc_now(),
        tool_version="0.1.0",
        profile_name="bench",
        cache=cache_tree_from_listing(listing, mount_path="/cache", dir_id=dir_id),
        artifacts={"items": []},
        trials={"planned": 1, "passed": 1, "results": [{"index": 1, "passed": True, "reasons": []}]},
        golden=[{"prompt": "p", "max_tokens": 1, "text": "x", "token_ids": [1]}],
        provenance=default_provenance("local"),
    )


def write_random(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        left = size
        while left:
            step = min(left, 8 * MIB)
            handle.write(os.urandom(step))
            left -= step


def make_tree(root: Path, total: int, files: int, seed: int) -> list[Path]:
    """One file of half the bytes, the rest spread over ``files - 1`` files of varied sizes."""
    rng = random.Random(seed)
    write_random(root / "big.bin", total // 2)
    weights = [rng.uniform(0.2, 1.8) for _ in range(files - 1)]
    scale = (total - total // 2) / sum(weights)
    paths = [root / "big.bin"]
    for index, weight in enumerate(weights):
        path = root / f"d{index % 16:02d}" / f"f{index:05d}.bin"
        write_random(path, max(1, int(weight * scale)))
        paths.append(path)
    return paths


def start_registry(workdir: Path) -> tuple[str, subprocess.Popen[bytes]]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    host = f"127.0.0.1:{port}"
    config = workdir / "registry.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {workdir / 'registry'}\nhttp:\n  addr: {host}\n"
    )
    binary = shutil.which("docker-registry") or shutil.which("registry")
    if binary is None:
        sys.exit("docker-registry is not installed (scripts/setup.sh installs it)")
    process = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import urllib.request

    for _ in range(200):
        try:
            urllib.request.urlopen(f"http://{host}/v2/", timeout=1).close()
            return host, process
        except OSError:
            time.sleep(0.05)
    process.kill()
    sys.exit("the registry did not start")


def timed(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def remove(path: Path) -> None:
    if path.exists():
        subprocess.run(["chmod", "-R", "u+w", str(path)], check=False)
        shutil.rmtree(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--changed", type=float, default=0.05)
    parser.add_argument("--sign-files", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        sys.exit("skopeo is not installed (scripts/setup.sh installs it)")
    total = int(args.size_gib * GIB)
    work = Path(tempfile.mkdtemp(prefix="bless-bench-fleet-"))
    results: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}",
        "size_bytes": total,
        "files": args.files,
    }
    host, registry = start_registry(work)
    try:
        origin = Store(work / "origin")
        tree = work / "tree"
        paths = make_tree(tree, total, args.files, seed=1)
        first = manifest_for(tree, "20250101T000000Z-aaaaaaaaaaaa")
        origin.publish(tree, first)
        ref = parse_reference(f"{host}/bench/blessing:v1")
        push_s = timed(lambda: push_blessing(origin, first, ref))
        results["push_s"] = round(push_s, 3)

        bless_times: list[float] = []
        skopeo_times: list[float] = []
        for attempt in range(args.repeat):

            def bless_pull(attempt: int = attempt) -> None:
                target = work / f"host-{attempt}"
                bless_times.append(timed(lambda: pull_blessing(Store(target), ref)))
                remove(target)

            def skopeo_copy(attempt: int = attempt) -> None:
                layout = work / f"layout-{attempt}"
                command = [skopeo, "copy", "--src-tls-verify=false", f"docker://{host}/bench/blessing:v1"]
                command.append(f"oci:{layout}:v1")
                skopeo_times.append(timed(lambda: subprocess.run(command, check=True, capture_output=True)))
                remove(layout)

            order = (bless_pull, skopeo_copy) if attempt % 2 == 0 else (skopeo_copy, bless_pull)
            for run in order:
                run()
        bless_s, skopeo_s = statistics.median(bless_times), statistics.median(skopeo_times)
        results["pull"] = {
            "bless_s": [round(t, 3) for t in bless_times],
            "skopeo_s": [round(t, 3) for t in skopeo_times],
            "bless_mb_s": round(total / bless_s / 1e6, 1),
            "skopeo_mb_s": round(total / skopeo_s / 1e6, 1),
            "ratio_bless_over_skopeo_throughput": round(skopeo_s / bless_s, 3),
        }

        # Rebless: a share of the files get new bytes.
        holder = Store(work / "holder")
        pull_blessing(holder, ref)
        rng = random.Random(2)
        small = paths[1:]
        changed = rng.sample(small, max(1, int(len(small) * args.changed)))
        tree2 = work / "tree2"
        shutil.copytree(tree, tree2)
        for path in changed:
            target = tree2 / path.relative_to(tree)
            write_random(target, target.stat().st_size)
        second = manifest_for(tree2, "20250102T000000Z-bbbbbbbbbbbb")
        origin.publish(tree2, second)
        pushed = push_blessing(origin, second, ref)
        pulled = pull_blessing(holder, ref)
        full = second.cache.total_size
        results["rebless"] = {
            "files_changed": len(changed),
            "bytes_changed": sum((tree2 / p.relative_to(tree)).stat().st_size for p in changed)
            if tree2.exists()
            else None,
            "full_bytes": full,
            "push_bytes": pushed.bytes_uploaded,
            "pull_bytes": pulled.bytes_downloaded,
            "push_share": round(pushed.bytes_uploaded / full, 4),
            "pull_share": round(pulled.bytes_downloaded / full, 4),
        }
    finally:
        registry.terminate()
        registry.wait(timeout=10)

    # Sign and verify-with-trust of a many-file blessing (the byte verification is not included).
    sign_root = work / "sign"
    many = sign_root / "tree"
    for index in range(args.sign_files):
        path = many / f"d{index % 40:02d}" / f"f{index:05d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(index.to_bytes(4, "big") * 16)
    store = Store(sign_root / "store")
    manifest = manifest_for(many, "20250103T000000Z-cccccccccccc")
    store.publish(many, manifest)
    keys = sign_root / "keys"
    init_repository(keys, sources=BENCH_KEYS)
    trust = sign_root / "host-trust"
    trust.mkdir()
    shutil.copy(keys / "metadata" / "root.json", trust / "root.json")
    sign_times: list[float] = []
    verify_times: list[float] = []

    def stored_bytes() -> bytes:
        """The manifest's bytes as bless sign and bless verify --trust get them: the store's lookup."""
        live = store.live(manifest.config_hash)
        assert live is not None
        return live.document

    def sign() -> None:
        sign_blessing(keys, manifest, stored_bytes(), sources=BENCH_KEYS)

    def verify() -> None:
        check_blessing(
            manifest,
            stored_bytes(),
            trust_dir=keys / "metadata",
            state_dir=store.paths.trust,
            lock_path=store.paths.trust_lock,
        )

    for _ in range(args.repeat):
        sign_times.append(timed(sign))
        verify_times.append(timed(verify))
    results["sign_verify"] = {
        "files": args.sign_files,
        "manifest_bytes": len(manifest.to_json_bytes()),
        "sign_ms": round(statistics.median(sign_times) * 1000, 1),
        "verify_trust_ms": round(statistics.median(verify_times) * 1000, 1),
    }
    remove(work)

    if args.json:
        print(json.dumps(results, indent=2))
    else:
        pull = results["pull"]
        rebless = results["rebless"]
        sv = results["sign_verify"]
        print(f"machine: {results['machine']}")
        print(f"blessing: {total / GIB:.2f} GiB over {args.files} files; push {results['push_s']} s")
        print(
            f"pull (median of {args.repeat}): bless {pull['bless_mb_s']} MB/s vs skopeo {pull['skopeo_mb_s']} MB/s "
            f"-> {pull['ratio_bless_over_skopeo_throughput']}x (bless {pull['bless_s']} s, skopeo {pull['skopeo_s']} s)"
        )
        print(
            f"rebless ({rebless['files_changed']} files changed): push {rebless['push_bytes']} B "
            f"({rebless['push_share']:.1%} of {rebless['full_bytes']}), pull {rebless['pull_bytes']} B "
            f"({rebless['pull_share']:.1%})"
        )
        print(
            f"{sv['files']}-file blessing ({sv['manifest_bytes']} B manifest): sign {sv['sign_ms']} ms, "
            f"verify with --trust {sv['verify_trust_ms']} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
