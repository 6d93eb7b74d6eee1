#!/usr/bin/env python3
"""Benchmark: the reference engine's cold vs blessed start, like for like, and where a start's time goes.

``--engine`` (default): real engine processes, started as a local start does (``reference_engine/launch.py``), timed
from spawn to the ``ready`` marker. One untimed warm-up start first (it writes the interpreter's
bytecode for torch and fills nothing that a timed start reuses), and it saves the artifact the
blessed starts load. Then ``--pairs`` pairs of one cold start (empty cache dir) and one blessed start
(the saved artifact), alternating which goes first. Every start gets a fresh Inductor and Triton
cache dir, so a cold start never hits a cache a previous start left. Reported: median and range of
each side, the ratio of the medians and each pair's ratio.

``--breakdown``: the same model booted step by step in child processes, each step timed: interpreter +
``import torch``, building the seeded model on the GPU, loading the Mega-Cache artifact, the first
compiled call (Dynamo tracing, the Inductor cache hit, the CUDA graph warm-up), the next calls (graph
capture), for a cold compile, a Mega-Cache load, and AOT compile (``aot_compile`` +
``save_compiled_function`` / ``torch.compiler.load_compiled_function``, torch >= 2.11) with and without
CUDA graphs. Each child prints one JSON line; a step that fails is recorded with its error.

``--dirs REPEATS``: the Mega-Cache against Inductor's and Triton's own cache dirs used as the artifact (a
start that loads from them needs no unpacking), cold and load in fresh children, with the files a loading
start writes into those dirs (what a read-only mount would have to take).

``--concurrent ROUNDS``: blessed starts alone vs two spawned together (what parallel trials do on one
host), with the shipped env and with Inductor's compile worker pool off, next to a cold start per round.

``--launch ROUNDS``: what importing bless costs a start: ``python3 -m bless.engines.reference_engine`` (the
bless package, and its dependencies, imported first) against the launcher a local start runs, both with
``--no-compile`` (no artifact), alternating, after one untimed start of each.

    python3 scripts/bench/bench_reference_start.py [--device cuda] [--pairs 3] [--breakdown] [--dirs 3]
        [--concurrent 3] [--launch 5] [--json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
#: What a local engine start runs (bless/engines/reference.py starts the same file): no bless import in the engine.
LAUNCHER = REPO / "bless" / "engines" / "reference_engine" / "launch.py"
READY = "bless-reference: ready on port "
COMPILE_TIME = "bless-reference: torch.compile took "
# The GPU profile's model (profiles/reference-cuda-local.toml); BENCH_TINY_MODEL=1: one small layer, to check
# the code paths quickly on a CPU.
TINY = os.environ.get("BENCH_TINY_MODEL") == "1"
MODEL_ARGS = ["--seed", "0", "--layers", "1" if TINY else "8", "--d-model", "64" if TINY else "1024",
              "--heads", "4" if TINY else "16", "--max-seq-len", "128"]  # fmt: skip


def fresh_env(scratch: Path) -> dict[str, str]:
    """Our environment with Inductor's and Triton's caches in a fresh dir: no start reuses another's."""
    inductor, triton = scratch / "inductor", scratch / "triton"
    inductor.mkdir(parents=True)
    triton.mkdir(parents=True)
    return {
        **os.environ,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "TORCHINDUCTOR_CACHE_DIR": str(inductor),
        "TRITON_CACHE_DIR": str(triton),
    }


class EngineRun:
    """One engine process, spawned at once; its output is read on a thread, so every line is timed when printed."""

    def __init__(
        self,
        device: str,
        cache_dir: Path,
        extra_env: dict[str, str] | None = None,
        *,
        entry: Sequence[str] = (str(LAUNCHER),),
        extra_args: Sequence[str] = (),
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="bless-bench-start-")
        env = {**fresh_env(Path(self._tmp.name)), **(extra_env or {})}
        command = [sys.executable, *entry, "--device", device, "--port", "0",
                   "--host", "127.0.0.1", "--cache-dir", str(cache_dir), *MODEL_ARGS, *extra_args]  # fmt: skip
        self.lines: list[str] = []
        self.ready_s: float | None = None
        self.ready = threading.Event()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if self.ready_s is None and line.startswith(READY):
                self.ready_s = time.monotonic() - self.started
                self.ready.set()
        self.ready.set()  # the engine exited: whoever waits for "ready" stops waiting

    def finish(self, timeout_s: float = 600) -> dict[str, Any]:
        """Wait for ready (or exit), stop the engine; its spawn -> ready time and what it did with the cache."""
        self.ready.wait(timeout_s)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=10)
        self._tmp.cleanup()
        if self.ready_s is None:
            raise SystemExit("engine never became ready:\n" + "\n".join(self.lines[-40:]))
        lines = self.lines
        compile_s = next((float(x[len(COMPILE_TIME) :].split()[0]) for x in lines if x.startswith(COMPILE_TIME)), None)
        return {
            "ready_s": round(self.ready_s, 3),
            "compile_s": compile_s,
            "loaded": any("Directly load compiled artifact" in x for x in lines),
            "saved": any("saved compiled artifact" in x for x in lines),
        }


