"""Blocks of the README and of docs/ marked ``<!-- readme-test: docker -->`` run for real: Docker, image, compiles."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.support.readme_blocks import Block, all_blocks, run_block

pytestmark = pytest.mark.integration

DOCKER_BLOCKS = [block for block in all_blocks() if block.marker == "docker"]


@pytest.mark.parametrize("block", DOCKER_BLOCKS, ids=[block.id for block in DOCKER_BLOCKS])
def test_docker_blocks_run(block: Block, tmp_path: Path, reference_image: str, blessed: Any) -> None:
    # The blocks start where scripts/main.sh leaves a user: $BLESS_ROOT (tmp_path/store, run_block) holds a
    # blessing of the shipped reference profile, a copy of the session's (the same config hash), so no block
    # compiles and proves it a second time.
    subprocess.run(["cp", "-a", str(blessed.root), str(tmp_path / "store")], check=True)
    result = run_block(block, tmp_path, timeout=1500)
    assert result.returncode == 0, f"{block.id} failed:\n{result.stderr[-4000:]}"
    if "bless gate" in block.text:
        # The gate walkthrough: the manifest landed in the checkout's dir, the gate passed and said so.
        (manifest,) = (tmp_path / "manifests" / "blessed").glob("*.json")
        suite = ET.parse(tmp_path / "gate.xml").getroot().find("testsuite")
        assert suite is not None and suite.get("tests") == "1" and suite.get("failures") == "0"
        document = json.loads(result.stdout)
        assert document["ok"] is True and document["rows"][0]["verified"] is True
        assert document["rows"][0]["config_hash"] == manifest.stem
