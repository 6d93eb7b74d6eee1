"""TUF trust: init, sign, verify, and every refusal (real python-tuf, real Ed25519 keys, real files)."""

from __future__ import annotations

import json
import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata, MetaFile, Root, Snapshot, TargetFile, Targets, Timestamp

from bless.core.manifest import Manifest
from bless.errors import (
    BelowThresholdError,
    ExitCode,
    MetadataExpiredError,
    RollbackError,
    SignatureUntrustedError,
    TargetMismatchError,
    TrustExistsError,
    TrustInvalidError,
    UnsignedError,
    UsageError,
)
from bless.trust import (
    RoleKeys,
    TrustVerdict,
    check_blessing,
    init_repository,
    parse_duration,
    rotate_role,
    sign_blessing,
    target_path,
)
from tests.support.trust_keys import TEST_KEYS
from tests.unit.store_helpers import make_factors, make_manifest, write_tree


def check(manifest: Manifest, trust: Path, state: Path, candidate: Any = None) -> TrustVerdict:
    """check_blessing of a manifest's own bytes."""
    verdict: TrustVerdict = check_blessing(
        manifest,
        manifest.to_json_bytes(),
        trust_dir=trust,
        state_dir=state,
        lock_path=state.parent / "trust.lock",
        candidate=candidate,
    )
    return verdict


@pytest.fixture
def manifest(tmp_path: Path) -> Manifest:
    return make_manifest(write_tree(tmp_path / "tree"))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    keys = tmp_path / "signing"
    init_repository(keys, sources=TEST_KEYS)
    return keys


def provision(tmp_path: Path, repo: Path, name: str = "host-trust") -> Path:
    """A serving host's --trust dir: only the root.json of the signing repository."""
    trust = tmp_path / name
    trust.mkdir()
    shutil.copy(repo / "metadata" / "root.json", trust / "root.json")
    return trust


def snapshot_metadata(repo: Path) -> dict[str, bytes]:
    directory = repo / "metadata"
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.name.endswith(".json")}


def test_init_creates_private_keys_0600_and_refuses_to_overwrite(tmp_path: Path) -> None:
    result = init_repository(tmp_path / "k", roles={"root": RoleKeys(3, 2)}, sources=TEST_KEYS)
    assert len(result.key_files) == 6
    for path in result.key_files:
        assert os.stat(path).st_mode & 0o777 == 0o600
    root = json.loads((tmp_path / "k" / "metadata" / "root.json").read_text())
    assert root["signed"]["roles"]["root"]["threshold"] == 2
    assert len(root["signed"]["roles"]["root"]["keyids"]) == 3
    assert len(root["signatures"]) == 3
    with pytest.raises(TrustExistsError) as info:
        init_repository(tmp_path / "k", sources=TEST_KEYS)
    assert info.value.exit_code == ExitCode.TRUST_EXISTS
    with pytest.raises(UsageError):
        init_repository(tmp_path / "other", roles={"targets": RoleKeys(1, 2)}, sources=TEST_KEYS)


def test_sign_then_verify_with_only_the_root(tmp_path: Path, repo: Path, manifest: Manifest) -> None:
    signed = sign_blessing(repo, manifest, manifest.to_json_bytes(), expires=timedelta(days=3), sources=TEST_KEYS)
    assert signed.target == target_path(manifest.config_hash, manifest.cache.dir_id)
    assert signed.versions["targets"] == 2 and signed.versions["timestamp"] == 2
    targets = json.loads((repo / "metadata" / "targets.json").read_text())
    custom = targets["signed"]["targets"][signed.target]["custom"]
    assert custom["config_hash"] == manifest.config_hash and custom["engine"] == "reference"
    trust = provision(tmp_path, repo)
    verdict = check(manifest, trust, tmp_path / "state", snapshot_metadata(repo))
    assert verdict.target == signed.target
    assert verdict.versions["targets"] == 2
    # A later check with no new metadata re-verifies what the host trusted, offline.
    again = check(manifest, trust, tmp_path / "state")
    assert again.versions == verdict.versions


def test_unsigned_blessing_is_refused(tmp_path: Path, repo: Path, manifest: Manifest) -> None:
    trust = provision(tmp_path, repo)
    with pytest.raises(UnsignedError) as info:
        check(manifest, trust, tmp_path / "state", snapshot_metadata(repo))
    assert info.value.exit_code == ExitCode.UNSIGNED
    # No metadata at all: unsigned too, not a crash.
    with pytest.raises(UnsignedError):
        check(manifest, trust, tmp_path / "state2")


