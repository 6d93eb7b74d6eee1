"""The signing repository (``bless trust init|rotate``, ``bless sign``): one writer of TUF metadata at a time.

The signing side is a directory (``bless trust init --keys DIR``)::

    DIR/keys/<role>-<keyid[:16]>.pem     Ed25519 file keys (encrypted PKCS#8 PEM, mode 0600): bless.trust.keys
                                         (a role whose keys are held by signers, e.g. an HSM, has none here)
    DIR/keys/model-signing-p256.*        the Model Signing key pair (bless.trust.modelsig): not TUF keys, never loaded
    DIR/metadata/root.json               the newest root: what a serving host is provisioned with
    DIR/metadata/<N>.root.json           every root version (key rotation: N+1 is signed by N's keys)
    DIR/metadata/{targets,snapshot,timestamp}.json

Every signing bumps and re-signs targets, snapshot and timestamp, and writes timestamp last; no
role's metadata is written larger than a verifier reads (:data:`bless.trust.metadata.ROLE_MAX_BYTES`).
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from securesystemslib.signer import Signer
from tuf.api.metadata import Key, Metadata, MetaFile, Role, Root, Snapshot, TargetFile, Targets, Timestamp

from bless.core.json_form import JsonForm, as_json
from bless.core.manifest import Manifest
from bless.errors import TrustExistsError, TrustInvalidError, UsageError
from bless.system.durable import atomic_write_bytes
from bless.system.file_locks import blocking_file_lock
from bless.system.os_refusals import os_errors
from bless.trust.keys import KeySources, load_signers, new_key, public_key_for_uri, uri_signers
from bless.trust.metadata import ROLE_MAX_BYTES, TOP_LEVEL_ROLES, iso_utc, metadata_from_dir, parse_metadata
from bless.trust.target import blessing_target, config_target_prefix

__all__ = [
    "DEFAULT_EXPIRES",
    "DEFAULT_ROOT_EXPIRES",
    "KeySources",
    "RoleKeys",
    "TrustInitResult",
    "TrustSigning",
    "init_repository",
    "parse_duration",
    "rotate_role",
    "sign_blessing",
]

#: Expiry of targets, snapshot and timestamp when ``--expires`` is not given (there is no online
#: timestamp service: the offline timestamp's expiry is the freshness window).
DEFAULT_EXPIRES = timedelta(days=30)
DEFAULT_ROOT_EXPIRES = timedelta(days=365)
_DURATION = re.compile(r"^([1-9][0-9]{0,5})([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass(frozen=True)
class RoleKeys:
    """How many keys a role gets at ``trust init`` and how many must sign."""

    keys: int = 1
    threshold: int = 1


@dataclass(frozen=True)
class TrustInitResult:
    """A signing repository created (``bless trust init``): its keys, metadata, roles and signers."""

    keys_dir: Path
    metadata_dir: Path
    key_files: tuple[Path, ...]
    roles: Mapping[str, RoleKeys]
    signers: Mapping[str, tuple[str, ...]] = dataclass_field(default_factory=dict)
    encrypted: bool = True

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``bless trust init --json``)."""
        # By hand (not JsonForm): re-shaped (``root``: the root.json path, ``encrypted_keys``).
        return {
            "keys_dir": str(self.keys_dir),
            "root": str(self.metadata_dir / "root.json"),
            "key_files": [str(path) for path in self.key_files],
            "encrypted_keys": self.encrypted,
            "signers": {role: list(held) for role, held in self.signers.items()},
            "roles": {role: {"keys": spec.keys, "threshold": spec.threshold} for role, spec in self.roles.items()},
        }


def _signatures_form(signatures: Mapping[str, tuple[int, int]]) -> dict[str, dict[str, int]]:
    """Each role's signatures as ``{signed, threshold}``."""
    return {role: {"signed": signed, "threshold": threshold} for role, (signed, threshold) in signatures.items()}


