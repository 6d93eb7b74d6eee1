"""``bless engines``: the engine versions bless has rules for, and the vLLM/torch of a local interpreter."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bless.core.json_form import OMIT, JsonForm
from bless.engines.known_versions import local_vllm_status, supported_engines
from bless.errors import InputInvalidError
from bless.probes import probe_python_environment

__all__ = ["EngineSupport", "known_engines"]


@dataclass(frozen=True)
class EngineSupport(JsonForm):
    """The supported engines (versions, torch pins, how proven) and what ``python`` has installed (its JSON
    form is ``bless engines --json``'s)."""

    python: str = field(metadata=OMIT)  # what was asked, named only in the failure
    engines: tuple[dict[str, Any], ...]
    local: dict[str, Any]

    @property
    def failure(self) -> InputInvalidError | None:
        """INPUT_INVALID (3) when ``python`` could not be asked, reported after the table."""
        if "error" not in self.local:
            return None
        # Not "nothing installed": nothing could be asked, so an "ok" answer would be a false all-clear.
        return InputInvalidError(
            f"cannot check the vLLM and torch of --python {self.python}: {self.local['error']}",
            hint="name an interpreter that runs here (the local runtime's, e.g. .venv/bin/python)",
            remedy="python_that_runs",
            details={"python": self.python},
        )


def known_engines(python: str = "python3") -> EngineSupport:
    """What bless knows of each engine, and the vLLM and torch installed for ``python`` (never an exception:
    an interpreter that cannot be run is in ``local["error"]`` and :attr:`EngineSupport.failure`)."""
    return EngineSupport(python, tuple(supported_engines()), local_vllm_status(python, probe_python_environment))
