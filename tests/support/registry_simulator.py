"""An in-memory OCI registry under bless's registry client, for the unit tests (after python-tuf's RepositorySimulator).

Where it sits, and why there: :class:`bless.oci.client.RegistryClient` sends every request through a
:data:`~bless.oci.client.Transport` (requests' transport adapter: a prepared request in, a response
out), the network unless the flow is handed another (``transport=`` of ``push_blessing``,
``pull_blessing``, ``render_blessing``, and of the client). :class:`RegistrySimulator` is one. So
everything above it is bless's production code, running as against a real registry: oras' URLs and
authentication, the client's status handling and error messages, its cap on every body it reads,
the digest and size of every blob checked while it streams, the Content-Length of a truncated blob,
the deadlines. A fake of ``RegistryClient`` itself would skip exactly the checks the attack tests
are about; this one only stores and serves bytes: digests are computed here from what was uploaded,
and a blob tampered with here is refused by bless's own hashing, not by the simulator.

What it serves: the routes bless uses, with the statuses, headers and error bodies Docker
Distribution 2.8 sends (recorded from Debian's ``docker-registry``, the one ``tests/support/registry.py``
runs): ``GET /v2/``; ``HEAD``/``GET /v2/<name>/blobs/<digest>``; ``POST /v2/<name>/blobs/uploads/``
and the monolithic ``PUT`` of its Location with ``?digest=`` (400 DIGEST_INVALID when the bytes
hash to another); ``PUT``/``GET``/``HEAD /v2/<name>/manifests/<tag or digest>`` (a PUT naming a
blob the repository lacks: 400 MANIFEST_BLOB_UNKNOWN; under a digest its bytes do not hash to: 400
DIGEST_INVALID; a GET that does not accept OCI manifests: 404); any other path 404. As in
Distribution, blobs and manifests share one content store by digest, each repository links what was
pushed to it, a blob already held is not rewritten by a new upload, and a manifest is answered with
the digest it is stored under (``Docker-Content-Digest``), whatever its bytes hash to now. With
``credentials``: HTTP basic authentication (Distribution's htpasswd), a 401 with a Basic challenge
for a request without them.

Hooks, the test's hand behind bless's back: :meth:`tamper` replaces the bytes held under a digest
(a blob or a manifest altered in the registry's storage); :meth:`put_manifest` stores a manifest
under a tag as anyone with push rights can (a tag moved back, a swapped config, crafted paths);
:meth:`kill` takes the registry down (every request: connection refused); :meth:`killed_after`
kills it once so many bytes of replies went out (a body cut mid-way); :meth:`lying` answers
matching requests with a lie of ``tests/support/lying_registry.py`` (a :class:`~tests.support.lying_registry.Reply`:
any status, headers and body, endless or with a false length, a bearer challenge; or a
:class:`~tests.support.lying_registry.Delayed`). A trickle or a stall mid-body needs a real socket for the
client's watchdog to shut down and its read timeout to expire: those lies are told only by the
lying server in front of the real registry.

``ALSO_REAL`` and ``REAL_ONLY`` (at the end) mark a unit test that runs against the real registry as
well (an end-to-end anchor of its attack class) or only there (it needs real sockets, or a ``bless``
process that cannot be handed a transport).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import http
import io
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
import urllib3
from requests.adapters import HTTPAdapter

from tests.support.lying_registry import SAFETY_LIMIT, Delayed, Lie, Reply, lie_for
from tests.support.registry import Registry

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_API_VERSION = {"Docker-Distribution-Api-Version": "registry/2.0"}
_JSON = "application/json; charset=utf-8"
_UPLOADS = re.compile(r"/v2/(?P<name>.+)/blobs/uploads/(?P<upload>[^/]*)")
_BLOB = re.compile(r"/v2/(?P<name>.+)/blobs/(?P<digest>[^/]+)")
_MANIFEST = re.compile(r"/v2/(?P<name>.+)/manifests/(?P<reference>[^/]+)")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass
class _Repository:
    """What was pushed to one repository: links into the registry's content store."""

    blobs: set[str] = field(default_factory=set)
    manifests: dict[str, str] = field(default_factory=dict)  # digest -> media type
    tags: dict[str, str] = field(default_factory=dict)  # tag -> digest


