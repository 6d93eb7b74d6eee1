"""``bless.k8s_render``: the Kubernetes documents through the public API, its options checked before any work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import bless
import bless.probes as probes

REPO = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32
TP4 = REPO / "profiles" / "vllm-0.26-llama-3.1-70b-dummy-tp4-local.toml"


def options(**changed: Any) -> bless.K8sOptions:
    chosen: dict[str, Any] = {
        "artifact": f"registry.example.com/blessings/tp4@{DIGEST}",
        "engine_image": f"registry.example.com/ml/engine@{DIGEST}",
        "bless_image": f"registry.example.com/ml/bless@{DIGEST}",
        "model_claim": "models",
    }
    return bless.K8sOptions(**{**chosen, **changed})


def test_a_rollout_tool_renders_a_tp_profile_dry_without_shelling_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def must_not(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the dry form reads nothing of this machine, the store or a registry")

    monkeypatch.setattr(probes, "probe_python_environment", must_not)
    monkeypatch.setattr(probes, "read_model_dir", must_not)
    store = bless.open_store(tmp_path / "root")
    rendered = bless.k8s_render(TP4, options(), store=store, dry_run=True)
    assert isinstance(rendered, bless.K8sRendered)
    kinds = [document["kind"] for document in rendered.to_dict()["documents"]]
    assert "Deployment" in kinds and "Service" in kinds and "PodDisruptionBudget" in kinds


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: bless.k8s_render(TP4, None, dry_run=True), "options"),  # type: ignore[arg-type]
        (lambda: bless.k8s_render(TP4, {"artifact": "x"}, dry_run=True), "options"),  # type: ignore[arg-type]
        (lambda: bless.k8s_render("pro\0file.toml", options(), dry_run=True), "profile"),
        (lambda: bless.k8s_render(TP4, options(), dry_run="yes"), "dry_run"),  # type: ignore[arg-type]
        (lambda: bless.k8s_render(TP4, options(), trust_dir=7, dry_run=True), "trust_dir"),  # type: ignore[arg-type]
    ],
)
def test_bad_options_are_refused_before_any_work(call: Any, needle: str) -> None:
    with pytest.raises(bless.UsageError) as refused:
        call()
    assert needle in str(refused.value) and refused.value.exit_code == bless.ExitCode.USAGE
