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

import errno
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
    "RequestFailure",
    "Transport",
    "bounded_session",
    "describe_failure",
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


# ------------------------------------------------------------------------------ failures in words


@dataclass(frozen=True)
class RequestFailure:
    """Why a request to a registry got no reply, as a sentence (``reason``) and what to check (``hint``).

    requests' own messages are urllib3's reprs (``_WatchedHTTPSPool(host=..., port=443): Max retries exceeded
    ... NameResolutionError(...``): neither a user's words nor short enough to keep whole.
    """

    reason: str
    hint: str
    #: The remedy key (:attr:`bless.errors.BlessError.remedy`) when an option of the caller is the remedy.
    remedy: str | None = None


def describe_failure(exc: requests.exceptions.RequestException, *, read_timeout: float) -> RequestFailure:
    """What went wrong with ``exc``'s request, from the OS's and the TLS library's errors under it.

    Each case names the host (and the port where it matters): a name that does not resolve, a refused
    connection, a TLS handshake that failed or a certificate not accepted, a connection or a reply that
    did not come in time, a connection closed or unreachable. ``read_timeout``: the seconds a reply was
    waited for (the session's read timeout).
    """
    url = urlsplit(exc.request.url if exc.request is not None and exc.request.url else "")
    host = url.hostname or "the registry"
    port = url.port or (443 if url.scheme == "https" else 80)
    causes = _causes(exc)

    def first(kind: type[BaseException]) -> Any:
        return next((cause for cause in causes if isinstance(cause, kind)), None)

    if (unresolved := first(socket.gaierror)) is not None or _named(causes, "NameResolutionError"):
        detail = f" ({unresolved.strerror})" if unresolved is not None and unresolved.strerror else ""
        return RequestFailure(
            f"the host name {host} does not resolve{detail}",
            "check the registry's name in the reference, and this machine's DNS (and proxy) settings",
        )
    if first(ConnectionRefusedError) is not None:
        return RequestFailure(
            f"{host} refused the connection on port {port}: nothing listens there, or a firewall rejects it",
            "check that the registry runs and on which port; loopback registries are reached over plain HTTP, "
            "others over HTTPS",
            remedy="plain_http",
        )
    if (certificate := first(ssl.SSLCertVerificationError)) is not None:
        why = certificate.verify_message or certificate.reason or "not trusted"
        return RequestFailure(
            f"the TLS certificate of {host} was not accepted ({why})",
            "a registry with a private CA needs that CA in this machine's trust store (or REQUESTS_CA_BUNDLE); "
            "a plain-HTTP registry needs plain HTTP",
        )
    if (handshake := first(ssl.SSLError)) is not None:
        why = str(handshake.reason or handshake.strerror or "no reason given").replace("_", " ").lower()
        speaks_plain_http = "wrong version number" in why or "record layer failure" in why
        return RequestFailure(
            f"the TLS handshake with {host} on port {port} failed ({why})"
            + (": it does not seem to speak TLS there (a plain-HTTP registry?)" if speaks_plain_http else ""),
            "a registry served over plain HTTP is reached with plain HTTP (loopback ones are, by default)",
            remedy="plain_http",
        )
    if isinstance(exc, requests.exceptions.ConnectTimeout) or _named(causes, "ConnectTimeoutError"):
        return RequestFailure(
            f"{host} did not accept a connection on port {port} within {CONNECT_TIMEOUT_S:g} s",
            "check that the registry is up and reachable from here (a firewall that drops packets looks like this)",
        )
    if isinstance(exc, requests.exceptions.ReadTimeout) or first(TimeoutError) is not None:
        return RequestFailure(
            f"{host} accepted the connection on port {port} but sent no reply within {read_timeout:g} s",
            "the registry is overloaded or stuck: retry when it is healthy (a slow link: a longer transfer grace "
            "period)",
        )
    if (unreachable := first(OSError)) is not None and unreachable.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return RequestFailure(
            f"{host} cannot be reached from here ({unreachable.strerror or 'no route'})",
            "check this machine's network (routes, VPN, proxy) and the registry's address",
        )
    if first(ConnectionResetError) is not None or _named(causes, "RemoteDisconnected", "ProtocolError"):
        return RequestFailure(
            f"{host} closed the connection on port {port} without a reply",
            "check what listens on that port (a proxy or a TLS terminator in front of the registry?)",
        )
    if isinstance(exc, requests.exceptions.ProxyError):
        return RequestFailure(
            f"the proxy between here and {host} failed or refused the request",
            "check the HTTPS_PROXY / HTTP_PROXY / NO_PROXY settings",
        )
    os_error = next((c for c in causes if isinstance(c, OSError) and c.strerror), None)
    detail = str(os_error.strerror) if os_error is not None else type(exc).__name__
    return RequestFailure(
        f"the request to {host} on port {port} failed ({detail})",
        "check that the registry is up and reachable from here, then retry",
    )


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception under it: chained, held as an argument, or as urllib3's ``reason``."""
    found: list[BaseException] = []
    pending: list[BaseException] = [exc]
    while pending and len(found) < 32:
        current = pending.pop(0)
        if any(current is seen for seen in found):
            continue
        found.append(current)
        reason = getattr(current, "reason", None)
        inner = [reason, current.__cause__, current.__context__, *current.args]
        pending.extend(item for item in inner if isinstance(item, BaseException))
    return found


def _named(causes: list[BaseException], *names: str) -> bool:
    """Whether one of ``causes`` is of a class called one of ``names`` (urllib3's and http.client's, by name:
    their module paths move between releases)."""
    return any(type(cause).__name__ in names for cause in causes)
