"""A real OCI registry for tests: Debian's ``docker-registry`` (Docker Distribution) on 127.0.0.1.

Each :class:`Registry` runs its own process on a free loopback port with its own storage dir, so a
test may alter stored blobs (``blob_path``), kill it mid-transfer (``kill``), or find it down. The
binary is installed by ``scripts/setup.sh`` (apt package ``docker-registry``). Missing binary: the
tests are skipped with the reason, or fail when ``BLESS_REQUIRE_REGISTRY=1`` (``scripts/test.sh``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

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
        """Where Docker Distribution keeps a blob's bytes (to alter them behind the registry's back)."""
        hexdigest = digest.removeprefix("sha256:")
        return self.storage / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"

    def ref(self, repository: str) -> str:
        return f"{self.host}/{repository}"


def _bcrypt(password: str) -> str:
    """An htpasswd bcrypt hash (Distribution accepts only bcrypt) through libc's crypt (libxcrypt on Debian)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        crypt = pytest.importorskip("crypt")
    return str(crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH)))


def running_registry(workdir: Path, credentials: tuple[str, str] | None = None) -> Iterator[Registry]:
    registry = Registry(workdir, credentials=credentials)
    registry.start()
    try:
        yield registry
    finally:
        registry.stop()
