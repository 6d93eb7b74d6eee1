"""The JSON of result types declared with :class:`~bless.core.json_form.JsonForm`'s options, byte for byte.

``tests/fixtures/json_forms.json`` holds what each instance below printed while its ``to_dict`` was written
by hand: the declared form must print the same bytes (``--json`` output is public)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from bless.core.coverage import CoverageClass, CoverageFamily, CoveragePlan, CoverageRun, Drive
from bless.core.factors import GpuInfo, ResolvedConfig
from bless.core.profile import load_profile
from bless.core.verify import Problem, TreeCheck
from bless.flows.gate.check import GateReport, GateRow
from bless.flows.inspect.diff import BlessingDiff
from bless.flows.inspect.engines import EngineSupport
from bless.flows.inspect.listing import BlessingList
from bless.flows.inspect.verify import VerifyOutcome
from bless.flows.run.results import CandidateResult, RunResult, TrialResult
from bless.flows.serve.detached import WatchOutcome
from bless.flows.serve.seal import UnprovenCompile
from bless.flows.serve.stop import StopOutcome
from bless.k8s.documents import K8sRendered
from bless.replay.canary import CanaryCheck, CanaryResult
from bless.replay.devices import GpuSlot
from bless.replay.engine_client import Completion
from bless.replay.trials import CoherenceReport, Observation
from bless.runtime.base import ContainerStop
from bless.trust.client import TrustVerdict
from bless.trust.repository import TrustSigning

REPO = Path(__file__).resolve().parents[2]
EXPECTED = REPO / "tests" / "fixtures" / "json_forms.json"
HASH = "ab" * 32
GPU = GpuInfo("NVIDIA H100", "9.0", 81559, 80000, index=1, uuid="GPU-8f2c")


def gate_rows() -> list[GateRow]:
    return [
        GateRow(
            "a.toml",
            "failed",
            "drifted",
            HASH,
            "a",
            "H100",
            "/m/a.json",
            "NoManifestError",
            20,
            ({"field": "engine.version", "before": "1", "after": "2"},),
            ("note",),
            False,
            1.234567891,
        ),
        GateRow("b.toml", "blessed", "ok"),
    ]


def unproven() -> list[UnprovenCompile]:
    return [
        UnprovenCompile("triton-cache-manager", 12.5, kernel="k", key="abc", file="f.py"),
        UnprovenCompile("watcher", 13.0, path="HOME/.triton/x", reason="new compiled file"),
        UnprovenCompile("watcher", 14.0),
    ]


def coherence() -> CoherenceReport:
    observation = Observation("alone", "p", "t", (1, 2), 0.1)
    return CoherenceReport(
        False, ("r1",), {"p": Completion("p", "t", (1, 2), 0.1)}, {"p": 2}, 7, 1.234567891, (observation,)
    )


def run_results() -> list[RunResult]:
    trial = TrialResult(
        0,
        True,
        (),
        coherence(),
        None,
        {"engine_seconds": 1.0},
        {"start": 1.0},
        {"files": 0},
        GpuSlot(0, (GPU,)),
        CoverageRun("auto", (Drive(17, 1, (), 1),), 0.5),
    )
    candidate = CandidateResult(0, False, {"seconds": 1.0}, (trial,), ("bad",), Path("/r/x"), 3.14159265)
    plain = CandidateResult(1, True, {}, (), ())
    return [
        RunResult(
            HASH,
            "run1",
            True,
            (candidate, plain),
            3,
            0.95,
            0.1,
            Path("/m.json"),
            Path("/b"),
            Path("/a.json"),
            10.123456,
            4.987654,
            ("w",),
            (GpuSlot(0, (GPU,)),),
        ),
        RunResult(HASH, "run2", False, (plain,), 3, 0.95, None, None, None, None, 0.0, 0.0),
        RunResult(
            HASH, "run3", True, (plain,), 3, 0.95, None, None, None, None, 10.0, 12.0, (), (GpuSlot(0), GpuSlot(1))
        ),
    ]


def coverage_plan() -> CoveragePlan:
    family = CoverageFamily("gemm", True, True, "r", "src", (CoverageClass("k", 17, 2, 17, 18, {"top_k": 2}, 4),))
    return CoveragePlan("vllm", "m", (family,), (1, 2048), (1000, 2000), ("n",))


def instances() -> dict[str, Any]:
    # Named by a relative path: the label is the profile's path, and the expected JSON is the same on any checkout.
    profile = dataclasses.replace(
        load_profile(REPO / "profiles" / "reference-cpu.toml"), path=Path("reference-cpu.toml")
    )
    verify_result = TreeCheck(False, (Problem("size", "a.bin", "d"),), (), 1, 2, 0.5)
    verdict = TrustVerdict("t/x.json", {"root": 1, "targets": 2}, "2030-01-01T00:00:00Z", {"k": "v"})
    rows = gate_rows()
    return {
        "gate_row_full": rows[0],
        "gate_row_plain": rows[1],
        "gate_report": GateReport(tuple(rows), Path("/m"), Path("/root"), True, ("bad.json",), 2.3456789),
        "gate_report_empty": GateReport((), Path("/m"), Path("/root"), False),
        "stop_found": StopOutcome("p", ("c1",), ("/s/1",), 1, ("n",)),
        "stop_none": StopOutcome("p", (), (), 0),
        "watch_stopped": WatchOutcome(
            "unproven-compile", tuple(unproven()[:1]), ContainerStop(0, True, 1.5), StopOutcome("p", ("c1",), (), 1)
        ),
        "watch_plain": WatchOutcome("engine-gone"),
        **{f"unproven_{i}": event for i, event in enumerate(unproven())},
        "verify_unsigned": VerifyOutcome(HASH, Path("/b/x"), verify_result, None),
        "verify_signed": VerifyOutcome(HASH, Path("/b/x"), verify_result, verdict),
        "diff_same": BlessingDiff({"kind": "manifest"}, {"kind": "profile"}, ()),
        "diff_changed": BlessingDiff({"kind": "manifest"}, {"kind": "profile"}, ({"field": "x"},)),
        "listing": BlessingList(
            Path("/r"), Path("/r/m"), ({"config_hash": HASH},), ({"path": "x.json"},), {HASH: ["a.json", "b.json"]}
        ),
        "engines": EngineSupport("python3", ({"engine": "vllm", "versions": ("0.1",)},), {"vllm": "0.1"}),
        **{f"run_{i}": result for i, result in enumerate(run_results())},
        "canary_check_match": CanaryCheck("p", 4, (1, 2), (1, 2), "t", "t"),
        "canary_check_differs": CanaryCheck("p", 4, (1, 2), (1, 3), "t", "u"),
        "canary_result": CanaryResult("failed", (CanaryCheck("p", 4, (1,), (2,), "t", "u"),), 0.123456789),
        "canary_skipped": CanaryResult("skipped", reason="--no-canary"),
        "coherence": coherence(),
        "trust_verdict": verdict,
        "sign_result": TrustSigning(
            "t/x.json",
            10,
            "cd" * 32,
            {"targets": 3},
            "2030-01-01T00:00:00Z",
            ("t/old.json",),
            {"targets": (1, 1), "snapshot": (2, 1)},
            ("w",),
        ),
        "coverage_plan": coverage_plan(),
        "resolved": ResolvedConfig(
            profile,
            {"engine": {"name": "reference", "version": "1"}, "env": {}},
            HASH,
            {"IGNORED": "1"},
            {"TOKEN": "secret"},
        ),
        "rendered": K8sRendered(({"kind": "Deployment", "spec": {"replicas": 1}},), ("w",)),
    }


@pytest.mark.parametrize("name", sorted(instances()))
def test_the_json_form_prints_the_bytes_it_always_did(name: str) -> None:
    expected = json.loads(EXPECTED.read_text(encoding="utf-8"))[name]
    assert json.dumps(instances()[name].to_dict()) == json.dumps(expected)


def test_every_case_has_its_expected_json() -> None:
    assert sorted(json.loads(EXPECTED.read_text(encoding="utf-8"))) == sorted(instances())
