"""``bless diff``: which factors differ between a blessing and a profile resolved here, or two blessings.

A report, not a judgement: the result says whether they are identical, and no outcome is a refusal.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bless.core.factors import change_to_dict, diff_factors
from bless.core.json_form import JsonForm
from bless.core.manifest import Manifest
from bless.errors import UsageError
from bless.flows.inspect.profile_hash import judge_profile
from bless.flows.lookup import lookup_manifest
from bless.flows.resolve import ProfileResolution
from bless.store import Store

__all__ = ["BlessingDiff", "diff_profile"]

_HOW = "compare a blessing with a profile resolved here, or two blessings"


@dataclass(frozen=True)
class BlessingDiff(JsonForm):
    """The two sides (each described) and the factor changes from ``a`` to ``b`` (``bless diff --json``)."""

    json_keys = ("a", "b", "identical", "changes")

    a: dict[str, Any]
    b: dict[str, Any]
    changes: tuple[dict[str, Any], ...]

    def json_extra(self) -> dict[str, Any]:
        """Whether no factor differs."""
        return {"identical": not self.changes}


def _manifest_side(manifest: Manifest) -> dict[str, Any]:
    return {
        "kind": "manifest",
        "config_hash": manifest.config_hash,
        "profile_name": manifest.profile_name,
        "created": manifest.created,
    }


def _profile_side(judged: ProfileResolution) -> dict[str, Any]:
    resolved = judged.resolved
    return {
        "kind": "profile",
        "profile": resolved.profile.label,
        "config_hash": resolved.config_hash,
        "hardware_source": judged.hardware_source,
    }


def diff_profile(
    store: Store,
    hash_a: str,
    hash_b: str | None = None,
    *,
    profile: Path | None = None,
    offline: bool = False,
    declared_hardware: bool = False,
) -> BlessingDiff:
    """Compare the blessing ``hash_a`` with the blessing ``hash_b``, or with the profile file ``profile``
    resolved here (:func:`~bless.flows.inspect.profile_hash.judge_profile`, once the blessing was found: a
    lookup refusal comes before any resolution).

    Raises:
        UsageError: both or neither of ``hash_b`` and ``profile``.
        lookup errors: as :func:`bless.flows.lookup.lookup_live`; resolution errors: as
        :func:`bless.flows.resolve.resolve_for_command`.
    """
    if profile is not None and hash_b is not None:
        raise UsageError(
            "a blessing is compared with a profile or with another blessing, not both", hint=_HOW, remedy="diff_usage"
        )
    if profile is None and hash_b is None:
        raise UsageError("nothing to compare HASH_A with", hint=_HOW, remedy="diff_usage")
    blessed = lookup_manifest(store, hash_a)
    if profile is not None:
        judged = judge_profile(profile, offline=offline, declared_hardware=declared_hardware)
        b_side, b_factors = _profile_side(judged), judged.resolved.factors
    else:
        assert hash_b is not None
        other = lookup_manifest(store, hash_b)
        b_side, b_factors = _manifest_side(other), other.factors
    changes = tuple(change_to_dict(change) for change in diff_factors(blessed.factors, b_factors))
    return BlessingDiff(_manifest_side(blessed), b_side, changes)
