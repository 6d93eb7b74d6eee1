"""``serve-full stop`` against a serve-full that is starting or serving in the foreground (issue 25, items 1 and 2).

Stop took a starting serve-full's lease for a detached engine's: ``killpg`` of a serve-full that does not
lead its process group raised ESRCH (suppressed), stop waited for serve-full to exit (it did, after handing
the lease over), released the lease and removed the serve dir, and the engine served on without a lease
(gc then deleted what it read). Against a foreground serve the wait after SIGKILL never ended, and the
readiness record was cleared first. Here real processes (tests/unit/serve_stop_child.py: serve-full's lease
protocol, an engine in its own session) race a real stop at many delays: whatever the timing, no engine
runs without its lease, stop returns in bounded time, and readiness is cleared only once the engine stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bless.errors import ContainerConflictError, LockHeldError, NotServingError, RuntimeUnavailableError
from bless.flows import serve
from bless.flows.serve import start_lock
from bless.flows.serve.ready import check_ready
from bless.runtime.base import Runtime
from bless.store import Store
from tests.support.hang_guard import finishes
from tests.unit.store_helpers import child_env, make_manifest, write_tree

CHILD = Path(__file__).with_name("serve_stop_child.py")
NAME = "race"


def no_docker() -> Runtime:
    raise RuntimeUnavailableError("no Docker here")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "root")
    tree = write_tree(tmp_path / "tree")
    store.publish(tree, make_manifest(tree))
    return store


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie (exited, not reaped by its parent) is gone
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


class ServeFull:
    """The child serve-full (not leading its own process group: as under a supervisor or a test harness)."""

    def __init__(self, store: Store, mode: str, delay: float = 0.0) -> None:
        record = store.records()[0].manifest
        assert record is not None
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(CHILD),
                str(store.root),
                NAME,
                record.config_hash,
                record.cache.dir_id,
                mode,
                str(delay),
            ],
            env=child_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        assert line[:1] == ["up"], line
        self.engine = int(line[1])

    def close(self) -> None:
        for pid in (self.proc.pid, self.engine):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def serve_full(store: Store) -> Iterator[list[ServeFull]]:
    started: list[ServeFull] = []
    yield started
    for child in started:
        child.close()


def engine_leases(store: Store, pid: int) -> list[object]:
    return [lease for lease in store.leases.leases() if lease.holder and lease.holder.get("pid") == pid]


@pytest.mark.parametrize("mode", ["detach", "legacy"])
@pytest.mark.parametrize("stop_after", [0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.6])
def test_stop_racing_a_detached_start_never_leaves_an_engine_without_its_lease(
    store: Store, serve_full: list[ServeFull], mode: str, stop_after: float
) -> None:
    child = ServeFull(store, mode, delay=0.3)  # hands its lease to the engine 0.3 s after taking it
    serve_full.append(child)
    time.sleep(stop_after)
    outcome = finishes(
        lambda: serve.stop_serving(NAME, store=store, docker=no_docker, timeout_s=5, serve_full_slack_s=5)
    )
    # Stop returned: what the start brought up is stopped, whichever side of the hand-over stop came.
    assert child.proc.wait(timeout=10) in (0, 130)
    assert not _alive(child.engine), f"the engine runs on ({outcome.to_dict()})"
    assert store.leases.leases() == [], "every lease released"
    with pytest.raises(NotServingError):
        check_ready(store, NAME)


def test_stop_of_a_foreground_serve_returns_and_clears_readiness_only_once_the_engine_stopped(
    store: Store, serve_full: list[ServeFull]
) -> None:
    child = ServeFull(store, "foreground")
    serve_full.append(child)
    deadline = time.monotonic() + 10
    while not store.paths.ready_file(NAME).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    outcome = finishes(  # never an unbounded wait
        lambda: serve.stop_serving(NAME, store=store, docker=no_docker, timeout_s=5, serve_full_slack_s=5)
    )
    assert outcome.stopped == (f"serve-full pid {child.proc.pid}",)
    assert child.proc.wait(timeout=10) == 130 and not _alive(child.engine)
    assert not store.paths.ready_file(NAME).exists() and store.leases.leases() == []


def test_a_serve_full_that_does_not_stop_is_refused_in_bounded_time_and_keeps_everything(
    store: Store, serve_full: list[ServeFull]
) -> None:
    child = ServeFull(store, "stubborn")
    serve_full.append(child)
    with pytest.raises(LockHeldError, match="after SIGTERM") as info:
        finishes(lambda: serve.stop_serving(NAME, store=store, docker=no_docker, timeout_s=1, serve_full_slack_s=1))
    assert "retry" in (info.value.hint or "")
    assert _alive(child.proc.pid) and _alive(child.engine), "nothing stopped by force: the engine would lose its lease"
    assert len(store.leases.leases()) == 1, "its lease is kept"


@pytest.mark.parametrize("stop_after", [0.0, 0.1, 0.3])
def test_stop_during_a_start_s_checks_ends_that_start_and_nothing_comes_up_after(
    store: Store, stop_after: float
) -> None:
    """A start still checking and planning holds no lease: stop used to find nothing (``stopped: []``, exit 0)
    and the serve came up behind it. It holds the start lock: stop ends it, and holds that lock meanwhile."""
    record = store.records()[0].manifest
    assert record is not None
    args = [str(store.root), NAME, record.config_hash, record.cache.dir_id, "plan", "1.5"]
    child = subprocess.Popen([sys.executable, str(CHILD), *args], env=child_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "planning"
        time.sleep(stop_after)
        outcome = finishes(
            lambda: serve.stop_serving(NAME, store=store, docker=no_docker, timeout_s=5, serve_full_slack_s=5)
        )
        assert child.wait(timeout=10) == 130, "the start was ended before it started anything"
        assert "engine" not in child.stdout.read(), "no engine came up"
        assert outcome.stopped == (f"serve-full pid {child.pid} (starting)",)
        assert store.leases.leases() == []
        with pytest.raises(NotServingError):
            check_ready(store, NAME)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_start_while_a_stop_holds_the_start_lock_is_refused(store: Store) -> None:
    stopped: list[str] = []
    with (
        start_lock.hold_for_stop(store, NAME, 1.0, stopped=stopped),
        pytest.raises(ContainerConflictError, match="starting \\(or stopping\\)"),
        serve.StartingLock(store, NAME),
    ):
        pass
    assert stopped == []
    with serve.StartingLock(store, NAME):  # released with the stop
        pass