def test_rebless_delists_the_old_version_unless_kept(tmp_path: Path, repo: Path) -> None:
    tree = write_tree(tmp_path / "tree")
    old = make_manifest(tree, dir_id="20250101T000000Z-aaaaaaaaaaaa")
    new = make_manifest(tree, dir_id="20250102T000000Z-bbbbbbbbbbbb")
    sign_blessing(repo, old, old.to_json_bytes(), sources=TEST_KEYS)
    result = sign_blessing(repo, new, new.to_json_bytes(), sources=TEST_KEYS)
    assert result.removed_targets == (target_path(old.config_hash, old.cache.dir_id),)
    trust = provision(tmp_path, repo)
    check(new, trust, tmp_path / "s", snapshot_metadata(repo))
    with pytest.raises(UnsignedError):
        check(old, trust, tmp_path / "s")
    sign_blessing(repo, old, old.to_json_bytes(), keep_previous=True, sources=TEST_KEYS)
    check(new, trust, tmp_path / "s", snapshot_metadata(repo))
    check(old, trust, tmp_path / "s")


def test_manifest_changed_after_signing_is_refused(tmp_path: Path, repo: Path, manifest: Manifest) -> None:
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    altered = Manifest(**{**manifest.__dict__, "golden": [{**manifest.golden[0], "text": "other"}]})
    with pytest.raises(TargetMismatchError) as info:
        check(altered, provision(tmp_path, repo), tmp_path / "s", snapshot_metadata(repo))
    assert info.value.exit_code == ExitCode.TARGET_MISMATCH


def test_rollback_to_older_validly_signed_metadata_is_refused(tmp_path: Path, repo: Path, manifest: Manifest) -> None:
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    old_metadata = snapshot_metadata(repo)
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)  # a newer signing of the same blessing
    trust = provision(tmp_path, repo)
    check(manifest, trust, tmp_path / "s", snapshot_metadata(repo))
    with pytest.raises(RollbackError) as info:
        check(manifest, trust, tmp_path / "s", old_metadata)
    assert info.value.exit_code == ExitCode.ROLLBACK


def test_expired_metadata_is_refused(tmp_path: Path, repo: Path, manifest: Manifest) -> None:
    sign_blessing(
        repo,
        manifest,
        manifest.to_json_bytes(),
        now=datetime.now(UTC) - timedelta(days=2),
        expires=timedelta(days=1),
        sources=TEST_KEYS,
    )
    with pytest.raises(MetadataExpiredError) as info:
        check(manifest, provision(tmp_path, repo), tmp_path / "s", snapshot_metadata(repo))
    assert info.value.exit_code == ExitCode.METADATA_EXPIRED


def test_metadata_that_expires_after_it_was_trusted_is_refused(tmp_path: Path, repo: Path, manifest: Manifest) -> None:
    sign_blessing(
        repo,
        manifest,
        manifest.to_json_bytes(),
        now=datetime.now(UTC) - timedelta(hours=1),
        expires=timedelta(hours=1, seconds=2),
        sources=TEST_KEYS,
    )
    trust = provision(tmp_path, repo)
    check(manifest, trust, tmp_path / "s", snapshot_metadata(repo))
    deadline = datetime.now(UTC) + timedelta(seconds=10)
    while datetime.now(UTC) < deadline:
        try:
            check(manifest, trust, tmp_path / "s")
        except MetadataExpiredError:
            return
    pytest.fail("trusted metadata past its expiry was still accepted")


def test_signature_by_an_untrusted_key_is_refused(tmp_path: Path, repo: Path, manifest: Manifest) -> None:
    impostor = tmp_path / "impostor"
    init_repository(impostor, sources=TEST_KEYS)
    sign_blessing(impostor, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    with pytest.raises(SignatureUntrustedError) as info:
        check(manifest, provision(tmp_path, repo), tmp_path / "s", snapshot_metadata(impostor))
    assert info.value.exit_code == ExitCode.SIGNATURE_UNTRUSTED


def test_threshold_two_with_one_signature_is_refused(tmp_path: Path, manifest: Manifest) -> None:
    repo = tmp_path / "k"
    init_repository(repo, roles={"targets": RoleKeys(3, 2)}, sources=TEST_KEYS)
    targets_keys = sorted((repo / "keys").glob("targets-*.pem"))
    for path in targets_keys[1:]:
        path.unlink()  # only one key holder present at signing
    result = sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    assert result.signatures["targets"] == (1, 2)
    assert result.warnings
    with pytest.raises(BelowThresholdError) as info:
        check(manifest, provision(tmp_path, repo), tmp_path / "s", snapshot_metadata(repo))
    assert info.value.exit_code == ExitCode.BELOW_THRESHOLD


def test_threshold_two_of_three_met(tmp_path: Path, manifest: Manifest) -> None:
    repo = tmp_path / "k"
    init_repository(repo, roles={"root": RoleKeys(3, 2), "targets": RoleKeys(3, 2)}, sources=TEST_KEYS)
    (sorted((repo / "keys").glob("targets-*.pem"))[0]).unlink()  # two of three are enough
    assert sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS).signatures["targets"] == (2, 2)
    check(manifest, provision(tmp_path, repo), tmp_path / "s", snapshot_metadata(repo))


