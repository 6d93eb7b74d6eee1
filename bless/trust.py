"""Signed blessings with The Update Framework (python-tuf): keys, signing, offline verification.

A blessing's **manifest** is a TUF target: its canonical bytes (:meth:`Manifest.to_json_bytes`, exactly
what the store writes) are listed with their length and sha256 in the ``targets`` role, under
``blessings/<config_hash>/<dir_id>.json`` with the config hash, engine and model as custom fields.
The manifest names every file's size and sha256, so the signature covers the whole tree.

The signing side is a directory (``bless trust init --keys DIR``)::

    DIR/keys/<role>-<keyid[:16]>.pem     Ed25519 private keys (PKCS#8 PEM, mode 0600)
    DIR/keys/model-signing-p256.*        the Model Signing key pair (bless.modelsig): not TUF keys, never loaded
    DIR/metadata/root.json               the newest root: what a serving host is provisioned with
    DIR/metadata/<N>.root.json           every root version (key rotation: N+1 is signed by N's keys)
    DIR/metadata/{targets,snapshot,timestamp}.json

A serving host verifies with ``--trust DIR`` (a directory holding at least the trusted ``root.json``)
through python-tuf's own client (:class:`tuf.ngclient.Updater`), fed from memory instead of a
network: the metadata comes from a pulled artifact, from ``DIR`` itself, or from what the host trusted
before. The Updater keeps TUF's trusted-metadata directory in the store root (``<root>/trust/``): the
highest versions seen, so metadata that is older (rolled back) or expired is refused even when it is
validly signed, and thresholds and root rotation work as TUF defines them. A store remembers one root
chain: the Updater always starts from the store's own trusted root, and a presented ``root.json`` must
be on that chain (:func:`_bootstrap_root`); another chain needs ``<root>/trust`` removed on purpose.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import os
import re
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib import parse

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from filelock import FileLock
from securesystemslib.signer import CryptoSigner, SSlibKey
from tuf.api import exceptions as tuf_errors
from tuf.api.metadata import (
    Key,
    Metadata,
    MetaFile,
    Role,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.ngclient import Updater, UpdaterConfig
from tuf.ngclient.fetcher import FetcherInterface

from bless.errors import (
    BelowThresholdError,
    BlessError,
    MetadataExpiredError,
    RollbackError,
    SignatureUntrustedError,
    TargetMismatchError,
    TrustExistsError,
    TrustInvalidError,
    UnsignedError,
    UsageError,
)
from bless.manifest import MAX_MANIFEST_BYTES, Manifest, strict_json
from bless.store import atomic_write_bytes
from bless.store.fsutil import UnreadableFileError, full_disk, full_disk_error, read_bounded
from bless.untrusted_text import shown

__all__ = [
    "DEFAULT_EXPIRES",
    "DEFAULT_ROOT_EXPIRES",
    "METADATA_FILE",
    "TOP_LEVEL_ROLES",
    "InitResult",
    "RoleKeys",
    "SignResult",
    "TrustVerdict",
    "check_blessing",
    "init_repository",
    "manifest_file_bytes",
    "metadata_from_dir",
    "parse_duration",
    "rotate_role",
    "sign_blessing",
    "target_path",
    "trust_state_dir",
]

TOP_LEVEL_ROLES: tuple[str, ...] = (Root.type, Targets.type, Snapshot.type, Timestamp.type)
#: Expiry of targets, snapshot and timestamp when ``--expires`` is not given (there is no online
#: timestamp service: the offline timestamp's expiry is the freshness window).
DEFAULT_EXPIRES = timedelta(days=30)
DEFAULT_ROOT_EXPIRES = timedelta(days=365)
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
_UPDATER_CONFIG = UpdaterConfig(
    root_max_length=ROLE_MAX_BYTES[Root.type],
    targets_max_length=ROLE_MAX_BYTES[Targets.type],
    snapshot_max_length=ROLE_MAX_BYTES[Snapshot.type],
    timestamp_max_length=ROLE_MAX_BYTES[Timestamp.type],
)
#: Largest private key file read (an Ed25519 PKCS#8 PEM is 119 bytes).
MAX_KEY_BYTES = 64 << 10
#: File names of a metadata directory the Updater can ask for (no consistent snapshots).
METADATA_FILE = re.compile(r"^(?:[1-9][0-9]{0,9}\.root|root|timestamp|snapshot|targets)\.json$")

_TARGET_PREFIX = "blessings"
#: The TUF private key files of DIR/keys: ``<role>-<anything>.pem`` (``_key_file`` writes ``<role>-<keyid[:16]>``;
#: a key holder may copy theirs in under another suffix). Only these are loaded: keys/ also holds files that
#: are not TUF private keys (the Model Signing pair, whose public half is 0644 by design), and loading those
#: made every later sign and rotate fail.
_ROLE_KEY_FILE = re.compile(r"^(?:root|targets|snapshot|timestamp)-[^/]+\.pem$")
_PUBLIC_KEY_SUFFIX = ".pub.pem"
_DURATION = re.compile(r"^([1-9][0-9]{0,5})([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_BASE_URL = "https://metadata.bless.invalid/"


# --------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class RoleKeys:
    """How many keys a role gets at ``trust init`` and how many must sign."""

    keys: int = 1
    threshold: int = 1


@dataclass(frozen=True)
class InitResult:
    keys_dir: Path
    metadata_dir: Path
    key_files: tuple[Path, ...]
    roles: Mapping[str, RoleKeys]


@dataclass(frozen=True)
class SignResult:
    """A signing: the target written, the new versions, and signatures per role (count, threshold)."""

    target: str
    length: int
    sha256: str
    versions: Mapping[str, int]
    expires: str
    removed_targets: tuple[str, ...]
    signatures: Mapping[str, tuple[int, int]]
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrustVerdict:
    """A blessing verified against trusted metadata: which target, at which versions, until when."""

    target: str
    versions: Mapping[str, int]
    expires: str
    custom: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "signed": True,
            "target": self.target,
            "versions": dict(self.versions),
            "expires": self.expires,
            "custom": dict(self.custom),
        }


# --------------------------------------------------------------------------------------------
# Small helpers


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``2w``, ``3600s`` -> timedelta; anything else is a usage error."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise UsageError(f"bad duration {text!r}", hint="write a number and a unit: 30d, 12h, 90m, 2w or 3600s")
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def target_path(config_hash: str, dir_id: str) -> str:
    """The TUF target name of one blessed version."""
    return f"{_TARGET_PREFIX}/{config_hash}/{dir_id}.json"


def trust_state_dir(store_root: Path) -> Path:
    """TUF's trusted-metadata directory of a store (the highest versions this host has trusted)."""
    return Path(store_root) / "trust"


