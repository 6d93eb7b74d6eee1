"""The measurement and proof scripts: they must fail loudly and run on the hosts they are meant for."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
PROOF_SCRIPTS = sorted((REPO / "scripts").glob("gpu-proof-*.sh"))


def _load_script(name: str) -> ModuleType:
    path = REPO / "scripts" / name
    spec = importlib.util.spec_from_file_location(f"_script_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_there_are_proof_scripts() -> None:
    assert len(PROOF_SCRIPTS) >= 2


@pytest.mark.parametrize("script", PROOF_SCRIPTS, ids=lambda p: p.name)
def test_proof_scripts_stop_at_an_unexpected_failure(script: Path) -> None:
    """Without -e a failed step goes unnoticed and the proof records whatever came after it."""
    assert re.search(r"^set -euo pipefail$", script.read_text(), re.MULTILINE), f"{script.name} lacks set -euo"


@pytest.mark.parametrize("script", PROOF_SCRIPTS, ids=lambda p: p.name)
def test_tar_options_come_before_member_names(script: Path) -> None:
    """GNU tar applies --exclude only to the names after it: one placed last excludes nothing."""
    for line in script.read_text().splitlines():
        if not re.search(r"\btar\b", line) or line.lstrip().startswith("#"):
            continue
        words = shlex.split(line.split("tar ", 1)[1].split(";")[0])
        first_name = next(
            (i for i, w in enumerate(words) if not w.startswith("-") and words[i - 1] not in ("-C", "-czf")), None
        )
        late = [w for w in words[first_name or len(words) :] if w.startswith("--exclude")]
        assert not late, f"{script.name}: {late} after the member names in: {line.strip()}"


def test_bench_serve_describes_a_host_without_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU hosts run the local runtime with no docker binary: describing the machine must not crash."""
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty dir: no docker here
    bench_serve = _load_script("bench_serve.py")
    assert bench_serve.machine()["docker"] == "none"


def _hint(venv: str, active: str | None) -> str:
    env = {"PATH": "/usr/bin:/bin"} | ({"VIRTUAL_ENV": active} if active else {})
    result = subprocess.run(
        ["bash", "-c", f'source scripts/common.sh && activation_hint "{venv}"'],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout == "", "the hint must not mix into a command's stdout (main.sh passes --json through)"
    return result.stderr


def test_main_ends_by_saying_how_to_activate_the_venv() -> None:
    """After main.sh, the README's next command is ``bless list``: without the venv on PATH it is not found."""
    lines = [line for line in (REPO / "scripts" / "main.sh").read_text().splitlines() if line.strip()]
    assert "source scripts/common.sh" in lines
    assert lines[-1] == 'activation_hint "$PWD/.venv"'
    hint = _hint("/srv/clone/.venv", None)
    assert "\n    source /srv/clone/.venv/bin/activate\n" in hint  # on a line of its own, to copy
    assert "/srv/clone/.venv/bin/bless" in hint
    assert "is active" in _hint("/srv/clone/.venv", "/srv/clone/.venv")
    assert "source /srv/clone/.venv/bin/activate" in _hint("/srv/clone/.venv", "/elsewhere/.venv")


def test_setup_says_how_to_activate_the_venv_whichever_way_it_ends() -> None:
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert setup.count('say "ready: source .venv/bin/activate puts bless and serve-full on PATH"') == 2
