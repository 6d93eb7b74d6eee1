"""Fixtures for the end-to-end tests: the reference image, a CLI runner, one session-scoped real blessing, a registry.

The Docker client and the busybox image are shared with the runtime contract suite: tests/conftest.py.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import REPO, our_containers, our_containers_and_roots, run_cli, write_profile
from tests.support.registry import Registry, running_registry
from tests.support.workers import machine_lock, made_once


@pytest.fixture
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A real OCI registry (Docker Distribution) on 127.0.0.1, with its own storage dir (tests/support/registry.py)."""
    yield from running_registry(tmp_path_factory.mktemp("registry"))


# --- bless end to end: the reference image, a CLI runner, one session-scoped real blessing ---------


@pytest.fixture(scope="session")
def reference_image(docker_client: Any) -> str:
    """bless-reference:0.1.0, built (or found up to date) by the real build script; its image ID.

    One script at a time on the machine (parallel workers each ask once): tests/support/workers.py.
    """
    with machine_lock("build-reference-image"):
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "images" / "build-reference-image.sh")],
            capture_output=True,
            text=True,
            timeout=1800,
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
    """One real blessing (K=3) of the reference profile, shared by the integration tests that only read it.

    Made once per run, by the first parallel worker that needs it (tests/support/workers.py): minutes of compiles.
    """

    def bless_once(base: Path) -> dict[str, Any]:
        profile = write_profile(base / "reference.toml")
        root = base / "root"
        result = run_cli("--root", str(root), "run", "--profile", str(profile), "--trials", "3", "--json")
        assert result.code == 0, result.stderr[-5000:]
        data = result.json()
        assert our_containers(f"org.bless.run-id={data['run_id']}") == [], "a bless run left containers behind"
        return {"root": str(root), "profile": str(profile), "result": data}

    made = made_once(tmp_path_factory, "blessed", bless_once)
    data = made["result"]
    return Blessed(root=Path(made["root"]), profile=Path(made["profile"]), config_hash=data["config_hash"], result=data)


@pytest.fixture
def no_leftovers(tmp_path: Path) -> Iterator[None]:
    """Asserts the test leaves no container of ours behind.

    Its containers are the serve containers of its store roots, all under its ``tmp_path`` (a serve container
    carries its root: org.bless.store-root). Others' containers are not its doing: present before, or made
    meanwhile by tests in other parallel workers (scripts/test.sh), with roots of their own.
    """
    before = set(our_containers())
    yield
    left = sorted(
        name
        for name, root in our_containers_and_roots().items()
        if name not in before and root and Path(root).is_relative_to(tmp_path)
    )
    assert left == [], f"containers of ours left behind: {left}"
