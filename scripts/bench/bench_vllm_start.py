#!/usr/bin/env python3
"""Benchmark: vLLM start->ready like for like, on one GPU host, in one run.

Three ways to start the same configuration (the profile's serve arguments and env, as serve-full's
plan builds them), each timed from process launch until ``GET /v1/models`` answers:

* ``plain-cold``: vLLM with an empty compile cache and a fresh, empty HOME (a plain cold start);
* ``plain-warm``: vLLM with the cache its cold start of the same round left, read-write, and the HOME
  that start left (Triton's kernels included): the best an operator gets without bless;
* ``serve-full``: ``serve-full --profile P`` of the blessing in ``--root`` (verification, the overlay,
  a fresh private HOME: a fresh fleet host); its canary time is recorded beside.

With ``--traffic-seconds S``, plain warm and serve-full are each measured under the same varied traffic
(``scripts/bench/drive_traffic.py``: an untimed pass, then S timed seconds) before they stop: request latency
p50/p99 with bless's Triton cache manager in the engine (serve-full) and without it (plain warm).

One untimed plain cold start first (it writes the interpreter's bytecode of the site tree, which the
first process on a fresh host pays for), then ``--rounds`` rounds, the order alternating (round 1:
cold, warm, serve-full; round 2: serve-full, cold, warm; ...). Reported: every start, each side's
median and range, the ratios of the medians, and each start's ``torch.compile took`` seconds.

    python3 scripts/bench/bench_vllm_start.py --profile profiles/vllm-0.26-llama-3.1-8b-dummy-local.toml \\
        --root /tmp/bless-vllm-root [--rounds 2] [--json OUT]

Needs a blessing of the profile in ``--root`` (``bless run``), vLLM importable by the profile's python,
and root (serve-full's overlay). Plain starts get the env serve-full would give the engine minus what
bless adds (compile locations, the private temp dir, the force-load switch), on a port of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # runnable from a checkout without installing the package
COMPILE_TOOK = re.compile(r"torch\.compile took ([0-9.]+) s")
CANARY_PASSED = re.compile(r"canary passed", re.IGNORECASE)
# What bless adds to the engine's env beyond the profile's (its sealed Triton cache manager too): a plain start goes
# without it.
BLESS_ONLY_ENV = ("TMPDIR", "TMP", "TEMP", "TRITON_CACHE_AUTOTUNING", "VLLM_FORCE_AOT_LOAD", "TRITON_CACHE_MANAGER")


def serve_plan(profile: str, root: str) -> dict[str, Any]:
    """serve-full's dry-run plan: the engine's argv and env exactly as a blessed serve would start it.

    Through the library (a dry run of :func:`bless.serve`): the plan is an input here, not a timing.
    """
    import bless  # from this checkout (REPO on sys.path), as the serve below runs it

    try:
        outcome = bless.serve(profile, store=bless.open_store(root), dry_run=True)
    except bless.BlessError as exc:
        sys.exit(f"serve-full --dry-run failed ({int(exc.exit_code)}): {exc.diagnostics()}")
    return dict(json.loads(json.dumps(dict(outcome.plan), default=str)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Poll ``/v1/models`` every 0.25 s until it answers 200, the process exits, or the time is up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as reply:
                if reply.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.25)
    return False


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 120) -> int | None:
    """SIGINT for vLLM, SIGTERM for serve-full (both stop gracefully), SIGKILL after ``timeout_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def under_load(port: int, traffic: argparse.Namespace | None) -> dict[str, Any]:
    """Request latency of the ready engine on ``port`` under ``scripts/bench/drive_traffic.py``'s varied traffic.

    An untimed pass first (``--traffic-warmup-seconds``, another seed), then the timed one: both sides of the
    comparison meet the same requests in the same order. Empty without ``--traffic-seconds``.
    """
    if traffic is None or not traffic.traffic_seconds:
        return {}
    measured: dict[str, Any] = {}
    for phase, seconds, seed in (("warmup", traffic.traffic_warmup_seconds, 1), ("timed", traffic.traffic_seconds, 2)):
        if not seconds:
            continue
        out = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "bench" / "drive_traffic.py"), "--port", str(port), "--model",
             traffic.model, "--vocab", str(traffic.vocab), "--seconds", str(seconds), "--concurrency",
             str(traffic.traffic_concurrency), "--max-prompt", str(traffic.max_prompt), "--seed", str(seed)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        try:
            measured[phase] = json.loads(out.stdout)["varied"]
        except (ValueError, KeyError):
            measured[phase] = {"error": out.stderr[-500:]}
    return {"traffic": measured}


