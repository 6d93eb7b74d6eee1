"""What a pull does with the live blessing of its config: the decision, made over one lookup, with no I/O.

The way python-tuf's ``TrustedMetadataSet`` decides what metadata to accept and its ``Updater``
fetches: :func:`decide_pull` is given the live manifest (looked up once, under the config's writer
lock where it can be taken) and the pulled one, and says whether the pull ends here (the very
blessing is present), is refused (an older blessing over a newer one) or installs; the flow
(:mod:`.flow`) does the lookup and the fetching.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bless.core.manifest import Manifest
from bless.errors import DowngradeError

__all__ = ["PullDecision", "decide_pull"]


@dataclass(frozen=True)
class PullDecision:
    """What to do: ``present`` (nothing: this very blessing is live) or ``install`` (download and publish).

    ``live`` is the live blessing of the config the decision was made over (None: none), whose files a
    rebless's unchanged ones are linked from.
    """

    action: Literal["present", "install"]
    live: Manifest | None


def decide_pull(live: Manifest | None, pulled: Manifest, *, allow_downgrade: bool) -> PullDecision:
    """Decide a pull of ``pulled`` over ``live`` (the config's live manifest, or None).

    Present: the same blessing (dir id and tree hash) is live. Refused: the pulled blessing is older
    than a live one of another dir id, unless ``allow_downgrade``. Signed metadata protects a host
    against rolled-back *metadata* under ``--trust``; this protects the store itself, with or
    without it: a tag moved back to an older blessing must not silently win.

    Raises:
        DowngradeError: an older blessing over a newer one (16), naming both; nothing was downloaded.
    """
    if (
        live is not None
        and live.cache.dir_id == pulled.cache.dir_id
        and live.cache.tree_sha256 == pulled.cache.tree_sha256
    ):
        return PullDecision("present", live)
    if (
        not allow_downgrade
        and live is not None
        and live.cache.dir_id != pulled.cache.dir_id
        and pulled.created < live.created
    ):
        raise DowngradeError(
            f"{pulled.config_hash[:16]}...: the pulled blessing ({pulled.cache.dir_id}, created {pulled.created}) "
            f"is older than the live one ({live.cache.dir_id}, created {live.created}); nothing was downloaded",
            hint="check the reference (a tag moved back?); to install the older blessing on purpose, pull it "
            "allowing a downgrade (allow_downgrade)",
            details={"live": live.cache.dir_id, "pulled": pulled.cache.dir_id},
            remedy="allow_downgrade",
        )
    return PullDecision("install", live)
