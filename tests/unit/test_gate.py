"""``bless gate`` without Docker: profiles pin their image ID (or a fake runtime resolves tags).

Real stores with real published blessings; the table, JSON, JUnit and GitHub annotations are
checked through the library and through the CLI (typer's CliRunner).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bless.cli.main import app
from bless.core.profile import load_profile
from bless.errors import ExitCode
from bless.flows.gate import GateReport, GateRow, github_annotations, junit_xml, run_gate
from bless.flows.resolve import resolve_profile
from bless.probes import cpu_isa_level
from bless.runtime.base import Runtime
from bless.store import Store
from tests.support.cli import cli_runner
from tests.support.fakes import FakeRuntime
from tests.unit.store_helpers import make_manifest, write_tree

IMAGE_ID = "sha256:" + "ab" * 32


def profile_text(*, name: str = "gate-test", layers: int = 2, image: str = IMAGE_ID, isa: str | None = "auto") -> str:
    isa_line = f'cpu_isa = "{cpu_isa_level() if isa == "auto" else isa}"' if isa else ""
    return f"""
profile_version = 1
name = "{name}"

[engine]
name = "reference"

[runtime]
kind = "docker"
image = "{image}"

[model]
source = "builtin"
id = "reference-tiny"

[serve]
layers = {layers}

