"""Engine adapters (policy per serving engine) and the reference engine that runs inside images.

Kept free of imports beyond the standard library: the reference engine runs as
``python -m bless.engines.reference_engine`` on GPU hosts, where only torch is guaranteed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bless.engines.base import EngineAdapter

ENGINES = ("reference", "vllm")


def get_adapter(name: str) -> EngineAdapter:
    """The adapter for an engine name from a profile."""
    if name == "reference":
        from bless.engines.reference import ReferenceAdapter

        return ReferenceAdapter()
    if name == "vllm":
        from bless.engines.vllm import VllmAdapter

        return VllmAdapter()
    from bless.errors import InputInvalidError

    raise InputInvalidError(f"unknown engine {name!r}", hint=f"known engines: {', '.join(ENGINES)}")
