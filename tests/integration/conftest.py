"""Fixtures for tests that need a real Docker Engine.

``busybox_image``: a tiny image (``bless-test-busybox:1``) made from the host's static
busybox, with no registry and no network: a rootfs tar with ``/bin/busybox`` and a
symlink per applet, ``docker import``-ed once per session and removed at its end.

Docker unreachable -> these tests are skipped with the reason (start it with
scripts/ensure-docker.sh); set BLESS_REQUIRE_DOCKER=1 (CI) to make that a failure.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import REPO, imported_image, our_containers, run_cli, write_profile

BUSYBOX_IMAGE = "bless-test-busybox:1"
BUSYBOX_PATHS = (Path("/bin/busybox"), Path("/usr/bin/busybox"))


def _docker_client() -> Any:
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except Exception as exc:
        message = f"Docker Engine not reachable ({exc}); start it with scripts/ensure-docker.sh"
        if os.environ.get("BLESS_REQUIRE_DOCKER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return client


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """The plain SDK client, for what tests do behind bless's back (foreign containers, inspect)."""
    client = _docker_client()
    yield client
    client.close()


def _static_busybox() -> Path:
    for path in BUSYBOX_PATHS:
        if path.is_file():
            return path
    if os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "busybox-static"],
            check=False,
            capture_output=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
    for path in BUSYBOX_PATHS:
        if path.is_file():
            return path
    pytest.skip("no static busybox on this host (apt-get install busybox-static)")
    raise AssertionError("unreachable")


def _rootfs_tar(busybox: Path) -> bytes:
    """A rootfs with /bin/busybox, one symlink per applet, and the usual empty dirs."""
    applets = subprocess.run([str(busybox), "--list"], check=True, capture_output=True, text=True).stdout.split()
    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, mode in (("bin", 0o755), ("tmp", 0o1777), ("etc", 0o755), ("www", 0o755), ("root", 0o700)):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, now
            tar.addfile(info)
        tar.add(str(busybox), arcname="bin/busybox")
        for applet in applets:
            if applet == "busybox":
                continue
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, "busybox", 0o777, now
            tar.addfile(info)
        for name, text in (("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"), ("etc/group", "root:x:0:\n")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, now
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="session")
def busybox_image(docker_client: Any) -> Iterator[str]:
    """``bless-test-busybox:1``, imported from the host's static busybox for the session, removed after it.

    Present before the session (an operator's, or a run that was killed): used and left alone.
    """
    docker = pytest.importorskip("docker")
    try:
        docker_client.images.get(BUSYBOX_IMAGE)
        rootfs = b""  # present: imported_image uses it as it is
    except docker.errors.ImageNotFound:
        rootfs = _rootfs_tar(_static_busybox())
    with imported_image(docker_client, BUSYBOX_IMAGE, rootfs, ["ENV PATH=/bin", 'CMD ["sh"]']) as name:
        yield name


# --- bless end to end: the reference image, a CLI runner, one session-scoped real blessing ---------


@pytest.fixture(scope="session")
def reference_image(docker_client: Any) -> str:
    """bless-reference:0.1.0, built (or found up to date) by the real build script; its image ID."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-reference-image.sh")], capture_output=True, text=True, timeout=1800
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@dataclass(frozen=True)
class Blessed:
    root: Path
    profile: Path
    config_hash: str
    result: dict[str, Any]


@pytest.fixture(scope="session")
def blessed(reference_image: str, tmp_path_factory: pytest.TempPathFactory) -> Blessed:
    """One real blessing (K=3) of the reference profile, shared by the integration tests that only read it."""
    base = tmp_path_factory.mktemp("blessed")
    profile = write_profile(base / "reference.toml")
    root = base / "root"
    result = run_cli("--root", str(root), "run", "--profile", str(profile), "--trials", "3", "--json")
    assert result.code == 0, result.stderr[-5000:]
    data = result.json()
    assert our_containers(f"org.bless.run-id={data['run_id']}") == [], "a bless run left containers behind"
    return Blessed(root=root, profile=profile, config_hash=data["config_hash"], result=data)


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    """Asserts the test leaves no container of ours behind (others' containers, present before, are not its doing)."""
    before = set(our_containers())
    yield
    left = sorted(set(our_containers()) - before)
    assert left == [], f"containers of ours left behind: {left}"
