"""``--trust DIR`` for a blessing in a store, one rule for verify, pull and serve-full.

Under ``--trust`` the blessing must be a validly signed, fresh, current TUF target
(:func:`bless.trust.check_blessing`), checked on the exact bytes the caller parsed the manifest from
(the store lookup's :class:`~bless.store.LiveManifest`, or the pulled artifact's), and what was
trusted is recorded in the store's trusted metadata (``StorePaths.trust``) under its lock. Without it
nothing is checked: the verdict is None and the report says the blessing is unsigned.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from bless.core.manifest import Manifest
from bless.store import Store
from bless.trust import TrustVerdict, check_blessing

__all__ = ["trust_verdict"]


def trust_verdict(
    store: Store,
    manifest: Manifest,
    trust_dir: Path | None,
    *,
    data: bytes,
    candidate: Mapping[str, bytes] | None = None,
) -> TrustVerdict | None:
    """Under ``--trust`` (``trust_dir``): the verdict, or a refusal with its exit code. Without it: None (unsigned).

    ``data``: the bytes ``manifest`` was parsed from; ``candidate``: the metadata that came with a
    pulled blessing.
    """
    if trust_dir is None:
        return None
    return check_blessing(
        manifest,
        data,
        trust_dir=trust_dir,
        state_dir=store.paths.trust,
        lock_path=store.paths.trust_lock,
        candidate=candidate,
    )
