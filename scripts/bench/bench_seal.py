#!/usr/bin/env python3
"""Benchmark sealed serving's costs on a huge engine log and a flood of misses (not a test).

Writes an engine log of --log-gb gigabytes (default 1.0) under --dir (default: a temp dir, removed at the end):
filler lines as an engine prints them, with --misses seal lines (default 300,000: what bless's Triton cache
manager writes before each compile the blessing does not hold) spread through it. Then, each in a fresh child
process (so its peak RSS is its own), the real seal watcher of the local runtime (``SealWatcher`` reading the log
through ``LocalRuntime.follow_log``, ``Seal`` under the policy ``record`` writing the evidence file and the
readiness record of a store in the temp dir) reads the whole log, in two cases:

* ``distinct keys``: every miss a kernel of its own (the worst case for the evidence file: its bound is reached);
* ``100 keys``: the same 100 kernels missed again and again (a serve meeting the same few shapes).

It prints, per case: the child's peak RSS before reading and after (``ru_maxrss``), the seconds the log took, the
evidence file's size and lines, the readiness record's size, and the distinct / repeated / dropped counts.
``--baseline`` also measures what the watcher did before it followed the log: ``runtime.logs()``, the whole log
as one string, once (its RSS grows with the log).

Usage:
    python3 scripts/bench/bench_seal.py                      # 1 GB log, 300,000 misses
    python3 scripts/bench/bench_seal.py --log-gb 0.1 --misses 30000 --baseline
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

_FILLER = (
    b"INFO 11-28 05:10:00 [engine.py:420] Avg prompt throughput: 1234.5 tokens/s, Avg generation throughput: "
    b"321.0 tokens/s, Running: 17 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 12.3%\n"
)


def _seal_line(index: int, keys: int | None) -> bytes:
    key = index if keys is None else index % keys
    event = {
        "event": "unproven_compile",
        "source": "triton-cache-manager",
        "kernel": "fused_moe_kernel",
        "key": f"{key:052d}",
        "file": "fused_moe_kernel.json",
        "time": 1764306600.0 + index,
    }
    return b"(EngineCore_DP0 pid=42) bless-seal: " + json.dumps(event, separators=(",", ":")).encode() + b"\n"


def write_log(path: Path, size: int, misses: int, keys: int | None) -> int:
    """The log: filler up to ``size`` bytes with ``misses`` seal lines spread evenly; its size."""
    fillers = max(1, (size - misses * 200) // len(_FILLER))
    every = max(1, fillers // max(1, misses))
    block = _FILLER * every
    written = 0
    with path.open("wb") as out:
        for index in range(misses):
            out.write(block)
            out.write(_seal_line(index, keys))
            written += len(block) + 200
        while written < size:
            out.write(block)
            written += len(block)
    return path.stat().st_size


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(log: Path, work: Path, baseline: bool) -> dict[str, Any]:
    """In the child: the real watcher reads the whole log once; what it cost."""
    from bless.engines import get_adapter
    from bless.flows.engine_start import EngineSession
    from bless.flows.serve.ready import mark_ready
    from bless.flows.serve.seal import Seal, SealWatcher
    from bless.runtime.base import ContainerSpec, Started
    from bless.runtime.local import LocalRuntime
    from bless.store import Store

    store = Store(work / "root")
    store.paths.ensure_layout()
    serve_dir = store.paths.serve / "bench-20261128T000000Z-000000"
    serve_dir.mkdir(parents=True)
    mark_ready(store, name="bench", config_hash="c" * 64, host="127.0.0.1", port=8000, canary="passed", holder={})
    runtime = LocalRuntime(use_mount_namespace=False)
    spec = ContainerSpec(name="bench", command=(), env={}, labels={}, log_path=log)
    started = Started(id="1", name="bench", spec=spec, host_port=None)
    rss_before = _rss_mib()
    began = time.monotonic()
    if baseline:
        text = runtime.logs(started)  # what each poll did before: the whole log, as one string
        lines = text.count("bless-seal: ")
        del text
        return {"rss_before_mib": rss_before, "rss_peak_mib": _rss_mib(), "seconds": time.monotonic() - began,
                "seal_lines": lines}  # fmt: skip
    session = EngineSession(
        runtime, spec, ready_timeout_s=0.0, request_timeout_s=0.0, stop_timeout_s=1, started=started
    )
    watcher = SealWatcher(runtime=runtime, session=session, adapter=get_adapter("reference"))
    seal = Seal(
        store=store,
        name="bench",
        serve_dir=serve_dir,
        policy="record",
        events=lambda event: None,
        stop=threading.Event(),
        config_hash="c" * 64,
    )
    polls = 0
    while True:  # one poll reads all there is (a batch at a time, as watching() hands them on); a second finds none
        batches = 0
        for batch in watcher.batches():
            seal(batch)
            batches += 1
        polls += 1
        if not batches:
            break
    watcher.close()
    evidence = seal.evidence_file
    return {
        "rss_before_mib": rss_before,
        "rss_peak_mib": _rss_mib(),
        "seconds": time.monotonic() - began,
        "polls": polls,
        "evidence_bytes": evidence.stat().st_size,
        "evidence_lines": len(evidence.read_bytes().splitlines()),
        "ready_record_bytes": store.paths.ready_file("bench").stat().st_size,
        "distinct": len(seal.seen),
        "repeats": seal.repeats,
        "dropped": seal.dropped,
    }


def run_child(log: Path, work: Path, baseline: bool) -> dict[str, Any]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    command = [sys.executable, __file__, "--child", str(log), str(work)] + (["--baseline"] if baseline else [])
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-gb", type=float, default=1.0)
    parser.add_argument("--misses", type=int, default=300_000)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--baseline", action="store_true", help="also measure reading the whole log at once")
    parser.add_argument("--child", nargs=2, metavar=("LOG", "WORK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child[0]), Path(args.child[1]), args.baseline)))
        return
    root = args.dir or Path(tempfile.mkdtemp(prefix="bless-bench-seal-"))
    root.mkdir(parents=True, exist_ok=True)
    size = int(args.log_gb * (1 << 30))
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, {platform.platform()}")
    try:
        for label, keys in (("distinct keys", None), ("100 keys", 100)):
            log = root / "engine.log"
            began = time.monotonic()
            actual = write_log(log, size, args.misses, keys)
            print(f"\n{label}: log {actual / (1 << 30):.2f} GiB with {args.misses:,} seal lines "
                  f"(written in {time.monotonic() - began:.0f} s)")  # fmt: skip
            result = run_child(log, root / "work", baseline=False)
            print(
                f"  watcher: RSS {result['rss_before_mib']:.0f} MiB before, {result['rss_peak_mib']:.0f} MiB peak; "
                f"{result['seconds']:.1f} s for the log ({result['polls']} polls)"
            )
            print(
                f"  evidence file: {result['evidence_bytes']:,} bytes, {result['evidence_lines']:,} lines; "
                f"readiness record: {result['ready_record_bytes']:,} bytes"
            )
            print(f"  distinct {result['distinct']:,}, repeats {result['repeats']:,}, dropped {result['dropped']:,}")
            if args.baseline and keys is None:
                old = run_child(log, root / "work", baseline=True)
                print(
                    f"  baseline (the whole log as one string, as each poll read it before): RSS "
                    f"{old['rss_before_mib']:.0f} MiB before, {old['rss_peak_mib']:.0f} MiB peak, "
                    f"{old['seconds']:.1f} s"
                )
            log.unlink()
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
