"""The rebless rule: a new blessing may not quietly replace one with a stronger failure-rate bound.

Checked before any engine starts, so nothing is spent on a run that may not publish.
"""

from __future__ import annotations

from collections.abc import Mapping

from bless.core.manifest import Manifest
from bless.errors import WeakerBlessingError
from bless.flows.run.results import DEFAULT_CONFIDENCE, RunOptions
from bless.replay.trials import failure_rate_bound


def existing_passes(manifest: Manifest) -> int:
    """How many trials in a row the blessing passed (K of K: a run stops at its first failure)."""
    passed = manifest.trials.get("passed")
    return passed if isinstance(passed, int) and not isinstance(passed, bool) and passed >= 0 else 0


def weaker_than(existing: Manifest, options: RunOptions) -> str | None:
    """Why a rebless with ``options`` would publish a weaker failure-rate bound than ``existing``, or None.

    Both bounds are taken at the confidence of the blessing being replaced, so a different
    ``--confidence`` alone never makes a rebless look weaker or stronger: only the evidence (how
    many trials passed) counts.
    """
    stored = existing.trials.get("failure_rate_bound")
    confidence = stored.get("confidence") if isinstance(stored, Mapping) else None
    if not isinstance(confidence, float) or not 0 < confidence < 1:
        confidence = DEFAULT_CONFIDENCE
    passes = existing_passes(existing)
    before = failure_rate_bound(passes, confidence)
    after = failure_rate_bound(options.k, confidence)
    if after <= before:
        return None
    return (
        f"--rebless with K={options.k} would replace a {passes}/{passes} blessing of "
        f"{existing.config_hash[:16]}: failure-rate bound {before:.0%} -> {after:.0%} per start "
        f"at {confidence:.0%} confidence (weaker)"
    )


def check_bound_kept(existing: Manifest, options: RunOptions) -> str | None:
    """Refuse a rebless that would publish a weaker bound (:class:`WeakerBlessingError`), unless allowed.

    Returns the warning to report when ``--allow-weaker`` lets a weaker bound through, None when the
    bound is kept.
    """
    weaker = weaker_than(existing, options)
    if weaker is None:
        return None
    if not options.allow_weaker:
        raise WeakerBlessingError(
            weaker,
            hint=f"bless with at least {existing_passes(existing)} trials to keep the bound, "
            "or allow a weaker bound (allow_weaker) to publish the weaker one",
            details={
                "config_hash": existing.config_hash,
                "trials": options.k,
                "trials_to_keep_bound": existing_passes(existing),
            },
            remedy="allow_weaker",
        )
    return f"{weaker}; publishing it anyway (--allow-weaker)"
