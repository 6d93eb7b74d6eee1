"""What ``bless engines`` reports: the engine versions bless has rules for, and what a local interpreter has."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bless.engines.vllm import versions as vllm_versions
from bless.engines.vllm.coverage import GPU_PROVEN_RELEASES, MODELED_RELEASES

#: ``(python, packages) -> {"python_version": ..., "packages": {name: version or None}}``; raises on failure.
EnvironmentProbe = Callable[[str, tuple[str, ...]], dict[str, Any]]


def supported_engines() -> list[dict[str, Any]]:
    """Every engine and the versions bless has rules for, each saying whether a GPU run proved it."""
    rules = vllm_versions.all_rules()
    vllm = [
        {
            "version": version,
            "torch": rules[version].torch,
            "proven": "gpu" if rules[version].gpu_proven else "source",
            "gpu_proven": rules[version].gpu_proven,
            "wheel": rules[version].wheel,
            "coverage": coverage_status(version),
        }
        for version in vllm_versions.known_versions()
    ]
    return [
        {"name": "vllm", "versions": vllm},
        {"name": "reference", "versions": [{"version": "bundled", "proven": "bundled", "torch": "any"}]},
    ]


def coverage_status(release: str) -> str:
    """How the release's coverage model (its lazily compiled kernel families) stands: ``gpu`` (derived from source
    and confirmed by a GPU run), ``source`` (derived from source, not yet GPU-proven) or ``none`` (no model: every
    lazy family is a gap that ``[coverage] mode = "require"`` refuses)."""
    if release in GPU_PROVEN_RELEASES:
        return "gpu"
    return "source" if release in MODELED_RELEASES else "none"


def local_vllm_status(python: str, probe: EnvironmentProbe) -> dict[str, Any]:
    """The vLLM and torch ``python`` imports, and whether bless knows that vLLM (exact, nearest older, or not)."""
    try:
        found = probe(python, ("vllm", "torch"))
    except Exception as exc:  # the probe's own errors all mean "cannot tell"; said, never raised
        return {"python": python, "error": str(exc)}
    raw_packages = found.get("packages")
    packages: dict[str, Any] = raw_packages if isinstance(raw_packages, dict) else {}
    vllm, torch = packages.get("vllm"), packages.get("torch")
    status: dict[str, Any] = {
        "python": python,
        "python_version": found.get("python_version"),
        "vllm": vllm,
        "torch": torch,
        "known": False,
        "rules": None,
        "torch_matches_pin": None,
    }
    if not isinstance(vllm, str):
        return status
    exact = vllm_versions.rules_for(vllm)
    nearest = exact or vllm_versions.nearest_older(vllm)
    status["known"] = exact is not None
    status["rules"] = nearest.version if nearest else None
    if nearest is not None and isinstance(torch, str):
        status["torch_matches_pin"] = vllm_versions.release_of(torch) == nearest.torch
    return status