def _expiry(now: datetime, delta: timedelta) -> datetime:
    return (now + delta).replace(microsecond=0)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _read_limited(path: Path, *, limit: int = MAX_METADATA_BYTES) -> bytes:
    """A trust file's bytes through the store's bounded reader (:func:`bless.store.fsutil.read_bounded`).

    Opened without blocking and checked to be a regular file of at most ``limit`` bytes before a
    byte is read: a FIFO named ``root.json`` would hang the reader, /dev/zero or a huge file would be
    read whole. Links are followed, and what they lead to is checked the same: python-tuf's own
    state keeps ``root.json`` as a link into ``root_history/``, and an operator's ``--trust``
    directory may be made of links (a Kubernetes ConfigMap mount is).
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
            hint="--trust names a directory that holds the trusted root.json (from bless trust init)",
        ) from None
    for name in entries:
        if METADATA_FILE.fullmatch(name):
            found[name] = _read_limited(Path(directory) / name)
    history = Path(directory) / "root_history"
    if history.is_dir():
        for name in sorted(entry.name for entry in history.iterdir()):
            if METADATA_FILE.fullmatch(name) and name != "root.json":
                found.setdefault(name, _read_limited(history / name))
    _strict(found, shown(str(directory)))
    return found


def _strict(files: Mapping[str, bytes], where: str) -> None:
    """Refuse a metadata file with a duplicate key (or NaN): the one JSON rule of :func:`bless.manifest.strict_json`.

    python-tuf keeps the last of duplicate keys; another TUF client may keep the first. Checked before
    any file reaches python-tuf.
    """
    for name, data in files.items():
        try:
            strict_json(data)
        except (ValueError, RecursionError) as exc:
            raise TrustInvalidError(
                f"{where}: {shown(name)} is not valid JSON metadata: {exc}",
                hint="metadata from bless sign never holds a duplicate key: this file was edited or crafted",
            ) from None


def _parse(data: bytes, what: str) -> Metadata[Any]:
    _strict({what: data}, what)
    try:
        return Metadata.from_bytes(data)
    except Exception as exc:  # DeserializationError, ValueError, KeyError...: all "malformed"
        raise TrustInvalidError(f"{what} is not valid TUF metadata: {exc}") from None


# --------------------------------------------------------------------------------------------
# Keys


def _key_file(keys_dir: Path, role: str, keyid: str) -> Path:
    return keys_dir / f"{role}-{keyid[:16]}.pem"


def _new_key(keys_dir: Path, role: str) -> tuple[Key, Path]:
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


def _load_signers(keys_dir: Path) -> dict[str, CryptoSigner]:
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
            private = serialization.load_pem_private_key(_read_limited(path, limit=MAX_KEY_BYTES), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise TrustInvalidError(f"cannot load private key {path}: {exc}") from None
        if not isinstance(private, Ed25519PrivateKey):
            raise TrustInvalidError(f"{path} is not an Ed25519 key")
        signer = CryptoSigner(private)
        signers[signer.public_key.keyid] = signer
    return signers


# --------------------------------------------------------------------------------------------
# The signing repository


class _Repository:
    """The signing side: metadata + private keys of ``keys_dir`` (one writer at a time)."""

    def __init__(self, keys_dir: Path) -> None:
        self.keys_dir = Path(keys_dir)
        self.metadata_dir = self.keys_dir / "metadata"
        files = metadata_from_dir(self.metadata_dir)
        missing = [f"{role}.json" for role in TOP_LEVEL_ROLES if f"{role}.json" not in files]
        if missing:
            raise TrustInvalidError(
                f"{self.metadata_dir} lacks {', '.join(missing)}",
                hint="create a signing repository with bless trust init --keys DIR",
            )
        self.root: Metadata[Root] = _parse(files["root.json"], "root.json")
        self.targets: Metadata[Targets] = _parse(files["targets.json"], "targets.json")
        self.snapshot: Metadata[Snapshot] = _parse(files["snapshot.json"], "snapshot.json")
        self.timestamp: Metadata[Timestamp] = _parse(files["timestamp.json"], "timestamp.json")
        self.signers = _load_signers(self.keys_dir)

    def sign(self, metadata: Metadata[Any], role: str, *, keyholder: Root | None = None) -> tuple[int, int]:
        """Replace the signatures of ``metadata`` with one per available key of ``role``; (signed, threshold)."""
        delegator = keyholder or self.root.signed
        role_def = delegator.roles[role]
        metadata.signatures.clear()
        count = 0
        for keyid in role_def.keyids:
            signer = self.signers.get(keyid)
            if signer is not None:
                metadata.sign(signer, append=True)
                count += 1
        if count == 0:
            raise TrustInvalidError(
                f"no private key of role {role} is in {self.keys_dir / 'keys'}",
                hint=f"the trusted root lists {len(role_def.keyids)} key(s) for {role}; put one of them there",
            )
        return count, role_def.threshold

    def write(self, metadata: Metadata[Any], name: str) -> None:
        atomic_write_bytes(self.metadata_dir / name, self.serialized(metadata))

    def serialized(self, metadata: Metadata[Any]) -> bytes:
        """The bytes of ``metadata``; refused when no verifier would read them (:data:`ROLE_MAX_BYTES`)."""
        data = metadata.to_bytes()
        role = metadata.signed.type
        limit = ROLE_MAX_BYTES[role]
        if len(data) > limit:
            listed = f" ({len(metadata.signed.targets)} targets)" if isinstance(metadata.signed, Targets) else ""
            raise TrustInvalidError(
                f"{role}.json would be {len(data)} bytes{listed}, over the {limit} bytes a verifier reads; "
                "nothing was written",
                hint="a signing repository lists about 37,000 blessings at most: sign re-blessed configs without "
                "--keep-previous (their older versions are delisted), or sign further blessings in another "
                "signing repository (bless trust init) whose root the hosts serving them trust",
                details={"role": role, "bytes": len(data), "limit": limit},
            )
        return data

    def resign_chain(self, now: datetime, expires: timedelta) -> dict[str, tuple[int, int]]:
        """Bump and sign targets, then snapshot, then timestamp (written in that order: timestamp last)."""
        counts: dict[str, tuple[int, int]] = {}
        self.targets.signed.version += 1
        self.targets.signed.expires = _expiry(now, expires)
        counts[Targets.type] = self.sign(self.targets, Targets.type)
        self.snapshot.signed.meta["targets.json"] = MetaFile(version=self.targets.signed.version)
        self.snapshot.signed.version += 1
        self.snapshot.signed.expires = _expiry(now, expires)
        counts[Snapshot.type] = self.sign(self.snapshot, Snapshot.type)
        self.timestamp.signed.snapshot_meta = MetaFile(version=self.snapshot.signed.version)
        self.timestamp.signed.version += 1
        self.timestamp.signed.expires = _expiry(now, expires)
        counts[Timestamp.type] = self.sign(self.timestamp, Timestamp.type)
        # Every size checked before the first write: a refusal leaves the repository as it was.
        for metadata in (self.targets, self.snapshot, self.timestamp):
            self.serialized(metadata)
        self.write(self.targets, "targets.json")
        self.write(self.snapshot, "snapshot.json")
        self.write(self.timestamp, "timestamp.json")
        return counts

    def result(
        self,
        counts: Mapping[str, tuple[int, int]],
        expires: str,
        target: TargetFile | None = None,
        removed: tuple[str, ...] = (),
    ) -> SignResult:
        """What a signing did: the target (if any), the new versions, the signatures per role."""
        return SignResult(
            target=target.path if target is not None else "",
            length=target.length if target is not None else 0,
            sha256=target.hashes["sha256"] if target is not None else "",
            versions=self.versions(),
            expires=expires,
            removed_targets=removed,
            signatures=counts,
            warnings=_below_threshold_warnings(counts),
        )

    def versions(self) -> dict[str, int]:
        return {
            Root.type: self.root.signed.version,
            Targets.type: self.targets.signed.version,
            Snapshot.type: self.snapshot.signed.version,
            Timestamp.type: self.timestamp.signed.version,
        }


@contextlib.contextmanager
def _repository(keys_dir: Path) -> Iterator[_Repository]:
    lock_path = Path(keys_dir) / ".lock"
    if not (Path(keys_dir) / "metadata").is_dir():
        raise TrustInvalidError(
            f"{keys_dir} is not a signing repository (no metadata/ directory)",
            hint="create one with bless trust init --keys DIR",
        )
    # A full or read-only disk under the keys directory is its own refusal (15), wherever a write meets it.
    with full_disk(f"writing the signing repository {keys_dir}"), FileLock(str(lock_path)):
        yield _Repository(Path(keys_dir))


def _below_threshold_warnings(counts: Mapping[str, tuple[int, int]]) -> tuple[str, ...]:
    return tuple(
        f"{role} has {signed} of the {threshold} signatures its threshold needs: verifiers refuse it "
        "until the other key holders sign"
        for role, (signed, threshold) in counts.items()
        if signed < threshold
    )


def init_repository(
    keys_dir: Path,
    *,
    roles: Mapping[str, RoleKeys] | None = None,
    expires: timedelta = DEFAULT_EXPIRES,
    root_expires: timedelta = DEFAULT_ROOT_EXPIRES,
    now: datetime | None = None,
) -> InitResult:
    """Create the four TUF roles, their Ed25519 keys (0600) and signed version-1 metadata in ``keys_dir``.

    Raises:
        TrustExistsError: ``keys_dir/keys`` or ``keys_dir/metadata`` exists and is not empty.
        UsageError: a threshold larger than its key count, or below 1.
    """
    chosen = {role: RoleKeys() for role in TOP_LEVEL_ROLES}
    chosen.update(roles or {})
    for role, spec in chosen.items():
        if role not in TOP_LEVEL_ROLES:
            raise UsageError(f"unknown TUF role {role!r}", hint=f"roles are {', '.join(TOP_LEVEL_ROLES)}")
        if not 1 <= spec.threshold <= spec.keys:
            raise UsageError(f"{role}: a threshold of {spec.threshold} with {spec.keys} key(s) cannot be met")
    keys_dir = Path(keys_dir)
    keys_path, metadata_path = keys_dir / "keys", keys_dir / "metadata"
    for directory in (keys_path, metadata_path):
        if directory.exists() and any(directory.iterdir()):
            raise TrustExistsError(
                f"{directory} exists and is not empty",
                hint="keys and metadata are never overwritten; choose a new directory, or rotate keys with "
                "bless trust rotate",
            )
    now = now or datetime.now(UTC)
    try:
        keys_path.mkdir(parents=True, exist_ok=True, mode=0o700)
        metadata_path.mkdir(parents=True, exist_ok=True)
        root = Root(expires=_expiry(now, root_expires), consistent_snapshot=False)
        key_files: list[Path] = []
        for role in TOP_LEVEL_ROLES:
            root.roles[role].threshold = chosen[role].threshold
            for _ in range(chosen[role].keys):
                public, path = _new_key(keys_path, role)
                root.add_key(public, role)
                key_files.append(path)
        signers = _load_signers(keys_dir)
        documents: dict[str, Metadata[Any]] = {
            Root.type: Metadata(root),
            Targets.type: Metadata(Targets(expires=_expiry(now, expires))),
            Snapshot.type: Metadata(Snapshot(expires=_expiry(now, expires))),
            Timestamp.type: Metadata(Timestamp(expires=_expiry(now, expires))),
        }
        for role, document in documents.items():
            for keyid in root.roles[role].keyids:
                document.sign(signers[keyid], append=True)
        atomic_write_bytes(metadata_path / "1.root.json", documents[Root.type].to_bytes())
        for role in (Root.type, Targets.type, Snapshot.type, Timestamp.type):
            atomic_write_bytes(metadata_path / f"{role}.json", documents[role].to_bytes())
    except OSError as exc:
        what = f"cannot create the trust repository in {keys_dir}"
        raise full_disk_error(exc, what) or BlessError(f"{what}: {exc.strerror or exc}") from exc
    return InitResult(keys_dir, metadata_path, tuple(key_files), chosen)


#: What a report says of a blessing whose signature was not checked.
UNSIGNED_NOTE = "unsigned: no --trust given, signatures were not checked"


def trust_report(verdict: TrustVerdict | None) -> dict[str, Any]:
    """The ``trust`` section of a report: the verdict, or a note that nothing was checked."""
    return verdict.to_dict() if verdict is not None else {"signed": False, "note": UNSIGNED_NOTE}


def manifest_file_bytes(path: Path, manifest: Manifest) -> bytes:
    """The bytes that are signed and checked: the manifest file as the store wrote it.

    They must still be ``manifest`` (the file could have changed since it was read). Hashing the file
    costs far less than serializing a 2,000-file manifest again (indented JSON is encoded in Python).

    Raises:
        TargetMismatchError: the file no longer holds this manifest.
    """
    try:
        data = read_bounded(path, MAX_MANIFEST_BYTES)  # never blocks on a FIFO, never reads past the cap
        if data is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
        same = json.loads(data) == manifest.to_dict()
    except (OSError, ValueError, UnreadableFileError) as exc:
        raise TargetMismatchError(f"cannot read the manifest {path} again: {exc}") from None
    if not same:
        raise TargetMismatchError(
            f"{path} changed while it was being checked", hint="run the command again; find out what writes manifests"
        )
    return data


def sign_blessing(
    keys_dir: Path,
    manifest: Manifest,
    data: bytes,
    *,
    expires: timedelta = DEFAULT_EXPIRES,
    keep_previous: bool = False,
    now: datetime | None = None,
) -> SignResult:
    """List ``manifest`` (whose file bytes are ``data``) as a target; re-sign targets, snapshot and timestamp.

    Other versions of the same config hash are delisted unless ``keep_previous``: a superseded
    blessing then fails verification under ``--trust`` (exit UNSIGNED).
    """
    now = now or datetime.now(UTC)
    name = target_path(manifest.config_hash, manifest.cache.dir_id)
    with _repository(keys_dir) as repo:
        targets = repo.targets.signed.targets
        prefix = f"{_TARGET_PREFIX}/{manifest.config_hash}/"
        superseded = (path for path in targets if path.startswith(prefix) and path != name)
        removed = () if keep_previous else tuple(sorted(superseded))
        for path in removed:
            del targets[path]
        info = TargetFile.from_data(name, data, ["sha256"])
        info.unrecognized_fields["custom"] = {
            "config_hash": manifest.config_hash,
            "dir_id": manifest.cache.dir_id,
            "engine": manifest.engine,
            "model": manifest.model_label,
            "created": manifest.created,
        }
        targets[name] = info
        counts = repo.resign_chain(now, expires)
        return repo.result(counts, _iso(_expiry(now, expires)), info, removed)


def rotate_role(
    keys_dir: Path,
    role: str,
    *,
    expires: timedelta = DEFAULT_EXPIRES,
    root_expires: timedelta = DEFAULT_ROOT_EXPIRES,
    now: datetime | None = None,
) -> SignResult:
    """Replace every key of ``role`` with fresh ones in a new root version, then re-sign the chain.

    The new root is signed by the old root keys and (when ``role`` is root) the new ones, as TUF
    requires, so hosts provisioned with any earlier root follow the rotation.
    """
    if role not in TOP_LEVEL_ROLES:
        raise UsageError(f"unknown TUF role {role!r}", hint=f"roles are {', '.join(TOP_LEVEL_ROLES)}")
    now = now or datetime.now(UTC)
    with _repository(keys_dir) as repo:
        old_root = copy.deepcopy(repo.root.signed)
        root = repo.root.signed
        old_keyids = list(root.roles[role].keyids)
        for keyid in old_keyids:
            root.revoke_key(keyid, role)
        for _ in old_keyids:
            public, _path = _new_key(repo.keys_dir / "keys", role)
            root.add_key(public, role)
        root.version += 1
        root.expires = _expiry(now, root_expires)
        repo.signers = _load_signers(repo.keys_dir)
        repo.root.signatures.clear()
        signed_old = _sign_append(repo, repo.root, old_root.roles[Root.type])
        signed_new = _sign_append(repo, repo.root, root.roles[Root.type])
        repo.write(repo.root, f"{root.version}.root.json")
        repo.write(repo.root, "root.json")
        counts = {Root.type: (min(signed_old, signed_new), root.roles[Root.type].threshold)}
        counts.update(repo.resign_chain(now, expires))
        return repo.result(counts, _iso(_expiry(now, expires)))


def _sign_append(repo: _Repository, metadata: Metadata[Any], role: Role) -> int:
    count = 0
    for keyid in role.keyids:
        signer = repo.signers.get(keyid)
        if signer is not None:
            if keyid not in metadata.signatures:
                metadata.sign(signer, append=True)
            count += 1
    return count


# --------------------------------------------------------------------------------------------
# Verification (the serving side)


class _MemoryFetcher(FetcherInterface):
    """Serves metadata files from memory: the Updater's checks, without a network."""

    def __init__(self, files: Mapping[str, bytes]) -> None:
        self._files = dict(files)

    def _fetch(self, url: str) -> Iterator[bytes]:
        name = parse.unquote(url.removeprefix(_BASE_URL))
        data = self._files.get(name)
        if data is None:
            raise tuf_errors.DownloadHTTPError(f"{name} not available", 404)
        return iter((data,))