def test_key_rotation_through_a_new_root(tmp_path: Path, repo: Path, manifest: Manifest) -> None:
    trust = provision(tmp_path, repo)  # provisioned with root v1
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    check(manifest, trust, tmp_path / "s", snapshot_metadata(repo))
    old_targets_keys = sorted((repo / "keys").glob("targets-*.pem"))
    rotated = rotate_role(repo, "targets", sources=TEST_KEYS)
    assert rotated.versions["root"] == 2
    # The host follows the rotation from its v1 root, through 2.root.json.
    verdict = check(manifest, trust, tmp_path / "s", snapshot_metadata(repo))
    assert verdict.versions["root"] == 2
    # Metadata signed with the revoked targets key is now refused, even with a higher version.
    stale = tmp_path / "stale"
    shutil.copytree(repo, stale)
    for path in (stale / "keys").glob("targets-*.pem"):
        path.unlink()
    for path in old_targets_keys:
        shutil.copy(path, stale / "keys" / path.name)
    with pytest.raises(TrustInvalidError):
        sign_blessing(
            stale, manifest, manifest.to_json_bytes(), sources=TEST_KEYS
        )  # no key of the current targets role: refused at signing


def test_rotate_root_keys(tmp_path: Path, repo: Path, manifest: Manifest) -> None:
    trust = provision(tmp_path, repo)
    rotate_role(repo, "root", sources=TEST_KEYS)
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    verdict = check(manifest, trust, tmp_path / "s", snapshot_metadata(repo))
    assert verdict.versions["root"] == 2


def test_another_root_for_the_same_store_is_refused(tmp_path: Path, repo: Path, manifest: Manifest) -> None:
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    check(manifest, provision(tmp_path, repo), tmp_path / "s", snapshot_metadata(repo))
    other = tmp_path / "other"
    init_repository(other, sources=TEST_KEYS)
    with pytest.raises(TrustInvalidError):
        check(manifest, provision(tmp_path, other, "other-trust"), tmp_path / "s")


def test_trust_dir_without_root_and_malformed_metadata(tmp_path: Path, repo: Path, manifest: Manifest) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TrustInvalidError):
        check(manifest, empty, tmp_path / "s")
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    broken = snapshot_metadata(repo)
    broken["timestamp.json"] = b"{not json"
    with pytest.raises(TrustInvalidError):
        check(manifest, provision(tmp_path, repo), tmp_path / "s2", broken)


def test_group_readable_private_key_is_refused(tmp_path: Path, repo: Path, manifest: Manifest) -> None:
    key = next((repo / "keys").glob("targets-*.pem"))
    key.chmod(0o644)
    with pytest.raises(TrustInvalidError):
        sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)


def test_parse_duration() -> None:
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("12h") == timedelta(hours=12)
    for bad in ("", "30", "0d", "-1d", "1y", "d"):
        with pytest.raises(UsageError):
            parse_duration(bad)


def test_other_config_is_not_signed_by_a_signing_of_this_one(tmp_path: Path, repo: Path) -> None:
    tree = write_tree(tmp_path / "tree")
    one = make_manifest(tree, make_factors(seed=1))
    two = make_manifest(tree, make_factors(seed=2))
    sign_blessing(repo, one, one.to_json_bytes(), sources=TEST_KEYS)
    with pytest.raises(UnsignedError):
        check(two, provision(tmp_path, repo), tmp_path / "s", snapshot_metadata(repo))