@dataclass(frozen=True)
class TrustSigning(JsonForm):
    """A signing: the target written, the new versions, and signatures per role (count, threshold).

    Its JSON form is ``bless sign --json``'s and ``bless trust rotate --json``'s."""

    target: str
    length: int
    sha256: str
    versions: Mapping[str, int]
    expires: str
    removed_targets: tuple[str, ...]
    signatures: Mapping[str, tuple[int, int]] = dataclass_field(metadata=as_json(to_json=_signatures_form))
    warnings: tuple[str, ...] = ()


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``2w``, ``3600s`` -> timedelta; anything else is a usage error."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise UsageError(f"bad duration {text!r}", hint="write a number and a unit: 30d, 12h, 90m, 2w or 3600s")
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def _expiry(now: datetime, delta: timedelta) -> datetime:
    return (now + delta).replace(microsecond=0)


class _Repository:
    """The signing side: metadata + private keys of ``keys_dir`` and of ``sources``' signers (one writer at a time)."""

    def __init__(self, keys_dir: Path, sources: KeySources) -> None:
        self.keys_dir = Path(keys_dir)
        self.metadata_dir = self.keys_dir / "metadata"
        files = metadata_from_dir(self.metadata_dir)
        missing = [f"{role}.json" for role in TOP_LEVEL_ROLES if f"{role}.json" not in files]
        if missing:
            raise TrustInvalidError(
                f"{self.metadata_dir} lacks {', '.join(missing)}",
                hint="create a signing repository in that directory (trust init)",
                remedy="trust_init_repository",
            )
        self.root: Metadata[Root] = parse_metadata(files["root.json"], "root.json")
        self.targets: Metadata[Targets] = parse_metadata(files["targets.json"], "targets.json")
        self.snapshot: Metadata[Snapshot] = parse_metadata(files["snapshot.json"], "snapshot.json")
        self.timestamp: Metadata[Timestamp] = parse_metadata(files["timestamp.json"], "timestamp.json")
        self.sources = sources
        self.key_warnings: tuple[str, ...] = ()
        self.signers = self.load_signers(self.root.signed)

    def load_signers(self, *roots: Root) -> dict[str, Signer]:
        """The file keys of DIR/keys and the signers of ``sources`` (matched against the keys ``roots`` list)."""
        loaded = load_signers(self.keys_dir, self.sources.passphrase)
        self.key_warnings = loaded.warnings
        held = uri_signers(_role_keys(*roots), self.sources.signers, self.sources.secrets_handler)
        return {**loaded.signers, **held}

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
                f"no private key of role {role} is in {self.keys_dir / 'keys'} or named by --signer",
                hint=f"the trusted root lists {len(role_def.keyids)} key(s) for {role}; put one of them there, "
                f"or name the HSM or KMS key that holds one as a signer URI for {role}",
                details={"role": role, "listed": len(role_def.keyids)},
                remedy="signer_for_role",
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
                "keeping their previous versions (they are delisted), or sign further blessings in another "
                "signing repository (trust init) whose root the hosts serving them trust",
                remedy="signing_repository_full",
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
    ) -> TrustSigning:
        """What a signing did: the target (if any), the new versions, the signatures per role."""
        return TrustSigning(
            target=target.path if target is not None else "",
            length=target.length if target is not None else 0,
            sha256=target.hashes["sha256"] if target is not None else "",
            versions=self.versions(),
            expires=expires,
            removed_targets=removed,
            signatures=counts,
            warnings=self.key_warnings + _below_threshold_warnings(counts),
        )

    def versions(self) -> dict[str, int]:
        return {
            Root.type: self.root.signed.version,
            Targets.type: self.targets.signed.version,
            Snapshot.type: self.snapshot.signed.version,
            Timestamp.type: self.timestamp.signed.version,
        }