@dataclass(frozen=True)
class _Answer:
    """What the registry (or a lie) answers, before it is made a response."""

    status: int
    headers: Mapping[str, str]
    body: bytes = b""
    endless: bool = False
    #: Count what the client reads of it (a lie's body), or let it be cut by killed_after (the registry's own).
    lie: bool = False


#: Distribution's answer to a path it has no route for (Go's mux).
_NO_ROUTE = _Answer(
    404,
    {**_API_VERSION, "Content-Type": "text/plain; charset=utf-8", "X-Content-Type-Options": "nosniff",
     "Content-Length": "19"},
    b"404 page not found\n",
)  # fmt: skip


class _Body(io.RawIOBase):
    """A reply's body as the client reads it: ``data``, then zeros up to SAFETY_LIMIT when ``endless``."""

    def __init__(self, data: bytes, endless: bool, on_read: Callable[[int, int], None]) -> None:
        super().__init__()
        self._data = data
        self._size = SAFETY_LIMIT if endless else len(data)
        self._position = 0
        self._on_read = on_read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = min(len(buffer), self._size - self._position)
        if count <= 0:
            return 0
        self._on_read(count, self._position + count)  # may raise: the connection broke
        chunk = self._data[self._position : self._position + count]
        buffer[: len(chunk)] = chunk
        buffer[len(chunk) : count] = bytes(count - len(chunk))
        self._position += count
        return count