def plain_start(
    plan: dict[str, Any], cache: Path, home: Path, log: Path, traffic: argparse.Namespace | None = None
) -> dict[str, Any]:
    """One plain vLLM start of the plan's argv with ``cache`` as VLLM_CACHE_ROOT and ``home`` as HOME.

    With ``traffic``, the ready engine is measured under load before it is stopped (:func:`under_load`).
    """
    container = plan["container"]
    # bless's compile locations point under the cache mount: a plain start keeps each library's default.
    under_cache = plan["mount"]["target"].rstrip("/") + "/"
    from bless.runtime.local import inherited_env  # this checkout's (REPO on sys.path)

    # What the local runtime passes a blessed engine of this host's env (the NVLink-multicast switches included,
    # which a tensor-parallel start must keep), so the two starts differ only in what bless adds.
    env = inherited_env(os.environ)
    env.update(
        {
            name: value
            for name, value in container["env"].items()
            if name not in BLESS_ONLY_ENV and not value.startswith(under_cache)
        }
    )
    env.update({"HOME": str(home), "VLLM_CACHE_ROOT": str(cache)})
    port = free_port()
    command = list(container["command"])
    command[command.index("--port") + 1] = str(port)
    began = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    ready = wait_ready(port, proc, 900)
    seconds = time.monotonic() - began
    loaded = under_load(port, traffic) if ready else {}
    code = stop(proc)
    # What a plain start leaves in HOME (Triton's kernels): compiled state outside any cache an operator keeps.
    files = [path for path in home.rglob("*") if path.is_file()]
    return {
        "ready": ready,
        "start_to_ready_s": round(seconds, 2),
        "exit_code": code,
        "home_files": len(files),
        "home_bytes": sum(path.stat().st_size for path in files),
        **compile_time(log),
        **loaded,
    }


