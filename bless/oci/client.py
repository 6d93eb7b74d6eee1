"""The OCI registry edge: the only module that talks to a registry (through ``oras``).

``oras`` (0.2.x) gives reference parsing, the distribution API's URLs, and authentication (docker
config files, credential helpers, bearer tokens). What it does not do, done here:

* every blob is checked against its digest **while it streams** (oras does not check), into a file
  the caller owns, with its size enforced;
* OCI manifests are sent as exact bytes (``artifactType`` included; oras' ``push`` takes none);
* no retries with sleeps: oras retries a failed request five times, sleeping 3 s to 83 s, which would
  hang a pull on a registry that is down for minutes; here a failure is reported at once;
* every request has a timeout; plain HTTP only for loopback registries (or when asked for);
* nothing a registry sends is read whole without a cap by its kind: an OCI manifest
  :data:`~bless.oci.artifact.MAX_OCI_MANIFEST_BYTES`, a blob the size its descriptor declares, an error
  body :data:`MAX_ERROR_BODY` (the rest is dropped), a bearer-token reply
  :data:`~bless.oci.http.MAX_TOKEN_BODY`; the ``/v2/`` challenge body is not read at all. A registry
  sending an endless body gets a refusal, not this process's memory;
* every exchange has a deadline, not only a timeout per read (a registry sending one byte every
  20 s never trips a read timeout): :class:`~bless.oci.limits.TransferLimits` gives each request a grace
  plus its size at a minimum rate, and a pull (:mod:`bless.flows.pull`) one for the whole artifact.
  A watchdog (:mod:`bless.oci.http`) shuts the exchange's sockets down when its time is up,
  which is refused as a broken transfer (74).

Credentials stay inside oras' session: nothing here logs, stores or returns them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import oras.container
import oras.provider
import requests

from bless.core.manifest import Manifest
from bless.core.untrusted_text import has_credentials, shown, without_credentials
from bless.errors import (
    ArtifactInvalidError,
    ArtifactNotFoundError,
    DigestMismatchError,
    InputInvalidError,
    RegistryUnavailableError,
    TransferIncompleteError,
    UsageError,
)
from bless.oci.artifact import (
    MAX_OCI_MANIFEST_BYTES,
    BlessingArtifact,
    is_sha256_digest,
    parse_blessing_artifact,
    parse_blessing_config,
)
from bless.oci.http import Transport, bounded_session, describe_failure, guarded, read_upto
from bless.oci.limits import DEFAULT_LIMITS, TransferLimits
from bless.system.user_files import read_input

__all__ = ["CHUNK", "Reference", "RegistryClient", "Transport", "parse_reference"]

CHUNK = 1 << 20
_MANIFEST_ACCEPT = "application/vnd.oci.image.manifest.v1+json"
#: The most of an error reply read (its JSON names a code and a message per error); the rest is dropped.
MAX_ERROR_BODY = 64 << 10
#: A docker config (credentials, a pull secret) is a few KiB; a Kubernetes Secret holds at most 1 MiB.
DOCKER_CONFIG_MAX = 1 << 20


@dataclass(frozen=True)
class Reference:
    """``registry/repository[:tag][@sha256:...]``."""

    registry: str
    repository: str
    tag: str | None
    digest: str | None

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text

    def with_digest(self, digest: str) -> Reference:
        return Reference(self.registry, self.repository, None, digest)

    @property
    def loopback(self) -> bool:
        host = urlsplit(f"//{self.registry}").hostname or ""  # host:port, [::1]:port
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False


def parse_reference(text: str) -> Reference:
    """Parse ``REGISTRY/REPO[:TAG][@sha256:HEX]``; a registry host is required (no Docker Hub default).

    A reference naming a user and password (``user:pass@registry/...``) is refused, and never echoed
    back: refusals show it with the credentials masked.
    """
    raw = text.strip()
    quoted = repr(without_credentials(text))
    if has_credentials(raw):
        raise UsageError(
            f"{quoted} carries credentials (user:password@): bless never takes them from a reference",
            hint="drop them from the reference and log in instead (docker login: bless reads the docker config, "
            "$DOCKER_CONFIG/config.json); then change that password, it may be in your shell history",
        )
    first = raw.split("/", 1)[0]
    if "/" not in raw or not ("." in first or ":" in first or first == "localhost"):
        raise UsageError(
            f"{quoted} names no registry host",
            hint="write the registry too, e.g. localhost:5000/caches/llama:v1 or ghcr.io/org/caches:v1",
        )
    try:
        container = oras.container.Container(raw)
    except ValueError as exc:
        raise UsageError(f"{quoted} is not a registry reference: {without_credentials(str(exc))}") from None
    digest = container.digest
    if digest is not None and not is_sha256_digest(digest):
        raise UsageError(f"{quoted}: only sha256 digests are supported")
    name_part = raw.split("@", 1)[0]
    tag = container.tag if ":" in name_part.rsplit("/", 1)[-1] else None
    repository = f"{container.namespace}/{container.repository}" if container.namespace else container.repository
    return Reference(container.registry, repository, tag, digest)


class _Oras(oras.provider.Registry):  # type: ignore[misc]
    """oras' client without its sleeping retries (see the module docstring)."""

    do_request = oras.provider.Registry.do_request.__wrapped__


