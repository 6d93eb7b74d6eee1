"""Fixtures of the unit tests: the `bless run` flow's (serial and parallel trials) and the fleet tests' registry."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bless.core.profile import Profile
from bless.store import Store
from tests.support.fakes import FakeRuntime, Scenario, coherent_scenario
from tests.support.registry import running_registry
from tests.support.registry_simulator import AnyRegistry, RegistrySimulator
from tests.unit.run_harness import Harness, make_profile, make_resolved


@pytest.fixture(params=["simulated"])
def registry(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AnyRegistry]:
    """The registry of a push/pull test: the in-memory one (tests/support/registry_simulator.py), whose ``transport``
    the flows are handed. A test marked ``ALSO_REAL`` runs against a real Docker Distribution as well,
    one marked ``REAL_ONLY`` only there (tests/support/registry.py, ``transport`` None: over the network).
    """
    if request.param == "real":
        yield from running_registry(tmp_path_factory.mktemp("registry"))
    else:
        yield RegistrySimulator()


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """A store root with its layout made (serve-full's tests); a module that needs another one defines its own."""
    found = Store(tmp_path / "root")
    found.paths.ensure_layout()
    return found


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    """A factory of harnesses over one store; their fake engines are closed at the end."""
    made: list[Harness] = []

    def factory(scenario: Scenario = coherent_scenario, profile: Profile | None = None) -> Harness:
        runtime = FakeRuntime(scenario)
        harness = Harness(Store(tmp_path / "root"), runtime, make_resolved(profile or make_profile(), runtime), [])
        made.append(harness)
        return harness

    yield factory
    for harness in made:
        harness.runtime.close()


@pytest.fixture
def real_sigint() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in the main thread, as in a terminal (pytest may have replaced the handler)."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("needs the main thread to receive SIGINT")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