def _diagnose_unsigned(state_dir: Path, candidate: Mapping[str, bytes], cause: Exception) -> BlessError:
    """Tell a signature by an untrusted key apart from too few signatures, for the failing role."""
    try:
        trusted_root: Root = Metadata.from_bytes(_read_limited(state_dir / "root.json")).signed
    except Exception:
        trusted_root = None  # type: ignore[assignment]
    hint_keys = "sign with the keys the trusted root lists (bless sign --keys DIR), or provision the right root.json"
    if trusted_root is not None:
        for role in (Timestamp.type, Snapshot.type, Targets.type):
            data = candidate.get(f"{role}.json")
            if data is None:
                continue
            try:
                metadata = Metadata.from_bytes(data)
                result = trusted_root.get_verification_result(role, metadata.signed_bytes, metadata.signatures)
            except Exception:  # noqa: S112 -- malformed: the generic message below says so
                continue
            if result.verified:
                continue
            if result.signed:
                return BelowThresholdError(
                    f"{role} metadata has {len(result.signed)} valid signature(s); its threshold is {result.threshold}",
                    hint=f"{result.missing} more key holder(s) of role {role} must sign",
                    details={"role": role, "signed": len(result.signed), "threshold": result.threshold},
                )
            return SignatureUntrustedError(
                f"{role} metadata carries no valid signature by a key the trusted root lists for {role}",
                hint=hint_keys,
                details={"role": role, "threshold": result.threshold},
            )
    return SignatureUntrustedError(f"signature check failed: {cause}", hint=hint_keys)


