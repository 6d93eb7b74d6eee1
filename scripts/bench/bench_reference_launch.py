#!/usr/bin/env python3
"""Benchmark: what importing bless costs a local reference engine start, side by side in one run.

Two ways to start the same engine, each timed from spawn to its ``ready`` marker, ``--rounds`` times in
alternating order after one untimed start of each (bytecode, driver):

* ``module``: ``python3 -m bless.engines.reference_engine``, which imports the bless package (and its
  dependencies) before the engine;
* ``launcher``: ``python3 bless/engines/reference_engine/launch.py``, what a local start runs, which loads the
  engine package from its directory and imports nothing of bless.

Both start with ``--no-compile`` (no artifact needed), so the difference is the imports. Prints one JSON object:
each side's seconds and median.

    python3 scripts/bench/bench_reference_launch.py [--device cuda] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
READY = "bless-reference: ready on port "
MODEL_ARGS = ["--seed", "0", "--layers", "8", "--d-model", "1024", "--heads", "16", "--max-seq-len", "128"]
COMMANDS = {
    "module": [sys.executable, "-m", "bless.engines.reference_engine"],
    "launcher": [sys.executable, str(REPO / "bless" / "engines" / "reference_engine" / "launch.py")],
}


def start(command: list[str], device: str) -> float:
    """Seconds from spawn to the ready marker of one engine start (then it is stopped)."""
    with tempfile.TemporaryDirectory(prefix="bless-bench-launch-") as cache:
        began = time.monotonic()
        engine = subprocess.Popen(
            [*command, "--device", device, "--port", "0", "--host", "127.0.0.1", "--cache-dir", cache, "--no-compile",
             *MODEL_ARGS],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
        )  # fmt: skip
        assert engine.stdout is not None
        ready = next((line for line in engine.stdout if line.startswith(READY)), None)
        seconds = time.monotonic() - began
        engine.terminate()
        engine.wait(timeout=60)
        if ready is None:
            raise SystemExit(f"{command} exited before it was ready")
        return round(seconds, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    for command in COMMANDS.values():
        start(command, args.device)  # untimed
    seconds: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for round_index in range(args.rounds):
        order = list(COMMANDS) if round_index % 2 == 0 else list(COMMANDS)[::-1]
        for name in order:
            seconds[name].append(start(COMMANDS[name], args.device))
            print(f"round {round_index + 1}/{args.rounds}: {name} {seconds[name][-1]} s", file=sys.stderr)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    saved = round(medians["module"] - medians["launcher"], 3)
    print(json.dumps({**seconds, "median": medians, "launcher_saves_s": saved}))


if __name__ == "__main__":
    main()
