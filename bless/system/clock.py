"""The one spelling of "now" that bless records (manifests, leases, owner and holder records)."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["utc_now"]


def utc_now() -> str:
    """ISO-8601 UTC timestamp with a Z suffix, as the schema wants."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
