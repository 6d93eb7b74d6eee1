"""``bless gate`` as CI runs it: a real process, the session's real blessing, JUnit parsed as XML.

No engine starts here. The session blessing is only read (the invalid-manifest case works on a
copy of its manifests directory).
"""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from bless.probes import cpu_isa_level
from tests.integration.helpers import run_cli, write_profile

pytestmark = pytest.mark.integration


def gate(*args: str, env: dict[str, str] | None = None) -> Any:
    return run_cli("gate", *args, env={"GITHUB_ACTIONS": "", **(env or {})}, timeout=300)


def junit_cases(path: Path) -> dict[str, ET.Element | None]:
    """testcase name -> its <failure> element (None when it passed)."""
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    return {str(case.get("name")): case.find("failure") for case in suite.findall("testcase")}


def test_gate_pass_with_verify_json_and_junit(blessed: Any, tmp_path: Path) -> None:
    junit = tmp_path / "gate.xml"
    result = gate(
        str(blessed.profile),
        "--manifests-dir",
        str(blessed.root / "manifests"),
        "--root",
        str(blessed.root),
        "--verify",
        "--junit",
        str(junit),
        "--json",
    )
    assert result.code == 0, result.stderr
    doc = result.json()
    (row,) = doc["rows"]
    assert doc["passed"] is True and row["status"] == "blessed" and row["config_hash"] == blessed.config_hash
    assert row["verified"] is True and row["hardware"] == "probed"  # the test profile declares no cpu_isa
    assert junit_cases(junit) == {str(blessed.profile): None}


def test_gate_drift_and_missing_blessing_fail_with_annotations(blessed: Any, tmp_path: Path) -> None:
    drifted = write_profile(tmp_path / "drifted.toml", env={"BLESS_GATE_DRIFT": "on"})
    junit = tmp_path / "gate.xml"
    manifests = str(blessed.root / "manifests")
    result = gate(
        str(blessed.profile),
        str(drifted),
        "--manifests-dir",
        manifests,
        "--junit",
        str(junit),
        env={"GITHUB_ACTIONS": "true"},
    )
    assert result.code == 24, result.stderr
    assert "gate failed" in result.stderr and "FAILED" in result.stderr
    errors = [line for line in result.stdout.splitlines() if line.startswith("::error")]
    assert len(errors) == 1 and errors[0].startswith(f"::error file={drifted},")
    assert 'env.BLESS_GATE_DRIFT: (absent) -> "on"' in errors[0]
    cases = junit_cases(junit)
    assert cases[str(blessed.profile)] is None
    failure = cases[str(drifted)]
    assert failure is not None and "env.BLESS_GATE_DRIFT" in str(failure.get("message"))
    assert failure.get("type") == "NoManifestError"

    # An empty manifests directory: nothing is blessed, both fail; --json keeps annotations off stdout.
    empty = tmp_path / "empty-manifests"
    empty.mkdir()
    missing = gate(str(blessed.profile), "--manifests-dir", str(empty), "--json", env={"GITHUB_ACTIONS": "true"})
    assert missing.code == 24
    doc = missing.json()
    assert doc["ok"] is False and doc["failed"] == 1 and "no blessing" in doc["rows"][0]["reason"]
    assert doc["error"]["exit_code"] == 24 and "::error" not in missing.stdout


def test_gate_invalid_manifest(blessed: Any, tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    shutil.copytree(blessed.root / "manifests", manifests)
    (manifests / "half-written.json").write_text('{"schema_version": 1,')
    junit = tmp_path / "gate.xml"
    result = gate(str(blessed.profile), "--manifests-dir", str(manifests), "--junit", str(junit), "--json")
    assert result.code == 24
    (row,) = result.json()["rows"]
    assert row["status"] == "failed" and "half-written.json" in row["reason"]
    failure = junit_cases(junit)[str(blessed.profile)]
    assert failure is not None and failure.get("type") == "ManifestInvalidError"


def test_gate_offline_pinned_profile_needs_no_docker(blessed: Any, tmp_path: Path) -> None:
    image_id = json.loads((blessed.root / "manifests" / f"{blessed.config_hash}.json").read_text())["factors"][
        "runtime"
    ]["image_id"]
    pinned = write_profile(tmp_path / "pinned.toml")
    text = pinned.read_text().replace('"bless-reference:0.1.0"', f'"{image_id}"')
    pinned.write_text(text.replace('accelerator = "cpu"', f'accelerator = "cpu"\ncpu_isa = "{cpu_isa_level()}"', 1))
    tagged = write_profile(tmp_path / "tagged.toml")
    offline = {"DOCKER_HOST": "unix:///nonexistent.sock"}
    manifests = str(blessed.root / "manifests")
    result = gate(str(pinned), str(tagged), "--manifests-dir", manifests, "--json", env=offline)
    assert result.code == 24
    by_profile = {row["profile"]: row for row in result.json()["rows"]}
    assert by_profile[str(pinned)]["status"] == "blessed" and by_profile[str(pinned)]["hardware"] == "declared"
    assert by_profile[str(pinned)]["config_hash"] == blessed.config_hash
    assert by_profile[str(tagged)]["status"] == "failed"
    assert "needs a Docker Engine, which is unreachable" in by_profile[str(tagged)]["reason"]
