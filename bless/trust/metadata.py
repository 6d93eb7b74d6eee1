"""TUF metadata files as both sides read them: which files, how large, parsed strictly.

The signing repository (:mod:`bless.trust.repository`) and the verifying client
(:mod:`bless.trust.client`) read metadata through these functions and hold it to one size limit per
role, so what ``bless sign`` writes is exactly what a serving host accepts to read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from tuf.api.metadata import Metadata, Root, Snapshot, Targets, Timestamp

from bless.core.manifest import strict_json
from bless.core.untrusted_text import shown
from bless.errors import TrustInvalidError
from bless.system.bounded_read import UnreadableFileError, read_bounded

__all__ = [
    "MAX_METADATA_BYTES",
    "METADATA_FILE",
    "ROLE_MAX_BYTES",
    "TOP_LEVEL_ROLES",
    "check_distinct_keys",
    "check_strict_json",
    "iso_utc",
    "metadata_from_dir",
    "parse_metadata",
    "parse_root",
    "read_trust_file",
]

TOP_LEVEL_ROLES: tuple[str, ...] = (Root.type, Targets.type, Snapshot.type, Timestamp.type)
#: The most each role's metadata may be, one limit for both sides: ``bless sign`` (and rotate) refuse
#: to write more, and the verifying client (python-tuf's Updater, whose own default for targets is
#: 5,000,000 bytes) is configured to read up to exactly this. A target is about 450 bytes, so
#: targets.json holds about 37,000 blessings; snapshot and timestamp name one file each; root is
#: python-tuf's default (hundreds of keys).
ROLE_MAX_BYTES: Mapping[str, int] = {
    Root.type: 512_000,
    Targets.type: 16 << 20,
    Snapshot.type: 64 << 10,
    Timestamp.type: 16 << 10,
}
#: Largest metadata file read from anywhere (a crafted file must not exhaust memory): the largest role's.
MAX_METADATA_BYTES = max(ROLE_MAX_BYTES.values())
#: File names of a metadata directory the Updater can ask for (no consistent snapshots).
METADATA_FILE = re.compile(r"^(?:[1-9][0-9]{0,9}\.root|root|timestamp|snapshot|targets)\.json$")


def iso_utc(moment: datetime) -> str:
    """A metadata expiry as reports show it: ``2025-01-31T12:00:00Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_trust_file(path: Path, *, limit: int = MAX_METADATA_BYTES) -> bytes:
    """A trust file's bytes through the bounded reader (:func:`bless.system.bounded_read.read_bounded`).

    Opened without blocking and checked to be a regular file of at most ``limit`` bytes before a
    byte is read: a FIFO named ``root.json`` would hang the reader, /dev/zero or a huge file would be
    read whole. Links are followed, and what they lead to is checked the same: python-tuf's own
    state keeps ``root.json`` as a link into ``root_history/``, and an operator's ``--trust``
    directory may be made of links (a Kubernetes ConfigMap mount is).

    Raises:
        TrustInvalidError: not a readable regular file within ``limit``, or missing (66).
    """
    try:
        data = read_bounded(path, limit, follow=True)
    except UnreadableFileError as exc:
        raise TrustInvalidError(
            f"{shown(str(path))} {exc}",
            hint="trust files are regular files of signed TUF metadata (or PEM keys); replace this one",
        ) from None
    if data is None:
        raise TrustInvalidError(f"{shown(str(path))} does not exist")
    return data


def metadata_from_dir(directory: Path) -> dict[str, bytes]:
    """Every TUF metadata file of a directory by name (``root.json``, ``2.root.json``, ``targets.json``...)."""
    found: dict[str, bytes] = {}
    try:
        entries = sorted(entry.name for entry in Path(directory).iterdir())
    except OSError as exc:
        raise TrustInvalidError(
            f"cannot read the trust directory {directory}: {exc.strerror or exc}",
            hint="the trust directory holds the trusted root.json (from trust init)",
            remedy="trust_dir",
        ) from None
    for name in entries:
        if METADATA_FILE.fullmatch(name):
            found[name] = read_trust_file(Path(directory) / name)
    history = Path(directory) / "root_history"
    if history.is_dir():
        for name in sorted(entry.name for entry in history.iterdir()):
            if METADATA_FILE.fullmatch(name) and name != "root.json":
                found.setdefault(name, read_trust_file(history / name))
    check_strict_json(found, shown(str(directory)))
    return found


def check_strict_json(files: Mapping[str, bytes], where: str) -> None:
    """Refuse a metadata file with a duplicate key (or NaN): the one JSON rule of
    :func:`bless.core.manifest.strict_json`.

    python-tuf keeps the last of duplicate keys; another TUF client may keep the first. Checked before
    any file reaches python-tuf.
    """
    for name, data in files.items():
        try:
            strict_json(data)
        except (ValueError, RecursionError) as exc:
            raise TrustInvalidError(
                f"{where}: {shown(name)} is not valid JSON metadata: {exc}",
                hint="metadata bless signs never holds a duplicate key: this file was edited or crafted",
                remedy="crafted_duplicate_key",
            ) from None


def parse_metadata(data: bytes, what: str) -> Metadata[Any]:
    """``data`` as TUF metadata of any role, held to the strict JSON rule first; malformed is 66.

    A root must list each key once (:func:`check_distinct_keys`).
    """
    check_strict_json({what: data}, what)
    try:
        metadata: Metadata[Any] = Metadata.from_bytes(data)
    except Exception as exc:  # DeserializationError, ValueError, KeyError...: all "malformed"
        raise TrustInvalidError(f"{what} is not valid TUF metadata: {exc}") from None
    if isinstance(metadata.signed, Root):
        check_distinct_keys(metadata.signed, what)
    return metadata


def check_distinct_keys(root: Root, what: str) -> None:
    """Refuse a root that lists the same key material under two key ids.

    python-tuf counts signatures by key id (python-tuf #1429): one key listed twice would let one
    signature count twice toward a threshold of 2. bless never writes such a root; both sides refuse it.
    """
    seen: dict[bytes, str] = {}
    for keyid, key in sorted(root.keys.items()):
        material = _key_material(key.keytype, key.keyval.get("public"))
        if material in seen:
            raise TrustInvalidError(
                f"{what} lists the same public key under two key ids ({shown(seen[material][:16])}... and "
                f"{shown(keyid[:16])}...): one signature would count twice toward a threshold",
                hint="a root that bless's trust init or rotate wrote never does this: it was crafted; use the "
                "signing repository's own root.json",
                remedy="crafted_root",
            )
        seen[material] = keyid


def _key_material(keytype: str, public: Any) -> bytes:
    """A public key as comparable bytes whatever its encoding: DER SubjectPublicKeyInfo when it parses."""
    text = str(public).strip()
    try:
        if text.startswith("-----BEGIN"):
            loaded = serialization.load_pem_public_key(text.encode())
            return loaded.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        if keytype == "ed25519":
            raw = ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(text))
            return raw.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        pass
    return text.lower().encode()


def parse_root(data: bytes, what: str) -> Metadata[Root]:
    """``data`` as root metadata; anything else (another role, malformed) is 66."""
    metadata = parse_metadata(data, what)
    if not isinstance(metadata.signed, Root):
        raise TrustInvalidError(f"{what} is not root metadata")
    return metadata
