"""Registry failures in words: each refusal names the host and says what failed (a name that does not resolve, a
refused connection, a TLS handshake or certificate, no reply in time), never urllib3's reprs cut mid-sentence.

Every failure here is real: a ``.invalid`` name (RFC 6761: never resolves), a loopback port nothing listens on, a
plain-HTTP server spoken to over HTTPS, a TLS server with a self-signed certificate, a server that never replies.
"""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from typer.testing import CliRunner

from bless.cli.main import app
from bless.errors import RegistryUnavailableError
from bless.oci.client import RegistryClient, parse_reference
from bless.oci.http import describe_failure
from bless.oci.limits import TransferLimits

DIGEST = "sha256:" + "ab" * 32
#: What a message leaking requests' and urllib3's internals holds.
INTERNALS = ("Pool(", "Max retries", "NameResolutionError", "NewConnectionError", "object at 0x", "Caused by")


def _refusal(reference: str, *, plain_http: bool | None = None) -> RegistryUnavailableError:
    limits = TransferLimits(grace_s=5.0)
    with pytest.raises(RegistryUnavailableError) as info:
        RegistryClient(parse_reference(reference), plain_http=plain_http, limits=limits)
    for internal in INTERNALS:
        assert internal not in info.value.message, info.value.message
    assert not info.value.message.endswith("..."), "cut mid-sentence"
    return info.value


@contextmanager
def _server(answer: Callable[[socket.socket], None]) -> Iterator[int]:
    """A loopback TCP server whose every connection ``answer`` handles; yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.1)  # accept() wakes up to see the stop (closing the socket would not wake it)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(1.0)
            with conn, suppress(OSError):
                answer(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def _plain_http(conn: socket.socket) -> None:
    conn.recv(4096)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def _self_signed_context(tmp_path: Path) -> ssl.SSLContext:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bless-test-registry")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return context


def test_a_name_that_does_not_resolve_is_said_so() -> None:
    refusal = _refusal(f"no-such-registry.invalid/blessings/tiny@{DIGEST}")
    assert refusal.message.startswith("no-such-registry.invalid: cannot connect while contacting the registry: ")
    assert "the host name no-such-registry.invalid does not resolve" in refusal.message
    assert refusal.hint and "DNS" in refusal.hint


def test_a_refused_connection_names_the_host_and_port() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refusal = _refusal(f"127.0.0.1:{port}/blessings/tiny@{DIGEST}")
    assert f"127.0.0.1 refused the connection on port {port}: nothing listens there" in refusal.message


def test_tls_to_a_plain_http_registry_says_it_does_not_speak_tls() -> None:
    with _server(_plain_http) as port:
        refusal = _refusal(f"127.0.0.1:{port}/blessings/tiny@{DIGEST}", plain_http=False)
    assert f"the TLS handshake with 127.0.0.1 on port {port} failed (" in refusal.message
    assert "it does not seem to speak TLS there (a plain-HTTP registry?)" in refusal.message
    assert refusal.hint and "plain HTTP" in refusal.hint and refusal.remedy == "plain_http"


def test_an_untrusted_certificate_is_said_so(tmp_path: Path) -> None:
    context = _self_signed_context(tmp_path)

    def tls(conn: socket.socket) -> None:
        with context.wrap_socket(conn, server_side=True) as secure:
            secure.recv(4096)

    with _server(tls) as port:
        refusal = _refusal(f"127.0.0.1:{port}/blessings/tiny@{DIGEST}", plain_http=False)
    assert "the TLS certificate of 127.0.0.1 was not accepted (" in refusal.message
    assert refusal.hint and "CA" in refusal.hint


def test_no_reply_in_time_is_said_so() -> None:
    """The session's read timeout, as the client's exchanges meet it (the watchdog's deadline is tested apart)."""

    def read_only(conn: socket.socket) -> None:  # reads the request, never replies
        conn.recv(4096)
        conn.recv(4096)

    never_replies = _server(read_only)
    with never_replies as port, pytest.raises(requests.exceptions.ReadTimeout) as info:
        requests.get(f"http://127.0.0.1:{port}/v2/", timeout=(5, 0.3))
    failure = describe_failure(info.value, read_timeout=0.3)
    assert failure.reason == f"127.0.0.1 accepted the connection on port {port} but sent no reply within 0.3 s"


def test_k8s_render_against_an_unresolvable_registry_says_so_in_words(tmp_path: Path) -> None:
    """The new user's case: the whole message, as the command prints it, holds no internals and is not cut."""
    profile = tmp_path / "profile.toml"
    profile.write_text(
        'profile_version = 1\nname = "tiny-test"\n[engine]\nname = "reference"\n[runtime]\nkind = "local"\n'
        'python = "python3"\n[model]\nsource = "builtin"\nid = "reference-tiny"\n[hardware]\naccelerator = "cuda"\n'
        "gpu_count = 2\n"
    )
    args = ["--root", str(tmp_path / "empty-store"), "k8s", "render", "--profile", str(profile)]
    args += ["--from", f"registry.example.invalid/blessings/tiny@{DIGEST}"]
    args += ["--image", f"e@{DIGEST}", "--bless-image", f"b@{DIGEST}", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 70, result.output
    assert "the host name registry.example.invalid does not resolve" in result.stdout
    assert f"the store {tmp_path / 'empty-store'} holds no blessing pushed as it" in result.stdout
    for internal in INTERNALS:
        assert internal not in result.stdout
