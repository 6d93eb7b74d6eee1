"""GPU profiles on a CPU-only host (issue 26, item 4).

``bless hash``, ``bless diff`` and ``bless gate`` use a complete ``[hardware]`` declaration on any
machine; an incomplete one is probed, and on a machine without GPUs fails naming what to add.
``bless run`` and ``serve-full`` always probe and refuse a GPU that differs from the declaration
(exit 32, naming both).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import bless.probes as probes
import bless.runtime
from bless.cli.main import app
from bless.core.factors import GpuInfo, declared_hardware_factor
from bless.core.profile import HardwareSpec, load_profile
from bless.errors import ExitCode, HardwareMismatchError, ResolutionError
from bless.flows.gate import run_gate
from bless.flows.resolve import resolve_profile
from bless.probes import hardware_factor, judged_hardware
from bless.runtime.base import Runtime
from bless.store import Store
from tests.support.cli import cli_runner
from tests.support.fakes import FakeRuntime
from tests.unit.store_helpers import make_manifest, write_tree

REPO = Path(__file__).resolve().parents[2]
IMAGE_ID = "sha256:" + "ab" * 32
H100 = GpuInfo("NVIDIA H100 80GB HBM3", "9.0", 81559, 81000, 0, "GPU-aaaa")
H200 = GpuInfo("NVIDIA H200", "9.0", 143771, 143000, 0, "GPU-bbbb")
DECLARED = 'gpu_count = 1\ngpu_name = "NVIDIA H100 80GB HBM3"\ncompute_capability = "9.0"'


def cuda_profile(directory: Path, filename: str = "gpu.toml", *, hardware: str = DECLARED) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / filename
    path.write_text(
        f"""
profile_version = 1
name = "gpu-test"

[engine]
name = "reference"

[runtime]
kind = "docker"
image = "{IMAGE_ID}"

[model]
source = "builtin"
id = "reference-tiny"

[serve]
device = "cuda"

[hardware]
accelerator = "cuda"
{hardware}
""",
        encoding="utf-8",
    )
    return path


def no_gpus() -> list[GpuInfo]:
    return []


def gpus_must_not_be_probed() -> list[GpuInfo]:
    raise AssertionError("a complete declaration must not probe this machine's GPUs")


@pytest.fixture
def cpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine has no GPU (what nvidia-smi's absence looks like to bless)."""
    monkeypatch.setattr(probes, "probe_gpus", no_gpus)


@pytest.fixture
def runner() -> CliRunner:
    return cli_runner()


# --- the rule ------------------------------------------------------------------------------------------


def test_a_complete_declaration_is_the_factor_without_probing() -> None:
    spec = HardwareSpec("cuda", gpu_count=2, gpu_name="NVIDIA H100 80GB HBM3", compute_capability="9.0")
    judged = judged_hardware(spec, gpus=gpus_must_not_be_probed)
    assert judged.source == "declared" and judged.undeclared == ()
    assert judged.factor == {
        "accelerator": "cuda",
        "gpu_count": 2,
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "compute_capability": "9.0",
    }
    # The same factor a GPU host that matches the declaration probes: one hash on both.
    assert judged.factor == hardware_factor(spec, gpus=[H100, H100])


def test_an_incomplete_declaration_is_probed_on_a_gpu_host() -> None:
    judged = judged_hardware(HardwareSpec("cuda", gpu_count=1), gpus=lambda: [H200])
    assert judged.source == "probed" and judged.undeclared == ("gpu_name", "compute_capability")
    assert judged.factor["gpu_name"] == "NVIDIA H200"


def test_an_incomplete_declaration_on_a_cpu_host_names_what_to_add() -> None:
    with pytest.raises(ResolutionError) as caught:
        judged_hardware(HardwareSpec("cuda", gpu_name="NVIDIA H100 80GB HBM3"), gpus=no_gpus)
    error = caught.value
    assert error.exit_code == ExitCode.RESOLUTION_FAILED
    assert "hardware.compute_capability, hardware.gpu_count" in error.message and "no GPU" in error.message
    assert error.hint is not None and "compute_capability = " in error.hint and "nvidia-smi" in error.hint
    assert error.details["undeclared"] == ["hardware.compute_capability", "hardware.gpu_count"]