_MIXED_HINT = (
    "its files come from different signings: use timestamp.json, snapshot.json and targets.json of one signing "
    "(the signing repository's metadata/ as bless sign left it), or pull the signed blessing again"
)


def _mixed_versions(files: Mapping[str, bytes]) -> str | None:
    """Why the timestamp, snapshot and targets of ``files`` are not one signing's, or None.

    A version mismatch inside the presented metadata is not a rollback (the host may never have trusted
    anything): it is told apart here, before python-tuf reports both as one error.
    """
    try:
        timestamp = Metadata.from_bytes(files["timestamp.json"]).signed
        snapshot = Metadata.from_bytes(files["snapshot.json"]).signed
        targets = Metadata.from_bytes(files["targets.json"]).signed
    except Exception:  # missing or malformed: python-tuf's own checks name it
        return None
    if not (isinstance(timestamp, Timestamp) and isinstance(snapshot, Snapshot) and isinstance(targets, Targets)):
        return None
    if timestamp.snapshot_meta.version != snapshot.version:
        return (
            f"timestamp.json (version {timestamp.version}) names snapshot version {timestamp.snapshot_meta.version}, "
            f"but snapshot.json is version {snapshot.version}"
        )
    listed = snapshot.meta.get("targets.json")
    if listed is not None and listed.version != targets.version:
        return (
            f"snapshot.json (version {snapshot.version}) names targets version {listed.version}, "
            f"but targets.json is version {targets.version}"
        )
    return None


