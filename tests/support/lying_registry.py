"""A lying registry for tests: a loopback HTTP server in front of a real one, lying where told to.

Every request is forwarded to the real registry (:class:`tests.support.registry.Registry`) unless a
:class:`Lie` matches its method and path; then the lie answers instead: an endless body, a
Content-Length it never keeps, a trickle of one byte at a time, a body cut short. Lies that send
without end stop at :data:`SAFETY_LIMIT` bytes, so a client that does read everything fails its
test instead of exhausting the machine; ``sent`` counts what the lies sent, and ``owed`` what the slow
lies (:func:`trickle`, :func:`slow_headers`) set out to send a byte at a time: a client that gave up on
its deadline leaves ``sent`` short of ``owed``; one bounded only per read waits for all of it.

A lie's answer is a :class:`Reply` or a :class:`Delayed` (data: the in-memory registry of
``tests/support/registry_simulator.py`` tells the same lies without a socket), or a function writing to the
socket itself (:func:`trickle`, :func:`slow_headers`: only a real socket makes the client's watchdog
and read timeout matter, so those lies are told here only).
"""

from __future__ import annotations

import http.client
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.support.registry import Registry

#: The most an endless lie sends: far above every cap of the client, far below the machine's memory.
SAFETY_LIMIT = 256 << 20
_CHUNK = b"\0" * (64 << 10)


@dataclass(frozen=True)
class Reply:
    """A whole reply of a lie's choosing: ``status``, ``headers`` and ``body``.

    ``{host}`` in a header value is the answering server's ``host``. Not ``endless``: a Content-Length of
    the body is added (after any the headers declare). ``endless``: after ``body``, zeros until
    :data:`SAFETY_LIMIT` or the client stops reading, with no Content-Length but one ``headers`` declares.
    """

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    endless: bool = False


@dataclass(frozen=True)
class Delayed:
    """The registry's true reply, after ``seconds`` of silence (a slow but honest registry)."""

    seconds: float


#: A lie told by writing to the socket itself (this server only).
SocketLie = Callable[["LyingRegistry", BaseHTTPRequestHandler], None]


@dataclass(frozen=True)
class Lie:
    """Answer ``method`` requests whose path matches ``path`` (a regex) with ``answer`` instead of forwarding."""

    method: str
    path: str
    answer: Reply | Delayed | SocketLie
    #: Lie only this many times (None: always), then forward.
    times: int | None = None


def lie_for(lies: list[Lie], used: dict[int, int], method: str, path: str) -> Lie | None:
    """The first of ``lies`` for ``method`` and ``path`` (its query ignored) not used up, counted in ``used``."""
    for index, lie in enumerate(lies):
        if lie.method == method and re.fullmatch(lie.path, path.split("?", 1)[0]):
            if lie.times is not None and used.get(index, 0) >= lie.times:
                continue
            used[index] = used.get(index, 0) + 1
            return lie
    return None


class LyingRegistry:
    """The server; ``host`` is ``127.0.0.1:PORT``. Use :func:`lying_registry`."""

    def __init__(self, upstream: Registry, lies: list[Lie]) -> None:
        self.upstream = upstream
        self.lies = list(lies)
        self.used: dict[int, int] = {}
        self.sent = 0
        #: The bytes the slow lies set out to send one at a time (``sent`` counts those they did).
        self.owed = 0
        #: The most one reply sent: the kernel's socket buffers take a few MiB of every reply nobody reads,
        #: so a client that reads several replies only partly (pull, then push) sums past one reply's bound.
        self.largest_reply = 0
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        #: The registry client reaches this server over the network.
        self.transport = None

    def ref(self, repository: str) -> str:
        return f"{self.host}/{repository}"

    def count(self, size: int, reply_so_far: int = 0) -> None:
        with self.lock:
            self.sent += size
            self.largest_reply = max(self.largest_reply, reply_so_far)

    def owe(self, size: int) -> None:
        with self.lock:
            self.owed += size

    def lie_for(self, method: str, path: str) -> Lie | None:
        with self.lock:
            return lie_for(self.lies, self.used, method, path)


def _handler(lying: LyingRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def handle_one(self) -> None:
            lie = lying.lie_for(self.command, self.path)
            if lie is None:
                self.forward()
                return
            with suppress(OSError):
                if isinstance(lie.answer, Delayed):
                    time.sleep(lie.answer.seconds)
                    self.forward()
                    return
                self.close_connection = True
                if isinstance(lie.answer, Reply):
                    _send(lying, self, lie.answer)
                else:
                    lie.answer(lying, self)

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
    # A short poll: shutdown() waits for it (the default half second was most of a lie test's time).
    thread = threading.Thread(target=lying.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield lying
    finally:
        lying.server.shutdown()
        lying.server.server_close()


# --------------------------------------------------------------------------------------------- lies


def _send(lying: LyingRegistry, handler: BaseHTTPRequestHandler, reply: Reply) -> None:
    handler.send_response(reply.status)
    for key, value in reply.headers.items():
        handler.send_header(key, value.replace("{host}", lying.host))
    if not reply.endless:
        handler.send_header("Content-Length", str(len(reply.body)))
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.wfile.write(reply.body)
    sent = len(reply.body)
    while reply.endless and sent < SAFETY_LIMIT:
        handler.wfile.write(_CHUNK)
        sent += len(_CHUNK)
        lying.count(len(_CHUNK), sent)


def endless(status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    """A reply whose body never ends (up to :data:`SAFETY_LIMIT`): no Content-Length, closed at the end."""
    return Reply(status, headers or {}, endless=True)


def declared(size: int, status: int = 200) -> Reply:
    """A reply that declares a Content-Length of ``size`` and then sends an endless body."""
    return Reply(status, {"Content-Length": str(size)}, endless=True)


def reply(data: bytes, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
    """A whole reply of the lie's choosing: ``status``, ``headers`` and ``data``."""
    return Reply(status, headers or {}, data)


#: A 401 asking for a bearer token from ``/token`` of the answering server.
token_challenge = Reply(401, {"WWW-Authenticate": 'Bearer realm="http://{host}/token",service="test"'})


def delayed(seconds: float) -> Delayed:
    """The upstream's true reply, after ``seconds`` of silence (a slow but honest registry)."""
    return Delayed(seconds)


def trickle(every_s: float, status: int = 200, content_length: int | None = None, prefix: int = 0) -> SocketLie:
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
        lying.owe(max(0, len(data) - prefix))
        for index in range(prefix, len(data)):
            time.sleep(every_s)
            handler.wfile.write(data[index : index + 1])
            handler.wfile.flush()
            lying.count(1)

    return answer


def slow_headers(every_s: float, count: int = 10_000) -> SocketLie:
    """A status line, then a header that never ends: one byte each ``every_s`` seconds."""

    def answer(lying: LyingRegistry, handler: BaseHTTPRequestHandler) -> None:
        handler.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        handler.wfile.flush()
        lying.owe(count)
        for _ in range(count):
            time.sleep(every_s)
            handler.wfile.write(b"a")
            handler.wfile.flush()
            lying.count(1)

    return answer
