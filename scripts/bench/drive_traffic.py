#!/usr/bin/env python3
"""Drive an OpenAI-compatible engine on 127.0.0.1 the way serving does, to find what it compiles lazily.

Two phases, each optional:

* ``--sweep N``: every scheduled token count M from 1 to N once: a lone request whose prompt is exactly M
  token ids (random ids, so no prefix-cache hit shortens the step) and ``max_tokens`` 1, one at a time;
* ``--seconds S``: S seconds of varied traffic from ``--concurrency`` threads: prompt lengths across
  1..``--max-prompt``, ``max_tokens`` 1..64, sampling modes (greedy, top-p, top-k, min-p, penalties,
  logprobs, n=2), each thread picking a new request at random (seeded). With ``--structured F`` a fraction F
  of the requests carry a structured output (regexes, JSON schemas, choices, JSON object, EBNF grammars of
  its own, none of them bless's coverage requests), and with ``--chat F`` a fraction F go to chat completions
  (system prompts, several turns, JSON-schema answers, tool calls with ``tool_choice`` required, named or
  none, tool results).

Prints one JSON object: requests, errors, seconds, per-phase latency p50/p99, and the varied phase's requests by
kind; a text prompt vLLM refuses as longer than the context (HTTP 400 before scheduling) is counted apart.
Stdlib only: it runs on the GPU host beside the engine. Only loopback: the port is the engine's published port on
127.0.0.1.

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


#: Structured outputs of every kind vLLM takes, none of them the ones bless's coverage requests send.
STRUCTURED: tuple[dict[str, Any], ...] = (
    {"structured_outputs": {"regex": r"\d{3}-\d{4}"}},
    {"structured_outputs": {"regex": r"(yes|no|maybe), because [a-z ]{10,40}\."}},
    {"structured_outputs": {"regex": r"[A-Z][a-z]{2,12}@[a-z]{3,8}\.(com|org)"}},
    {"structured_outputs": {"choice": ["positive", "negative", "neutral", "mixed", "unknown"]}},
    {"structured_outputs": {"choice": ["A", "B"]}},
    {
        "structured_outputs": {
            "json": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 20},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                },
                "required": ["name", "age"],
            }
        }
    },
    {
        "structured_outputs": {
            "json": {
                "type": "object",
                "properties": {
                    "point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}}
                },
            }
        }
    },
    {"response_format": {"type": "json_object"}},
    {"structured_outputs": {"grammar": 'root ::= item (", " item)*\nitem ::= [a-z]+'}},
)
TOOLS: tuple[dict[str, Any], ...] = (
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Find an order by its number.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "verbose": {"type": "boolean"}},
                "required": ["order_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert",
            "description": "Convert an amount between currencies.",
            "parameters": {
                "type": "object",
                "properties": {"amount": {"type": "number"}, "to": {"type": "string", "enum": ["EUR", "USD", "JPY"]}},
                "required": ["amount", "to"],
            },
        },
    },
)


def chat_body(rng: random.Random, model: str, max_tokens: int) -> dict[str, Any]:
    """A chat completion: a system prompt or none, one to three turns, and one of the answer forms."""
    words = ("order", "refund", "weather", "invoice", "kernel", "cache")
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": "You are a terse assistant."})
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": " ".join(rng.choice(words) for _ in range(rng.randint(2, 40)))})
        messages.append({"role": "assistant", "content": rng.choice(words)})
    messages.pop()
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens}
    form = rng.randrange(5)
    if form == 1:
        schema = rng.choice(STRUCTURED[5:7])["structured_outputs"]["json"]
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    elif form in (2, 3, 4):
        body["tools"] = list(TOOLS[: rng.randint(1, 2)])
        name = body["tools"][-1]["function"]["name"]
        body["tool_choice"] = ("required", {"type": "function", "function": {"name": name}}, "none")[form - 2]
        if form == 4 and rng.random() < 0.5:  # a finished tool call and its result in the history
            call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": "{}"}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": "call_1", "content": '{"ok": true}'})
    if rng.random() < 0.5:
        body.update(rng.choice(SAMPLING))
        body.pop("n", None)
        if "logprobs" in body:  # chat asks for logprobs as a flag and a width
            body["top_logprobs"] = body["logprobs"]
            body["logprobs"] = True
    return body


class ContextRefused(RuntimeError):
    """vLLM refused a prompt longer than the context (HTTP 400 before scheduling): counted apart, not an error."""


class Client:
    """One keep-alive HTTP connection to the engine on 127.0.0.1."""

    def __init__(self, port: int, timeout_s: float) -> None:
        self.port = port
        self.timeout_s = timeout_s
        self.conn: http.client.HTTPConnection | None = None

    def complete(self, body: dict[str, Any], path: str = "/v1/completions") -> float:
        """POST ``path`` (completions by default); returns the latency; raises on a non-200 reply."""
        payload = json.dumps(body).encode()
        started = time.monotonic()
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout_s)
            try:
                self.conn.request("POST", path, payload, {"Content-Type": "application/json"})
                reply = self.conn.getresponse()
                data = reply.read()
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
                continue
            if reply.status == 400 and b"maximum context length" in data:
                raise ContextRefused(f"HTTP 400: {data[:200]!r}")
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
    kinds: dict[str, int] = {}
    refused = 0
    lock = threading.Lock()

    def worker(index: int) -> None:
        nonlocal refused
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
            path, kind = "/v1/completions", "completion"
            draw = rng.random()
            if draw < args.chat:
                body, path, kind = chat_body(rng, args.model, max_tokens), "/v1/chat/completions", "chat"
                kind = "tool call" if "tools" in body else "chat json_schema" if "response_format" in body else kind
            elif draw < args.chat + args.structured:
                body.update(rng.choice(STRUCTURED))
                kind = "structured " + next(iter(body.get("structured_outputs", {"json_object": 1})))
            try:
                latency = client.complete(body, path)
                with lock:
                    latencies.append(latency)
                    kinds[kind] = kinds.get(kind, 0) + 1
            except ContextRefused:
                with lock:
                    refused += 1
            except (OSError, RuntimeError, http.client.HTTPException) as exc:
                with lock:
                    errors.append(f"{kind}: {exc}")

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(args.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(args.seconds + args.timeout + 5)
    report = summary(latencies, errors, time.monotonic() - started)
    return {**report, "refused_too_long": refused, "kinds": dict(sorted(kinds.items()))}


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
    parser.add_argument("--structured", type=float, default=0, help="fraction of requests with a structured output")
    parser.add_argument("--chat", type=float, default=0, help="fraction of requests to chat completions (tool calls)")
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
