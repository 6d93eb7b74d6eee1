#!/usr/bin/env python3
"""Benchmark: `bless run --parallel N` against `--parallel 1`, side by side in one run.

For each pair, the same profile is blessed twice into throw-away store roots, once with
``--parallel 1`` and once with ``--parallel N`` (the order alternates between pairs), K trials
each. Reported per run: the process wall time, bless's own wall time, and the wall time of
phase 2 (the K trials, which is what --parallel shortens; the bootstrap compile is the same
in both). Ratios are parallel / serial, per pair, then the median. A first, untimed run warms
the interpreter's bytecode and the driver so neither side pays for it.

    python3 scripts/bench/bench_parallel.py [--profile P] [--trials 4] [--parallel 2] [--pairs 1] [--json]

Goal (issue 12, 2 GPUs): K=4 trials with --parallel 2 take <= 0.6x the wall time of --parallel 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GOAL_RATIO = 0.6


def gpus() -> list[str]:
    """nvidia-smi's GPU list (index, name, UUID), empty without one."""
    if shutil.which("nvidia-smi") is None:
        return []
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,name,uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def machine() -> dict[str, Any]:
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {"nproc": os.cpu_count(), "cpu": model, "python": platform.python_version(), "gpus": gpus()}


def bless_run(
    profile: str, trials: int, parallel: int, keep: Path | None, evidence: Path | None = None
) -> dict[str, Any]:
    """One `bless run` into a fresh root; its timings. ``evidence``: keep its JSON result and manifest there."""
    root = Path(tempfile.mkdtemp(prefix=f"bless-bench-p{parallel}-"))
    try:
        started = time.monotonic()
        # The `bless run` process on purpose: its wall time (start-up included) is what is measured.
        proc = subprocess.run(
            [sys.executable, "-m", "bless.cli.main", "--root", str(root), "run", "--profile", profile,
             "--trials", str(trials), "--parallel", str(parallel), "--json"],
            cwd=REPO, capture_output=True, text=True, check=False,
        )  # fmt: skip
        process_wall = time.monotonic() - started
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            (keep / f"p{parallel}-{int(started)}.stderr").write_text(proc.stderr)
        if proc.returncode != 0:
            raise SystemExit(f"bless run --parallel {parallel} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        result: dict[str, Any] = json.loads(proc.stdout)
        if evidence is not None:
            evidence.mkdir(parents=True, exist_ok=True)
            (evidence / f"run-parallel{parallel}.json").write_text(proc.stdout)
            (evidence / f"run-parallel{parallel}.stderr").write_text(proc.stderr)
            shutil.copyfile(result["manifest_path"], evidence / f"manifest-parallel{parallel}.json")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    candidate = result["candidates"][-1]
    return {
        "parallel": parallel,
        "process_wall_s": round(process_wall, 2),
        "run_wall_s": result["wall_seconds"],
        "trials_wall_s": candidate["trials_seconds"],
        "bootstrap_ready_s": candidate["bootstrap"].get("start_to_ready_s"),
        "trials": [
            {"index": t["index"], "gpus": [g["index"] for g in t["gpus"]], "start_to_ready_s": t["start_to_ready_s"]}
            for t in candidate["trials"]
        ],
        "slots": result.get("slots"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default=str(REPO / "profiles" / "reference-cuda-local.toml"))
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed first run")
    parser.add_argument("--logs", type=Path, help="keep each run's stderr here")
    parser.add_argument("--evidence", type=Path, help="keep the first pair's results and manifests here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    warmup = None
    if not args.no_warmup:
        print("warm-up run (untimed): bytecode, driver, caches outside the blessing ...", file=sys.stderr)
        warmup = bless_run(args.profile, 1, 1, args.logs)
    pairs = []
    for index in range(args.pairs):
        order = (1, args.parallel) if index % 2 == 0 else (args.parallel, 1)
        runs = {}
        for parallel in order:
            print(f"pair {index + 1}/{args.pairs}: --parallel {parallel}, K={args.trials} ...", file=sys.stderr)
            runs[parallel] = bless_run(
                args.profile, args.trials, parallel, args.logs, args.evidence if index == 0 else None
            )
        serial, parallel_run = runs[1], runs[args.parallel]
        pairs.append(
            {
                "order": list(order),
                "serial": serial,
                "parallel": parallel_run,
                "trials_ratio": round(parallel_run["trials_wall_s"] / serial["trials_wall_s"], 3),
                "run_ratio": round(parallel_run["run_wall_s"] / serial["run_wall_s"], 3),
            }
        )
    summary = {
        "machine": machine(),
        "profile": args.profile,
        "trials": args.trials,
        "parallel": args.parallel,
        "warmup": warmup,
        "pairs": pairs,
        "median_trials_ratio": statistics.median(p["trials_ratio"] for p in pairs),
        "median_run_ratio": statistics.median(p["run_ratio"] for p in pairs),
        "goal_ratio": GOAL_RATIO,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    mach = summary["machine"]
    print(f"machine: {mach['nproc']} cores, {mach['cpu']}; GPUs: {'; '.join(mach['gpus']) or 'none'}")
    print(f"{'pair':<5} {'run':<14} {'trials wall s':>14} {'run wall s':>11} {'process s':>10}")
    for number, pair in enumerate(pairs, 1):
        for key in ("serial", "parallel"):
            run = pair[key]
            label = f"--parallel {run['parallel']}"
            print(f"{number:<5} {label:<14} {run['trials_wall_s']:>14.2f} {run['run_wall_s']:>11.2f} "
                  f"{run['process_wall_s']:>10.2f}")  # fmt: skip
        print(f"      ratio (parallel/serial): trials {pair['trials_ratio']:.3f}, whole run {pair['run_ratio']:.3f}")
    print(
        f"median ratio: trials {summary['median_trials_ratio']:.3f}, whole run {summary['median_run_ratio']:.3f} "
        f"(goal <= {GOAL_RATIO} for the K trials)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