@contextlib.contextmanager
def _repository(keys_dir: Path, sources: KeySources) -> Iterator[_Repository]:
    lock_path = Path(keys_dir) / ".lock"
    if not (Path(keys_dir) / "metadata").is_dir():
        raise TrustInvalidError(
            f"{keys_dir} is not a signing repository (no metadata/ directory)",
            hint="create one there (trust init)",
            remedy="trust_init_here",
        )
    # A full or read-only disk is its own refusal (15), wherever a write meets it; any other OSError
    # (permissions, a directory where a file belongs) makes the repository unusable here (66).
    with (
        os_errors(
            f"writing the signing repository {keys_dir}",
            refusal=TrustInvalidError,
            hint=f"run as a user who can write {keys_dir}, and check that keys/ and metadata/ hold only files",
        ),
        blocking_file_lock(lock_path, what="lock of the signing repository", refusal=TrustInvalidError),
    ):
        yield _Repository(Path(keys_dir), sources)


def _role_keys(*roots: Root) -> dict[str, list[Key]]:
    """The keys each role lists in any of ``roots`` (once each): the candidates a signer URI may hold."""
    keys: dict[str, dict[str, Key]] = {}
    for root in roots:
        for role in TOP_LEVEL_ROLES:
            for keyid in root.roles[role].keyids:
                keys.setdefault(role, {})[keyid] = root.keys[keyid]
    return {role: list(by_id.values()) for role, by_id in keys.items()}


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
    sources: KeySources | None = None,
    expires: timedelta = DEFAULT_EXPIRES,
    root_expires: timedelta = DEFAULT_ROOT_EXPIRES,
    now: datetime | None = None,
) -> TrustInitResult:
    """Create the four TUF roles, their keys and signed version-1 metadata in ``keys_dir``.

    A role named in ``sources.signers`` gets the keys of those URIs (read from their holder: an HSM, a KMS);
    every other role gets Ed25519 file keys (0600), encrypted with ``sources.passphrase``. Without a
    passphrase a file key is written only when ``sources.unencrypted`` says so.

    Raises:
        TrustExistsError: ``keys_dir/keys`` or ``keys_dir/metadata`` exists and is not empty.
        UsageError: a threshold larger than its key count, or below 1; a file key with neither a passphrase
            nor ``unencrypted``; a signer URI bless cannot read a public key from.
        TrustInvalidError: a signer's key cannot be read or does not sign; ``keys_dir`` cannot be created
            or written here (NoSpaceError when the disk is full).
    """
    sources = sources or KeySources()
    chosen = _chosen_roles(roles, sources)
    for role in TOP_LEVEL_ROLES:
        if role not in sources.signers:
            sources.require_file_key_protection(role)
    keys_dir = Path(keys_dir)
    keys_path, metadata_path = keys_dir / "keys", keys_dir / "metadata"
    now = now or datetime.now(UTC)
    with os_errors(
        f"creating the trust repository in {keys_dir}",
        refusal=TrustInvalidError,
        hint="choose a keys directory this user can create and write (not below a file)",
        remedy="writable_keys_dir",
    ):
        _refuse_existing(keys_path, metadata_path)
        # Read from the holders before anything is created: a token that does not answer leaves no directory.
        held = {
            role: [public_key_for_uri(uri, sources.secrets_handler) for uri in uris]
            for role, uris in sources.signers.items()
        }
        keys_path.mkdir(parents=True, exist_ok=True, mode=0o700)
        metadata_path.mkdir(parents=True, exist_ok=True)
        root, key_files = _new_root(keys_path, chosen, held, sources.passphrase, _expiry(now, root_expires))
        signers = {
            **load_signers(keys_dir, sources.passphrase).signers,
            **uri_signers(_role_keys(root), sources.signers, sources.secrets_handler),
        }
        documents = _first_metadata(root, signers, _expiry(now, expires))
        atomic_write_bytes(metadata_path / "1.root.json", documents[Root.type].to_bytes())
        for role in TOP_LEVEL_ROLES:
            atomic_write_bytes(metadata_path / f"{role}.json", documents[role].to_bytes())
    return TrustInitResult(
        keys_dir, metadata_path, key_files, chosen, dict(sources.signers), encrypted=sources.passphrase is not None
    )


