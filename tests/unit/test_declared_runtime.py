"""Local-runtime GPU profiles gated on a CPU-only runner: ``[runtime]`` and ``[model]`` declarations.

``bless hash``, ``diff`` and ``gate`` use a profile's declared Python and engine package versions and its model
directory's content hash as they are (nothing probed, no model directory needed); ``bless run`` and
``serve-full`` read the live ones and refuse any that differ (34). An engine package that is not installed is
never hashed as missing. ``gate --verify`` fails a profile whose cache files it could not verify, unless told
otherwise.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import bless.probes as probes
import bless.runtime
from bless.cli.main import app
from bless.core.factors import GpuInfo
from bless.core.manifest import load_manifest, manifest_from_dict
from bless.core.profile import load_profile
from bless.engines import get_adapter
from bless.errors import EnvironmentMismatchError, ExitCode, InputInvalidError, ResolutionError
from bless.flows.resolve import HardwareRule, resolve_for_command
from bless.flows.serve.checks import Preflight, resolve_here
from bless.store import Store
from tests.support.cli import cli_runner
from tests.support.fakes import FakeRuntime
from tests.unit.store_helpers import make_manifest, write_tree

REPO = Path(__file__).resolve().parents[2]
H100 = GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 81559, 81000, 0, "GPU-aaaa")
#: The H200 blessings of the shipped MoE, 8B and expert-parallel profiles, as `bless show --json` recorded them on
#: the GPU host (each proven as a copy declaring the H200, as scripts/gpu/proof-lib.sh's for_this_gpu writes it).
TRAFFIC_EVIDENCE = REPO / "docs" / "evidence" / "vllm-0.26-h200-traffic"
GPU_RECORDS = [
    ("vllm-0.26-qwen3-30b-a3b-dummy-local.toml", TRAFFIC_EVIDENCE / "moe-show-record.json"),
    ("vllm-0.26-qwen3-30b-a3b-fp8-dummy-local.toml", TRAFFIC_EVIDENCE / "fp8-show-record.json"),
    ("vllm-0.26-llama-3.1-8b-dummy-local.toml", TRAFFIC_EVIDENCE / "8b-show-record.json"),
    (
        "vllm-0.26-qwen3-30b-a3b-dummy-ep2-local.toml",
        REPO / "docs" / "evidence" / "vllm-0.26-h200x2-parallel" / "ep-show-record.json",
    ),
    (
        "vllm-0.26-llama-3.1-8b-dummy-tp2-local.toml",
        REPO / "docs" / "evidence" / "vllm-0.26-h200x2-tp2" / "show-record.json",
    ),
]
VLLM_026 = {"vllm": "0.26.0", "torch": "2.11.0", "triton": "3.6.0", "transformers": "5.17.0"}


def gpu_local_profiles() -> list[Path]:
    return [
        path
        for path in sorted((REPO / "profiles").glob("*.toml"))
        if load_profile(path).hardware.accelerator == "cuda" and load_profile(path).runtime_kind == "local"
    ]


def must_not_probe_python(python: str, packages: tuple[str, ...]) -> dict[str, Any]:
    raise AssertionError("a declared environment must not be probed")


def must_not_read_model(path: str, *, where: str) -> Any:
    raise AssertionError("a declared model content hash must not read the model directory")


@pytest.fixture
def cpu_runner_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as a CPU-only CI runner: no GPU, and nothing of the serving host may be read."""
    monkeypatch.setattr(probes, "probe_gpus", list)
    monkeypatch.setattr(probes, "probe_python_environment", must_not_probe_python)
    monkeypatch.setattr(probes, "read_model_dir", must_not_read_model)


@pytest.fixture
def runner() -> CliRunner:
    return cli_runner()


def clean_clone_profiles(tmp_path: Path) -> Path:
    """The profiles directory as a clean clone has it: no model directory, no engine beside it."""
    target = tmp_path / "clone" / "profiles"
    shutil.copytree(REPO / "profiles", target)
    return target


# --- hash, diff and gate on a CPU-only runner ------------------------------------------------------------


@pytest.mark.usefixtures("cpu_runner_host")
def test_every_gpu_profile_hashes_diffs_and_gates_from_a_clean_clone(runner: CliRunner, tmp_path: Path) -> None:
    shipped = gpu_local_profiles()
    assert len(shipped) >= 7
    profiles = clean_clone_profiles(tmp_path)
    store = Store(tmp_path / "root")
    for original in shipped:
        path = profiles / original.name
        hashed = runner.invoke(app, ["hash", "--profile", str(path), "--json"])
        assert hashed.exit_code == 0, (path, hashed.stderr)
        document = json.loads(hashed.stdout)
        factors = document["factors"]
        profile = load_profile(path)
        assert factors["runtime"] == {
            "kind": "local",
            "python_version": profile.python_version,
            "packages": dict(profile.packages or {}),
        }
        assert None not in factors["runtime"]["packages"].values()
        if profile.model.source == "local":
            assert factors["model"]["content_sha256"] == profile.model.content_sha256
            assert factors["model"]["path"] == profile.model.path
        tree = write_tree(tmp_path / "trees" / path.stem)
        store.publish(tree, make_manifest(tree, factors))
        config_hash = document["config_hash"]
        diffed = runner.invoke(app, ["--root", str(store.root), "diff", config_hash, "--profile", str(path), "--json"])
        assert diffed.exit_code == 0, (path, diffed.stderr)
        assert json.loads(diffed.stdout)["identical"] is True
    gated = runner.invoke(
        app, ["gate", *(str(profiles / p.name) for p in shipped), "--manifests-dir", str(store.manifests_dir), "--json"]
    )
    assert gated.exit_code == 0, gated.stderr
    rows = json.loads(gated.stdout)["rows"]
    assert [row["status"] for row in rows] == ["blessed"] * len(shipped)


