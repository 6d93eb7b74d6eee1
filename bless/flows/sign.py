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

from bless.errors import VerifyFailedError
from bless.flows.lookup import lookup_live
from bless.store import LiveManifest, Store
from bless.trust import DEFAULT_EXPIRES, KeySources, TrustSigning, parse_duration, sign_blessing
from bless.trust.keys import NO_KEY_OPTIONS, KeyAccess, has_encrypted_keys
from bless.trust.modelsig import ModelSigningBundle, write_bundle

__all__ = ["SignOutcome", "sign_named_blessing", "sign_stored_blessing"]


@dataclass(frozen=True)
class SignOutcome:
    """A signed blessing: the TUF signing, and the Model Signing bundle when one was asked for."""

    config_hash: str
    signing: TrustSigning
    model_signing: ModelSigningBundle | None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``bless sign --json``)."""
        # By hand (not JsonForm): the signing's JSON with the config hash first, the bundle only when made.
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

    The blessed tree is verified against the manifest first: a signature vouches for files, so a tree that
    differs from its manifest is never signed.

    Raises:
        VerifyFailedError: the blessed files differ from the manifest (nothing is signed).
        TrustInvalidError, NoSpaceError: the signing repository (or the bundle) cannot be used or written.
        UsageError: ``model_signing`` without the model-signing package.
    """
    manifest = live.manifest
    check = store.verify_blessing(manifest)
    if not check.ok:
        raise VerifyFailedError.from_result(check, store.blessed_dir(manifest), config_hash=manifest.config_hash)
    signing = sign_blessing(
        keys, manifest, live.document, sources=sources, expires=expires, keep_previous=keep_previous
    )
    bundle = write_bundle(keys, store.blessed_dir(manifest), manifest) if model_signing else None
    return SignOutcome(config_hash=manifest.config_hash, signing=signing, model_signing=bundle)


def sign_named_blessing(
    store: Store,
    text: str,
    keys: Path,
    *,
    access: KeyAccess = NO_KEY_OPTIONS,
    expires: str = f"{DEFAULT_EXPIRES.days}d",
    keep_previous: bool = False,
    model_signing: bool = False,
) -> SignOutcome:
    """``bless sign``: sign the blessing ``text`` names (a config hash or a unique prefix) with the signing
    repository ``keys``, as :func:`sign_stored_blessing`; a passphrase is asked of ``access`` only when a
    file key of ``keys`` is encrypted, and ``expires`` is a duration as written (``30d``).

    Raises: the lookup's errors (:func:`bless.flows.lookup.lookup_live`), UsageError for a bad duration
    or signer, and :func:`sign_stored_blessing`'s.
    """
    sources = access.sources(passphrase_needed=has_encrypted_keys(keys), confirm=False)
    live = lookup_live(store, text)
    return sign_stored_blessing(
        store,
        live,
        keys,
        expires=parse_duration(expires),
        sources=sources,
        keep_previous=keep_previous,
        model_signing=model_signing,
    )
