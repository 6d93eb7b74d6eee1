"""``bless sign``: a blessing in the store becomes a signed TUF target, and if asked an OpenSSF Model
Signing bundle of its tree.

What is signed is the live manifest file's exact bytes, those the store's lookup validated, so the
signature covers the manifest and, through the size and sha256 it names for every file, the tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from bless.store import LiveManifest, Store
from bless.trust import KeySources, SignResult, sign_blessing
from bless.trust.modelsig import ModelSigningBundle, write_bundle

__all__ = ["SignOutcome", "sign_stored_blessing"]


@dataclass(frozen=True)
class SignOutcome:
    """A signed blessing: the TUF signing, and the Model Signing bundle when one was asked for."""

    config_hash: str
    signing: SignResult
    model_signing: ModelSigningBundle | None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``bless sign --json``)."""
        data = {"config_hash": self.config_hash, **self.signing.to_dict()}
        if self.model_signing is not None:
            data["model_signing"] = self.model_signing.to_dict()
        return data


def sign_stored_blessing(
    store: Store,
    live: LiveManifest,
    keys: Path,
    *,
    expires: timedelta,
    sources: KeySources | None = None,
    keep_previous: bool = False,
    model_signing: bool = False,
) -> SignOutcome:
    """Sign ``live`` (a blessing in ``store``, as its lookup read it) with the signing repository ``keys``.

    A re-blessed config's older signed versions are delisted unless ``keep_previous``. ``sources``: the
    file keys' passphrase and the signer URIs (HSM, KMS) by role.

    Raises:
        TrustInvalidError, NoSpaceError: the signing repository (or the bundle) cannot be used or written.
        UsageError: ``model_signing`` without the model-signing package.
    """
    manifest = live.manifest
    signing = sign_blessing(
        keys, manifest, live.document, sources=sources, expires=expires, keep_previous=keep_previous
    )
    bundle = write_bundle(keys, store.blessed_dir(manifest), manifest) if model_signing else None
    return SignOutcome(config_hash=manifest.config_hash, signing=signing, model_signing=bundle)