@pytest.mark.usefixtures("cpu_runner_host")
@pytest.mark.parametrize(("name", "record_path"), GPU_RECORDS)
def test_the_gpu_profiles_gate_against_their_recorded_gpu_blessings(
    runner: CliRunner, tmp_path: Path, name: str, record_path: Path
) -> None:
    """The declared values are the GPU host's: the hash on this runner is the one the H200 blessing recorded."""
    record = json.loads(record_path.read_text())
    manifest = manifest_from_dict({k: v for k, v in record.items() if k not in ("ok", "manifest_path", "blessed_dir")})
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / f"{manifest.config_hash}.json").write_text(json.dumps(manifest.to_dict()))
    shipped = clean_clone_profiles(tmp_path) / name
    profile = tmp_path / f"this-gpu-{name}"
    profile.write_text(shipped.read_text().replace('gpu_name = "NVIDIA H100 80GB HBM3"', 'gpu_name = "NVIDIA H200"'))
    gated = runner.invoke(app, ["gate", str(profile), "--manifests-dir", str(manifests), "--json"])
    assert gated.exit_code == 0, gated.stderr
    (row,) = json.loads(gated.stdout)["rows"]
    assert row["status"] == "blessed" and row["config_hash"] == record["config_hash"]


def test_an_undeclared_environment_without_the_engine_is_refused_never_hashed_as_null(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        probes, "probe_python_environment", lambda python, packages: {"python_version": "3.11.2", "packages": {
            name: None for name in packages
        }}
    )  # fmt: skip
    text = (REPO / "profiles" / "vllm-0.26-llama-3.1-8b-dummy-local.toml").read_text()
    undeclared = tmp_path / "undeclared.toml"
    undeclared.write_text(
        "\n".join(line for line in text.splitlines() if not line.startswith(("python_version", "packages")))
    )
    rules: tuple[HardwareRule, ...] = ("judge", "probe")
    for rule in rules:
        with pytest.raises(ResolutionError) as caught:
            resolve_for_command(undeclared, image_resolver=None, hardware=rule, gpus=[H100])
        assert "vllm" in caught.value.message and "never hashed as missing" in caught.value.message
        assert caught.value.exit_code == ExitCode.RESOLUTION_FAILED


def test_a_declaration_names_both_fields_and_exactly_the_engine_packages(tmp_path: Path) -> None:
    text = (REPO / "profiles" / "reference-cuda-local.toml").read_text()
    half = tmp_path / "half.toml"
    half.write_text(text.replace('python_version = "3.12.3"\n', ""))
    with pytest.raises(InputInvalidError, match=r"runtime\.packages is declared without runtime\.python_version"):
        load_profile(half)
    extra = tmp_path / "extra.toml"
    extra.write_text(text.replace('packages = { torch = "2.11.0" }', 'packages = { torch = "2.11.0", numpy = "2" }'))
    with pytest.raises(ResolutionError, match="remove numpy"):
        resolve_for_command(extra, image_resolver=None, hardware="judge")
    docker = tmp_path / "docker.toml"
    docker.write_text(
        text.replace('kind = "local"', 'kind = "docker"\nimage = "sha256:' + "ab" * 32 + '"').replace(
            'python = "python3"', ""
        )
    )
    with pytest.raises(InputInvalidError, match="only the local runtime declares its environment"):
        load_profile(docker)


# --- run and serve-full check the declaration against the live values -------------------------------------


def live(**changed: str) -> Any:
    def probe(python: str, packages: tuple[str, ...]) -> dict[str, Any]:
        versions = {**VLLM_026, **changed}
        return {"python_version": changed.get("python", "3.12.3"), "packages": {n: versions.get(n) for n in packages}}

    return probe


