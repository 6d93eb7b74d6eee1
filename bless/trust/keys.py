"""The TUF private keys of a signing repository: file keys in ``DIR/keys/``, and keys held by signers (URIs).

A role's key is either

* a **signer URI** (securesystemslib's signer interface): ``hsm:`` (a PKCS#11 token: ECDSA P-256/P-384),
  ``gcpkms:``, ``awskms:``, ``azurekms:``, ``hv:`` (HashiCorp Vault) or ``file2:``. The private key never
  leaves its holder; ``trust init`` and ``trust rotate`` read the public key from it (:func:`public_key_for_uri`),
  ``sign`` finds which of a role's keys a URI holds by a test signature (:func:`uri_signers`); or
* a **file key**: ``DIR/keys/<role>-<keyid[:16]>.pem``, an Ed25519 private key (PKCS#8 PEM, mode 0600),
  encrypted with a passphrase (:class:`KeySources`). Unencrypted files are written only when asked
  (``KeySources(unencrypted=True)``) and still read (repositories made before encryption), with a warning.

The directory also holds files that are not TUF keys (the Model Signing pair of :mod:`bless.trust.modelsig`);
those are never loaded here. The library never prompts and never reads the environment: the CLI turns
``BLESS_KEY_PASSPHRASE`` / ``BLESS_HSM_PIN`` (or a prompt) into a :class:`KeySources`.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib import parse

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from securesystemslib.signer import CryptoSigner, Signer, SSlibKey
from tuf.api.metadata import Key

from bless.errors import TrustExistsError, TrustInvalidError, UsageError
from bless.system.durable import create_new_file
from bless.system.user_files import read_input
from bless.trust.metadata import TOP_LEVEL_ROLES, read_trust_file

__all__ = [
    "HSM_PIN_ENV",
    "PASSPHRASE_ENV",
    "SIGNER_SCHEMES",
    "KeySources",
    "LoadedSigners",
    "check_passphrase",
    "has_encrypted_keys",
    "load_signers",
    "new_key",
    "parse_signer_option",
    "public_key_for_uri",
    "uri_signers",
]

#: The environment variable the CLI reads the file keys' passphrase from (else it prompts on a terminal).
PASSPHRASE_ENV = "BLESS_KEY_PASSPHRASE"  # noqa: S105 (the variable's name, not a secret)
#: The environment variable the CLI reads an HSM's user PIN from (else it prompts on a terminal).
HSM_PIN_ENV = "BLESS_HSM_PIN"
#: securesystemslib's private key URI schemes that ``--signer`` accepts (``file2`` only at sign/rotate:
#: its public key cannot be read without the unencrypted private key file).
SIGNER_SCHEMES = ("hsm", "gcpkms", "awskms", "azurekms", "hv", "file2")
#: The schemes whose public key trust init / rotate can read from the key holder.
_IMPORTABLE = ("hsm", "gcpkms", "awskms", "azurekms", "hv")

#: Largest private key file read (an encrypted Ed25519 PKCS#8 PEM is about 400 bytes).
MAX_KEY_BYTES = 64 << 10
#: The longest passphrase the key encryption takes (cryptography's PKCS#8 limit), in UTF-8 bytes.
MAX_PASSPHRASE_BYTES = 1023
#: The TUF private key files of DIR/keys: ``<role>-<anything>.pem`` (``_key_file`` writes ``<role>-<keyid[:16]>``;
#: a key holder may copy theirs in under another suffix). Only these are loaded: keys/ also holds files that
#: are not TUF private keys (the Model Signing pair, whose public half is 0644 by design), and loading those
#: made every later sign and rotate fail.
_ROLE_KEY_FILE = re.compile(r"^(?:root|targets|snapshot|timestamp)-[^/]+\.pem$")
_PUBLIC_KEY_SUFFIX = ".pub.pem"
_ENCRYPTED_PEM = b"-----BEGIN ENCRYPTED PRIVATE KEY-----"
_PROBE = b"bless: which key of the role does this signer hold?"

SecretsHandler = Callable[[str], str]


@dataclass(frozen=True)
class KeySources:
    """Where a signing repository's private keys are, and how to open them.

    Attributes:
        signers: signer URIs by role (``{"targets": ("hsm:2?label=bless",)}``): at ``trust init`` each
            URI is one key of its role (instead of a file key); at ``sign``/``rotate`` the URIs sign
            alongside the file keys of ``DIR/keys``.
        passphrase: of the encrypted file keys: new ones are encrypted with it, existing ones opened.
        unencrypted: write new file keys without encryption (an explicit choice; never the default).
        secrets_handler: answers a signer's request for a secret (an HSM's user PIN).
    """

    signers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    passphrase: bytes | None = None
    unencrypted: bool = False
    secrets_handler: SecretsHandler | None = None

    def __post_init__(self) -> None:
        if self.passphrase is not None:
            check_passphrase(self.passphrase)

    def require_file_key_protection(self, role: str) -> None:
        """Refuse to write a file key for ``role`` that would be unencrypted without being asked."""
        if self.passphrase is None and not self.unencrypted:
            raise UsageError(
                f"a new file key for role {role} would be written unencrypted",
                hint=f"set {PASSPHRASE_ENV} (or answer the prompt) to encrypt it, keep the key in an HSM or KMS "
                f"named by a signer URI for {role}, or ask for an unencrypted key (unencrypted)",
                details={"role": role, "passphrase_env": PASSPHRASE_ENV},
                remedy="protect_file_key",
            )


def check_passphrase(passphrase: bytes) -> None:
    """Refuse (UsageError, 2) a passphrase no key could be written or opened with: over
    :data:`MAX_PASSPHRASE_BYTES` bytes, or not UTF-8 text. Checked when the sources are made, before
    anything is created or read."""
    hint = f"give a passphrase of 1 to {MAX_PASSPHRASE_BYTES} bytes of UTF-8 text ({PASSPHRASE_ENV} or the prompt)"
    if len(passphrase) > MAX_PASSPHRASE_BYTES:
        raise UsageError(
            f"the key passphrase is {len(passphrase)} bytes, over the {MAX_PASSPHRASE_BYTES} bytes a key's "
            "encryption takes",
            hint=hint,
        )
    try:
        passphrase.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError("the key passphrase is not UTF-8 text", hint=hint) from None


@dataclass(frozen=True)
class LoadedSigners:
    """The signers a repository holds by key id, and warnings about them (unencrypted key files)."""

    signers: dict[str, Signer]
    warnings: tuple[str, ...] = ()


def parse_signer_option(values: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """``--signer ROLE=URI`` values as URIs by role (order kept; a URI repeated for a role is refused)."""
    by_role: dict[str, list[str]] = {}
    for value in values:
        role, sep, uri = value.partition("=")
        role = role.strip()
        if not sep or not uri:
            raise UsageError(
                f"bad --signer {value!r}", hint="write ROLE=URI, e.g. targets=hsm:2?label=bless", remedy="signer_syntax"
            )
        if role not in TOP_LEVEL_ROLES:
            raise UsageError(
                f"--signer {value!r}: unknown TUF role {role!r}", hint=f"roles are {', '.join(TOP_LEVEL_ROLES)}"
            )
        _require_scheme(uri)
        if uri in by_role.get(role, []):
            raise UsageError(f"--signer {value!r} is given twice", hint="each key of a role is listed once")
        by_role.setdefault(role, []).append(uri)
    return {role: tuple(uris) for role, uris in by_role.items()}


#: Asked for the file keys' passphrase as ``(needed, confirm)``: ``needed`` when a key will be written
#: or opened encrypted (a caller may prompt then), ``confirm`` when a new one is being chosen. Returns
#: the passphrase, or None for none.
PassphraseSource = Callable[[bool, bool], bytes | None]


def _no_passphrase(needed: bool, confirm: bool) -> bytes | None:
    return None


@dataclass(frozen=True)
class KeyAccess:
    """How a command reaches its keys, before it knows which it needs: the ``--signer ROLE=URI`` values,
    where a passphrase comes from (the CLI: an environment variable or a prompt), ``--unencrypted-keys``,
    and what answers a signer's request for a PIN."""

    signers: tuple[str, ...] = ()
    passphrase: PassphraseSource = _no_passphrase
    unencrypted: bool = False
    secrets_handler: SecretsHandler | None = None

    def sources(self, *, passphrase_needed: bool, confirm: bool) -> KeySources:
        """The :class:`KeySources` of these options: the signers parsed (a bad one refused first), then the
        passphrase asked for."""
        uris = parse_signer_option(self.signers)
        passphrase = self.passphrase(passphrase_needed, confirm)
        return KeySources(uris, passphrase, self.unencrypted, self.secrets_handler)