def _forget_hint(state_dir: Path) -> str:
    """How an operator deliberately moves a store to another root chain (and what that costs)."""
    return (
        f"to trust another root on purpose, remove {state_dir} (the host then forgets the versions it trusted: "
        "rollback protection starts again from the new root), or use another store root (--root)"
    )


def _root_metadata(data: bytes, what: str) -> Metadata[Root]:
    metadata = _parse(data, what)
    if not isinstance(metadata.signed, Root):
        raise TrustInvalidError(f"{what} is not root metadata")
    return metadata


def _bootstrap_root(state_dir: Path, anchor: bytes, available: Mapping[str, bytes]) -> bytes:
    """The root the Updater starts from: the store's trusted root, once ``anchor`` is shown to be on its chain.

    A store remembers one root chain. The presented ``anchor`` is accepted only if it is the store's
    trusted root, a root the store passed through, or a successor reachable through ``N.root.json``
    files of ``available``, each version signed by a threshold of the previous version's root keys and
    of its own (checked with python-tuf's ``Root.verify_delegate``, as its Updater does). Starting the
    Updater from the store's root (never from ``anchor``) keeps its rollback state: bootstrapping from
    an unrelated root made the Updater discard the timestamp and snapshot versions it had trusted.

    Raises:
        TrustInvalidError: another root chain, a missing link of the chain, or unreadable trust state (66).
        RollbackError: a root older than the store's that the store never trusted (64).
    """
    presented = _root_metadata(anchor, "the trusted root.json")
    current_path = state_dir / "root.json"
    if not current_path.exists():
        return anchor  # first use: this store trusts the root it is provisioned with
    current_bytes = _read_limited(current_path)
    try:
        current = _root_metadata(current_bytes, f"{current_path}")
    except TrustInvalidError as exc:
        raise TrustInvalidError(str(exc), hint=_forget_hint(state_dir)) from None
    have, want = current.signed.version, presented.signed.version
    another = TrustInvalidError(
        f"this store already trusts another root chain (its root is version {have}: {current_path}); "
        f"the presented root.json (version {want}) is not on that chain",
        hint=f"use the root.json this store was first verified with (or a later one of its chain); "
        f"{_forget_hint(state_dir)}",
        details={"trusted_root_version": have, "presented_root_version": want},
    )
    if want == have:
        if presented.signed != current.signed:
            raise another
        return current_bytes
    if want < have:
        kept = state_dir / "root_history" / f"{want}.root.json"
        if not kept.is_file():
            raise RollbackError(
                f"the presented root.json is version {want}; this store already trusts version {have} and never "
                f"trusted a version {want}",
                hint="provision the host with the current root.json of the signing repository (DIR/metadata/root.json)",
                details={"trusted_root_version": have, "presented_root_version": want},
            )
        if _root_metadata(_read_limited(kept), f"{kept}").signed != presented.signed:
            raise another
        return current_bytes  # a root this store followed before: it keeps following from where it is
    trusted = current.signed
    for version in range(have + 1, want + 1):
        name = f"{version}.root.json"
        data = anchor if version == want else available.get(name)
        if data is None:
            raise TrustInvalidError(
                f"cannot follow this store's root version {have} to the presented version {want}: {name} is missing",
                hint="verify with --trust pointing at the signing repository's metadata directory (it keeps every "
                "N.root.json), or put the missing N.root.json files beside the root.json",
                details={"trusted_root_version": have, "presented_root_version": want},
            )
        successor = _root_metadata(data, name)
        try:
            if successor.signed.version != version:
                raise tuf_errors.BadVersionNumberError(f"{name} holds version {successor.signed.version}")
            trusted.verify_delegate(Root.type, successor.signed_bytes, successor.signatures)
            successor.signed.verify_delegate(Root.type, successor.signed_bytes, successor.signatures)
        except tuf_errors.RepositoryError as exc:
            raise TrustInvalidError(f"{another} ({name}: {exc})", hint=another.hint, details=another.details) from None
        trusted = successor.signed
    return current_bytes