class RegistryClient:
    """Blob and manifest operations on one repository of a registry."""

    def __init__(
        self,
        reference: Reference,
        *,
        plain_http: bool | None = None,
        limits: TransferLimits = DEFAULT_LIMITS,
        deadline: float | None = None,
        transport: Transport | None = None,
    ) -> None:
        """``deadline`` (``time.monotonic()``) bounds every exchange on top of its own budget (a pull's).

        ``transport`` carries every request instead of the network (None: the network). Everything
        above it, this client's checks included, is the same either way.
        """
        self.reference = reference
        self.limits = limits
        self.deadline = deadline
        self.plain_http = plain_http
        self.transport = transport
        insecure = reference.loopback if plain_http is None else plain_http
        self._prefix = "http" if insecure else "https"
        # oras would read the docker configs itself, whole and blocking: they are read here, bounded, and
        # before any request (a config that cannot be read is refused whether or not the registry is up).
        auth_config = _docker_auth_config()
        self._basic = self._challenge() == "basic"
        backend = "basic" if self._basic else "token"
        self._oras = _Oras(hostname=reference.registry, insecure=insecure, auth_backend=backend)
        bounded_session(self._oras.session, read_timeout=limits.grace_s, transport=transport)
        self._container = oras.container.Container(f"{reference.registry}/{reference.repository}")
        self._oras.auth._auth_config = auth_config
        with self._errors("reading credentials"):
            self._oras.auth.load_configs(self._container, [])

    def _challenge(self) -> str:
        """How the registry asks for credentials: ``basic`` (htpasswd) or ``token`` (bearer, the default)."""
        # Only the status and the header matter: the body is never read (a registry may send one without end).
        with (
            self._deadline(0, "contacting the registry"),
            self._errors("contacting the registry"),
            bounded_session(requests.Session(), read_timeout=self.limits.grace_s, transport=self.transport) as session,
        ):
            response = session.get(f"{self._prefix}://{self.reference.registry}/v2/", stream=True)
            response.close()
        challenge = response.headers.get("WWW-Authenticate", "") if response.status_code == 401 else ""
        return "basic" if challenge.lower().startswith("basic") else "token"

    # ------------------------------------------------------------------------------ plumbing

    @contextmanager
    def _deadline(self, size: int, what: str) -> Iterator[None]:
        """Bound one exchange of ``size`` bytes by its budget (and the client's deadline); 74 past it."""
        budget = self.limits.budget(size)
        if self.deadline is not None:
            budget = min(budget, self.deadline - time.monotonic())
        expired = TransferIncompleteError(
            f"{self.reference.registry}: {what} did not finish within its {max(budget, 0):.0f} s (a "
            f"{self.limits.grace_s:.0f} s grace plus {self.limits.min_rate} bytes/s for its size)",
            hint="nothing was installed; the registry or the link stalls or trickles: retry when it is healthy, "
            "or give a slow link a lower minimum transfer rate (min_rate)",
            remedy="lower_min_rate",
        )
        if budget <= 0:
            raise expired
        with guarded(budget) as guard:
            try:
                yield
            except Exception:
                if guard.expired:
                    raise expired from None
                raise
            if guard.expired:  # a shut-down socket can also read as a clean end (a reply cut in its headers)
                raise expired

    @contextmanager
    def _body_errors(self, what: str) -> Iterator[None]:
        """Errors while a reply's body streams: the registry answered, so a transfer broke (74), not a connection."""
        try:
            yield
        except requests.exceptions.RequestException as exc:
            if "timed out" in str(exc).lower():
                raise TransferIncompleteError(
                    f"{self.reference.registry}: the transfer stalled while {what}: no byte arrived for "
                    f"{self.limits.grace_s:g} s",
                    hint="nothing was installed; retry when the registry is healthy (a slow link: a longer "
                    "transfer grace period)",
                    remedy="longer_transfer_grace",
                ) from None
            raise TransferIncompleteError(
                f"{self.reference.registry}: the transfer broke off while {what}: {_broken_body(exc)}",
                hint="nothing was installed; retry when the registry is healthy",
            ) from None

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Requests' failures as refusals that say, in words, what failed while ``what`` (no urllib3 reprs)."""
        try:
            yield
        except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError) as exc:
            raise TransferIncompleteError(
                f"{self.reference.registry}: the transfer broke off while {what}: {_broken_body(exc)}",
                hint="nothing was installed; retry when the registry is healthy",
            ) from None
        except requests.exceptions.RequestException as exc:
            # A connect timeout is both a Timeout and a ConnectionError: it reads as a timeout.
            if isinstance(exc, requests.exceptions.Timeout):
                doing = f"timed out while {what}"
            elif isinstance(exc, requests.exceptions.ConnectionError):
                doing = f"cannot connect while {what}"
            else:
                doing = f"{what} failed"
            failure = describe_failure(exc, read_timeout=self.limits.grace_s)
            raise RegistryUnavailableError(
                f"{self.reference.registry}: {doing}: {failure.reason}", hint=failure.hint, remedy=failure.remedy
            ) from None
        except ValueError as exc:  # oras: "Cannot respond to request for authentication."
            raise RegistryUnavailableError(
                f"{self.reference.registry}: {what} failed: {exc}",
                hint="log in (docker login REGISTRY writes the credentials oras reads) or check permissions",
            ) from None

    def _url(self, kind: str, reference: str) -> str:
        return f"{self._prefix}://{self.reference.registry}/v2/{self.reference.repository}/{kind}/{reference}"

    def _request(self, method: str, url: str, what: str, **kwargs: Any) -> requests.Response:
        """A request whose body is left unread (``stream``): each caller reads it with the cap of its kind."""
        kwargs["stream"] = True
        response: requests.Response
        if self._basic:
            # Basic credentials go with every request, up front: a body streamed from a file cannot be
            # sent a second time after a 401. Without credentials the 401 is the answer (access denied).
            if getattr(self._oras.auth, "_basic_auth", None):
                kwargs["headers"] = {**kwargs.get("headers", {}), **self._oras.auth.get_auth_header()}
            with self._errors(what):
                response = self._oras.session.request(method, url, **kwargs)
            return response
        with self._errors(what):
            try:
                response = self._oras.do_request(url, method, **kwargs)
            except (AttributeError, TypeError, KeyError, IndexError):
                # oras reads the bearer challenge and the token reply as well-formed: a registry (or token
                # service) that sends a challenge without a realm, or a token reply that is no JSON object,
                # makes it fail on a None or a list. That is the registry's malformed reply, not a bug here.
                raise RegistryUnavailableError(
                    f"{self.reference.registry}: {what}: its authentication challenge or token reply is malformed "
                    "(a challenge without a realm, or a token reply that is not a JSON object with a token)",
                    hint="the registry or its token service answers outside the distribution spec; check what "
                    "serves it (and docker login REGISTRY for credentials)",
                ) from None
        return response

    def _fail(self, response: requests.Response, what: str) -> None:
        if response.status_code in (200, 201, 202, 204):
            return
        with self._errors(what):
            detail = _registry_message(response)
        response.close()
        if response.status_code == 404:
            raise ArtifactNotFoundError(
                f"{self.reference}: {what}: not found ({detail})",
                hint="check the repository, tag or digest (a push reports what it pushed)",
                remedy="check_pushed_reference",
            )
        if response.status_code in (401, 403):
            raise RegistryUnavailableError(
                f"{self.reference.registry}: {what}: access denied ({response.status_code})",
                hint="log in with docker login REGISTRY (oras reads the docker config) or check permissions",
            )
        raise RegistryUnavailableError(f"{self.reference.registry}: {what}: HTTP {response.status_code} ({detail})")

    # ------------------------------------------------------------------------------ manifests

    def get_manifest(self, reference: str) -> tuple[bytes, str | None]:
        """The exact bytes of a manifest (by tag or digest) and the registry's Docker-Content-Digest."""
        url = self._url("manifests", reference)
        what = f"reading manifest {reference}"
        with self._deadline(MAX_OCI_MANIFEST_BYTES, what):
            response = self._request("GET", url, what, headers={"Accept": _MANIFEST_ACCEPT})
            with response:
                self._fail(response, f"manifest {reference}")
                with self._body_errors(what):
                    data, whole = read_upto(response, MAX_OCI_MANIFEST_BYTES)
        if not whole:
            raise ArtifactInvalidError(
                f"{self.reference}: manifest {reference} is larger than {MAX_OCI_MANIFEST_BYTES} bytes",
                hint="a bless artifact's OCI manifest is never that large (registries need not accept more than "
                "4 MiB); nothing was installed",
            )
        return data, response.headers.get("Docker-Content-Digest")

    def resolve_blessing(self, reference: Reference) -> tuple[BlessingArtifact, Manifest, bytes]:
        """The blessing artifact at ``reference``, its bless manifest, and that manifest's exact bytes.

        Only the OCI manifest and its config blob (the bless manifest) are read: the cache's files are
        not. A digest reference is checked against the bytes; a tag against the registry's own digest.
        """
        data, header_digest = self.get_manifest(reference.digest or reference.tag or "latest")
        artifact = parse_blessing_artifact(data, reference.digest)
        if reference.digest is None and header_digest is not None and header_digest != artifact.digest:
            raise DigestMismatchError(
                f"the registry says tag {reference.tag} is {header_digest}, but its bytes hash to {artifact.digest}",
                hint="the registry is inconsistent or tampered with; pull by digest from a trusted source",
            )
        config_bytes = self.read_blob(artifact.config.digest, artifact.config.size)
        return artifact, parse_blessing_config(artifact, config_bytes), config_bytes

    def put_manifest(self, data: bytes, reference: str, media_type: str) -> None:
        """Store an OCI manifest's exact bytes under a tag or its digest."""
        url = self._url("manifests", reference)
        headers = {"Content-Type": media_type}
        what = f"writing manifest {reference}"
        with self._deadline(len(data), what):
            response = self._request("PUT", url, what, data=data, headers=headers)
            with response:
                self._fail(response, what)

    # ---------------------------------------------------------------------------------- blobs

    def blob_exists(self, digest: str) -> bool:
        what = f"checking blob {digest[:19]}"
        with self._deadline(0, what):
            response = self._request("HEAD", self._url("blobs", digest), what)
            with response:
                if response.status_code == 404:
                    return False
                self._fail(response, f"blob {digest}")
        return True

    def upload_blob(self, digest: str, size: int, source: Path | bytes) -> None:
        """Monolithic upload (POST a session, PUT the bytes with their digest); a file streams from disk."""
        with self._deadline(size, f"uploading {digest[:19]}"):
            self._upload(digest, size, source)

    def _upload(self, digest: str, size: int, source: Path | bytes) -> None:
        start = self._oras.prefix + f"://{self._container.upload_blob_url()}"
        response = self._request("POST", start, "starting an upload", headers={"Content-Length": "0"})
        with response:
            self._fail(response, "starting an upload")
        location = response.headers.get("Location", "")
        if not location.startswith("http"):
            location = f"{self._prefix}://{self.reference.registry}{location}"
        separator = "&" if "?" in location else "?"
        url = f"{location}{separator}digest={digest}"
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        if size == 0:  # requests sends an empty file chunked, which registries wait on: send no body
            source = b""
        if isinstance(source, bytes):
            response = self._request("PUT", url, f"uploading {digest[:19]}", data=source, headers=headers)
        else:
            with source.open("rb") as handle:
                response = self._request("PUT", url, f"uploading {digest[:19]}", data=handle, headers=headers)
        with response:
            self._fail(response, f"uploading blob {digest}")

    def read_blob(self, digest: str, size: int) -> bytes:
        """A small blob in memory, checked like :meth:`download_blob`."""
        chunks: list[bytes] = []
        self._stream_blob(digest, size, chunks.append)
        return b"".join(chunks)

    def download_blob(
        self, digest: str, size: int, sink: IO[bytes], progress: Callable[[int], None] | None = None
    ) -> None:
        """Stream a blob into ``sink``, hashing as it arrives; refuse a wrong size or digest.

        Raises:
            DigestMismatchError: the bytes hash to another digest, or there are more than ``size``.
            TransferIncompleteError: the stream ended early.
        """

        def write(chunk: bytes) -> None:
            sink.write(chunk)
            if progress is not None:
                progress(len(chunk))

        self._stream_blob(digest, size, write)

    def _stream_blob(self, digest: str, size: int, write: Callable[[bytes], None]) -> None:
        what = f"downloading blob {digest[:19]}"
        with self._deadline(size, what):
            self._stream(digest, size, write, what)

    def _stream(self, digest: str, size: int, write: Callable[[bytes], None], what: str) -> None:
        response = self._request("GET", self._url("blobs", digest), what)
        with response:
            self._fail(response, what)
            self._check_length(response, digest, size)
            hasher = hashlib.sha256()
            received = 0
            with self._body_errors(what):
                for chunk in response.iter_content(chunk_size=CHUNK):
                    received += len(chunk)
                    if received > size:
                        raise DigestMismatchError(
                            f"blob {digest} is larger than the {size} bytes its descriptor states",
                            hint="the registry content was altered; nothing was installed",
                        )
                    hasher.update(chunk)
                    write(chunk)
        if received < size:
            if "chunked" in response.headers.get("Transfer-Encoding", "").lower():
                # A chunked reply that ended properly: the registry sent all it holds.
                raise self._altered(digest, size, f"its complete reply held {received}")
            raise TransferIncompleteError(
                f"blob {digest}: {received} of {size} bytes arrived",
                hint="nothing was installed; retry when the registry is healthy",
            )
        actual = "sha256:" + hasher.hexdigest()
        if actual != digest:
            raise DigestMismatchError(
                f"blob {digest[:19]}... arrived as {actual[:19]}... ({size} bytes)",
                hint="the registry holds altered content under this digest; nothing was installed. Tell the "
                "registry's operator and push the blessing again",
                details={"expected": digest, "actual": actual},
            )

    def _check_length(self, response: requests.Response, digest: str, size: int) -> None:
        """A Content-Length other than the descriptor's size: the registry holds other bytes (72), say so now.

        A blob truncated in the registry's storage is served whole, with its true (shorter) length; that
        is altered content, not a transfer to retry. (An encoded body's length is not the blob's.)
        """
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) != size and not response.headers.get("Content-Encoding"):
            raise self._altered(digest, size, f"the registry serves it as {int(declared)}")

    def _altered(self, digest: str, size: int, found: str) -> DigestMismatchError:
        return DigestMismatchError(
            f"blob {digest[:19]}... is {size} bytes by its descriptor, but {found}",
            hint="the registry holds altered (e.g. truncated) content under this digest; nothing was installed. "
            "Tell the registry's operator and push the blessing again",
            details={"expected_size": size, "digest": digest},
        )