def _chosen_roles(roles: Mapping[str, RoleKeys] | None, sources: KeySources) -> dict[str, RoleKeys]:
    """Every top-level role's keys and threshold: one key of threshold 1 unless ``roles`` says otherwise;
    a role with signer URIs has one key per URI."""
    chosen = {role: RoleKeys() for role in TOP_LEVEL_ROLES}
    chosen.update(roles or {})
    for role, uris in sources.signers.items():
        _require_known_role(role)
        spec = chosen[role]
        if spec.keys not in (1, len(uris)):
            raise UsageError(
                f"{role}: {spec.keys} keys asked for and {len(uris)} --signer URI(s) given",
                hint=f"a role held by signers has one key per signer URI: give {spec.keys} signer URIs for {role}",
                details={"role": role, "keys": spec.keys},
                remedy="one_signer_per_key",
            )
        chosen[role] = RoleKeys(len(uris), spec.threshold)
    for role, spec in chosen.items():
        _require_known_role(role)
        if not 1 <= spec.threshold <= spec.keys:
            raise UsageError(f"{role}: a threshold of {spec.threshold} with {spec.keys} key(s) cannot be met")
    return chosen


def _require_known_role(role: str) -> None:
    if role not in TOP_LEVEL_ROLES:
        raise UsageError(f"unknown TUF role {role!r}", hint=f"roles are {', '.join(TOP_LEVEL_ROLES)}")


def _refuse_existing(*directories: Path) -> None:
    for directory in directories:
        if directory.exists() and any(directory.iterdir()):
            raise TrustExistsError(
                f"{directory} exists and is not empty",
                hint="keys and metadata are never overwritten; choose a new directory, or rotate keys (trust rotate)",
                remedy="trust_rotate",
            )


def _new_root(
    keys_path: Path,
    chosen: Mapping[str, RoleKeys],
    held: Mapping[str, list[Key]],
    passphrase: bytes | None,
    expires: datetime,
) -> tuple[Root, tuple[Path, ...]]:
    """Version 1 of root, listing the ``held`` keys of signers and fresh file keys (written to ``keys_path``)
    for every other role; and the key files."""
    root = Root(expires=expires, consistent_snapshot=False)
    key_files: list[Path] = []
    for role in TOP_LEVEL_ROLES:
        root.roles[role].threshold = chosen[role].threshold
        if role in held:
            for public in held[role]:
                root.add_key(public, role)
            continue
        for _ in range(chosen[role].keys):
            public, path = new_key(keys_path, role, passphrase=passphrase)
            root.add_key(public, role)
            key_files.append(path)
    return root, tuple(key_files)


def _first_metadata(root: Root, signers: Mapping[str, Signer], expires: datetime) -> dict[str, Metadata[Any]]:
    """Version 1 of every role, each signed by every key ``root`` lists for it."""
    documents: dict[str, Metadata[Any]] = {
        Root.type: Metadata(root),
        Targets.type: Metadata(Targets(expires=expires)),
        Snapshot.type: Metadata(Snapshot(expires=expires)),
        Timestamp.type: Metadata(Timestamp(expires=expires)),
    }
    for role, document in documents.items():
        for keyid in root.roles[role].keyids:
            document.sign(signers[keyid], append=True)
    return documents