[hardware]
accelerator = "cpu"
{isa_line}
"""


def write(directory: Path, filename: str, **kwargs: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / filename
    path.write_text(profile_text(**kwargs), encoding="utf-8")
    return path


def bless(store: Store, profile: Path, work: Path) -> str:
    resolved = resolve_profile(load_profile(profile), image_resolver=None)
    tree = write_tree(work / f"tree-{resolved.config_hash[:8]}")
    manifest = make_manifest(tree, resolved.factors)
    store.publish(tree, manifest)
    return manifest.config_hash


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "root")


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    return tmp_path / "profiles"


def no_docker(kind: str) -> Runtime:
    """A runtime factory whose Docker is unreachable."""
    return FakeRuntime(reachable=False)


def test_pass(store: Store, profiles: Path, tmp_path: Path) -> None:
    profile = write(profiles, "a.toml")
    config_hash = bless(store, profile, tmp_path)
    report = run_gate([profile], store=store, verify=True, runtime_factory=no_docker)
    assert report.ok
    (row,) = report.rows
    assert row.status == "blessed" and row.config_hash == config_hash and row.hardware == "declared"
    assert row.verified is True and row.reason == "blessed and verified"


def test_missing_blessing_and_drift(store: Store, profiles: Path, tmp_path: Path) -> None:
    blessed = write(profiles, "a.toml")
    bless(store, blessed, tmp_path)
    drifted = write(profiles, "b.toml", layers=3)
    other_model = write(profiles, "c.toml", name="other")
    report = run_gate([blessed, drifted, other_model], store=store, runtime_factory=no_docker)
    assert not report.ok and [row.status for row in report.rows] == ["blessed", "failed", "blessed"]
    row = report.rows[1]
    assert "serve.layers: 2 -> 3" in row.reason and row.exit_code == ExitCode.NO_MANIFEST
    assert row.drift == (
        {"field": "serve.layers", "before": 2, "after": 3, "before_absent": False, "after_absent": False},
    )


def test_a_drifted_profile_is_named_once_in_the_gate_failure(
    runner: CliRunner, store: Store, profiles: Path, tmp_path: Path
) -> None:
    """The row names the profile: the drift reason and the summary must not repeat the path."""
    bless(store, write(profiles, "a.toml"), tmp_path)
    drifted = write(profiles, "b.toml", layers=3)
    (row,) = run_gate([drifted], store=store, runtime_factory=no_docker).rows
    assert row.status == "failed" and str(drifted) not in row.reason and "no blessing for this profile" in row.reason
    args = ["gate", str(drifted), "--manifests-dir", str(store.manifests_dir), "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == ExitCode.GATE_FAILED
    message = json.loads(result.stdout)["error"]["message"]
    assert message.count(str(drifted)) == 1, message


def test_no_blessing_at_all(store: Store, profiles: Path) -> None:
    report = run_gate([write(profiles, "a.toml")], store=store, runtime_factory=no_docker)
    (row,) = report.rows
    assert row.status == "failed" and "no blessing" in row.reason and row.exit_code == ExitCode.NO_MANIFEST


def test_invalid_manifest_fails_every_profile(store: Store, profiles: Path, tmp_path: Path) -> None:
    profile = write(profiles, "a.toml")
    bless(store, profile, tmp_path)
    (store.manifests_dir / "broken.json").write_text("{ truncated")
    report = run_gate([profile], store=store, runtime_factory=no_docker)
    (row,) = report.rows
    assert row.status == "failed" and "broken.json" in row.reason and row.exit_code == ExitCode.MANIFEST_INVALID
    assert report.invalid_manifests == (str(store.manifests_dir / "broken.json"),)


def test_duplicate_manifest(store: Store, profiles: Path, tmp_path: Path) -> None:
    profile = write(profiles, "a.toml")
    config_hash = bless(store, profile, tmp_path)
    live = store.manifests_dir / f"{config_hash}.json"
    (store.manifests_dir / "copy.json").write_bytes(live.read_bytes())
    (row,) = run_gate([profile], store=store, runtime_factory=no_docker).rows
    assert row.status == "failed" and row.exit_code == ExitCode.MANIFEST_DUPLICATE


def test_tag_needs_docker_and_says_so(store: Store, profiles: Path) -> None:
    profile = write(profiles, "a.toml", image="bless-reference:0.1.0")
    (row,) = run_gate([profile], store=store, runtime_factory=no_docker).rows
    assert row.status == "failed" and "needs a Docker Engine, which is unreachable" in row.reason
    assert row.exit_code == ExitCode.RESOLUTION_FAILED


def test_undeclared_hardware_is_probed_and_noted(store: Store, profiles: Path, tmp_path: Path) -> None:
    declared = write(profiles, "a.toml")
    bless(store, declared, tmp_path)
    probed = write(profiles, "b.toml", isa=None)  # hashes alike: the probe finds this machine's ISA
    (row,) = run_gate([probed], store=store, runtime_factory=no_docker).rows
    assert row.status == "blessed" and row.hardware == "probed"
    assert any("hardware probed on this machine" in note for note in row.notes)


def test_verify_failure_fails_the_row(store: Store, profiles: Path, tmp_path: Path) -> None:
    profile = write(profiles, "a.toml")
    bless(store, profile, tmp_path)
    manifest = store.find(run_gate([profile], store=store).rows[0].config_hash or "")
    assert manifest is not None
    target = store.blessed_dir(manifest) / "artifact.bin"
    target.chmod(0o644)
    target.write_bytes(b"flipped")
    assert run_gate([profile], store=store).ok, "without --verify only the manifest is checked"
    (row,) = run_gate([profile], store=store, verify=True).rows
    assert row.status == "failed" and "artifact.bin (size" in row.reason and row.verified is False


def test_unreadable_profile_is_a_failed_row(store: Store, tmp_path: Path) -> None:
    (row,) = run_gate([tmp_path / "nope.toml"], store=store).rows
    assert row.status == "failed" and "no such profile file" in row.reason


def test_a_bad_profile_is_named_once_in_the_gate_failure(
    runner: CliRunner, store: Store, profiles: Path, tmp_path: Path
) -> None:
    """The row already names the profile: its reason and the summary must not repeat the path."""
    bless(store, write(profiles, "a.toml"), tmp_path)
    broken = write(profiles, "broken.toml")
    broken.write_text('name = "open\n', encoding="utf-8")
    (row,) = run_gate([broken], store=store).rows
    assert row.status == "failed" and str(broken) not in row.reason and "not valid TOML" in row.reason
    result = runner.invoke(app, ["gate", str(broken), "--manifests-dir", str(store.manifests_dir), "--json"])
    assert result.exit_code == ExitCode.GATE_FAILED
    message = json.loads(result.stdout)["error"]["message"]
    assert message.count(str(broken)) == 1, message


# --------------------------------------------------------------------------------------------- formats


def _report() -> GateReport:
    return GateReport(
        rows=(
            GateRow(profile="profiles/ok.toml", status="blessed", reason="blessed", config_hash="a" * 64),
            GateRow(
                profile="profiles/bad,name:x.toml",
                status="failed",
                reason='no blessing; nearest differs in: env.FOO: (absent) -> "1"\n100% sure',
                config_hash="b" * 64,
                error="NoManifestError",
                drift=(
                    {"field": "env.FOO", "before": None, "after": "1", "before_absent": True, "after_absent": False},
                ),
            ),
        ),
        manifests_dir=Path("manifests"),
        root=Path("/r"),
        verify=False,
    )


def test_junit_parses_with_one_failure_per_unblessed_profile() -> None:
    root = ET.fromstring(junit_xml(_report()))
    suite = root.find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "1"
    cases = suite.findall("testcase")
    assert [case.get("name") for case in cases] == ["profiles/ok.toml", "profiles/bad,name:x.toml"]
    assert cases[0].find("failure") is None
    failure = cases[1].find("failure")
    assert failure is not None and failure.get("type") == "NoManifestError"
    assert "env.FOO" in (failure.get("message") or "") and "drift: env.FOO" in (failure.text or "")


def test_github_annotations_are_escaped() -> None:
    (line,) = github_annotations(_report())
    assert line.startswith("::error file=profiles/bad%2Cname%3Ax.toml,title=not blessed::bless gate: ")
    assert "%0A100%25 sure" in line and "\n" not in line


# --------------------------------------------------------------------------------------------- CLI


@pytest.fixture
def runner() -> CliRunner:
    return cli_runner(GITHUB_ACTIONS=None, DOCKER_HOST="unix:///nonexistent.sock")


def test_cli_pass_json_and_junit(runner: CliRunner, store: Store, profiles: Path, tmp_path: Path) -> None:
    profile = write(profiles, "a.toml")
    config_hash = bless(store, profile, tmp_path)
    junit = tmp_path / "reports" / "gate.xml"
    result = runner.invoke(
        app, ["gate", str(profile), "--manifests-dir", str(store.manifests_dir), "--junit", str(junit), "--json"]
    )
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["ok"] is True and document["rows"][0]["config_hash"] == config_hash
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "0"


def test_cli_failure_exit_24_table_and_annotations(
    runner: CliRunner, store: Store, profiles: Path, tmp_path: Path
) -> None:
    blessed = write(profiles, "a.toml")
    bless(store, blessed, tmp_path)
    drifted = write(profiles, "b.toml", layers=4)
    args = ["gate", str(blessed), str(drifted), "--manifests-dir", str(store.manifests_dir)]
    result = runner.invoke(app, args, env={"GITHUB_ACTIONS": "true"})
    assert result.exit_code == ExitCode.GATE_FAILED
    assert f"::error file={drifted}" in result.stdout and "serve.layers: 2 -> 4" in result.stdout
    assert "FAILED" in result.stderr and "blessed" in result.stderr
    as_json = runner.invoke(app, [*args, "--json"], env={"GITHUB_ACTIONS": "true"})
    assert as_json.exit_code == ExitCode.GATE_FAILED
    assert "::error" not in as_json.stdout, "--json keeps stdout one JSON document"
    assert json.loads(as_json.stdout)["error"]["exit_code"] == ExitCode.GATE_FAILED


def test_cli_default_profiles_dir(
    runner: CliRunner, store: Store, profiles: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bless(store, write(profiles, "a.toml"), tmp_path)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["gate", "--manifests-dir", str(store.manifests_dir), "--json"])
    assert result.exit_code == 0, result.stderr
    assert [row["profile"] for row in json.loads(result.stdout)["rows"]] == ["profiles/a.toml"]
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    assert runner.invoke(app, ["gate", "--manifests-dir", str(store.manifests_dir)]).exit_code == ExitCode.USAGE


def test_cli_default_profiles_say_how_to_name_the_ones_to_gate(
    runner: CliRunner, store: Store, profiles: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """profiles/*.toml may hold examples for other machines: a failure says how to pick the profiles."""
    bless(store, write(profiles, "a.toml"), tmp_path)
    write(profiles, "example-gpu.toml", layers=8)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["gate", "--manifests-dir", str(store.manifests_dir), "--json"])
    assert result.exit_code == ExitCode.GATE_FAILED
    hint = json.loads(result.stdout)["error"]["hint"]
    assert "no profiles were named" in hint and "bless gate profiles/a.toml" in hint
    named = runner.invoke(
        app, ["gate", "profiles/example-gpu.toml", "--manifests-dir", str(store.manifests_dir), "--json"]
    )
    assert named.exit_code == ExitCode.GATE_FAILED
    assert "no profiles were named" not in json.loads(named.stdout)["error"]["hint"]


def test_cli_gate_takes_the_shared_root_and_manifests_dir_options(
    runner: CliRunner, store: Store, profiles: Path, tmp_path: Path
) -> None:
    """--root / --manifests-dir after ``gate`` are the global options (env vars included); the command line wins."""
    profile = write(profiles, "a.toml")
    config_hash = bless(store, profile, tmp_path)
    manifests = str(store.manifests_dir)
    decoy = tmp_path / "decoy"
    decoy.mkdir()

    def gate(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        result = runner.invoke(app, [*args, "--json"], env=env)
        assert result.exit_code == 0, result.stderr
        document: dict[str, Any] = json.loads(result.stdout)
        return document

    by_env = gate("gate", str(profile), env={"BLESS_MANIFESTS_DIR": manifests, "BLESS_ROOT": str(store.root)})
    assert by_env["rows"][0]["config_hash"] == config_hash and by_env["root"] == str(store.root)
    global_wins_over_env = gate(
        "--manifests-dir", manifests, "gate", str(profile), env={"BLESS_MANIFESTS_DIR": str(decoy)}
    )
    assert global_wins_over_env["manifests_dir"] == manifests
    command_wins_over_global = gate("--manifests-dir", str(decoy), "gate", str(profile), "--manifests-dir", manifests)
    assert command_wins_over_global["manifests_dir"] == manifests


def test_cli_gate_missing_manifests_dir_says_which(runner: CliRunner, profiles: Path, tmp_path: Path) -> None:
    missing = tmp_path / "manifests" / "blessed"
    result = runner.invoke(app, ["gate", str(write(profiles, "a.toml")), "--manifests-dir", str(missing)])
    assert result.exit_code == ExitCode.USAGE
    assert f"the manifests directory {missing} does not exist" in result.stderr
    assert "bless --manifests-dir DIR run --profile P" in result.stderr


def _gate_hint(runner: CliRunner, *args: str) -> str:
    result = runner.invoke(app, ["gate", *args, "--json"])
    assert result.exit_code == ExitCode.GATE_FAILED, result.stderr
    hint: str = json.loads(result.stdout)["error"]["hint"]
    return hint


def test_cli_gate_hint_names_the_cause_drift(runner: CliRunner, store: Store, profiles: Path, tmp_path: Path) -> None:
    bless(store, write(profiles, "a.toml"), tmp_path)
    hint = _gate_hint(runner, str(write(profiles, "b.toml", layers=4)), "--manifests-dir", str(store.manifests_dir))
    assert "revert the drifted factors" in hint and "Docker" not in hint


def test_cli_gate_hint_names_the_cause_docker_down(runner: CliRunner, store: Store, profiles: Path) -> None:
    store.manifests_dir.mkdir(parents=True)
    tagged = write(profiles, "a.toml", image="bless-reference:0.1.0")  # DOCKER_HOST points nowhere
    hint = _gate_hint(runner, str(tagged), "--manifests-dir", str(store.manifests_dir))
    assert "pin runtime.image to its sha256 ID" in hint and "Docker Engine is reachable" in hint
    assert "revert" not in hint


def test_cli_gate_hint_names_the_cause_tampered_cache(
    runner: CliRunner, store: Store, profiles: Path, tmp_path: Path
) -> None:
    profile = write(profiles, "a.toml")
    manifest = store.find(bless(store, profile, tmp_path))
    assert manifest is not None
    target = store.blessed_dir(manifest) / "artifact.bin"
    target.chmod(0o644)
    target.write_bytes(b"flipped")
    hint = _gate_hint(runner, str(profile), "--verify", "--root", str(store.root))
    assert "do not serve it" in hint and "--rebless" in hint
    assert "revert" not in hint
