"""Fixtures shared by unit, contract and integration tests.

``tests`` is a package: pytest puts the repository root on ``sys.path`` (the first directory above
without an ``__init__.py``), so tests import their helpers as ``tests.<module>``.

``docker_client`` / ``busybox_image``: a real Docker Engine and a tiny image (``bless-test-busybox:1``)
made from the host's static busybox, with no registry and no network: a rootfs tar with
``/bin/busybox`` and a symlink per applet, ``docker import``-ed once per session (per parallel worker) and
removed at its end. Docker unreachable -> the tests that use them are skipped with the reason (start it with
scripts/ensure-docker.sh); BLESS_REQUIRE_DOCKER=1 (CI) makes that a failure.
"""

from __future__ import annotations

import importlib
import io
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import imported_image
from tests.support.workers import worker_id

#: Each parallel worker imports (and removes at its end) its own tag: one worker's end must not remove another's.
BUSYBOX_IMAGE = "bless-test-busybox:1" if worker_id() == "main" else f"bless-test-busybox:1-{worker_id()}"
BUSYBOX_PATHS = (Path("/bin/busybox"), Path("/usr/bin/busybox"))


# --- parallel workers (scripts/test.sh: pytest -n N --dist loadgroup) ------------------------------------
#: Test files whose tests run in one worker, in order, with the rest of their group (every other test goes
#: to whichever worker is free). Why each group is one: CONTRIBUTING.md "Tests".
SERIAL_GROUPS = {
    # the image scripts tag, load and prune images machine-wide: one build at a time, and
    # test_images_left_behind plants a leftover stage the scripts are to remove
    "tests/integration/test_images.py": "images",
    "tests/integration/test_images_left_behind.py": "images",
    "tests/integration/test_k8s_pod.py": "images",
    # they read the session's real K=3 blessing (minutes of compiles, made once); the fleet test signs it in place;
    # the guide blocks run against a copy of it (it must be whole when copied)
    "tests/integration/test_serve_full.py": "blessed",
    "tests/integration/test_fleet_e2e.py": "blessed",
    "tests/integration/test_gate_e2e.py": "blessed",
    "tests/integration/test_readme_blocks.py": "blessed",
    # the sealed-serving tests bless two profiles of their own and serve them one after another
    "tests/integration/test_coverage_seal.py": "coverage",
    # the runtime contract and the Docker runtime's own tests start containers of fixed names
    "tests/contract/test_runtime.py": "docker",
    "tests/integration/test_runtime_docker.py": "docker",
}
#: Single tests that join a group their file is not in. test_bless_run.py's cases each bless a profile of their
#: own config hash and name (case_profile), so they spread over the workers; the happy path reads the session
#: blessing, and the rebless test blesses its config hash again (as the README blocks do).
SERIAL_TESTS = {
    "tests/integration/test_bless_run.py::test_happy_path_k3_blessing_is_published_verified_and_listed": "blessed",
    "tests/integration/test_bless_run.py::test_rebless_refused_without_flag_then_archives_prior_and_gc_drops_it": (
        "blessed"
    ),
}


@pytest.hookimpl(optionalhook=True)  # xdist's hook: a run without xdist (plain pytest) has no such hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with :data:`SERIAL_GROUPS` as the groups (by file), every other test on its own.

    Not xdist's ``xdist_group`` mark: xdist 3.8 puts the group into ``item._nodeid``, which pytest 9 no longer
    reads, so the marked tests were spread over every worker.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    # Imported here: this hook is only called when xdist runs (a venv without it still collects and type-checks).
    load_group: Any = importlib.import_module("xdist.scheduler").LoadGroupScheduling

    def split_scope(self: Any, nodeid: str) -> str:
        group = SERIAL_TESTS.get(nodeid.split("[", 1)[0]) or SERIAL_GROUPS.get(nodeid.split("::", 1)[0])
        return group if group is not None else str(load_group._split_scope(self, nodeid))

    return type("SerialGroupScheduling", (load_group,), {"_split_scope": split_scope})(config, log)


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
