"""docs/reference/python-api.md's examples, run for real: the reference engine in Docker, real compiles, and a real
registry (Docker Distribution). The same blocks run in the unit tests against a fake runtime
(tests/unit/test_python_api.py, which also type-checks them with mypy --strict): this is the typed program a
platform engineer would write, through the public API alone."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import REPO, our_containers_and_roots
from tests.support.registry import Registry
from tests.unit.test_python_api import examples

pytestmark = pytest.mark.integration


def test_the_python_api_examples_run_against_docker_and_a_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reference_image: str, blessed: Any, registry: Registry
) -> None:
    # ``blessed`` only orders: the examples bless the shipped reference profile, the session blessing's config
    # hash, and two runs of one config on one Docker Engine would share their run containers' names (12).
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    # The image by the ID the session built: the tag may move mid-test where other checkouts rebuild it on this
    # Docker Engine, and a moved tag is another config hash (the examples resolve the profile more than once).
    profile = tmp_path / "profiles" / "reference-cpu.toml"
    text = profile.read_text(encoding="utf-8")
    assert 'image = "bless-reference:0.1.0"' in text
    profile.write_text(text.replace('image = "bless-reference:0.1.0"', f'image = "{reference_image}"', 1))
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BLESS_ROOT", str(tmp_path / "root"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("REGISTRY", registry.host)
    for example in examples():
        code = compile(example.code, f"python-api.md:{example.line}", "exec")
        exec(code, {})  # the page's own examples, run as a reader would
    assert (tmp_path / "elsewhere" / "manifests").is_dir()  # the registry example pulled into a second store
    mine = [name for name, root in our_containers_and_roots().items() if root.startswith(str(tmp_path))]
    assert mine == [], "the examples left containers behind"
