"""Make the repository root importable when tests run without an installed package; shared fixtures."""

import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


import pytest  # noqa: E402

from tests.registry import Registry, running_registry  # noqa: E402


@pytest.fixture
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A real OCI registry (Docker Distribution) on 127.0.0.1, with its own storage dir (tests/registry.py)."""
    yield from running_registry(tmp_path_factory.mktemp("registry"))
