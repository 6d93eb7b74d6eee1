"""The TUF private keys of a signing repository (``DIR/keys/``): creating them, loading them as signers.

``DIR/keys/<role>-<keyid[:16]>.pem`` holds one Ed25519 private key (PKCS#8 PEM, mode 0600). The
directory also holds files that are not TUF keys (the Model Signing pair of :mod:`bless.modelsig`);
those are never loaded here.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from securesystemslib.signer import CryptoSigner, SSlibKey
from tuf.api.metadata import Key

from bless.errors import TrustExistsError, TrustInvalidError
from bless.trust.metadata import read_trust_file

__all__ = ["load_signers", "new_key"]

#: Largest private key file read (an Ed25519 PKCS#8 PEM is 119 bytes).
MAX_KEY_BYTES = 64 << 10
#: The TUF private key files of DIR/keys: ``<role>-<anything>.pem`` (``_key_file`` writes ``<role>-<keyid[:16]>``;
#: a key holder may copy theirs in under another suffix). Only these are loaded: keys/ also holds files that
#: are not TUF private keys (the Model Signing pair, whose public half is 0644 by design), and loading those
#: made every later sign and rotate fail.
_ROLE_KEY_FILE = re.compile(r"^(?:root|targets|snapshot|timestamp)-[^/]+\.pem$")
_PUBLIC_KEY_SUFFIX = ".pub.pem"


def _key_file(keys_dir: Path, role: str, keyid: str) -> Path:
    return keys_dir / f"{role}-{keyid[:16]}.pem"


def new_key(keys_dir: Path, role: str) -> tuple[Key, Path]:
    """Generate an Ed25519 key and write its private half (PKCS#8 PEM) with mode 0600, never over a file."""
    private = Ed25519PrivateKey.generate()
    public = SSlibKey.from_crypto(private.public_key())
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path = _key_file(keys_dir, role, public.keyid)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise TrustExistsError(f"{path} exists", hint="keys are never overwritten") from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
        handle.flush()
        os.fsync(handle.fileno())
    return public, path


def _is_role_key_file(name: str) -> bool:
    """Whether ``name`` is a TUF role's private key file of DIR/keys (``<role>-*.pem``, not ``*.pub.pem``)."""
    return bool(_ROLE_KEY_FILE.fullmatch(name)) and not name.endswith(_PUBLIC_KEY_SUFFIX)


def load_signers(keys_dir: Path) -> dict[str, CryptoSigner]:
    """Every TUF role private key of ``keys_dir/keys`` by key id.

    Only ``<role>-*.pem`` files are read; such a file that is readable by others or not an Ed25519
    PEM private key is refused. Other files (the Model Signing key pair) are not TUF keys and are left alone.
    """
    directory = keys_dir / "keys"
    signers: dict[str, CryptoSigner] = {}
    try:
        names = sorted(entry.name for entry in directory.iterdir() if _is_role_key_file(entry.name))
    except OSError as exc:
        raise TrustInvalidError(
            f"cannot read the keys directory {directory}: {exc.strerror or exc}",
            hint="create the signing keys with bless trust init --keys DIR",
        ) from None
    for name in names:
        path = directory / name
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        if mode & 0o077:
            raise TrustInvalidError(
                f"private key {path} is readable by others (mode {mode:o})", hint=f"chmod 600 {path}"
            )
        try:
            private = serialization.load_pem_private_key(read_trust_file(path, limit=MAX_KEY_BYTES), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise TrustInvalidError(f"cannot load private key {path}: {exc}") from None
        if not isinstance(private, Ed25519PrivateKey):
            raise TrustInvalidError(f"{path} is not an Ed25519 key")
        signer = CryptoSigner(private)
        signers[signer.public_key.keyid] = signer
    return signers
