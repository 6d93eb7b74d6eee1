"""Engine adapters (policy per serving engine) and the reference engine that runs inside images."""

from __future__ import annotations

from bless.engines.base import EngineAdapter
from bless.errors import InputInvalidError

ENGINES = ("reference", "vllm")


def get_adapter(name: str) -> EngineAdapter:
    """The adapter for an engine name from a profile."""
    if name == "reference":
        from bless.engines.reference import ReferenceAdapter

        return ReferenceAdapter()
    if name == "vllm":
        from bless.engines.vllm import VllmAdapter

        return VllmAdapter()
    raise InputInvalidError(f"unknown engine {name!r}", hint=f"known engines: {', '.join(ENGINES)}")