def _docker_configs() -> list[Path]:
    """``$DOCKER_CONFIG/config.json`` when set, as the docker CLI reads it, and ``~/.docker/config.json`` (oras's)."""
    directory = os.environ.get("DOCKER_CONFIG")
    found = [Path(directory) / "config.json"] if directory else []
    return [*found, Path("~/.docker/config.json").expanduser()]


def _docker_auth_config() -> dict[str, Any]:
    """The credentials of the docker configs, merged as oras merges them, each read through the bounded reader.

    A missing config is no credentials, as for docker. One that is a FIFO, a device, a directory, too
    big or not a JSON object is refused (3): a pull secret mounted there is a small regular file.
    """
    auths: dict[str, Any] = {}
    helpers: dict[str, Any] = {}
    store: Any = None
    hint = "DOCKER_CONFIG names a directory whose config.json is a docker config (docker login writes one)"
    for path in dict.fromkeys(_docker_configs()):
        if not os.path.lexists(path):
            continue
        data = read_input(path, what="docker config", hint=hint, limit=DOCKER_CONFIG_MAX)
        try:
            document = json.loads(data)
        except (ValueError, RecursionError):
            document = None
        if not isinstance(document, dict):
            raise InputInvalidError(f"{shown(str(path))}: the docker config is not a JSON object", hint=hint)
        for key, into in (("auths", auths), ("credHelpers", helpers)):
            value = document.get(key, {})
            if isinstance(value, dict):
                into.update(value)
        store = document.get("credsStore", store)
    return {"auths": auths, "credsStore": store, "credHelpers": helpers}


def _broken_body(exc: requests.exceptions.RequestException) -> str:
    """Why a reply's body broke off, in words."""
    if isinstance(exc, requests.exceptions.ContentDecodingError):
        return "its body could not be decompressed"
    if isinstance(exc, requests.exceptions.ChunkedEncodingError):
        return "the connection closed before the whole body arrived"
    return f"the connection failed mid-body ({type(exc).__name__})"


def _short(exc: BaseException | str) -> str:
    text = str(exc)
    return text if len(text) < 200 else text[:200] + "..."


def _registry_message(response: requests.Response) -> str:
    """The messages of an error reply, from at most :data:`MAX_ERROR_BODY` of its body (the rest is not read)."""
    body, _whole = read_upto(response, MAX_ERROR_BODY)
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        document = None
    errors = document.get("errors") if isinstance(document, dict) else None
    if not isinstance(errors, list):  # any shape at all may come back: only the spec's is read
        return _short(response.reason or "") or "no detail"
    messages = "; ".join(str(e.get("message", e.get("code", ""))) for e in errors if isinstance(e, dict))
    return _short(messages) or "no detail"
