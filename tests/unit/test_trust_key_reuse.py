"""TUF roots that list one key twice, and a ``<root>/trust`` that is a link, are refused (issue 25, item 10).

python-tuf counts a role's signatures by key id (python-tuf #1429): a root listing the same public key
under two key ids lets one signature count twice toward a threshold of 2. Such a root is refused when
the signing side loads it (``bless sign``, ``bless trust rotate``) and when a blessing is checked (every
root the client reads). The store's trusted-metadata directory that is a symlink was followed, and the
trust state written outside the store: refused like every other store directory, nothing written there.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from securesystemslib.signer import CryptoSigner, SSlibKey
from tuf.api.metadata import Metadata, Root

from bless.core.manifest import Manifest
from bless.errors import TrustInvalidError
from bless.trust import init_repository, rotate_role, sign_blessing
from tests.support.trust_keys import TEST_KEYS
from tests.unit.store_helpers import make_manifest, write_tree
from tests.unit.test_trust import check, provision, snapshot_metadata


@pytest.fixture
def manifest(tmp_path: Path) -> Manifest:
    return make_manifest(write_tree(tmp_path / "tree"))


def twice_listed_root(repo: Path, *, pem: bool = False) -> bytes:
    """The repository's root with its targets key listed a second time under another key id, signed by the root key."""
    metadata: Metadata[Root] = Metadata.from_file(str(repo / "metadata" / "root.json"))
    root = metadata.signed
    (targets_id,) = root.roles["targets"].keyids
    key = root.keys[targets_id]
    keyval = dict(key.keyval)
    if pem:  # the same key in another encoding: still the same key
        private = load_pem_private_key(next((repo / "keys").glob("targets-*.pem")).read_bytes(), TEST_KEYS.passphrase)
        keyval["public"] = (
            private.public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode()
        )
    root.add_key(SSlibKey("ab" * 32, key.keytype, key.scheme, keyval), "targets")
    root.roles["targets"].threshold = 2
    metadata.signatures.clear()
    root_pem = next((repo / "keys").glob("root-*.pem")).read_bytes()
    metadata.sign(CryptoSigner(load_pem_private_key(root_pem, TEST_KEYS.passphrase)))
    return metadata.to_bytes()


@pytest.mark.parametrize("pem", [False, True], ids=["same-hex", "pem-encoded"])
def test_checking_refuses_a_root_that_lists_one_key_twice(tmp_path: Path, manifest: Manifest, pem: bool) -> None:
    repo = tmp_path / "signing"
    init_repository(repo, sources=TEST_KEYS)
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    trust = provision(tmp_path, repo)
    (trust / "root.json").write_bytes(twice_listed_root(repo, pem=pem))
    with pytest.raises(TrustInvalidError, match="same public key under two key ids"):
        check(manifest, trust, tmp_path / "state", snapshot_metadata(repo))


def test_the_signing_side_refuses_a_root_that_lists_one_key_twice(tmp_path: Path, manifest: Manifest) -> None:
    repo = tmp_path / "signing"
    init_repository(repo, sources=TEST_KEYS)
    crafted = twice_listed_root(repo)
    for name in ("root.json", "1.root.json"):
        (repo / "metadata" / name).write_bytes(crafted)
    with pytest.raises(TrustInvalidError, match="same public key under two key ids"):
        sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    with pytest.raises(TrustInvalidError, match="same public key under two key ids"):
        rotate_role(repo, "targets", sources=TEST_KEYS)


def test_a_trust_state_dir_that_is_a_symlink_is_refused(tmp_path: Path, manifest: Manifest) -> None:
    repo = tmp_path / "signing"
    init_repository(repo, sources=TEST_KEYS)
    sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
    elsewhere = tmp_path / "outside-the-store"
    elsewhere.mkdir()
    state = tmp_path / "root" / "trust"
    state.parent.mkdir()
    state.symlink_to(elsewhere)
    with pytest.raises(TrustInvalidError, match="is a symlink"):
        check(manifest, provision(tmp_path, repo), state, snapshot_metadata(repo))
    assert list(elsewhere.iterdir()) == [], "nothing written outside the store"
    state.unlink()
    check(manifest, provision(tmp_path, repo, "again"), state, snapshot_metadata(repo))  # a real dir is fine
    shutil.rmtree(state)
