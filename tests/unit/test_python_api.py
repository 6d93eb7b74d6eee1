"""The public Python API (``import bless``): its surface, and every example of docs/reference/python-api.md run.

The examples run as written, in order, in one scratch directory holding this checkout's ``profiles/`` with
``$BLESS_ROOT`` there. The engine is the one fake: ``bless.runtime.get_runtime`` hands out a
:class:`~tests.support.fakes.FakeRuntime` (bless's own Runtime interface; its engines answer coherently), so a
blessing takes a second; the store, the adapter, the trial protocol, verify, the serve plan and TUF signing
are the real ones. The ``registry`` example pushes and pulls through a real Docker Distribution.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import bless
import bless.runtime
from bless.trust.keys import KeySources
from bless.trust.repository import init_repository
from tests.support.fakes import FakeRuntime
from tests.support.registry import running_registry

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "reference" / "python-api.md"
MARKER = re.compile(r"<!-- python-api: (offline|registry) -->")


@dataclass(frozen=True)
class Example:
    line: int
    marker: str
    code: str


def examples() -> list[Example]:
    """The page's ``python`` blocks, each with the marker on the line before its fence (every block has one)."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    found: list[Example] = []
    for index, line in enumerate(lines):
        if line.strip() != "```python":
            continue
        marker = MARKER.fullmatch(lines[index - 1].strip()) if index else None
        assert marker, f"python-api.md:{index + 1}: a python block without a python-api marker"
        end = lines.index("```", index + 1)
        found.append(Example(index + 1, marker.group(1), "\n".join(lines[index + 1 : end]) + "\n"))
    return found


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The examples' directory: profiles/, a signing repository (signing/), $BLESS_ROOT, the fake runtime."""
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    init_repository(tmp_path / "signing", sources=KeySources(unencrypted=True))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BLESS_ROOT", str(tmp_path / "root"))
    runtime = FakeRuntime()
    monkeypatch.setattr(bless.runtime, "get_runtime", lambda kind: runtime)
    yield tmp_path
    runtime.close()


def run_examples(markers: tuple[str, ...], namespace: dict[str, object]) -> None:
    for example in examples():
        if example.marker in markers:
            code = compile(example.code, f"python-api.md:{example.line}", "exec")
            exec(code, dict(namespace))  # the page's own examples, run as a reader would


def test_every_name_of_the_api_is_documented_and_nothing_else_is_public() -> None:
    page = PAGE.read_text(encoding="utf-8")
    for name in bless.__all__:
        if name != "__version__":
            assert f"bless.{name}" in page, name
    public = {name for name in vars(bless) if not name.startswith("_") and callable(getattr(bless, name))}
    modules = {name for name in public if isinstance(getattr(bless, name), type(bless))}
    assert public - modules - {"annotations", "StrPath", "TYPE_CHECKING", "timedelta", "Path"} <= set(bless.__all__)


def test_import_bless_stays_cheap() -> None:
    """Importing the API imports no engine, runtime, registry client or TUF: each call imports what it needs."""
    script = "import sys, bless\nprint(sorted(m for m in sys.modules if m.split('.')[0] in ('bless', 'oras', "
    script += "'requests', 'docker', 'tuf', 'typer')))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO)
    loaded = ["bless", "bless._version", "bless.core", "bless.core.untrusted_text", "bless.errors"]
    assert out.stdout.strip() == str(loaded)


def test_the_offline_examples_run(scratch: Path) -> None:
    assert [e.marker for e in examples()].count("offline") >= 6
    run_examples(("offline",), {})
    assert any((scratch / "root" / "archive").iterdir())  # the rebless example replaced the first blessing


def test_the_registry_example_runs(scratch: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    for registry in running_registry(tmp_path_factory.mktemp("registry")):
        run_examples(("offline",), {})
        run_examples(("registry",), {"registry": registry.host})
        assert (scratch / "elsewhere" / "manifests").is_dir()