def model_dir_profile(tmp_path: Path, content: bytes = b"{}") -> tuple[Path, Path]:
    """The shipped 8B profile with a model directory of this test, its content hash declared."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(content)
    digest = probes.hash_model_dir(model, where="test")
    text = (REPO / "profiles" / "vllm-0.26-llama-3.1-8b-dummy-local.toml").read_text()
    text = text.replace('"/tmp/models/llama-3.1-8b"', json.dumps(str(model)))
    text, declared = re.subn(r'^content_sha256 = "[0-9a-f]{64}"', f'content_sha256 = "{digest}"', text, flags=re.M)
    assert declared == 1, "the shipped 8B profile declares one model content hash"
    path = tmp_path / "profile.toml"
    path.write_text(text)
    return path, model


def test_a_gpu_host_matching_the_declaration_hashes_what_the_runner_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _model = model_dir_profile(tmp_path)
    monkeypatch.setattr(probes, "probe_python_environment", live())
    judged = resolve_for_command(path, image_resolver=None, hardware="judge")
    started = resolve_for_command(path, image_resolver=None, hardware="probe", gpus=[H100])
    assert started.config_hash == judged.config_hash


@pytest.mark.parametrize(
    ("changed", "named"),
    [({"torch": "2.10.0"}, "packages.torch: declared 2.11.0"), ({"python": "3.12.4"}, "python_version: declared")],
)
def test_serve_full_refuses_a_live_environment_unlike_the_declaration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, changed: dict[str, str], named: str
) -> None:
    path, _model = model_dir_profile(tmp_path)
    monkeypatch.setattr(probes, "probe_python_environment", live(**changed))
    profile = load_profile(path)
    with pytest.raises(EnvironmentMismatchError) as caught:
        resolve_here(profile, get_adapter("vllm"), Preflight(None, (H100,)))
    assert named in caught.value.message and int(caught.value.exit_code) == 34


def test_a_live_model_directory_unlike_the_declaration_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, model = model_dir_profile(tmp_path)
    monkeypatch.setattr(probes, "probe_python_environment", live())
    (model / "config.json").write_bytes(b'{"changed": true}')
    with pytest.raises(EnvironmentMismatchError, match="content_sha256: declared"):
        resolve_for_command(path, image_resolver=None, hardware="probe", gpus=[H100])
    (model / "config.json").write_bytes(b"{}")
    link = tmp_path / "link"
    link.symlink_to(model)
    linked = tmp_path / "linked.toml"
    linked.write_text(path.read_text().replace(json.dumps(str(model)), json.dumps(str(link))))
    with pytest.raises(EnvironmentMismatchError, match="real path"):
        resolve_for_command(linked, image_resolver=None, hardware="probe", gpus=[H100])


def test_bless_run_refuses_a_live_environment_unlike_the_declaration_before_any_start(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _model = model_dir_profile(tmp_path)
    monkeypatch.setattr(probes, "probe_python_environment", live(vllm="0.26.1"))
    monkeypatch.setattr(probes, "probe_gpus", lambda: [H100])
    fake = FakeRuntime()
    monkeypatch.setattr(bless.runtime, "get_runtime", lambda kind: fake)
    result = runner.invoke(app, ["--root", str(tmp_path / "root"), "run", "--profile", str(path)])
    assert result.exit_code == 34, result.stderr
    assert "packages.vllm: declared 0.26.0" in result.stderr and "0.26.1" in result.stderr
    assert fake.containers == []


# --- gate --verify ------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("cpu_runner_host")
def test_gate_verify_fails_when_nothing_could_be_verified_unless_allowed(runner: CliRunner, tmp_path: Path) -> None:
    path = clean_clone_profiles(tmp_path) / "reference-cuda-local.toml"
    hashed = json.loads(runner.invoke(app, ["hash", "--profile", str(path), "--json"]).stdout)
    manifests = tmp_path / "manifests"  # the manifests alone, as a CI checkout has them: no cache files
    manifests.mkdir()
    manifest = make_manifest(write_tree(tmp_path / "tree"), hashed["factors"])
    (manifests / f"{manifest.config_hash}.json").write_text(json.dumps(manifest.to_dict()))
    args = ["gate", str(path), "--manifests-dir", str(manifests), "--root", str(tmp_path / "root"), "--verify"]
    refused = runner.invoke(app, [*args, "--json"])
    assert refused.exit_code == ExitCode.GATE_FAILED, refused.stderr
    (row,) = json.loads(refused.stdout)["rows"]
    assert row["status"] == "failed" and row["exit_code"] == ExitCode.VERIFY_FAILED
    assert "nothing verified" in row["reason"]
    allowed = runner.invoke(app, [*args, "--allow-unverified", "--json"])
    assert allowed.exit_code == 0, allowed.stderr
    (row,) = json.loads(allowed.stdout)["rows"]
    assert row["status"] == "blessed" and row["verified"] is None and any("not verified" in n for n in row["notes"])


# --- evidence files say what they are ------------------------------------------------------------------------


def test_evidence_files_named_manifest_are_manifests_and_records_say_so() -> None:
    named_manifest = sorted((REPO / "docs" / "evidence").rglob("*manifest*.json"))
    for path in named_manifest:
        load_manifest(path)  # a file named a manifest is one (schema-valid), or it must be named otherwise
    records = 0
    for path in sorted((REPO / "docs" / "evidence").rglob("*.json")):
        document = json.loads(path.read_text())
        if isinstance(document, dict) and "factors" in document and path not in named_manifest:
            assert path.name.endswith("-record.json"), f"{path} holds a manifest's fields: name it *-record.json"
            records += 1
    assert records >= 7