#: No signer URIs, no passphrase, no PIN: only unencrypted file keys can be used.
NO_KEY_OPTIONS = KeyAccess()


def _require_scheme(uri: str) -> str:
    scheme = uri.partition(":")[0]
    if scheme not in SIGNER_SCHEMES:
        raise UsageError(
            f"signer URI {uri!r} has no scheme bless knows",
            hint=f"securesystemslib's schemes are {', '.join(SIGNER_SCHEMES)} (e.g. hsm:2?label=bless)",
        )
    return scheme


def _key_file(keys_dir: Path, role: str, keyid: str) -> Path:
    return keys_dir / f"{role}-{keyid[:16]}.pem"


def new_key(keys_dir: Path, role: str, *, passphrase: bytes | None) -> tuple[Key, Path]:
    """Generate an Ed25519 key and write its private half (PKCS#8 PEM, encrypted with ``passphrase`` unless
    None) with mode 0600, never over a file. Callers decide whether None is allowed
    (:meth:`KeySources.require_file_key_protection`)."""
    private = Ed25519PrivateKey.generate()
    public = SSlibKey.from_crypto(private.public_key())
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase) if passphrase is not None else serialization.NoEncryption()
    )
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    path = _key_file(keys_dir, role, public.keyid)
    try:
        fd = create_new_file(path, 0o600)
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


