"""How slow a registry may be, as the commands that may pull or push take it (``--min-rate``, ``--stall-timeout``):
the transfer limits of :mod:`bless.oci.limits`, handed up to the command line through the flows, without the
registry client's imports (a command that never talks to a registry does not load oras or requests)."""

from __future__ import annotations

from bless.oci.limits import DEFAULT_LIMITS, DEFAULT_MIN_RATE, TransferLimits, parse_rate

__all__ = ["DEFAULT_LIMITS", "DEFAULT_MIN_RATE", "TransferLimits", "parse_rate"]
