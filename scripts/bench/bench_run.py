#!/usr/bin/env python3
"""Benchmark: orchestration overhead of `bless run`, measured in one run.

overhead = 1 - (engine seconds / wall seconds), where engine seconds are the engine's own
start->ready, request and stop times summed over the bootstrap and every trial. Everything
else (resolution, locking, hashing the staged tree, overlay volumes, publishing) is ours.
Goal: overhead <= 10%.

    .venv/bin/python scripts/bench/bench_run.py [--profile P] [--trials K] [--json]

It blesses into a throw-away store root (a temp dir) and prints a table of phases.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default=str(REPO / "profiles" / "reference-cpu.toml"))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bless-bench-run-"))
    try:
        started = time.monotonic()
        # The `bless run` process on purpose: the overhead is measured against its whole wall time.
        proc = subprocess.run(
            [sys.executable, "-m", "bless.cli.main", "--root", str(root), "run", "--profile", args.profile,
             "--trials", str(args.trials), "--json"],
            cwd=REPO, capture_output=True, text=True, check=False,
        )  # fmt: skip
        process_wall = time.monotonic() - started
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-4000:])
            return proc.returncode
        result = json.loads(proc.stdout)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for candidate in result["candidates"]:
        boot = candidate["bootstrap"]
        rows.append(("bootstrap", boot.get("start_to_ready_s"), boot.get("request_seconds"), boot.get("stop_seconds")))
        for trial in candidate["trials"]:
            coherence = trial.get("coherence") or {}
            rows.append((f"trial {trial['index']}", trial.get("start_to_ready_s"), coherence.get("request_seconds"),
                         trial.get("stop_seconds")))  # fmt: skip
    summary = {
        "machine": {"nproc": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version()},
        "profile": args.profile,
        "trials": args.trials,
        "process_wall_s": round(process_wall, 2),
        "run_wall_s": result["wall_seconds"],
        "engine_s": result["engine_seconds"],
        "orchestration_overhead": result["orchestration_overhead"],
        "phases": [dict(zip(("phase", "start_to_ready_s", "requests_s", "stop_s"), row, strict=True)) for row in rows],
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"machine: {summary['machine']['nproc']} cores, {summary['machine']['cpu']}")
    print(f"{'phase':<12} {'start->ready s':>15} {'requests s':>11} {'stop s':>8}")
    for phase, ready, requests, stop in rows:
        print(f"{phase:<12} {ready or 0:>15.2f} {requests or 0:>11.2f} {stop or 0:>8.2f}")
    print(
        f"bless run wall {summary['run_wall_s']:.2f} s (process {process_wall:.2f} s), "
        f"engine {summary['engine_s']:.2f} s"
    )
    print(f"orchestration overhead: {summary['orchestration_overhead']:.1%} of wall (goal <= 10%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
