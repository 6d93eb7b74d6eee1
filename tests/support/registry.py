"""A real OCI registry for tests: Debian's ``docker-registry`` (Docker Distribution) on 127.0.0.1.

Each :class:`Registry` runs its own process on a free loopback port with its own storage dir, so a
test may alter stored blobs and manifests (``tamper``), move a tag (``put_manifest``), kill it
(``kill``) or have it killed mid-transfer (``killed_after``), put a lying server in front of it
(``lying``), or find it down. Its hooks are those of the in-memory registry of the unit tests
(``tests/support/registry_simulator.py``), so a test body runs against either. The binary is installed by
``scripts/setup.sh`` (apt package ``docker-registry``). Missing binary: the tests are skipped with
the reason, or fail when ``BLESS_REQUIRE_REGISTRY=1`` (``scripts/test.sh``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path

import pytest

from tests.support.lying_registry import Lie, LyingRegistry, lying_registry

_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"

BINARY_NAMES = ("docker-registry", "registry")


def registry_binary() -> str:
    for name in BINARY_NAMES:
        found = shutil.which(name)
        if found:
            return found
    message = "docker-registry not installed (apt-get install docker-registry; scripts/setup.sh does it)"
    if os.environ.get("BLESS_REQUIRE_REGISTRY") == "1":
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Registry:
    """One registry process; ``host`` is ``127.0.0.1:PORT`` (plain HTTP, as every loopback registry)."""

    #: The registry client reaches this registry over the network (the simulator is a transport itself).
    transport = None

    def __init__(self, workdir: Path, *, credentials: tuple[str, str] | None = None) -> None:
        self.workdir = workdir
        self.credentials = credentials
        self.storage = workdir / "storage"
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.storage.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.yml"
        auth = ""
        if self.credentials is not None:
            htpasswd = self.workdir / "htpasswd"
            htpasswd.write_text(f"{self.credentials[0]}:{_bcrypt(self.credentials[1])}\n", encoding="utf-8")
            auth = f"auth:\n  htpasswd:\n    realm: bless-test\n    path: {htpasswd}\n"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.storage}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n" + auth,
            encoding="utf-8",
        )
        log = (self.workdir / "registry.log").open("ab")
        self.process = subprocess.Popen([registry_binary(), "serve", str(config)], stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1) as reply:
                    if reply.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                if exc.code == 401 and self.credentials is not None:
                    return  # up, and asking for credentials
            except OSError:
                if self.process.poll() is not None:
                    break
                time.sleep(0.05)
        self.stop()
        pytest.fail(f"the registry did not start: {(self.workdir / 'registry.log').read_text(errors='replace')}")

    def kill(self) -> None:
        """SIGKILL, as a crash or an outage."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def blob_path(self, digest: str) -> Path:
        """Where Docker Distribution keeps a blob's (or a manifest's) bytes."""
        hexdigest = digest.removeprefix("sha256:")
        return self.storage / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"

    def ref(self, repository: str) -> str:
        return f"{self.host}/{repository}"

    def stored(self, digest: str) -> bytes:
        """The bytes the registry holds under ``digest`` (a blob or a manifest)."""
        return self.blob_path(digest).read_bytes()

    def tamper(self, digest: str, data: bytes) -> None:
        """Replace the bytes held under ``digest`` behind the registry's back (its storage dir)."""
        self.blob_path(digest).write_bytes(data)

    def manifest_bytes(self, repository: str, reference: str) -> bytes:
        """A manifest's bytes as the registry serves them, by tag or digest."""
        request = urllib.request.Request(
            f"http://{self.host}/v2/{repository}/manifests/{reference}", headers={"Accept": _OCI_MANIFEST}
        )
        with urllib.request.urlopen(request) as reply:
            data: bytes = reply.read()
        return data

    def put_manifest(self, repository: str, tag: str, data: bytes) -> None:
        """Store an OCI manifest under ``tag`` through the registry's API, as anyone with push rights can."""
        request = urllib.request.Request(
            f"http://{self.host}/v2/{repository}/manifests/{tag}",
            data=data,
            method="PUT",
            headers={"Content-Type": _OCI_MANIFEST},
        )
        urllib.request.urlopen(request).close()

    def lying(self, *lies: Lie) -> AbstractContextManager[LyingRegistry]:
        """A lying server in front of this registry (``tests/support/lying_registry.py``): pull from its ``ref``."""
        return lying_registry(self, *lies)

    @contextmanager
    def killed_after(self, after_bytes: int) -> Iterator[str]:
        """The host of a loopback relay that SIGKILLs this registry once ``after_bytes`` of replies went through."""
        relay = _KillingRelay(self, after_bytes)
        thread = threading.Thread(target=relay.serve, daemon=True)
        thread.start()
        try:
            yield f"127.0.0.1:{relay.server.getsockname()[1]}"
        finally:
            relay.stopping = True
            relay.server.close()


class _KillingRelay:
    def __init__(self, registry: Registry, after_bytes: int) -> None:
        self.registry = registry
        self.after_bytes = after_bytes
        self.sent = 0
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.stopping = False

    def serve(self) -> None:
        while not self.stopping:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.registry.port))
            threading.Thread(target=self.pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self.pipe, args=(upstream, client, True), daemon=True).start()

    def pipe(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
                if counted and len(chunk) > 0:
                    with self.lock:
                        self.sent += len(chunk)
                        if self.sent > self.after_bytes + (64 << 10):
                            self.registry.kill()
                            break
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


def _bcrypt(password: str) -> str:
    """An htpasswd bcrypt hash (Distribution accepts only bcrypt) through libc's crypt (libxcrypt on Debian).

    At bcrypt's lowest cost (4, 16 rounds): Distribution checks the password on every request, and
    the default cost (12) made that a quarter of a second each.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        crypt = pytest.importorskip("crypt")
    return str(crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)))


def running_registry(workdir: Path, credentials: tuple[str, str] | None = None) -> Iterator[Registry]:
    registry = Registry(workdir, credentials=credentials)
    registry.start()
    try:
        yield registry
    finally:
        registry.stop()