class RegistrySimulator(HTTPAdapter):
    """An OCI registry in memory, and the transport that reaches it (see the module docstring).

    ``host`` is loopback, as the real test registry's, so the client speaks plain HTTP to both; port
    9 (discard): a request that missed the simulator finds nothing there.
    """

    def __init__(self, *, host: str = "127.0.0.1:9", credentials: tuple[str, str] | None = None) -> None:
        super().__init__()
        self.host = host
        self.credentials = credentials
        #: The most the client read of one lie's body (what ``lying`` told since it was entered).
        self.largest_reply = 0
        #: The requests answered (refused ones included) since ``lying`` was entered: a client's retries and
        #: redirects show here as work done.
        self.requests = 0
        self._content: dict[str, bytes] = {}
        self._repositories: dict[str, _Repository] = {}
        self._uploads: dict[str, str] = {}  # upload id -> repository
        self._lies: list[Lie] = []
        self._used: dict[int, int] = {}
        self._down = False
        self._kill_after: int | None = None
        self._sent = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------ the test's hooks

    @property
    def transport(self) -> RegistrySimulator:
        """What the flows and the client are handed (``transport=``): this simulator."""
        return self

    def ref(self, repository: str) -> str:
        return f"{self.host}/{repository}"

    def stored(self, digest: str) -> bytes:
        """The bytes held under ``digest`` (a blob or a manifest)."""
        with self._lock:
            return self._content[digest]

    def tamper(self, digest: str, data: bytes) -> None:
        """Replace the bytes held under ``digest``, which stays their name (altered storage)."""
        with self._lock:
            assert digest in self._content, f"the registry holds nothing under {digest}"
            self._content[digest] = data

    def manifest_bytes(self, repository: str, reference: str) -> bytes:
        """A manifest's bytes as the registry serves them, by tag or digest."""
        answer = self._get_manifest(repository, reference, {"Accept": OCI_MANIFEST})
        assert answer.status == 200, answer
        return answer.body

    def put_manifest(self, repository: str, tag: str, data: bytes) -> None:
        """Store an OCI manifest under ``tag`` through the registry's own rules, as anyone with push rights can."""
        answer = self._put_manifest(repository, tag, data, OCI_MANIFEST)
        assert answer.status == 201, answer

    def kill(self) -> None:
        """Down from now on: every request is refused as by a closed port."""
        with self._lock:
            self._down = True

    @contextmanager
    def killed_after(self, after_bytes: int) -> Iterator[str]:
        """The registry dies once more than ``after_bytes`` of reply bodies went out, mid-body; yields its host."""
        with self._lock:
            self._kill_after, self._sent = after_bytes, 0
        try:
            yield self.host
        finally:
            with self._lock:
                self._kill_after = None

    @contextmanager
    def lying(self, *lies: Lie) -> Iterator[RegistrySimulator]:
        """Answer requests ``lies`` match with their lie while inside; yields this registry (its ``ref``)."""
        with self._lock:
            self._lies, self._used, self.largest_reply, self.requests = list(lies), {}, 0, 0
        try:
            yield self
        finally:
            with self._lock:
                self._lies, self._used = [], {}

    # ------------------------------------------------------------------------------------ the transport

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: Any = None,
    ) -> requests.Response:
        """Answer ``request`` from memory, as a registry on ``host`` would over HTTP."""
        url = urlsplit(request.url or "")
        method = request.method or "GET"
        with self._lock:
            self.requests += 1
            refused = self._down or url.netloc != self.host
            lie = lie_for(self._lies, self._used, method, url.path)
        if refused:
            # Chained as urllib3 chains it: the client words a refusal from the OSError under it.
            refusal = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
            raise requests.exceptions.ConnectionError(f"{url.netloc}: {refusal}", request=request) from refusal
        if lie is not None and isinstance(lie.answer, Delayed):
            time.sleep(lie.answer.seconds)
            lie = None
        if lie is None:
            answer = self._answer(method, url.path, parse_qs(url.query), request.headers, _request_body(request))
        elif isinstance(lie.answer, Reply):
            answer = self._lie(lie.answer)
        else:
            raise NotImplementedError(f"{lie}: a lie written to a socket needs the real registry (REAL_ONLY)")
        return self._response(request, method, answer)

    def close(self) -> None:
        """Nothing to close: sessions that end (the client's challenge session) leave the registry as it is."""

    def _response(self, request: requests.PreparedRequest, method: str, answer: _Answer) -> requests.Response:
        """The reply as requests' own adapter makes it of what urllib3 read off a socket."""
        try:
            reason = http.HTTPStatus(answer.status).phrase
        except ValueError:
            reason = ""
        body = b"" if method == "HEAD" else answer.body
        try:
            raw = urllib3.HTTPResponse(
                body=_Body(
                    body, answer.endless and method != "HEAD", self._count_lie if answer.lie else self._count_sent
                ),
                headers=urllib3.HTTPHeaderDict(answer.headers),
                status=answer.status,
                reason=reason,
                preload_content=False,
                decode_content=True,
                enforce_content_length=True,
                request_method=method,
                request_url=request.url,
            )
        except urllib3.exceptions.InvalidHeader as exc:  # e.g. two Content-Lengths that differ
            raise requests.exceptions.InvalidHeader(exc, request=request) from None
        return self.build_response(request, raw)

    def _count_lie(self, _count: int, read_so_far: int) -> None:
        with self._lock:
            self.largest_reply = max(self.largest_reply, read_so_far)

    def _count_sent(self, count: int, _read_so_far: int) -> None:
        with self._lock:
            self._sent += count
            if self._kill_after is None or self._sent <= self._kill_after:
                return
            self._down = True
        raise ConnectionResetError(104, "Connection reset by peer")

    def _lie(self, lie: Reply) -> _Answer:
        headers = urllib3.HTTPHeaderDict()
        for key, value in lie.headers.items():
            headers.add(key, value.replace("{host}", self.host))
        if not lie.endless:
            headers.add("Content-Length", str(len(lie.body)))  # beside one the lie declares, as the lying server
        return _Answer(lie.status, headers, lie.body, endless=lie.endless, lie=True)

    # ------------------------------------------------------------------------------------ the registry

    def _answer(
        self, method: str, path: str, query: dict[str, list[str]], headers: Mapping[str, str], body: bytes
    ) -> _Answer:
        if not path.startswith("/v2/"):
            return _NO_ROUTE
        denied = self._unauthorized(path, method, headers)
        if denied is not None:
            return denied
        if path == "/v2/":
            return _Answer(200, {**_API_VERSION, "Content-Type": _JSON, "Content-Length": "2"}, b"{}")
        if match := _UPLOADS.fullmatch(path):
            if method == "POST" and not match["upload"]:
                return self._start_upload(match["name"])
            if method == "PUT" and match["upload"]:
                return self._finish_upload(match["name"], match["upload"], query.get("digest", [""])[0], body)
        elif match := _BLOB.fullmatch(path):
            if method in ("GET", "HEAD"):
                return self._get_blob(match["name"], match["digest"])
        elif match := _MANIFEST.fullmatch(path):
            if method in ("GET", "HEAD"):
                return self._get_manifest(match["name"], match["reference"], headers)
            if method == "PUT":
                return self._put_manifest(match["name"], match["reference"], body, headers.get("Content-Type", ""))
        else:
            return _NO_ROUTE
        return _error(405, "UNSUPPORTED", "The operation is unsupported.")

    def _unauthorized(self, path: str, method: str, headers: Mapping[str, str]) -> _Answer | None:
        if self.credentials is None:
            return None
        expected = "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
        if headers.get("Authorization") == expected:
            return None
        name = next((m["name"] for r in (_UPLOADS, _BLOB, _MANIFEST) if (m := r.fullmatch(path))), None)
        action = "pull" if method in ("GET", "HEAD") else "push"
        detail = None if name is None else [{"Type": "repository", "Class": "", "Name": name, "Action": action}]
        answer = _error(401, "UNAUTHORIZED", "authentication required", detail)
        return _Answer(401, {**answer.headers, "WWW-Authenticate": 'Basic realm="bless-test"'}, answer.body)

    def _repository(self, name: str) -> _Repository:
        return self._repositories.setdefault(name, _Repository())

    def _start_upload(self, name: str) -> _Answer:
        upload = str(uuid.uuid4())
        with self._lock:
            self._uploads[upload] = name
        state = base64.urlsafe_b64encode(json.dumps({"Name": name, "UUID": upload, "Offset": 0}).encode()).decode()
        return _Answer(
            202,
            {**_API_VERSION, "Content-Length": "0", "Docker-Upload-Uuid": upload, "Range": "0-0",
             "Location": f"http://{self.host}/v2/{name}/blobs/uploads/{upload}?_state={state}"},
        )  # fmt: skip

    def _finish_upload(self, name: str, upload: str, digest: str, data: bytes) -> _Answer:
        with self._lock:
            if self._uploads.get(upload) != name:
                return _error(404, "BLOB_UPLOAD_UNKNOWN", "blob upload unknown to registry", upload)
            if not _DIGEST.fullmatch(digest) or _digest(data) != digest:
                return _error(
                    400, "DIGEST_INVALID", "provided digest did not match uploaded content",
                    {"Digest": digest, "Reason": {}},
                )  # fmt: skip
            del self._uploads[upload]
            self._content.setdefault(digest, data)  # a blob already held is not rewritten
            self._repository(name).blobs.add(digest)
        return _Answer(
            201,
            {**_API_VERSION, "Content-Length": "0", "Docker-Content-Digest": digest,
             "Location": f"http://{self.host}/v2/{name}/blobs/{digest}"},
        )  # fmt: skip

    def _get_blob(self, name: str, digest: str) -> _Answer:
        with self._lock:
            repository = self._repositories.get(name)
            if repository is None or digest not in repository.blobs:
                return _error(404, "BLOB_UNKNOWN", "blob unknown to registry", digest)
            data = self._content[digest]
        return _Answer(
            200,
            {"Accept-Ranges": "bytes", "Cache-Control": "max-age=31536000", "Content-Length": str(len(data)),
             "Content-Type": "application/octet-stream", "Docker-Content-Digest": digest,
             **_API_VERSION, "Etag": f'"{digest}"'},
            data,
        )  # fmt: skip

    def _get_manifest(self, name: str, reference: str, headers: Mapping[str, str]) -> _Answer:
        with self._lock:
            repository = self._repositories.get(name, _Repository())
            digest = reference if _DIGEST.fullmatch(reference) else repository.tags.get(reference)
            if digest is None:
                return _error(404, "MANIFEST_UNKNOWN", "manifest unknown", {"Tag": reference})
            media_type = repository.manifests.get(digest)
            if media_type is None:
                return _error(404, "MANIFEST_UNKNOWN", "manifest unknown", {"Name": name, "Revision": digest})
            data = self._content[digest]
        accepted = [part.split(";")[0].strip() for part in headers.get("Accept", "").split(",")]
        if media_type == OCI_MANIFEST and OCI_MANIFEST not in accepted:
            return _error(
                404, "MANIFEST_UNKNOWN", "OCI manifest found, but accept header does not support OCI manifests"
            )
        return _Answer(
            200,
            {"Content-Length": str(len(data)), "Content-Type": media_type, "Docker-Content-Digest": digest,
             **_API_VERSION, "Etag": f'"{digest}"'},
            data,
        )  # fmt: skip

    def _put_manifest(self, name: str, reference: str, data: bytes, media_type: str) -> _Answer:
        try:
            document = json.loads(data)
        except ValueError:
            document = None
        if (
            media_type != OCI_MANIFEST
            or not isinstance(document, dict)
            or document.get("mediaType", OCI_MANIFEST) != OCI_MANIFEST
        ):
            return _error(400, "MANIFEST_INVALID", "manifest invalid")
        digest = _digest(data)
        if _DIGEST.fullmatch(reference) and reference != digest:
            return _error(400, "DIGEST_INVALID", "provided digest did not match uploaded content")
        with self._lock:
            repository = self._repository(name)
            for descriptor in [document.get("config"), *(document.get("layers") or [])]:
                referenced = descriptor.get("digest") if isinstance(descriptor, dict) else None
                if referenced not in repository.blobs:
                    return _error(400, "MANIFEST_BLOB_UNKNOWN", "blob unknown to registry", referenced)
            self._content.setdefault(digest, data)
            repository.manifests[digest] = media_type
            if reference != digest:
                repository.tags[reference] = digest
        return _Answer(
            201,
            {"Docker-Content-Digest": digest, **_API_VERSION,
             "Location": f"http://{self.host}/v2/{name}/manifests/{digest}", "Content-Length": "0"},
        )  # fmt: skip


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _request_body(request: requests.PreparedRequest) -> bytes:
    """The bytes of a request: none, bytes, or a file streamed from disk (a blob upload)."""
    body = request.body
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    data = body.read()
    return data if isinstance(data, bytes) else bytes(data)


