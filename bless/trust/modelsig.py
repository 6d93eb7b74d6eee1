"""An OpenSSF Model Signing bundle of a blessed tree (optional; the ``model-signing`` package).

So that tools outside bless can check the files: ``bless sign HASH --keys DIR --model-signing`` signs
the blessed tree with an ECDSA P-256 key (``DIR/keys/model-signing-p256.key``, PKCS#8 PEM, mode 0600;
created on first use, its public half beside it as ``model-signing-p256.pub.pem``) and writes the
bundle to ``DIR/model-signing/<config_hash>-<dir_id>.sig``. Anyone with the public key checks it with
``model_signing verify key BLESSED_DIR --signature SIG --public_key PUB``.

What it covers: every file of the tree, by path and sha256. What it does not: no version, no expiry, no
rollback protection, and not the manifest (config hash, trials, golden outputs): that is what the TUF
signature (:mod:`bless.trust`) is for. The key is a separate one (Model Signing wants ECDSA; TUF's are
Ed25519).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bless.core.json_form import JsonForm
from bless.core.manifest import Manifest
from bless.errors import TrustInvalidError, UsageError
from bless.system.durable import atomic_write_bytes, create_new_file
from bless.system.os_refusals import os_errors

__all__ = ["ModelSigningBundle", "write_bundle"]

PRIVATE_KEY = "model-signing-p256.key"
PUBLIC_KEY = "model-signing-p256.pub.pem"


@dataclass(frozen=True)
class ModelSigningBundle(JsonForm):
    """Where a tree's OpenSSF Model Signing bundle and its public key were written, and how outside tools check it."""

    bundle: Path
    public_key: Path
    verify_command: str


def _key(keys_dir: Path) -> tuple[Path, Path]:
    """The P-256 key pair, created (0600, never over a file) when missing."""
    private_path, public_path = keys_dir / "keys" / PRIVATE_KEY, keys_dir / "keys" / PUBLIC_KEY
    if not private_path.exists():
        private = ec.generate_private_key(ec.SECP256R1())
        pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        fd = create_new_file(private_path, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
        public = private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        atomic_write_bytes(public_path, public)
    elif private_path.stat().st_mode & 0o077:
        raise TrustInvalidError(f"private key {private_path} is readable by others", hint=f"chmod 600 {private_path}")
    return private_path, public_path


def write_bundle(keys_dir: Path, blessed_dir: Path, manifest: Manifest) -> ModelSigningBundle:
    """Sign ``blessed_dir`` (the tree of ``manifest``) with Model Signing; return where the bundle is.

    Raises:
        UsageError: the model-signing package is not installed.
        TrustInvalidError: no ``keys/`` directory, a key unfit for use, or the key or bundle cannot be
            written (permissions, a file where a directory belongs); NoSpaceError: a full or read-only disk.
    """
    try:
        from model_signing import signing
    except ImportError:
        raise UsageError(
            "--model-signing needs the model-signing package", hint="pip install 'model-signing>=1.1,<2'"
        ) from None
    if not (keys_dir / "keys").is_dir():
        raise TrustInvalidError(
            f"{keys_dir} has no keys/ directory",
            hint="create the signing keys first (trust init)",
            remedy="trust_init_first",
        )
    out_dir = keys_dir / "model-signing"
    bundle = out_dir / f"{manifest.config_hash}-{manifest.cache.dir_id}.sig"
    scratch = out_dir / f".{bundle.name}.tmp"
    with os_errors(
        f"Model Signing of {blessed_dir}",
        refusal=TrustInvalidError,
        hint=f"check that {keys_dir / 'keys'} and {out_dir} are directories this user can write",
    ):
        private_path, public_path = _key(keys_dir)
        out_dir.mkdir(exist_ok=True)
        try:
            config = signing.Config()  # type: ignore[no-untyped-call]
            config.use_elliptic_key_signer(private_key=private_path).sign(blessed_dir, scratch)
            atomic_write_bytes(bundle, scratch.read_bytes())
        except ValueError as exc:  # the key is not one model-signing can use (curve, size, not a PEM key)
            raise TrustInvalidError(f"Model Signing of {blessed_dir} failed: {exc}") from exc
        finally:
            scratch.unlink(missing_ok=True)
    command = f"model_signing verify key {blessed_dir} --signature {bundle} --public_key {public_path}"
    return ModelSigningBundle(bundle, public_path, command)