def test_a_cpu_profile_declaring_its_isa_is_not_probed() -> None:
    declared = judged_hardware(HardwareSpec("cpu", cpu_isa="x86-64-v4"))
    assert declared.factor == {"accelerator": "cpu", "isa": "x86-64-v4"}
    assert judged_hardware(HardwareSpec("cpu")).source == "probed"


@pytest.mark.parametrize(
    ("spec", "live", "both"),
    [
        (HardwareSpec("cuda", gpu_count=1, gpu_name="NVIDIA H100 80GB HBM3"), [H200], ("H100", "H200")),
        (HardwareSpec("cuda", gpu_count=1, compute_capability="8.0"), [H200], ("'8.0'", "'9.0'")),
        (HardwareSpec("cuda", gpu_count=2), [H200], ("needs 2", "has 1")),
    ],
)
def test_a_live_gpu_unlike_the_declaration_is_refused_naming_both(
    spec: HardwareSpec, live: list[GpuInfo], both: tuple[str, str]
) -> None:
    """What run and serve-full resolve with (:func:`hardware_factor` always probes)."""
    with pytest.raises(HardwareMismatchError) as caught:
        hardware_factor(spec, gpus=live)
    assert caught.value.exit_code == ExitCode.HARDWARE_MISMATCH and int(ExitCode.HARDWARE_MISMATCH) == 32
    assert all(word in caught.value.message for word in both), caught.value.message


# --- hash and diff on a CPU-only host ----------------------------------------------------------------


def test_hash_of_a_declared_gpu_profile_on_a_cpu_host(runner: CliRunner, tmp_path: Path, cpu_host: None) -> None:
    profile = cuda_profile(tmp_path)
    result = runner.invoke(app, ["--root", str(tmp_path / "root"), "hash", "--profile", str(profile), "--json"])
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["hardware_source"] == "declared"
    assert document["factors"]["hardware"]["gpu_name"] == "NVIDIA H100 80GB HBM3"
    human = runner.invoke(app, ["--root", str(tmp_path / "root"), "hash", "--profile", str(profile)])
    assert human.exit_code == 0 and "declared in the profile's [hardware]" in human.stderr


def test_hash_of_an_undeclared_gpu_profile_on_a_cpu_host_says_what_to_add(
    runner: CliRunner, tmp_path: Path, cpu_host: None
) -> None:
    profile = cuda_profile(tmp_path, hardware="gpu_count = 1")
    result = runner.invoke(app, ["--root", str(tmp_path / "root"), "hash", "--profile", str(profile)])
    assert result.exit_code == ExitCode.RESOLUTION_FAILED, result.stderr
    assert "hardware.gpu_name, hardware.compute_capability" in result.stderr
    assert 'gpu_name = "NVIDIA H100 80GB HBM3"' in result.stderr