def _error(status: int, code: str, message: str, detail: object = None) -> _Answer:
    """Distribution's error reply: ``{"errors": [{"code", "message", "detail"}]}`` as JSON."""
    error: dict[str, object] = {"code": code, "message": message}
    if detail is not None:
        error["detail"] = detail
    body = json.dumps({"errors": [error]}, separators=(",", ":")).encode() + b"\n"
    return _Answer(status, {"Content-Type": _JSON, **_API_VERSION, "Content-Length": str(len(body))}, body)


# ---------------------------------------------------------------------------- choosing a test's registry

#: What a fleet unit test talks to: this simulator, or (``ALSO_REAL``, ``REAL_ONLY``) Docker Distribution.
AnyRegistry = Registry | RegistrySimulator
#: Run against the real registry too: the end-to-end anchor of an attack class.
ALSO_REAL = pytest.mark.parametrize("registry", ["simulated", "real"], indirect=True)
#: Run against the real registry only: real sockets (trickles, stalls, a relay), or ``bless`` processes.
REAL_ONLY = pytest.mark.parametrize("registry", ["real"], indirect=True)


def on_registries(cases: Mapping[str, tuple[object, ...]], *, also_real: Collection[str]) -> list[Any]:
    """Parameters for ``parametrize((..., "registry"), ..., indirect=["registry"])``: every case against the
    simulator, and those named in ``also_real`` against the real registry too (``id``: ``<case>-<registry>``)."""
    assert set(also_real) <= set(cases), set(also_real) - set(cases)
    return [
        pytest.param(*values, backend, id=f"{name}-{backend}")
        for name, values in cases.items()
        for backend in (("simulated", "real") if name in also_real else ("simulated",))
    ]
