"""What the parallel workers of one test run share (scripts/test.sh runs pytest-xdist: CONTRIBUTING.md "Tests").

Each worker is its own process with its own session fixtures. What a machine has one of (a Docker image
tag, a build) or what costs minutes to make (the session's real blessing) is made once: under a file
lock, by the first worker that needs it, in a directory every worker of the run sees; the others wait
for it, then use it. Without xdist there is one process, and the same code runs once.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock


def worker_id() -> str:
    """This process's xdist worker (``gw0``, ``gw1``, ...), or ``main`` when the run is not parallel."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory every worker of this run shares (the parent of the workers' base temps under xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if "PYTEST_XDIST_WORKER" in os.environ else base


@contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Hold the machine-wide lock ``name`` (a file in the temp dir): a build script run by one process at a time.

    Machine-wide, not per run: the image scripts change the one Docker Engine's tags, whoever runs them.
    """
    directory = Path(tempfile.gettempdir()) / "bless-tests-locks"
    directory.mkdir(exist_ok=True)
    with FileLock(str(directory / f"{name}.lock")):
        yield


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Any]) -> Any:
    """``make(directory)``'s result (JSON), made by the first worker of the run to ask; the others read it.

    ``directory`` (shared by the workers) is where ``make`` puts what it makes. A ``make`` that failed is
    not remembered: the next worker to ask tries again, and fails its own tests with its own error.
    """
    shared = run_dir(tmp_path_factory)
    done = shared / f"{name}.json"
    with FileLock(str(shared / f"{name}.lock")):
        if done.is_file():
            return json.loads(done.read_text())
        directory = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=shared))  # a failed attempt's leftovers stay apart
        result = make(directory)
        done.write_text(json.dumps(result))
        return result