def test_diff_of_a_declared_gpu_profile_on_a_cpu_host(runner: CliRunner, tmp_path: Path, cpu_host: None) -> None:
    store = Store(tmp_path / "root")
    profile = cuda_profile(tmp_path)
    blessed_on = {**declared_hardware_factor(load_profile(profile).hardware), "gpu_name": "NVIDIA H200"}
    resolved = resolve_profile(load_profile(profile), image_resolver=None, hardware_probe=lambda _spec: blessed_on)
    store.publish(write_tree(tmp_path / "tree"), make_manifest(write_tree(tmp_path / "tree"), resolved.factors))
    args = ["--root", str(store.root), "diff", "--profile", str(profile), resolved.config_hash, "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["b"]["hardware_source"] == "declared"
    assert [change["field"] for change in document["changes"]] == ["hardware.gpu_name"]


# --- gate on a CPU-only host ---------------------------------------------------------------------------


def no_docker(kind: str) -> Runtime:
    return FakeRuntime(reachable=False)


def _publish(store: Store, profile: Path, work: Path, hardware: dict[str, Any]) -> str:
    resolved = resolve_profile(load_profile(profile), image_resolver=None, hardware_probe=lambda _spec: hardware)
    tree = write_tree(work / f"tree-{resolved.config_hash[:8]}")
    manifest = make_manifest(tree, resolved.factors)
    store.publish(tree, manifest)
    return manifest.config_hash


def test_gate_passes_a_declared_gpu_profile_on_a_cpu_host(tmp_path: Path, cpu_host: None) -> None:
    """The blessing was made on a real H100 (its recorded hardware); the CI runner has no GPU."""
    store = Store(tmp_path / "root")
    profile = cuda_profile(tmp_path / "profiles")
    config_hash = _publish(store, profile, tmp_path, hardware_factor(load_profile(profile).hardware, gpus=[H100]))
    report = run_gate([profile], store=store, runtime_factory=no_docker)
    (row,) = report.rows
    assert report.ok and row.config_hash == config_hash and row.hardware == "declared" and row.notes == ()


def test_gate_compares_the_declaration_with_the_blessings_recorded_hardware(tmp_path: Path, cpu_host: None) -> None:
    """Blessed on an H200, declared H100: the row names the hardware drift."""
    store = Store(tmp_path / "root")
    profile = cuda_profile(tmp_path / "profiles")
    _publish(store, profile, tmp_path, hardware_factor(HardwareSpec("cuda", gpu_count=1), gpus=[H200]))
    (row,) = run_gate([profile], store=store, runtime_factory=no_docker).rows
    assert row.status == "failed" and row.exit_code == ExitCode.NO_MANIFEST
    assert 'hardware.gpu_name: "NVIDIA H200" -> "NVIDIA H100 80GB HBM3"' in row.reason


def test_gate_row_of_an_undeclared_gpu_profile_on_a_cpu_host_says_what_to_add(tmp_path: Path, cpu_host: None) -> None:
    store = Store(tmp_path / "root")
    store.manifests_dir.mkdir(parents=True)
    profile = cuda_profile(tmp_path / "profiles", hardware="gpu_count = 1")
    (row,) = run_gate([profile], store=store, runtime_factory=no_docker).rows
    assert row.status == "failed" and row.exit_code == ExitCode.RESOLUTION_FAILED
    assert "does not declare hardware.gpu_name, hardware.compute_capability" in row.reason


def test_every_shipped_gpu_profile_declares_its_hardware() -> None:
    """So bless hash, diff and gate resolve them on a CPU-only clone of this repository."""
    gpu_profiles = [
        path for path in sorted((REPO / "profiles").glob("*.toml")) if load_profile(path).hardware.accelerator == "cuda"
    ]
    assert len(gpu_profiles) >= 6
    for path in gpu_profiles:
        judged = judged_hardware(load_profile(path).hardware, gpus=gpus_must_not_be_probed)
        assert judged.source == "declared", path


# --- run refuses a live GPU unlike the declaration -------------------------------------------------------


def test_run_refuses_a_live_gpu_unlike_the_declaration_before_any_start(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probes, "probe_gpus", lambda: [H200])
    runtime = FakeRuntime()
    monkeypatch.setattr(bless.runtime, "get_runtime", lambda kind: runtime)
    profile = cuda_profile(tmp_path)
    result = runner.invoke(app, ["--root", str(tmp_path / "root"), "run", "--profile", str(profile)])
    assert result.exit_code == ExitCode.HARDWARE_MISMATCH, result.stderr
    assert "NVIDIA H100 80GB HBM3" in result.stderr and "NVIDIA H200" in result.stderr
    assert runtime.containers == []