def serve_full_start(
    profile: str, root: str, port: int, log: Path, traffic: argparse.Namespace | None = None
) -> dict[str, Any]:
    """One ``serve-full`` of the blessing, timed to the engine answering; the canary's verdict beside.

    With ``traffic``, measured under load after the canary (sealed: bless's Triton cache manager in the engine).
    """
    began = time.monotonic()
    with log.open("wb") as out:  # the serve-full process on purpose: its time to a ready engine is the measure
        proc = subprocess.Popen(
            [sys.executable, "-m", "bless.cli.serve", "--root", root, "--profile", profile],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    ready = wait_ready(port, proc, 900)
    seconds = time.monotonic() - began
    canary_s = None
    deadline = time.monotonic() + 300
    while ready and time.monotonic() < deadline and proc.poll() is None:
        if CANARY_PASSED.search(log.read_text(errors="replace")):
            canary_s = round(time.monotonic() - began, 2)
            break
        time.sleep(0.25)
    loaded = under_load(port, traffic) if canary_s is not None else {}
    code = stop(proc)
    return {
        "ready": ready,
        "start_to_ready_s": round(seconds, 2),
        "canary_passed_at_s": canary_s,
        "exit_code": code,
        **compile_time(log),
        **loaded,
    }


def compile_time(log: Path) -> dict[str, Any]:
    found = COMPILE_TOOK.findall(log.read_text(errors="replace")) if log.exists() else []
    return {"torch_compile_s": float(found[-1]) if found else None}


def summary(starts: list[dict[str, Any]], key: str) -> dict[str, Any]:
    values = [s[key] for s in starts if s.get(key) is not None and s.get("ready")]
    if not values:
        return {"n": 0}
    return {"n": len(values), "median": round(statistics.median(values), 2), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", required=True)
    parser.add_argument("--root", required=True, help="the store holding the profile's blessing")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--logs", type=Path, help="keep every start's log in this dir")
    parser.add_argument("--traffic-seconds", type=float, default=0, help="measure plain warm and serve-full under load")
    parser.add_argument("--traffic-warmup-seconds", type=float, default=20, help="untimed load before the timed one")
    parser.add_argument("--traffic-concurrency", type=int, default=8)
    parser.add_argument("--model", default="m", help="the served model name (traffic)")
    parser.add_argument("--vocab", type=int, default=32000, help="the model's vocabulary size (traffic)")
    parser.add_argument("--max-prompt", type=int, default=500, help="longest prompt plus max_tokens (traffic)")
    args = parser.parse_args(argv)
    plan = serve_plan(args.profile, args.root)
    port = int(plan["container"]["host_port"] or plan["container"]["port"])
    scratch = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    logs = args.logs or scratch / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    starts: dict[str, list[dict[str, Any]]] = {"plain-cold": [], "plain-warm": [], "serve-full": []}
    try:
        print("warm-up: one untimed plain cold start", file=sys.stderr)
        warmup = plain_start(plan, scratch / "w-cache", scratch / "w-home", logs / "warmup.log")
        print(f"  {warmup}", file=sys.stderr)
        for number in range(1, args.rounds + 1):
            cache, home = scratch / f"r{number}-cache", scratch / f"r{number}-home"
            order = ["plain", "serve-full"] if number % 2 else ["serve-full", "plain"]
            for side in order:
                if side == "plain":
                    cold = plain_start(plan, cache, home, logs / f"r{number}-plain-cold.log")
                    warm = plain_start(plan, cache, home, logs / f"r{number}-plain-warm.log", args)
                    starts["plain-cold"].append({"round": number, **cold})
                    starts["plain-warm"].append({"round": number, **warm})
                    print(f"round {number}: plain cold {cold}\nround {number}: plain warm {warm}", file=sys.stderr)
                else:
                    served = serve_full_start(args.profile, args.root, port, logs / f"r{number}-serve-full.log", args)
                    starts["serve-full"].append({"round": number, **served})
                    print(f"round {number}: serve-full {served}", file=sys.stderr)
    finally:
        shutil.rmtree(scratch / "w-cache", ignore_errors=True)
    ready = {side: summary(runs, "start_to_ready_s") for side, runs in starts.items()}
    compiled = {side: summary(runs, "torch_compile_s") for side, runs in starts.items()}

    def ratio(table: dict[str, Any], a: str, b: str) -> float | None:
        top, bottom = table[a].get("median"), table[b].get("median")
        return round(float(top) / float(bottom), 3) if top and bottom else None

    latency = {
        side: {
            quantile: summary(
                [{"ready": True, **s["traffic"]["timed"]} for s in runs if "timed" in s.get("traffic", {})], quantile
            )
            for quantile in ("p50_s", "p99_s")
        }
        for side, runs in starts.items()
        if side != "plain-cold"
    }
    result = {
        "profile": args.profile,
        "rounds": args.rounds,
        "warmup": warmup,
        "starts": starts,
        "start_to_ready_s": ready,
        "torch_compile_s": compiled,
        "ratios": {
            "serve_full_over_plain_warm": ratio(ready, "serve-full", "plain-warm"),
            "serve_full_over_plain_cold": ratio(ready, "serve-full", "plain-cold"),
            "plain_warm_over_plain_cold": ratio(ready, "plain-warm", "plain-cold"),
            "torch_compile_serve_full_over_plain_cold": ratio(compiled, "serve-full", "plain-cold"),
        },
        "latency_under_load": latency,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