def load_signers(keys_dir: Path, passphrase: bytes | None = None) -> LoadedSigners:
    """Every TUF role file key of ``keys_dir/keys`` by key id.

    Only ``<role>-*.pem`` files are read; such a file that is readable by others, not an Ed25519 PEM
    private key, encrypted without ``passphrase`` or not opened by it is refused. An unencrypted one
    is loaded with a warning. Other files (the Model Signing key pair) are not TUF keys and are left alone.
    """
    directory = keys_dir / "keys"
    signers: dict[str, Signer] = {}
    warnings: list[str] = []
    try:
        names = sorted(entry.name for entry in directory.iterdir() if _is_role_key_file(entry.name))
    except FileNotFoundError:
        return LoadedSigners({})  # every key may be held by signers (--signer ROLE=URI)
    except OSError as exc:
        raise TrustInvalidError(
            f"cannot read the keys directory {directory}: {exc.strerror or exc}",
            hint="create the signing keys (trust init)",
            remedy="trust_init_keys",
        ) from None
    for name in names:
        path = directory / name
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        if mode & 0o077:
            raise TrustInvalidError(
                f"private key {path} is readable by others (mode {mode:o})", hint=f"chmod 600 {path}"
            )
        try:
            data = read_trust_file(path, limit=MAX_KEY_BYTES)
        except OSError as exc:
            raise TrustInvalidError(f"cannot read private key {path}: {exc.strerror or exc}") from None
        encrypted = _ENCRYPTED_PEM in data
        if encrypted and passphrase is None:
            raise TrustInvalidError(
                f"private key {path} is encrypted and no passphrase was given",
                hint=f"set {PASSPHRASE_ENV} to its passphrase (or run on a terminal to be asked)",
            )
        try:
            private = serialization.load_pem_private_key(data, password=passphrase if encrypted else None)
        except (ValueError, TypeError) as exc:
            reason = "the passphrase does not open it" if encrypted else str(exc)
            raise TrustInvalidError(
                f"cannot load private key {path}: {reason}",
                hint=f"give the passphrase it was written with ({PASSPHRASE_ENV})" if encrypted else None,
            ) from None
        if not isinstance(private, Ed25519PrivateKey):
            raise TrustInvalidError(f"{path} is not an Ed25519 key")
        if not encrypted:
            warnings.append(
                f"private key {path} is not encrypted: anyone who reads it can sign; move the role to an HSM or "
                "KMS (bless trust rotate --new-signer URI) or rotate it to an encrypted key"
            )
        signer = CryptoSigner(private)
        signers[signer.public_key.keyid] = signer
    return LoadedSigners(signers, tuple(warnings))


