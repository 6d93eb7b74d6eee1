"""The HTTP side: an OpenAI-compatible subset on the standard library's ThreadingHTTPServer.

Endpoints: ``GET /v1/models``, ``POST /v1/completions`` (greedy only), ``GET /health``. Bad input is a
4xx JSON error in OpenAI's shape, never a 500 with a traceback.

Concurrency policy: each connection is handled by its own thread (parsing, validation, replies), but
every model call is serialized onto ONE dedicated inference thread (``InferenceWorker``), one request's
whole decode loop at a time. That is a lock with a fixed owner thread: besides serializing, it keeps
all compiled calls on the thread that compiled and warmed them up, which CUDA graph trees need (their
state is per thread; a call from another thread would record new graphs).

This module does not import torch: the decode function is injected, so the parsing helpers are pure.
"""

from __future__ import annotations

import json
import math
import queue
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar, cast

from .markers import MARKER_PREFIX

DEFAULT_MAX_TOKENS = 16
MAX_BODY_BYTES = 1 << 20
GREEDY_ONLY = "only greedy decoding (temperature 0) is supported"

T = TypeVar("T")

# (prompt tokens, max_tokens) -> (prompt tokens actually used, generated tokens)
DecodeFn = Callable[[list[int], int], tuple[list[int], list[int]]]


