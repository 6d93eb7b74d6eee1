"""A lying registry for tests: a loopback HTTP server in front of a real one, lying where told to.

Every request is forwarded to the real registry (:class:`tests.registry.Registry`) unless a
:class:`Lie` matches its method and path; then the lie answers instead: an endless body, a
Content-Length it never keeps, a trickle of one byte at a time, a body cut short. Lies that send
without end stop at :data:`SAFETY_LIMIT` bytes, so a client that does read everything fails its
test instead of exhausting the machine; ``sent`` counts what the lies sent.
"""

from __future__ import annotations

import http.client
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.registry import Registry

#: The most an endless lie sends: far above every cap of the client, far below the machine's memory.
SAFETY_LIMIT = 256 << 20
_CHUNK = b"\0" * (64 << 10)


@dataclass(frozen=True)
class Lie:
    """Answer ``method`` requests whose path matches ``path`` (a regex) with ``answer`` instead of forwarding."""

    method: str
    path: str
    answer: Callable[[LyingRegistry, BaseHTTPRequestHandler], None]
    #: Lie only this many times (None: always), then forward.
    times: int | None = None


class LyingRegistry:
    """The server; ``host`` is ``127.0.0.1:PORT``. Use :func:`lying_registry`."""

    def __init__(self, upstream: Registry, lies: list[Lie]) -> None:
        self.upstream = upstream
        self.lies = list(lies)
        self.used: dict[int, int] = {}
        self.sent = 0
        #: The most one reply sent: the kernel's socket buffers take a few MiB of every reply nobody reads,
        #: so a client that reads several replies only partly (pull, then push) sums past one reply's bound.
        self.largest_reply = 0
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"

    def ref(self, repository: str) -> str:
        return f"{self.host}/{repository}"

    def count(self, size: int, reply_so_far: int = 0) -> None:
        with self.lock:
            self.sent += size
            self.largest_reply = max(self.largest_reply, reply_so_far)

    def lie_for(self, method: str, path: str) -> Lie | None:
        with self.lock:
            for index, lie in enumerate(self.lies):
                if lie.method == method and re.fullmatch(lie.path, path.split("?", 1)[0]):
                    if lie.times is not None and self.used.get(index, 0) >= lie.times:
                        continue
                    self.used[index] = self.used.get(index, 0) + 1
                    return lie
        return None


def _handler(lying: LyingRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def handle_one(self) -> None:
            lie = lying.lie_for(self.command, self.path)
            if lie is not None:
                self.close_connection = True
                with suppress(OSError):
                    lie.answer(lying, self)
                return
            self.forward()

        do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = handle_one

        def forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            upstream = http.client.HTTPConnection("127.0.0.1", lying.upstream.port, timeout=60)
            try:
                upstream.request(self.command, self.path, body=body, headers=headers)
                reply = upstream.getresponse()
                data = reply.read()
            finally:
                upstream.close()
            self.send_response(reply.status, reply.reason)
            for key, value in reply.getheaders():
                if key.lower() in ("transfer-encoding", "connection", "content-length", "date", "server"):
                    continue
                if key.lower() == "location":  # keep the client talking to us
                    value = value.replace(lying.upstream.host, lying.host)
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

    return Handler


@contextmanager
def lying_registry(upstream: Registry, *lies: Lie) -> Iterator[LyingRegistry]:
    lying = LyingRegistry(upstream, list(lies))
    thread = threading.Thread(target=lying.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield lying
    finally:
        lying.server.shutdown()
        lying.server.server_close()


# --------------------------------------------------------------------------------------------- lies


def endless(
    status: int = 200, headers: dict[str, str] | None = None
) -> Callable[[LyingRegistry, BaseHTTPRequestHandler], None]:
    """A reply whose body never ends (up to :data:`SAFETY_LIMIT`): no Content-Length, closed at the end."""

    def answer(lying: LyingRegistry, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.send_header("Connection", "close")
        handler.end_headers()
        sent = 0
        while sent < SAFETY_LIMIT:
            handler.wfile.write(_CHUNK)
            sent += len(_CHUNK)
            lying.count(len(_CHUNK), sent)

    return answer


def declared(size: int, status: int = 200) -> Callable[[LyingRegistry, BaseHTTPRequestHandler], None]:
    """A reply that declares a Content-Length of ``size`` and then sends an endless body."""

    def answer(lying: LyingRegistry, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Length", str(size))
        handler.send_header("Connection", "close")
        handler.end_headers()
        sent = 0
        while sent < min(size, SAFETY_LIMIT):
            handler.wfile.write(_CHUNK)
            sent += len(_CHUNK)
            lying.count(len(_CHUNK), sent)

    return answer


def trickle(
    every_s: float, status: int = 200, content_length: int | None = None, prefix: int = 0
) -> Callable[[LyingRegistry, BaseHTTPRequestHandler], None]:
    """A reply that sends ``prefix`` bytes at once, then one byte each ``every_s`` seconds, for ever.

    ``content_length`` None: the upstream's real reply is fetched for its headers and bytes, which
    then arrive at that pace (a slow registry serving the right content).
    """

    def answer(lying: LyingRegistry, handler: BaseHTTPRequestHandler) -> None:
        upstream = http.client.HTTPConnection("127.0.0.1", lying.upstream.port, timeout=60)
        headers = {k: v for k, v in handler.headers.items() if k.lower() in ("accept", "authorization")}
        try:
            upstream.request(handler.command, handler.path, headers=headers)
            reply = upstream.getresponse()
            data = reply.read()
        finally:
            upstream.close()
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(data) if content_length is None else content_length))
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(data[:prefix])
        handler.wfile.flush()
        for index in range(prefix, len(data)):
            time.sleep(every_s)
            handler.wfile.write(data[index : index + 1])
            handler.wfile.flush()
            lying.count(1)

    return answer


def token_challenge(lying: LyingRegistry, handler: BaseHTTPRequestHandler) -> None:
    """A 401 asking for a bearer token from ``/token`` of this very server."""
    handler.send_response(401)
    handler.send_header("WWW-Authenticate", f'Bearer realm="http://{lying.host}/token",service="test"')
    handler.send_header("Content-Length", "0")
    handler.send_header("Connection", "close")
    handler.end_headers()


def delayed(seconds: float) -> Callable[[LyingRegistry, BaseHTTPRequestHandler], None]:
    """The upstream's true reply, after ``seconds`` of silence (a slow but honest registry)."""

    def answer(lying: LyingRegistry, handler: BaseHTTPRequestHandler) -> None:
        time.sleep(seconds)
        handler.close_connection = False
        handler.forward()  # type: ignore[attr-defined]

    return answer


def slow_headers(every_s: float, count: int = 10_000) -> Callable[[LyingRegistry, BaseHTTPRequestHandler], None]:
    """A status line, then a header that never ends: one byte each ``every_s`` seconds."""

    def answer(lying: LyingRegistry, handler: BaseHTTPRequestHandler) -> None:
        handler.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        handler.wfile.flush()
        for _ in range(count):
            time.sleep(every_s)
            handler.wfile.write(b"a")
            handler.wfile.flush()
            lying.count(1)

    return answer


def reply(
    data: bytes, status: int = 200, headers: dict[str, str] | None = None
) -> Callable[[LyingRegistry, BaseHTTPRequestHandler], None]:
    """A whole reply of the lie's choosing: ``status``, ``headers`` and ``data``."""

    def answer(lying: LyingRegistry, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(data)

    return answer