def _updater_refusal(
    exc: Exception, *, state_dir: Path, candidate: Mapping[str, bytes], trusted_before: bool
) -> BlessError:
    """The refusal for what python-tuf's Updater raised: one row per error, the most specific first."""
    size_limits = ", ".join(f"{role} {limit}" for role, limit in ROLE_MAX_BYTES.items())
    table: list[tuple[type[Exception], Callable[[], BlessError]]] = [
        (
            tuf_errors.ExpiredMetadataError,
            lambda: MetadataExpiredError(
                f"{exc}", hint="re-sign the blessing (bless sign HASH --keys DIR) and distribute the new metadata"
            ),
        ),
        (
            tuf_errors.BadVersionNumberError,
            lambda: (
                RollbackError(
                    f"{exc}: this host already trusted newer metadata",
                    hint="someone serves older signed metadata (a moved tag?); pull the current signed blessing",
                )
                if trusted_before  # nothing trusted here yet: nothing to roll back from
                else TrustInvalidError(f"the signed metadata is inconsistent: {exc}", hint=_MIXED_HINT)
            ),
        ),
        (
            tuf_errors.UnsignedMetadataError,
            lambda: _diagnose_unsigned(state_dir, candidate, exc),
        ),
        (
            tuf_errors.DownloadLengthMismatchError,
            lambda: TrustInvalidError(
                f"signed metadata is larger than a verifier reads ({exc}; limits in bytes: {size_limits})",
                hint="bless sign never writes metadata this large: it was made by other means; re-sign with bless sign",
            ),
        ),
        (
            tuf_errors.DownloadHTTPError,
            lambda: UnsignedError(
                "no signed metadata is available for this blessing",
                hint="sign it (bless sign HASH --keys DIR) and push it, or point --trust at the signing "
                "repository's metadata directory",
            ),
        ),
        (
            OSError,
            lambda: (
                full_disk_error(exc, f"cannot record the trusted metadata in {state_dir}")
                or TrustInvalidError(f"cannot use {state_dir}: {getattr(exc, 'strerror', None) or exc}")
            ),
        ),
    ]
    for error_type, refusal in table:
        if isinstance(exc, error_type):
            return refusal()
    return TrustInvalidError(f"trust metadata rejected: {exc}")  # any other RepositoryError or DownloadError


