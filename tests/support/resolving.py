"""Resolve a profile offline for unit tests: fake image ID, hardware, interpreter and model-dir probes.

Adapters launch from resolved factors only, so tests that look at argv, env or unsafe settings resolve first.
"""

from __future__ import annotations

from typing import Any

from bless.core.factors import FactorSource, LocalModelDir, ResolvedConfig, resolve
from bless.core.profile import HardwareSpec, Profile

FAKE_IMAGE_ID = "sha256:" + "ab" * 32
FAKE_GPU = {"accelerator": "cuda", "gpu_count": 1, "gpu_name": "NVIDIA H200", "compute_capability": "9.0"}
FAKE_CPU = {"accelerator": "cpu", "cpu_isa": "x86-64-v3"}


def resolved_offline(profile: Profile, adapter: FactorSource) -> ResolvedConfig:
    """``profile`` resolved with fakes (vLLM 0.20.0 / torch 2.11.0 on the local runtime)."""
    return resolve(
        profile,
        adapter,
        image_resolver=lambda _reference: FAKE_IMAGE_ID,
        hardware_probe=_hardware,
        environment_probe=fake_environment,
        model_dir_probe=fake_model_dir,
    )


def _hardware(spec: HardwareSpec) -> dict[str, Any]:
    return dict(FAKE_GPU if spec.accelerator == "cuda" else FAKE_CPU)


def fake_environment(_python: str, _packages: tuple[str, ...]) -> dict[str, Any]:
    return {"packages": {"vllm": "0.20.0", "torch": "2.11.0"}}


def fake_model_dir(path: str, *, where: str) -> LocalModelDir:
    return LocalModelDir(path, "0" * 64)