def engine_start(device: str, cache_dir: Path, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Spawn the engine, time spawn -> ready marker, stop it; returns the timing and its compile time."""
    return EngineRun(device, cache_dir, extra_env).finish()


def engines_at_once(device: str, cache_dir: Path, count: int, extra_env: dict[str, str] | None) -> list[dict[str, Any]]:
    """``count`` engines spawned together on one cache dir; each stopped only once all are ready."""
    runs = [EngineRun(device, cache_dir, extra_env) for _ in range(count)]
    for run in runs:
        run.ready.wait(600)
    return [run.finish() for run in runs]


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def bench_engine(device: str, pairs: int) -> dict[str, Any]:
    blessed_dir = Path(tempfile.mkdtemp(prefix="bless-bench-blessed-"))
    try:
        print("warm-up start (untimed; saves the artifact the blessed starts load) ...", file=sys.stderr)
        warmup = engine_start(device, blessed_dir)
        if not warmup["saved"]:
            raise SystemExit(f"the warm-up start saved no artifact: {warmup}")
        rows = []
        for index in range(pairs):
            order = ("cold", "blessed") if index % 2 == 0 else ("blessed", "cold")
            pair: dict[str, Any] = {"order": list(order)}
            for side in order:
                print(f"pair {index + 1}/{pairs}: {side} ...", file=sys.stderr)
                if side == "cold":
                    with tempfile.TemporaryDirectory(prefix="bless-bench-cold-") as cold_dir:
                        pair[side] = engine_start(device, Path(cold_dir))
                else:
                    pair[side] = engine_start(device, blessed_dir)
                    if not pair[side]["loaded"]:
                        raise SystemExit(f"a blessed start did not load the artifact: {pair[side]}")
            pair["ratio"] = round(pair["blessed"]["ready_s"] / pair["cold"]["ready_s"], 3)
            rows.append(pair)
    finally:
        shutil.rmtree(blessed_dir, ignore_errors=True)
    cold = [r["cold"]["ready_s"] for r in rows]
    blessed = [r["blessed"]["ready_s"] for r in rows]
    return {
        "warmup": warmup,
        "pairs": rows,
        "cold_ready_s": spread(cold),
        "blessed_ready_s": spread(blessed),
        "cold_compile_s": spread([r["cold"]["compile_s"] for r in rows]),
        "blessed_compile_s": spread([r["blessed"]["compile_s"] for r in rows]),
        "ratio_of_medians": round(statistics.median(blessed) / statistics.median(cold), 3),
        "pair_ratios": spread([r["ratio"] for r in rows]),
    }


# --- what importing bless costs a start ---------------------------------------------------------------------

#: How the engine is started: as ``-m`` of bless's subpackage, and as a local start does (the launcher).
ENTRIES: dict[str, tuple[str, ...]] = {"module": ("-m", "bless.engines.reference_engine"), "launcher": (str(LAUNCHER),)}


def bench_launch(device: str, rounds: int) -> dict[str, Any]:
    """Per entry: spawn -> ready of ``--no-compile`` starts, alternating which goes first, after one untimed each."""

    def start(name: str) -> float:
        with tempfile.TemporaryDirectory(prefix="bless-bench-launch-") as cache:
            return float(
                EngineRun(device, Path(cache), entry=ENTRIES[name], extra_args=["--no-compile"]).finish()["ready_s"]
            )

    for name in ENTRIES:
        start(name)  # untimed: bytecode, driver
    seconds: dict[str, list[float]] = {name: [] for name in ENTRIES}
    for index in range(rounds):
        for name in list(ENTRIES) if index % 2 == 0 else list(ENTRIES)[::-1]:
            seconds[name].append(start(name))
            print(f"round {index + 1}/{rounds}: {name} {seconds[name][-1]} s", file=sys.stderr)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    return {
        **{name: spread(values) for name, values in seconds.items()},
        "seconds": seconds,
        "launcher_saves_s": round(medians["module"] - medians["launcher"], 3),
    }


# --- two blessed starts at once (parallel trials) --------------------------------------------------------

#: Env of the blessed starts compared: as shipped, and with Inductor's compile worker pool off (a start that
#: loads its compiled graphs has nothing to compile, but Inductor still spawns one worker per core).
VARIANTS: dict[str, dict[str, str]] = {"default": {}, "compile-threads-1": {"TORCHINDUCTOR_COMPILE_THREADS": "1"}}


def bench_concurrent(device: str, rounds: int) -> dict[str, Any]:
    """Per variant: blessed starts alone and two at once, next to cold starts (default env), round by round."""
    blessed_dir = Path(tempfile.mkdtemp(prefix="bless-bench-blessed-"))
    try:
        print("warm-up start (untimed; saves the artifact the blessed starts load) ...", file=sys.stderr)
        if not engine_start(device, blessed_dir)["saved"]:
            raise SystemExit("the warm-up start saved no artifact")
        rows: list[dict[str, Any]] = []
        for index in range(rounds):
            for name, extra_env in VARIANTS.items():
                print(
                    f"round {index + 1}/{rounds}, {name}: cold, blessed alone, two blessed at once ...", file=sys.stderr
                )
                with tempfile.TemporaryDirectory(prefix="bless-bench-cold-") as cold_dir:
                    cold = engine_start(device, Path(cold_dir))
                alone = engine_start(device, blessed_dir, extra_env)
                pair = engines_at_once(device, blessed_dir, 2, extra_env)
                if not all(start["loaded"] for start in (alone, *pair)):
                    raise SystemExit(f"a blessed start did not load the artifact ({name}): {alone} {pair}")
                rows.append({"round": index + 1, "variant": name, "cold": cold, "alone": alone, "pair": pair})
    finally:
        shutil.rmtree(blessed_dir, ignore_errors=True)
    summary: dict[str, Any] = {"rounds": rows}
    for name in VARIANTS:
        mine = [r for r in rows if r["variant"] == name]
        cold_s: list[float] = [r["cold"]["ready_s"] for r in mine]
        alone_s: list[float] = [r["alone"]["ready_s"] for r in mine]
        pair_s: list[float] = [max(start["ready_s"] for start in r["pair"]) for r in mine]
        summary[name] = {
            "cold_ready_s": spread(cold_s),
            "blessed_alone_ready_s": spread(alone_s),
            "blessed_pair_ready_s": spread(pair_s),
            "blessed_over_cold": round(statistics.median(alone_s) / statistics.median(cold_s), 3),
            "pair_over_alone": round(statistics.median(pair_s) / statistics.median(alone_s), 3),
        }
    return summary


# --- breakdown (child processes) -----------------------------------------------------------------------


def child(mode: str, device: str, artifact: Path) -> dict[str, Any]:
    """Boot the model step by step in this process (a fresh child); every step timed."""
    steps: dict[str, Any] = {"mode": mode}
    mark = time.monotonic()

    def step(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        steps[name] = round(now - mark, 3)
        mark = now

    import torch

    from bless.engines.reference_engine.artifact import compile_model
    from bless.engines.reference_engine.model import ModelArgs, build_model

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    step("import_torch_s")
    steps["torch"] = str(torch.__version__)
    torch.zeros(1, device=device)
    step("cuda_init_s")
    args = ModelArgs(seed=0, layers=1 if TINY else 8, d_model=64 if TINY else 1024, heads=4 if TINY else 16,
                     max_seq_len=128)  # fmt: skip
    model = build_model(args, device)
    ids = torch.zeros((1, args.max_seq_len), dtype=torch.int64, device=device)
    sync()
    step("build_model_s")

    def calls(forward: Callable[[Any], Any]) -> None:
        with torch.no_grad():
            forward(ids)
            sync()
            step("first_call_s")
            for _ in range(2):
                forward(ids)
            sync()
            step("calls_2_3_s")
            steps["checksum"] = float(forward(ids).double().sum())  # same on every path when they agree

    try:
        if mode in ("dir-cold", "dir-load"):
            # Inductor's and Triton's own cache dirs are the artifact: run_child points the env at them.
            calls(compile_model(model, device))
        elif mode in ("mega-cold", "mega-load"):
            if mode == "mega-load":
                torch.compiler.load_cache_artifacts(artifact.read_bytes())
                step("load_artifact_s")
            calls(compile_model(model, device))
            if mode == "mega-cold":
                data = torch.compiler.save_cache_artifacts()
                assert data is not None
                artifact.write_bytes(data[0])
                step("save_artifact_s")
        elif mode.startswith("aot-"):
            cudagraphs = mode.endswith("-graphs")
            compile_mode = "reduce-overhead" if cudagraphs else None  # None: torch.compile's default
            import torch._dynamo.config as dynamo_config

            dynamo_config.enable_aot_compile = True  # torch 2.11 adds aot_compile only with it
            if mode.startswith("aot-save"):
                # Any: torch types torch.compile as returning the callable it was given, but what comes
                # back carries the aot_compile entry points, which differ between torch releases.
                compiled: Any = torch.compile(model, fullgraph=True, dynamic=False, mode=compile_mode)
                module_aot = getattr(compiled.forward, "aot_compile", None)
                with torch.no_grad():
                    if module_aot is not None:  # torch 2.13: the compiled Module.__call__, module first
                        steps["aot_path"] = "module"
                        aot = module_aot(((ids,), {}))
                    else:  # torch 2.11: compile the unbound forward; the module is its first argument
                        steps["aot_path"] = "unbound forward"
                        unbound: Any = torch.compile(
                            type(model).forward, fullgraph=True, dynamic=False, mode=compile_mode
                        )
                        aot = unbound.aot_compile(((model, ids), {}))
                step("aot_compile_s")
                try:
                    aot.save_compiled_function(str(artifact), external_data={"model": model})
                except TypeError:  # no external_data parameter in this torch
                    aot.save_compiled_function(str(artifact))
                step("save_artifact_s")
                steps["artifact_bytes"] = artifact.stat().st_size
                loaded = aot
            else:
                with artifact.open("rb") as handle:
                    saved = io.BytesIO(handle.read())
                try:
                    loaded = torch.compiler.load_compiled_function(saved, external_data={"model": model})
                except TypeError:  # no external_data parameter in this torch
                    loaded = torch.compiler.load_compiled_function(io.BytesIO(saved.getvalue()))
                step("load_artifact_s")

            def function(x: Any) -> Any:  # the compiled Module.__call__: the module is its first argument
                return loaded(model, x)

            def stepped(x: Any) -> Any:  # each call a new CUDA-graph step, as the engine does
                torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
                return function(x).clone()

            calls(stepped if cudagraphs else function)
        from torch._dynamo.utils import counters

        steps["counters"] = {g: dict(counters[g]) for g in ("inductor", "aot_autograd") if counters[g]}
    except Exception as exc:  # recorded: which paths work on this torch is part of the finding
        steps["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
    return steps


def _tree_state(root: Path) -> dict[str, tuple[int, int]]:
    return {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def run_child(mode: str, device: str, artifact: Path) -> dict[str, Any]:
    """One child process; ``dir-*`` modes keep (cold) or start from (load) a copy of Inductor's and Triton's dirs."""
    with tempfile.TemporaryDirectory(prefix="bless-bench-child-") as tmp:
        env = fresh_env(Path(tmp))
        before: dict[str, tuple[int, int]] = {}
        if mode == "dir-load":
            shutil.copytree(artifact, Path(tmp, "dirs"))
            env["TORCHINDUCTOR_CACHE_DIR"], env["TRITON_CACHE_DIR"] = (
                str(Path(tmp, "dirs", "inductor")),
                str(Path(tmp, "dirs", "triton")),
            )
            before = _tree_state(Path(tmp, "dirs"))
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--device", device, "--artifact", str(artifact)],
            cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=900,
        )  # fmt: skip
        wall = time.monotonic() - started
        extra: dict[str, Any] = {}
        if mode == "dir-cold":
            shutil.copytree(env["TORCHINDUCTOR_CACHE_DIR"], artifact / "inductor")
            shutil.copytree(env["TRITON_CACHE_DIR"], artifact / "triton")
            extra["artifact_files"] = sum(1 for p in artifact.rglob("*") if p.is_file())
        elif mode == "dir-load":
            # What a start that loads from the dirs writes into them: on a read-only lower layer, these would
            # be upper-layer entries.
            after = _tree_state(Path(tmp, "dirs"))
            extra["written_on_load"] = sorted(k for k, v in after.items() if before.get(k) != v)[:40]
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}"
    try:
        result: dict[str, Any] = json.loads(last)
    except json.JSONDecodeError:
        result = {"mode": mode, "error": f"exit {proc.returncode}: {proc.stderr[-800:]}"}
    result["process_wall_s"] = round(wall, 3)
    result.update(extra)
    return result


def bench_dirs(device: str, repeats: int) -> list[dict[str, Any]]:
    """Mega-Cache vs Inductor's and Triton's own cache dirs as the artifact: cold and load, in fresh children."""
    with tempfile.TemporaryDirectory(prefix="bless-bench-art-") as tmp:
        mega, dirs = Path(tmp, "mega.bin"), Path(tmp, "dirs")
        plan = [("mega-cold", mega), ("dir-cold", dirs)]
        for index in range(repeats):
            plan += [("mega-load", mega), ("dir-load", dirs), ("mega-cold", Path(tmp, f"mega{index}.bin"))]
        results = []
        for mode, artifact in plan:
            print(f"dirs: {mode} ...", file=sys.stderr)
            results.append(run_child(mode, device, artifact))
        return results


def bench_breakdown(device: str, repeats: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bless-bench-art-") as tmp:
        mega, aot, aot_graphs = Path(tmp, "mega.bin"), Path(tmp, "aot.bin"), Path(tmp, "aot-graphs.bin")
        plan = [("mega-cold", mega), ("aot-save", aot), ("aot-save-graphs", aot_graphs)]
        plan += [("mega-load", mega), ("aot-load", aot), ("aot-load-graphs", aot_graphs)] * repeats
        plan += [("mega-cold", Path(tmp, "mega2.bin"))]
        results = []
        for mode, artifact in plan:
            print(f"breakdown: {mode} ...", file=sys.stderr)
            results.append(run_child(mode, device, artifact))
        return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--breakdown", action="store_true", help="also time each boot step (cold, load, AOT)")
    parser.add_argument("--breakdown-repeats", type=int, default=2)
    parser.add_argument(
        "--dirs", type=int, metavar="REPEATS", default=0,
        help="also: the Mega-Cache vs Inductor's own cache dirs as the artifact (cold and load), REPEATS times",
    )  # fmt: skip
    parser.add_argument("--no-engine", action="store_true", help="skip the engine start pairs")
    parser.add_argument(
        "--concurrent", type=int, metavar="ROUNDS", default=0,
        help="also: blessed starts alone vs two at once, per env variant, ROUNDS rounds",
    )  # fmt: skip
    parser.add_argument(
        "--launch", type=int, metavar="ROUNDS", default=0,
        help="also: -m bless.engines.reference_engine vs the local launcher (--no-compile), ROUNDS rounds",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--artifact", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.device, args.artifact)))
        return 0
    summary: dict[str, Any] = {"python": sys.version.split()[0]}
    if shutil.which("nvidia-smi"):
        summary["gpu"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, check=False,
        ).stdout.strip().splitlines()[:1]  # fmt: skip
    if not args.no_engine:
        summary["engine"] = bench_engine(args.device, args.pairs)
    if args.concurrent:
        summary["concurrent"] = bench_concurrent(args.device, args.concurrent)
    if args.breakdown:
        summary["breakdown"] = bench_breakdown(args.device, args.breakdown_repeats)
    if args.dirs:
        summary["dirs"] = bench_dirs(args.device, args.dirs)
    if args.launch:
        summary["launch"] = bench_launch(args.device, args.launch)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    if "engine" in summary:
        engine = summary["engine"]
        print(f"cold ready s: {engine['cold_ready_s']}; blessed ready s: {engine['blessed_ready_s']}")
        print(f"blessed/cold, ratio of medians {engine['ratio_of_medians']}, per pair {engine['pair_ratios']}")
    for name in VARIANTS if "concurrent" in summary else ():
        print(f"{name}: {json.dumps(summary['concurrent'][name])}")
    for row in [*summary.get("breakdown", []), *summary.get("dirs", [])]:
        print(json.dumps(row))
    if "launch" in summary:
        print(f"launch: {json.dumps(summary['launch'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
