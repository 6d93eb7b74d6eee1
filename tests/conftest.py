"""Fixtures shared by unit and integration tests.

``tests`` is a package: pytest puts the repository root on ``sys.path`` (the first directory above
without an ``__init__.py``), so tests import their helpers as ``tests.<module>``.
"""

from collections.abc import Iterator

import pytest

from tests.registry import Registry, running_registry


@pytest.fixture
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A real OCI registry (Docker Distribution) on 127.0.0.1, with its own storage dir (tests/registry.py)."""
    yield from running_registry(tmp_path_factory.mktemp("registry"))