def has_encrypted_keys(keys_dir: Path) -> bool:
    """Whether any TUF file key of ``keys_dir/keys`` is encrypted (the CLI asks for a passphrase only then)."""
    directory = keys_dir / "keys"
    try:
        paths = [entry for entry in directory.iterdir() if _is_role_key_file(entry.name)]
        return any(_ENCRYPTED_PEM in read_trust_file(path, limit=MAX_KEY_BYTES) for path in paths)
    except OSError:
        return False  # load_signers reports it


def public_key_for_uri(uri: str, secrets_handler: SecretsHandler | None = None) -> Key:
    """The public key of the private key that ``uri`` names, read from its holder (trust init, rotate)."""
    scheme = _require_scheme(uri)
    if scheme not in _IMPORTABLE:
        raise UsageError(
            f"bless cannot read the public key of {uri!r} ({scheme}: keys are files)",
            hint="let trust init write an encrypted file key instead (no signer URI for that role), "
            f"or keep the key in {', '.join(_IMPORTABLE)}",
            details={"importable": list(_IMPORTABLE)},
            remedy="file_key_instead",
        )
    try:
        return _import(scheme, uri, secrets_handler)
    except UsageError:
        raise
    except Exception as exc:  # each backend raises its own types (pkcs11, boto, google, azure, hvac)
        raise TrustInvalidError(
            f"cannot read the public key of signer {uri}: {type(exc).__name__}: {exc}",
            hint=_backend_hint(scheme),
        ) from None


def _import(scheme: str, uri: str, secrets_handler: SecretsHandler | None) -> Key:
    """securesystemslib's ``import_`` of ``scheme`` for ``uri``; the URI it would write must be ``uri``."""
    parsed = parse.urlparse(uri)
    if scheme == "hsm":
        from securesystemslib.signer import HSMSigner

        try:
            hsm_keyid = int(parsed.path) if parsed.path else None
        except ValueError:
            raise UsageError(f"{uri!r}: the HSM key id must be a number (hsm:2?label=TOKEN)") from None
        label = parse.parse_qs(parsed.query).get("label", [None])[0]
        _uri, key = HSMSigner.import_(hsm_keyid, label, secrets_handler)
        return key
    rest = uri[len(scheme) + 1 :]
    if scheme == "gcpkms":
        from securesystemslib.signer import GCPSigner

        return GCPSigner.import_(rest)[1]
    if scheme == "awskms":
        from securesystemslib.signer import AWSSigner

        return AWSSigner.import_(rest)[1]
    if scheme == "hv":
        from securesystemslib.signer import VaultSigner

        return VaultSigner.import_(rest.rpartition("/")[0] or rest)[1]
    from securesystemslib.signer import AzureSigner  # azurekms://VAULT.vault.azure.net/keys/NAME[/VERSION]

    parts = parsed.path.strip("/").split("/")
    if not parsed.netloc or len(parts) < 2 or parts[0] != "keys":
        raise UsageError(f"{uri!r} is not azurekms://VAULT.vault.azure.net/keys/NAME")
    return AzureSigner.import_(parsed.netloc.split(".")[0], parts[1])[1]


def _backend_hint(scheme: str) -> str:
    if scheme == "hsm":
        return (
            "set PYKCS11LIB to the token's PKCS#11 module (e.g. /usr/lib/softhsm/libsofthsm2.so), check the key id "
            f"and label, give the user PIN ({HSM_PIN_ENV}), and install the hsm extra "
            "(pip install 'bless-cache[hsm]'); "
            "HSM keys are ECDSA P-256 or P-384"
        )
    extra = {"gcpkms": "gcpkms", "awskms": "awskms", "azurekms": "azurekms", "hv": "vault"}.get(scheme, scheme)
    return f"check the URI and the credentials, and install securesystemslib[{extra}]"


