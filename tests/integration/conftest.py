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

from tests.integration.helpers import REPO, our_containers, run_cli, write_profile
from tests.support.registry import Registry, running_registry


@pytest.fixture
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A real OCI registry (Docker Distribution) on 127.0.0.1, with its own storage dir (tests/support/registry.py)."""
    yield from running_registry(tmp_path_factory.mktemp("registry"))


# --- bless end to end: the reference image, a CLI runner, one session-scoped real blessing ---------


@pytest.fixture(scope="session")
def reference_image(docker_client: Any) -> str:
    """bless-reference:0.1.0, built (or found up to date) by the real build script; its image ID."""
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