def test_model_signing_key_pair_in_keys_dir_does_not_stop_signing_or_rotation(
    tmp_path: Path, repo: Path, manifest: Manifest
) -> None:
    """A repository after ``sign --model-signing``: keys/ also holds the P-256 pair (public half 0644)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private = ec.generate_private_key(ec.SECP256R1())
    (repo / "keys" / "model-signing-p256.key").write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    (repo / "keys" / "model-signing-p256.key").chmod(0o600)
    public = repo / "keys" / "model-signing-p256.pub.pem"
    public.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    public.chmod(0o644)  # as written, and as the README says: a public key is not a secret
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    public.chmod(0o600)  # what a user told to chmod it did: still not a TUF key
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    public.chmod(0o644)
    for role in ("targets", "root"):
        assert rotate_role(repo, role, sources=TEST_KEYS).signatures["root"][0] >= 1
    check(manifest, provision(tmp_path, repo), tmp_path / "s", snapshot_metadata(repo))
    assert public.stat().st_mode & 0o777 == 0o644


def test_a_rotated_other_root_chain_does_not_replace_the_trusted_one(tmp_path: Path, manifest: Manifest) -> None:
    """Two signing repositories: a store that trusts A's chain refuses B's, whatever B's root version."""
    a, b = tmp_path / "a", tmp_path / "b"
    for repo in (a, b):
        init_repository(repo, sources=TEST_KEYS)
        sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    state = tmp_path / "s"
    assert check(manifest, a / "metadata", state).versions["root"] == 1
    with pytest.raises(TrustInvalidError):
        check(manifest, b / "metadata", state)
    rotate_role(b, "targets", sources=TEST_KEYS)  # B's root v2: a higher version, but not signed by A's root keys
    with pytest.raises(TrustInvalidError) as info:
        check(manifest, b / "metadata", state)
    assert info.value.exit_code == ExitCode.TRUST_INVALID
    assert str(state) in (info.value.hint or "")
    rotate_role(b, "root", sources=TEST_KEYS)
    with pytest.raises(TrustInvalidError):
        check(manifest, b / "metadata", state)
    # The store still trusts A's chain at the versions it had seen: nothing was reset.
    verdict = check(manifest, a / "metadata", state)
    assert verdict.versions["root"] == 1 and verdict.versions["timestamp"] == 2


def test_a_root_successor_is_followed_only_through_its_chain(tmp_path: Path, repo: Path, manifest: Manifest) -> None:
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    host_v1 = provision(tmp_path, repo, "host-v1")
    state = tmp_path / "s"
    check(manifest, host_v1, state, snapshot_metadata(repo))
    rotate_role(repo, "targets", sources=TEST_KEYS)
    rotate_role(repo, "root", sources=TEST_KEYS)
    # Re-provisioned with root v3 alone: v2 (the link signed by v1's keys) is nowhere to be found.
    host_v3 = provision(tmp_path, repo, "host-v3")
    with pytest.raises(TrustInvalidError) as info:
        check(manifest, host_v3, state)
    assert "2.root.json" in str(info.value)
    # With the chain (the signing repository's metadata, or a pulled artifact) the store follows it.
    assert check(manifest, host_v3, state, snapshot_metadata(repo)).versions["root"] == 3
    assert check(manifest, host_v3, state).versions["root"] == 3
    # The root a host was first provisioned with still works: it is where this store's chain started.
    assert check(manifest, host_v1, state).versions["root"] == 3


def test_an_older_root_the_store_never_trusted_is_a_rollback(tmp_path: Path, repo: Path, manifest: Manifest) -> None:
    host_v1 = provision(tmp_path, repo, "host-v1")
    rotate_role(repo, "targets", sources=TEST_KEYS)
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    host_v2 = provision(tmp_path, repo, "host-v2")
    state = tmp_path / "s"
    assert check(manifest, host_v2, state, snapshot_metadata(repo)).versions["root"] == 2
    with pytest.raises(RollbackError) as info:
        check(manifest, host_v1, state)
    assert info.value.exit_code == ExitCode.ROLLBACK
    assert check(manifest, host_v2, state).versions["root"] == 2


# --- size limits: what bless sign writes, its verifiers read -----------------------------------------------


def pad_targets(repo: Path, size: int) -> None:
    """Make the repository's targets.json exactly ``size`` bytes, validly signed (as another tool could)."""
    _pad_targets(repo, size)
    _pad_targets(repo, 2 * size - (repo / "metadata" / "targets.json").stat().st_size)