def check_blessing(
    manifest: Manifest,
    data: bytes,
    *,
    trust_dir: Path,
    state_dir: Path,
    candidate: Mapping[str, bytes] | None = None,
) -> TrustVerdict:
    """Verify ``manifest`` (file bytes ``data``) is a signed, fresh, current TUF target; record what was trusted.

    ``trust_dir`` holds the trusted ``root.json`` (the anchor). New metadata comes from ``candidate``
    (e.g. a pulled artifact), else from ``trust_dir`` when it holds ``timestamp.json``, else from
    what ``state_dir`` trusted before. ``state_dir`` is TUF's trusted-metadata directory.

    Raises:
        UnsignedError, SignatureUntrustedError, BelowThresholdError, MetadataExpiredError,
        RollbackError, TargetMismatchError, TrustInvalidError: each refusal its own exit code.
    """
    trust_files = metadata_from_dir(Path(trust_dir))
    anchor = trust_files.get("root.json")
    if anchor is None:
        raise TrustInvalidError(
            f"{trust_dir} holds no root.json",
            hint="provision the serving host with the root.json of the signing repository (DIR/metadata/root.json)",
        )
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise full_disk_error(exc, f"cannot create {state_dir}") or TrustInvalidError(
            f"cannot create {state_dir}: {exc.strerror or exc}"
        ) from None
    if candidate is None:
        candidate = trust_files if "timestamp.json" in trust_files else metadata_from_dir(state_dir)
    name = target_path(manifest.config_hash, manifest.cache.dir_id)
    # The Updater follows root versions through the fetcher: offer it the chain the anchor was checked
    # through (the trust directory's N.root.json), and the anchor itself under its version's name.
    served = dict(candidate)
    for file_name, file_data in trust_files.items():
        if file_name.endswith(".root.json"):
            served.setdefault(file_name, file_data)
    with full_disk(f"recording the trusted metadata in {state_dir}"), FileLock(str(state_dir.parent / "trust.lock")):
        # python-tuf's Updater reads the state files itself, whole and through links: vet them first.
        trusted_before = "timestamp.json" in metadata_from_dir(state_dir)
        _strict(served, "the signed metadata")
        mixed = _mixed_versions(candidate)
        if mixed is not None:
            raise TrustInvalidError(f"the signed metadata mixes versions: {mixed}", hint=_MIXED_HINT)
        presented_version = _root_metadata(anchor, "the trusted root.json").signed.version
        served[f"{presented_version}.root.json"] = anchor
        bootstrap = _bootstrap_root(state_dir, anchor, served)
        try:
            updater = Updater(
                str(state_dir),
                _BASE_URL,
                fetcher=_MemoryFetcher(served),
                bootstrap=bootstrap,
                config=_UPDATER_CONFIG,
            )
            updater.refresh()
            info = updater.get_targetinfo(name)
        except (tuf_errors.RepositoryError, tuf_errors.DownloadError, OSError) as exc:
            raise _updater_refusal(
                exc, state_dir=state_dir, candidate=candidate, trusted_before=trusted_before
            ) from None
        if info is None:
            raise UnsignedError(
                f"{manifest.config_hash[:16]}... version {manifest.cache.dir_id} is not a target of the signed "
                "metadata",
                hint="sign it with bless sign HASH --keys DIR; a re-blessed config delists its older versions "
                "unless signed with --keep-previous",
                details={"target": name},
            )
        try:
            info.verify_length_and_hashes(data)
        except tuf_errors.LengthOrHashMismatchError as exc:
            raise TargetMismatchError(
                f"the manifest of {manifest.config_hash[:16]}... differs from its signed target: {exc}",
                hint="the manifest was changed after signing; restore it from the signer or pull it again",
                details={"target": name},
            ) from None
        trusted = metadata_from_dir(state_dir)
        if "root.json" not in trusted or _parse(trusted["root.json"], "root.json").signed.version < presented_version:
            # The chain was checked above; an Updater that did not reach the presented root is a bug, not a pass.
            raise TrustInvalidError(
                f"the store's trusted root did not reach the presented version {presented_version}",
                hint=_forget_hint(state_dir),
            )
    versions: dict[str, int] = {}
    expiries: list[str] = []
    for role in (Root.type, Timestamp.type, Snapshot.type, Targets.type):
        raw = trusted.get(f"{role}.json")
        if raw is None:
            continue
        signed = Metadata.from_bytes(raw).signed
        versions[role] = signed.version
        expiries.append(_iso(signed.expires))
    return TrustVerdict(
        target=name,
        versions=versions,
        expires=min(expiries) if expiries else "",
        custom=info.custom if isinstance(info.custom, dict) else {},
    )
