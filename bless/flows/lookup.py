"""A blessing named on a command line: a full config hash or a unique prefix of at least 8 hex digits.

Shared by the flows that read one blessing of a store (inspect, sign, push): one rule for what a user
may type, and one refusal when nothing matches.
"""

from __future__ import annotations

from bless.core.factors import parse_config_hash
from bless.core.manifest import Manifest
from bless.errors import NoManifestError
from bless.store import LiveManifest, Store

__all__ = ["lookup_live", "lookup_manifest"]


def lookup_manifest(store: Store, text: str) -> Manifest:
    """The live manifest named by a full config hash or a unique prefix of at least 8 hex digits.

    Raises: as :func:`lookup_live`.
    """
    return lookup_live(store, text).manifest


def lookup_live(store: Store, text: str) -> LiveManifest:
    """:func:`lookup_manifest`, with the file's path and the exact bytes the manifest was parsed from
    (what is signed and checked under ``--trust``).

    Raises:
        NoManifestError: nothing in the manifests dir has that hash (or prefix).
        InputInvalidError: a malformed or ambiguous prefix.
        ManifestInvalidError, ManifestDuplicateError: the store's fail-closed lookup errors.
    """
    if len(text.strip()) != 64:  # a prefix; both forms are checked against the one config-hash format
        return store.live_prefix(text)
    config_hash = parse_config_hash(text)
    live = store.live(config_hash)
    if live is None:
        raise NoManifestError(
            f"no manifest in {store.manifests_dir} has config hash {config_hash}",
            hint=(
                "the store's list of blessings shows what it holds; check the store root and the manifests dir "
                "(or $BLESS_ROOT / $BLESS_MANIFESTS_DIR), or bless the configuration"
            ),
            remedy="no_such_blessing",
            details={"config_hash": config_hash, "manifests_dir": str(store.manifests_dir)},
        )
    return live
