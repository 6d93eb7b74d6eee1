"""``--trust DIR`` for a blessing in a store, one rule for verify, pull and serve-full (and sign's bytes).

Under ``--trust`` the blessing must be a validly signed, fresh, current TUF target
(:func:`bless.trust.check_blessing`), checked on the manifest file's exact bytes, and what was trusted
is recorded in the store's trusted metadata (``StorePaths.trust``) under its lock. Without it nothing
is checked: the verdict is None and the report says the blessing is unsigned.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from bless.errors import NoManifestError, TargetMismatchError
from bless.manifest import Manifest
from bless.store import Store
from bless.trust import TrustVerdict, check_blessing

__all__ = ["stored_manifest_bytes", "trust_verdict"]


def stored_manifest_bytes(store: Store, manifest: Manifest) -> bytes:
    """The live manifest file's bytes (what is signed and checked), still holding ``manifest``.

    Raises:
        NoManifestError: the manifest is gone from the store's manifests dir.
        TargetMismatchError: the file no longer holds ``manifest``.
    """
    live = store.live(manifest.config_hash)
    if live is None:
        raise NoManifestError(f"the manifest of {manifest.config_hash[:16]}... is gone from {store.manifests_dir}")
    if live.manifest != manifest:
        raise TargetMismatchError(
            f"{live.path} changed while it was being checked",
            hint="run the command again; find out what writes manifests",
        )
    return live.document


def trust_verdict(
    store: Store,
    manifest: Manifest,
    trust_dir: Path | None,
    *,
    data: bytes | None = None,
    candidate: Mapping[str, bytes] | None = None,
) -> TrustVerdict | None:
    """Under ``--trust`` (``trust_dir``): the verdict, or a refusal with its exit code. Without it: None (unsigned).

    ``data`` is the manifest's bytes when the caller parsed them (default: the stored file's,
    :func:`stored_manifest_bytes`); ``candidate`` the metadata that came with a pulled blessing.
    """
    if trust_dir is None:
        return None
    return check_blessing(
        manifest,
        stored_manifest_bytes(store, manifest) if data is None else data,
        trust_dir=trust_dir,
        state_dir=store.paths.trust,
        lock_path=store.paths.trust_lock,
        candidate=candidate,
    )