def sign_blessing(
    keys_dir: Path,
    manifest: Manifest,
    data: bytes,
    *,
    sources: KeySources | None = None,
    expires: timedelta = DEFAULT_EXPIRES,
    keep_previous: bool = False,
    now: datetime | None = None,
) -> TrustSigning:
    """List ``manifest`` (whose file bytes are ``data``) as a target; re-sign targets, snapshot and timestamp.

    Other versions of the same config hash are delisted unless ``keep_previous``: a superseded
    blessing then fails verification under ``--trust`` (exit UNSIGNED). The keys are the file keys of
    ``keys_dir/keys`` (opened with ``sources.passphrase``) and the signers of ``sources.signers``.
    """
    now = now or datetime.now(UTC)
    info = blessing_target(manifest, data)
    with _repository(keys_dir, sources or KeySources()) as repo:
        targets = repo.targets.signed.targets
        prefix = config_target_prefix(manifest.config_hash)
        superseded = (path for path in targets if path.startswith(prefix) and path != info.path)
        removed = () if keep_previous else tuple(sorted(superseded))
        for path in removed:
            del targets[path]
        targets[info.path] = info
        counts = repo.resign_chain(now, expires)
        return repo.result(counts, iso_utc(_expiry(now, expires)), info, removed)


def rotate_role(
    keys_dir: Path,
    role: str,
    *,
    sources: KeySources | None = None,
    new_signers: tuple[str, ...] = (),
    expires: timedelta = DEFAULT_EXPIRES,
    root_expires: timedelta = DEFAULT_ROOT_EXPIRES,
    now: datetime | None = None,
) -> TrustSigning:
    """Replace every key of ``role`` in a new root version, then re-sign the chain.

    The new keys are those of ``new_signers`` (URIs: read from their holder) or, without them, as many
    fresh file keys as the role had (encrypted with ``sources.passphrase``; unencrypted only when
    ``sources.unencrypted``). The new root is signed by the old root keys and (when ``role`` is root) the
    new ones, as TUF requires, so hosts provisioned with any earlier root follow the rotation.
    """
    _require_known_role(role)
    sources = sources or KeySources()
    now = now or datetime.now(UTC)
    with _repository(keys_dir, sources) as repo:
        old_root = copy.deepcopy(repo.root.signed)
        root = repo.root.signed
        old_keyids = list(root.roles[role].keyids)
        if new_signers:
            if root.roles[role].threshold > len(new_signers):
                raise UsageError(
                    f"{role} needs {root.roles[role].threshold} signatures and {len(new_signers)} new signer(s) "
                    "were given",
                    hint=f"give at least {root.roles[role].threshold} new signer URIs",
                    details={"role": role, "threshold": root.roles[role].threshold},
                    remedy="enough_new_signers",
                )
            fresh = [public_key_for_uri(uri, sources.secrets_handler) for uri in new_signers]
        else:
            sources.require_file_key_protection(role)
            fresh = [new_key(repo.keys_dir / "keys", role, passphrase=sources.passphrase)[0] for _ in old_keyids]
        for keyid in old_keyids:
            root.revoke_key(keyid, role)
        for public in fresh:
            root.add_key(public, role)
        root.version += 1
        root.expires = _expiry(now, root_expires)
        if new_signers:
            merged = dict(sources.signers)
            merged[role] = tuple(dict.fromkeys((*merged.get(role, ()), *new_signers)))
            repo.sources = KeySources(merged, sources.passphrase, sources.unencrypted, sources.secrets_handler)
        repo.signers = repo.load_signers(old_root, root)
        repo.root.signatures.clear()
        signed_old = _sign_append(repo, repo.root, old_root.roles[Root.type])
        signed_new = _sign_append(repo, repo.root, root.roles[Root.type])
        repo.write(repo.root, f"{root.version}.root.json")
        repo.write(repo.root, "root.json")
        counts = {Root.type: (min(signed_old, signed_new), root.roles[Root.type].threshold)}
        counts.update(repo.resign_chain(now, expires))
        return repo.result(counts, iso_utc(_expiry(now, expires)))


def _sign_append(repo: _Repository, metadata: Metadata[Any], role: Role) -> int:
    """Add a signature by each key of ``role`` that ``repo`` holds and has not signed yet; how many it holds."""
    count = 0
    for keyid in role.keyids:
        signer = repo.signers.get(keyid)
        if signer is not None:
            if keyid not in metadata.signatures:
                metadata.sign(signer, append=True)
            count += 1
    return count
