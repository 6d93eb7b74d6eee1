"""``bless hash``: a profile resolved here, as its config hash, factors and where its hardware came from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bless.core.factors import ResolvedConfig
from bless.flows.resolve import RUNTIME_WHEN_NEEDED, ProfileResolution, resolve_for_command
from bless.probes import HardwareSource

__all__ = ["ProfileHash", "hash_profile", "judge_profile"]


def judge_profile(path: Path, *, offline: bool, declared_hardware: bool) -> ProfileResolution:
    """Load, validate and resolve a profile file to its factors and config hash, for a judging command
    (hash, diff) that may run on any machine.

    Hardware: the profile's complete ``[hardware]`` declaration on any machine, else this machine's
    (:func:`bless.probes.judged_hardware`); ``declared_hardware`` never probes. A Docker image tag is
    resolved by a runtime made only then.
    """
    return resolve_for_command(
        path,
        image_resolver=RUNTIME_WHEN_NEEDED,
        hardware="declared" if declared_hardware else "judge",
        offline=offline,
    )


@dataclass(frozen=True)
class ProfileHash:
    """What ``bless hash`` reports: the resolved config (hash, factors, recorded env) and the hardware's source."""

    resolved: ResolvedConfig
    hardware_source: HardwareSource

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``bless hash --json``)."""
        # By hand (not JsonForm): the resolved config's JSON with the hardware's source added.
        return {**self.resolved.to_dict(), "hardware_source": self.hardware_source}


def hash_profile(path: Path, *, offline: bool = False, declared_hardware: bool = False) -> ProfileHash:
    """The config hash report of the profile file ``path`` resolved here (see :func:`judge_profile`).

    Raises: as :func:`bless.flows.resolve.resolve_for_command`.
    """
    judged = judge_profile(path, offline=offline, declared_hardware=declared_hardware)
    return ProfileHash(judged.resolved, judged.hardware_source)
