"""Engine adapters (policy per serving engine) and the reference engine that runs inside images.

The reference engine (``reference_engine/``) imports only the standard library and torch: on a GPU host it runs
from its directory (``reference_engine/launch.py``), importing nothing of bless, since only torch is guaranteed there.
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
