#!/usr/bin/env python3
"""Drive an OpenAI-compatible engine on 127.0.0.1 the way serving does, to find what it compiles lazily.

Two phases, each optional:

* ``--sweep N``: every scheduled token count M from 1 to N once: a lone request whose prompt is exactly M
  token ids (random ids, so no prefix-cache hit shortens the step) and ``max_tokens`` 1, one at a time;
* ``--seconds S``: S seconds of varied traffic from ``--concurrency`` threads: prompt lengths across
  1..``--max-prompt``, ``max_tokens`` 1..64, sampling modes (greedy, top-p, top-k, min-p, penalties,
  logprobs, n=2), each thread picking a new request at random (seeded).

Prints one JSON object: requests, errors, seconds, per-phase latency p50/p99. Stdlib only: it runs on the
GPU host beside the engine. Only loopback: the port is the engine's published port on 127.0.0.1.

    python3 scripts/bench/drive_traffic.py --port 8000 --model m --vocab 151936 --sweep 2048 --seconds 120 \\
        --concurrency 16 --max-prompt 3900
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
from typing import Any

SAMPLING: tuple[dict[str, Any], ...] = (
    {"temperature": 0},
    {"temperature": 0.8, "top_p": 0.9},
    {"temperature": 0.7, "top_k": 20},
    {"temperature": 1.0, "min_p": 0.1},
    {"temperature": 0.6, "presence_penalty": 0.5, "frequency_penalty": 0.3, "repetition_penalty": 1.1},
    {"temperature": 0, "logprobs": 3},
    {"temperature": 0.9, "n": 2},
)


class Client:
    """One keep-alive HTTP connection to the engine on 127.0.0.1."""

    def __init__(self, port: int, timeout_s: float) -> None:
        self.port = port
        self.timeout_s = timeout_s
        self.conn: http.client.HTTPConnection | None = None

    def complete(self, body: dict[str, Any]) -> float:
        """POST /v1/completions; returns the latency; raises on a non-200 reply."""
        payload = json.dumps(body).encode()
        started = time.monotonic()
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout_s)
            try:
                self.conn.request("POST", "/v1/completions", payload, {"Content-Type": "application/json"})
                reply = self.conn.getresponse()
                data = reply.read()
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
                continue
            if reply.status != 200:
                raise RuntimeError(f"HTTP {reply.status}: {data[:300]!r}")
            return time.monotonic() - started
        raise AssertionError("unreachable")


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) of ``values``, None when empty."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[min(98, max(0, round(q * 100) - 1))]


def summary(latencies: list[float], errors: list[str], seconds: float) -> dict[str, Any]:
    """Counts and latency quantiles of one phase."""
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "first_errors": errors[:5],
        "seconds": round(seconds, 2),
        "p50_s": round(percentile(latencies, 0.5) or 0, 4),
        "p99_s": round(percentile(latencies, 0.99) or 0, 4),
    }


def sweep(args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    """Every token count 1..N once, alone, as exact token-id prompts."""
    client = Client(args.port, args.timeout)
    latencies: list[float] = []
    errors: list[str] = []
    started = time.monotonic()
    for m in range(1, args.sweep + 1):
        prompt = [rng.randrange(args.first_token, args.vocab - args.first_token) for _ in range(m)]
        try:
            body = {"model": args.model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
            latencies.append(client.complete(body))
        except (OSError, RuntimeError, http.client.HTTPException) as exc:
            errors.append(f"M={m}: {exc}")
    return summary(latencies, errors, time.monotonic() - started)


def varied(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """``--seconds`` of varied traffic from ``--concurrency`` threads."""
    deadline = time.monotonic() + args.seconds
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def worker(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        client = Client(args.port, args.timeout)
        while time.monotonic() < deadline:
            length = rng.choice((rng.randint(1, 64), rng.randint(1, 512), rng.randint(1, args.max_prompt)))
            max_tokens = rng.randint(1, 64)
            length = max(1, min(length, args.max_prompt - max_tokens))
            body: dict[str, Any] = {"model": args.model, "max_tokens": max_tokens, **rng.choice(SAMPLING)}
            if rng.random() < 0.5:
                body["prompt"] = [rng.randrange(args.first_token, args.vocab - args.first_token) for _ in range(length)]
            else:
                words = ("cache", "kernel", "bless", "serve", "token")
                # a word is a token or two, plus a separator: a third as many words stays within the length
                body["prompt"] = " ".join(rng.choice(words) for _ in range(max(1, length // 3)))
            try:
                latency = client.complete(body)
                with lock:
                    latencies.append(latency)
            except (OSError, RuntimeError, http.client.HTTPException) as exc:
                with lock:
                    errors.append(f"{exc}")

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(args.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(args.seconds + args.timeout + 5)
    return summary(latencies, errors, time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--vocab", type=int, required=True, help="the model's vocabulary size")
    parser.add_argument("--first-token", type=int, default=1000, help="lowest token id used (and distance from top)")
    parser.add_argument("--sweep", type=int, default=0, help="every token count 1..N once (0: skip)")
    parser.add_argument("--seconds", type=float, default=0, help="seconds of varied traffic (0: skip)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-prompt", type=int, default=512, help="longest prompt plus max_tokens")
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    report: dict[str, Any] = {}
    if args.sweep:
        report["sweep"] = sweep(args, rng)
    if args.seconds:
        report["varied"] = varied(args, args.seed)
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")
    return 1 if any(phase["errors"] for phase in report.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