def _pad_targets(repo: Path, size: int) -> None:
    """Give targets.json a padding target of ``size`` characters: re-sign targets, snapshot, timestamp."""
    signers: dict[str, CryptoSigner] = {}
    for pem in (repo / "keys").glob("*.pem"):
        private = load_pem_private_key(pem.read_bytes(), password=TEST_KEYS.passphrase)
        assert isinstance(private, Ed25519PrivateKey)
        signer = CryptoSigner(private)
        signers[signer.public_key.keyid] = signer
    metadata_dir = repo / "metadata"
    root: Root = Metadata[Root].from_bytes((metadata_dir / "root.json").read_bytes()).signed
    targets = Metadata[Targets].from_bytes((metadata_dir / "targets.json").read_bytes())
    snapshot = Metadata[Snapshot].from_bytes((metadata_dir / "snapshot.json").read_bytes())
    timestamp = Metadata[Timestamp].from_bytes((metadata_dir / "timestamp.json").read_bytes())
    padding = TargetFile.from_data("blessings/padding.json", b"x", ["sha256"])
    padding.unrecognized_fields["custom"] = {"pad": "x" * size}
    targets.signed.targets[padding.path] = padding
    targets.signed.version += 1
    snapshot.signed.meta["targets.json"] = MetaFile(version=targets.signed.version)
    snapshot.signed.version += 1
    timestamp.signed.snapshot_meta = MetaFile(version=snapshot.signed.version)
    timestamp.signed.version += 1
    documents: list[tuple[str, Metadata[Any]]] = [
        ("targets", targets),
        ("snapshot", snapshot),
        ("timestamp", timestamp),
    ]
    for role, document in documents:
        document.signatures.clear()
        for keyid in root.roles[role].keyids:
            document.sign(signers[keyid], append=True)
        (metadata_dir / f"{role}.json").write_bytes(document.to_bytes())


def test_sign_refuses_targets_no_verifier_would_read(tmp_path: Path, repo: Path, manifest: Manifest) -> None:
    """A repository just under the targets limit: signing one more blessing would pass it; refused, nothing written."""
    pad_targets(repo, (16 << 20) - 100)
    before = snapshot_metadata(repo)
    with pytest.raises(TrustInvalidError, match="over the 16777216 bytes a verifier reads") as info:
        sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    assert info.value.exit_code == ExitCode.TRUST_INVALID
    assert snapshot_metadata(repo) == before, "nothing was written"


def test_verifiers_read_what_sign_may_write_and_refuse_more(tmp_path: Path, repo: Path, manifest: Manifest) -> None:
    """6 MB of targets (past python-tuf's default 5,000,000) verify; past the limit a clear refusal."""
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    pad_targets(repo, 6_000_000)
    check(manifest, repo / "metadata", tmp_path / "state")
    pad_targets(repo, 17 << 20)
    pulled = {p.name: p.read_bytes() for p in (repo / "metadata").iterdir()}  # as a pulled artifact, in memory
    with pytest.raises(TrustInvalidError, match="larger than a verifier reads"):
        check(manifest, provision(tmp_path, repo), tmp_path / "state", candidate=pulled)


def test_mixed_metadata_versions_on_a_fresh_host_are_inconsistent_not_a_rollback(
    tmp_path: Path, repo: Path, manifest: Manifest
) -> None:
    """A --trust dir assembled from two signings: the host never trusted anything, so nothing was rolled back."""
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    first = snapshot_metadata(repo)
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    mixed = tmp_path / "mixed"
    shutil.copytree(repo / "metadata", mixed)
    (mixed / "targets.json").write_bytes(first["targets.json"])  # the older targets, the newer snapshot
    with pytest.raises(TrustInvalidError, match="mixes versions") as info:
        check(manifest, mixed, tmp_path / "fresh-state")
    assert "already trusted" not in info.value.message
    assert "different signings" in (info.value.hint or "")


def test_metadata_with_a_duplicate_key_is_refused_like_a_manifest(
    tmp_path: Path, repo: Path, manifest: Manifest
) -> None:
    """python-tuf keeps the last of two equal keys; a reader keeping the first would see other metadata."""
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    copy = tmp_path / "copy"
    shutil.copytree(repo / "metadata", copy)
    targets = (copy / "targets.json").read_bytes()
    (copy / "targets.json").write_bytes(b'{"signatures": [], ' + targets.lstrip()[1:])
    with pytest.raises(TrustInvalidError, match="duplicate key") as info:
        check(manifest, copy, tmp_path / "state")
    assert info.value.exit_code == ExitCode.TRUST_INVALID
