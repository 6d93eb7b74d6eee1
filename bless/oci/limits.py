"""How slow a registry may be: the limits of a transfer, without the registry client's imports.

The CLI builds :class:`TransferLimits` from its options on every command that may pull; keeping it
here spares commands that never talk to a registry the import of oras and requests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bless.errors import UsageError

__all__ = ["DEFAULT_LIMITS", "DEFAULT_MIN_RATE", "TransferLimits", "parse_rate"]


@dataclass(frozen=True)
class TransferLimits:
    """How slow a registry may be: every exchange gets ``grace_s`` plus its bytes at ``min_rate`` bytes/s.

    The grace covers connecting, a token round trip and the registry's latency, and is also the
    longest silence accepted mid-reply (the read timeout); the rate is far below any working link (a
    1 GiB blob at the default 100 KiB/s gets almost 3 hours), so only a registry that stalls or
    trickles runs into it.
    """

    min_rate: int = 100 << 10
    grace_s: float = 60.0

    def budget(self, size: int) -> float:
        """Seconds an exchange of ``size`` bytes may take."""
        return self.grace_s + size / self.min_rate


DEFAULT_LIMITS = TransferLimits()
#: ``DEFAULT_LIMITS.min_rate`` as the CLI writes it.
DEFAULT_MIN_RATE = "100k"
_RATE = re.compile(r"^([1-9][0-9]{0,12})([kKmMgG]?)$")
_RATE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_rate(text: str) -> int:
    """``100k``, ``2M``, ``512`` (bytes per second; k/M/G are powers of 1024) -> bytes per second."""
    match = _RATE.fullmatch(text.strip())
    if not match:
        raise UsageError(f"bad rate {text!r}", hint="write bytes per second, optionally with k, M or G: 100k, 2M")
    return int(match.group(1)) * _RATE_UNITS[match.group(2).lower()]
