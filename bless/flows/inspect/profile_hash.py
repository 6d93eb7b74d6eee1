"""``bless hash``: a profile resolved here, as its config hash, factors and where its hardware came from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from bless.core.factors import ResolvedConfig
from bless.probes import HardwareSource

__all__ = ["ProfileHash", "ResolvedProfile", "hash_profile"]


class ResolvedProfile(Protocol):
    """A profile file resolved on this machine, and whether its hardware was declared or probed."""

    @property
    def resolved(self) -> ResolvedConfig: ...

    @property
    def hardware_source(self) -> HardwareSource: ...


@dataclass(frozen=True)
class ProfileHash:
    """What ``bless hash`` reports: the resolved config (hash, factors, recorded env) and the hardware's source."""

    resolved: ResolvedConfig
    hardware_source: HardwareSource

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``bless hash --json``)."""
        return {**self.resolved.to_dict(), "hardware_source": self.hardware_source}


def hash_profile(profile: ResolvedProfile) -> ProfileHash:
    """The config hash report of a resolved profile."""
    return ProfileHash(profile.resolved, profile.hardware_source)
