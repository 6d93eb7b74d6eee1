"""The HTTP plumbing under the registry client: timeouts, capped bodies, and deadlines that hold.

``requests`` reads a reply whole unless asked to stream, and its timeouts bound each read, not an
exchange: a server sending one byte every 20 s keeps a request alive for ever. Here every request
of a session made by :func:`bounded_session` streams, has a timeout, and runs under the
:class:`Guard` of its exchange (:func:`guarded`), which shuts the exchange's sockets down when its
time is up.

Under a session, a :data:`Transport` (requests' transport adapter) carries the requests: the network
(:class:`_WatchedAdapter`, whose sockets the guard watches) unless the registry client is handed
another one (the unit tests' in-memory registry, ``tests/support/registry_simulator.py``).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import requests
import urllib3.connection
import urllib3.connectionpool
from requests.adapters import BaseAdapter, HTTPAdapter

from bless.errors import RegistryUnavailableError
from bless.system.deadline import Guard

__all__ = [
    "CONNECT_TIMEOUT_S",
    "MAX_REDIRECT_BODY",
    "MAX_TOKEN_BODY",
    "READ_TIMEOUT_S",
    "Guard",
    "Transport",
    "bounded_session",
    "guarded",
    "read_upto",
]

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
#: The most of a reply to oras' own requests (bearer tokens: a few KiB) read before it is refused.
MAX_TOKEN_BODY = 1 << 20
#: The most of a redirect's body read before it is refused: nobody needs it (the Location says where).
MAX_REDIRECT_BODY = 64 << 10
_READ_CHUNK = 64 << 10
#: What carries a session's requests: requests' transport adapter (``send`` a prepared request, get a response).
Transport = BaseAdapter


#: The guard of the exchange this thread runs (download workers each run their own).
_current = threading.local()


def _watch(sock: socket.socket | None) -> None:
    guard: Guard | None = getattr(_current, "guard", None)
    if guard is not None and sock is not None:
        guard.watch(sock)


class _WatchedHTTPConnection(urllib3.connection.HTTPConnection):
    """Hands every socket it connects or reuses to the guard of the running exchange."""

    def connect(self) -> None:
        super().connect()
        _watch(self.sock)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _watch(self.sock)
        super().request(*args, **kwargs)


class _WatchedHTTPSConnection(urllib3.connection.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _watch(self.sock)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _watch(self.sock)
        super().request(*args, **kwargs)


class _WatchedHTTPPool(urllib3.connectionpool.HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(urllib3.connectionpool.HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


class _WatchedAdapter(HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _WatchedHTTPPool, "https": _WatchedHTTPSPool}


@contextmanager
def guarded(seconds: float) -> Iterator[Guard]:
    """Run an exchange (its requests and the reading of their bodies) under a new guard of ``seconds``."""
    previous = getattr(_current, "guard", None)
    with Guard(seconds) as guard:
        _current.guard = guard
        try:
            yield guard
        finally:
            _current.guard = previous


def bounded_session(
    session: requests.Session, *, read_timeout: float = READ_TIMEOUT_S, transport: Transport | None = None
) -> requests.Session:
    """Every request of ``session`` gets a timeout (oras sets none) and a streamed, capped body.

    A request made with ``stream=True`` (all of ours) leaves the body to its caller, who reads it with
    the cap of its kind. One made without (oras' own: bearer tokens) has its body read here, at most
    :data:`MAX_TOKEN_BODY`: requests would otherwise read whatever the server sends into memory.
    requests also reads a redirect's body whole before following it, stream or not: a response hook
    reads it here first, at most :data:`MAX_REDIRECT_BODY`.
    ``transport`` carries the requests instead of the network (None: the network, guarded).
    """
    for prefix in ("http://", "https://"):
        session.mount(prefix, _WatchedAdapter() if transport is None else transport)
    session.hooks["response"].append(_cap_redirect_body)
    request = session.request

    def bounded(method: str, url: str, **kwargs: Any) -> requests.Response:
        stream = kwargs.pop("stream", False)
        kwargs.setdefault("timeout", (CONNECT_TIMEOUT_S, read_timeout))
        response: requests.Response = request(method, url, stream=True, **kwargs)
        if not stream:
            with response:
                body, whole = read_upto(response, MAX_TOKEN_BODY)
            if not whole:
                raise RegistryUnavailableError(
                    f"{urlsplit(url).netloc}: the reply to {method} {urlsplit(url).path} is larger than "
                    f"{MAX_TOKEN_BODY} bytes",
                    hint="a registry's (or its token service's) reply is never that large; check what serves it",
                )
            response._content = body
        return response

    session.request = bounded  # type: ignore[method-assign,assignment]
    return session


def _cap_redirect_body(response: requests.Response, *args: Any, **kwargs: Any) -> requests.Response:
    """A response hook: read a redirect's body capped, before requests reads it whole to follow it."""
    if response.is_redirect:
        body, whole = read_upto(response, MAX_REDIRECT_BODY)
        if not whole:
            response.close()
            url = urlsplit(response.url)
            raise RegistryUnavailableError(
                f"{url.netloc}: the redirect answering {url.path} has a body larger than {MAX_REDIRECT_BODY} bytes",
                hint="a registry's redirect carries a Location, not a body of that size; check what serves it",
            )
        response._content = body
    return response


def read_upto(response: requests.Response, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of a streamed body, and whether that was all of it.

    A declared Content-Length over the limit is believed without reading (the body is then not whole).
    """
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        return b"", False
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_content(chunk_size=_READ_CHUNK):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks)[:limit], False
    return b"".join(chunks), True