def uri_signers(
    candidates: Mapping[str, Iterable[Key]], uris: Mapping[str, tuple[str, ...]], secrets_handler: SecretsHandler | None
) -> dict[str, Signer]:
    """The signers of ``uris`` by the key id each holds, among ``candidates`` (the keys the root lists per role).

    A URI's key is found by a test signature, which every candidate key of its role must verify: a URI
    that holds none of them is refused (a key of another repository, or a rotated-out key).
    """
    found: dict[str, Signer] = {}
    for role, role_uris in uris.items():
        keys = list(candidates.get(role, ()))
        for uri in role_uris:
            private = _file2_private_key(uri) if uri.partition(":")[0] == "file2" else None
            signer, failure = _match(uri, keys, secrets_handler, private)
            if signer is None:
                why = f" ({failure})" if failure else ""
                raise TrustInvalidError(
                    f"signer {uri} holds none of the {len(keys)} key(s) the root lists for role {role}{why}",
                    hint="name a key of this repository's root (rotating the role to new signer URIs replaces its "
                    f"keys); {_backend_hint(uri.partition(':')[0])}",
                    details={"backend_hint": _backend_hint(uri.partition(":")[0])},
                    remedy="rotate_to_signer",
                )
            found[signer.public_key.keyid] = signer
    return found


_FILE2_HINT = (
    "a file2:PATH signer names an unencrypted PKCS#8 PEM private key file, mode 0600, of at most "
    f"{MAX_KEY_BYTES} bytes; prefer bless's encrypted file keys or an HSM/KMS signer"
)


def _file2_private_key(uri: str) -> PrivateKeyTypes:
    """The private key a ``file2:PATH`` URI names, read once through the bounded reader of user files.

    securesystemslib's own reader opens the path with no bound (a FIFO hangs it, /dev/zero reads until
    memory runs out) and garbles its not-found message; bless reads the file itself, as every file a user
    names: a FIFO, a device, a directory, a file over :data:`MAX_KEY_BYTES` or a missing one is invalid
    input (3). A key readable by group or others is refused as the keys directory refuses one (66). The
    path is the URI's, as written (``CRYPTO_SIGNER_PATH_PREFIX`` is not read: the library reads no
    environment).
    """
    path = Path(parse.urlparse(uri).path)
    data = read_input(path, what="file2 signer key", hint=_FILE2_HINT, limit=MAX_KEY_BYTES)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise TrustInvalidError(f"cannot read private key {path}: {exc.strerror or exc}", hint=_FILE2_HINT) from None
    if mode & 0o077:
        raise TrustInvalidError(
            f"private key {path} (signer {uri}) is readable by others (mode {mode:o})", hint=f"chmod 600 {path}"
        )
    try:
        return serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise TrustInvalidError(
            f"cannot load private key {path} (signer {uri}): {exc}"[:500], hint=_FILE2_HINT
        ) from None


def _match(
    uri: str, keys: list[Key], secrets_handler: SecretsHandler | None, private: PrivateKeyTypes | None = None
) -> tuple[Signer | None, str]:
    """The signer of ``uri`` for the one of ``keys`` it holds; else None and why the last other try failed.

    ``private``: a ``file2:`` URI's key, read already (:func:`_file2_private_key`).
    """
    from securesystemslib.exceptions import UnverifiedSignatureError

    failure = ""
    for key in keys:
        try:
            if private is not None:
                if not isinstance(key, SSlibKey):
                    raise ValueError(f"expected an SSlibKey for {uri}")
                signer: Signer = CryptoSigner(private, key)
            else:
                signer = Signer.from_priv_key_uri(uri, key, secrets_handler)
            key.verify_signature(signer.sign(_PROBE), _PROBE)
        except UnverifiedSignatureError:
            continue  # another key of the role
        except Exception as exc:  # a key type the URI cannot hold, or a signer that does not work: own types
            failure = f"{type(exc).__name__}: {exc}"
            continue
        return signer, ""
    return None, failure