class RequestError(Exception):
    """A client error: becomes ``{"error": {"message", "type"}}`` with ``status``."""

    def __init__(self, message: str, status: int = 400, error_type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_type = error_type

    def body(self) -> dict[str, Any]:
        """The OpenAI-style error object."""
        return {"error": {"message": self.message, "type": self.error_type}}


@dataclass(frozen=True)
class CompletionRequest:
    """A validated ``/v1/completions`` request."""

    prompt: list[int]
    max_tokens: int


def _is_int(value: Any) -> bool:
    # bool is a subclass of int in Python; JSON true/false must not pass as numbers.
    return isinstance(value, int) and not isinstance(value, bool)


def parse_prompt(prompt: Any) -> list[int]:
    """A string (its UTF-8 bytes) or a list of byte token ids 0..255; never empty."""
    if isinstance(prompt, str):
        tokens = list(prompt.encode("utf-8"))
    elif isinstance(prompt, list):
        if prompt and not _is_int(prompt[0]) and all(isinstance(p, (str, list)) for p in prompt):
            raise RequestError("batched prompts (a list of prompts) are not supported; send one prompt")
        for index, token in enumerate(prompt):
            if not _is_int(token):
                raise RequestError(f"prompt[{index}] must be an integer token id, got {type(token).__name__}")
            if not 0 <= token <= 255:
                raise RequestError(f"prompt[{index}] = {token} is out of range: token ids are bytes 0..255")
        tokens = list(prompt)
    else:
        raise RequestError(f"'prompt' must be a string or a list of token ids, got {type(prompt).__name__}")
    if not tokens:
        raise RequestError("'prompt' must not be empty")
    return tokens


def parse_completion_request(raw: bytes, served_model_name: str, max_seq_len: int) -> CompletionRequest:
    """Validate a ``/v1/completions`` body; raises RequestError (400, or 404 for an unknown model)."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(f"request body must be a JSON object, got {type(body).__name__}")

    model = body.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise RequestError(f"'model' must be a string, got {type(model).__name__}")
        if model != served_model_name:
            raise RequestError(f"The model `{model}` does not exist.", status=404, error_type="not_found_error")

    if "prompt" not in body:
        raise RequestError("'prompt' is required")
    prompt = parse_prompt(body["prompt"])

    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if not _is_int(max_tokens):
        raise RequestError(f"'max_tokens' must be an integer, got {type(max_tokens).__name__}")
    if not 1 <= max_tokens <= max_seq_len - 1:
        raise RequestError(f"'max_tokens' must be in 1..{max_seq_len - 1}, got {max_tokens}")

    temperature = body.get("temperature")
    if temperature is None:
        temperature = 0
    if not (isinstance(temperature, (int, float)) and not isinstance(temperature, bool)):
        raise RequestError(f"'temperature' must be a number, got {type(temperature).__name__}")
    if temperature != 0 or math.isnan(temperature):
        raise RequestError(GREEDY_ONLY)

    if body.get("stream") not in (None, False):
        raise RequestError("streaming is not supported ('stream' must be false)")
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise RequestError("only one choice per request is supported ('n' must be 1)")
    return CompletionRequest(prompt=prompt, max_tokens=max_tokens)


def completion_response(
    served_model_name: str, used_prompt: list[int], generated: list[int], created: int | None = None
) -> dict[str, Any]:
    """The OpenAI-style ``text_completion`` object; ``prompt_tokens`` counts the tokens actually used."""
    return {
        "id": f"cmpl-{secrets.token_hex(12)}",
        "object": "text_completion",
        "created": int(time.time()) if created is None else created,
        "model": served_model_name,
        "choices": [
            {
                "index": 0,
                "text": bytes(generated).decode("utf-8", "replace"),
                "token_ids": list(generated),
                "finish_reason": "length",
            }
        ],
        "usage": {
            "prompt_tokens": len(used_prompt),
            "completion_tokens": len(generated),
            "total_tokens": len(used_prompt) + len(generated),
        },
    }


def models_response(served_model_name: str) -> dict[str, Any]:
    """The ``/v1/models`` list with our single model."""
    return {"object": "list", "data": [{"id": served_model_name, "object": "model", "owned_by": "bless"}]}


class InferenceWorker:
    """Runs submitted callables one at a time, in order, on a single dedicated daemon thread."""

    def __init__(self, name: str = "bless-inference") -> None:
        self._queue: queue.Queue[tuple[Callable[[], Any], Future[Any]] | None] = queue.Queue()
        # Daemon: a shutdown while a compile runs must not wait for it to finish.
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Queue ``fn``; its result (or exception) arrives in the returned future."""
        future: Future[T] = Future()
        self._queue.put((fn, future))
        return future

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the worker thread and wait for its result (re-raises its exception)."""
        return self.submit(fn).result()

    def close(self) -> None:
        """Let the thread finish after the work already queued."""
        self._queue.put(None)


@dataclass
class App:
    """What the handlers need: names, limits and the serialized decode; counts requests in flight."""

    served_model_name: str
    max_seq_len: int
    worker: InferenceWorker
    decode: DecodeFn
    _inflight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self) -> None:
        """A completion request starts."""
        with self._lock:
            self._inflight += 1

    def leave(self) -> None:
        """A completion request has been answered (or failed)."""
        with self._lock:
            self._inflight -= 1

    def drain(self, timeout_s: float) -> bool:
        """Wait until no completion is in flight (after the listener stopped); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._inflight == 0:
                    return True
            time.sleep(0.05)
        return False


def _log(line: str) -> None:
    sys.stderr.write(f"{MARKER_PREFIX}{line}\n")
    sys.stderr.flush()


class Handler(BaseHTTPRequestHandler):
    """Routes the few endpoints; every reply is JSON with a Content-Length."""

    server_version = "bless-reference"
    sys_version = ""

    @property
    def app(self) -> App:
        """The App of the server this handler belongs to."""
        return cast(ReferenceHTTPServer, self.server).app

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Silenced: one summary line per request is written by ``_finish`` instead."""

    def log_message(self, format: str, *args: Any) -> None:
        """Protocol-level errors from the base class, as one short line."""
        _log("http " + (format % args))

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        data = (json.dumps(payload) + "\n").encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _finish(self, started: float, status: int) -> None:
        _log(f"{self.command} {self.path} {status} {time.monotonic() - started:.3f}s")

    def _route(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/") or "/"

    def _error(self, exc: RequestError) -> int:
        self._send_json(exc.status, exc.body())
        return exc.status

    def do_GET(self) -> None:
        """``/v1/models``, ``/health``."""
        started = time.monotonic()
        route = self._route()
        if route == "/v1/models":
            self._send_json(200, models_response(self.app.served_model_name))
            status = 200
        elif route == "/health":
            self._send_json(200, {"status": "ok"})
            status = 200
        elif route == "/v1/completions":
            status = self._error(RequestError("use POST for /v1/completions", 405))
        else:
            status = self._error(RequestError(f"no such endpoint: {route}", 404, "not_found_error"))
        self._finish(started, status)

    def do_POST(self) -> None:
        """``/v1/completions``."""
        started = time.monotonic()
        self.app.enter()
        try:
            status = self._post()
        except (BrokenPipeError, ConnectionResetError):
            status = 499  # the client went away; nothing to answer
        except Exception as exc:  # a bug of ours: answer 500 JSON, keep the traceback on stderr
            import traceback

            traceback.print_exc(file=sys.stderr)
            status = self._error(RequestError(f"internal error: {type(exc).__name__}: {exc}", 500, "internal_error"))
        finally:
            self.app.leave()
        self._finish(started, status)

    def _post(self) -> int:
        route = self._route()
        if route == "/v1/models":
            return self._error(RequestError("use GET for /v1/models", 405))
        if route != "/v1/completions":
            return self._error(RequestError(f"no such endpoint: {route}", 404, "not_found_error"))
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            self.close_connection = True
            return self._error(RequestError("Content-Length is required", 411))
        try:
            length = int(length_header)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            # The body is not read, so the connection cannot be reused.
            self.close_connection = True
            return self._error(RequestError(f"Content-Length must be 0..{MAX_BODY_BYTES}", 413))
        raw = self.rfile.read(length)
        app = self.app
        try:
            request = parse_completion_request(raw, app.served_model_name, app.max_seq_len)
        except RequestError as exc:
            return self._error(exc)
        used, generated = app.worker.call(lambda: app.decode(request.prompt, request.max_tokens))
        self._send_json(200, completion_response(app.served_model_name, used, generated))
        return 200

    def _method_not_allowed(self) -> None:
        started = time.monotonic()
        self._finish(started, self._error(RequestError(f"method {self.command} not allowed", 405)))

    do_PUT = do_DELETE = do_PATCH = _method_not_allowed


class ReferenceHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer carrying the App; IPv6 when the host is an IPv6 literal."""

    daemon_threads = True  # an in-flight request never blocks process exit after shutdown
    allow_reuse_address = True

    def __init__(self, host: str, port: int, app: App) -> None:
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.app = app
        super().__init__((host, port), Handler)

    @property
    def port(self) -> int:
        """The port actually bound (useful with ``--port 0``)."""
        return int(self.server_address[1])
