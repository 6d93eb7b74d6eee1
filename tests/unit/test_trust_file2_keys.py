"""``--signer ROLE=file2:PATH`` keys and the key passphrase: every bad input a refusal before anything is made.

A ``file2`` key is read through the bounded reader of user files (a FIFO is refused, never waited on;
``/dev/zero`` and a file over the key limit are refused before a byte is read), refused when group or others
can read it (as the keys directory refuses one), and a missing one is named in plain words. A passphrase no key
could be encrypted with (over 1,023 bytes, or not UTF-8) is a usage error (2) before ``keys/`` or
``metadata/`` exists.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from bless.core.manifest import Manifest
from bless.errors import ExitCode, InputInvalidError, TrustInvalidError, UsageError
from bless.trust import KeySources, init_repository, sign_blessing
from bless.trust.keys import MAX_KEY_BYTES, MAX_PASSPHRASE_BYTES, PASSPHRASE_ENV
from tests.support.hang_guard import finishes
from tests.support.trust_keys import TEST_KEYS
from tests.unit.store_helpers import make_manifest, write_tree


@pytest.fixture
def manifest(tmp_path: Path) -> Manifest:
    return make_manifest(write_tree(tmp_path / "tree"))


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A signing repository whose targets key is also written unencrypted to ``plain/targets.pem`` (0600)."""
    repo = tmp_path / "signing"
    init_repository(repo, sources=TEST_KEYS)
    encrypted = next((repo / "keys").glob("targets-*.pem"))
    private = load_pem_private_key(encrypted.read_bytes(), TEST_KEYS.passphrase)
    plain = tmp_path / "plain" / "targets.pem"
    plain.parent.mkdir()
    plain.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    plain.chmod(0o600)
    encrypted.unlink()  # the role's key is now held only by the file2 signer
    return repo


def sign_with(repo: Path, manifest: Manifest, key: Path) -> None:
    sources = KeySources(signers={"targets": (f"file2:{key}",)}, passphrase=TEST_KEYS.passphrase)
    finishes(lambda: sign_blessing(repo, manifest, manifest.to_json_bytes(), sources=sources), hang_s=60)


def test_a_file2_key_of_mode_0600_signs(repo: Path, manifest: Manifest, tmp_path: Path) -> None:
    sign_with(repo, manifest, tmp_path / "plain" / "targets.pem")


def test_a_file2_fifo_is_refused_at_once_never_waited_on(repo: Path, manifest: Manifest, tmp_path: Path) -> None:
    fifo = tmp_path / "plain" / "fifo.pem"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(InputInvalidError, match="FIFO") as caught:
        sign_with(repo, manifest, fifo)
    assert caught.value.exit_code == ExitCode.INPUT_INVALID


def test_a_file2_device_is_refused_before_a_byte_is_read(repo: Path, manifest: Manifest) -> None:
    with pytest.raises(InputInvalidError, match="character device"):
        sign_with(repo, manifest, Path("/dev/zero"))


def test_a_file2_key_over_the_limit_is_refused(repo: Path, manifest: Manifest, tmp_path: Path) -> None:
    big = tmp_path / "plain" / "big.pem"
    with big.open("wb") as handle:
        handle.truncate(MAX_KEY_BYTES + 1)  # sparse: nothing to read, only its size to refuse
    big.chmod(0o600)
    with pytest.raises(InputInvalidError, match=f"over the {MAX_KEY_BYTES} bytes"):
        sign_with(repo, manifest, big)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604], ids=["0644", "0640", "0604"])
def test_a_file2_key_readable_by_others_is_refused(repo: Path, manifest: Manifest, tmp_path: Path, mode: int) -> None:
    key = tmp_path / "plain" / "targets.pem"
    key.chmod(mode)
    with pytest.raises(TrustInvalidError, match=f"readable by others \\(mode {mode:o}\\)") as caught:
        sign_with(repo, manifest, key)
    assert f"chmod 600 {key}" in (caught.value.hint or "")


def test_a_missing_file2_key_is_named_in_plain_words(repo: Path, manifest: Manifest, tmp_path: Path) -> None:
    missing = tmp_path / "plain" / "nowhere.pem"
    with pytest.raises(InputInvalidError) as caught:
        sign_with(repo, manifest, missing)
    message = caught.value.message
    assert message == f"{missing}: no such file2 signer key file"
    assert "(with" not in message and "'" not in message  # securesystemslib's garbled tuple is gone


@pytest.mark.parametrize(
    ("passphrase", "why"),
    [(b"a" * (MAX_PASSPHRASE_BYTES + 1), "over the 1023 bytes"), (b"ab\xff", "not UTF-8")],
    ids=["1024-bytes", "not-utf8"],
)
def test_a_passphrase_no_key_can_take_is_refused_before_anything_is_made(
    tmp_path: Path, passphrase: bytes, why: str
) -> None:
    with pytest.raises(UsageError, match=why):
        init_repository(tmp_path / "signing", sources=KeySources(passphrase=passphrase))
    assert not (tmp_path / "signing").exists()
    KeySources(passphrase=b"a" * MAX_PASSPHRASE_BYTES)  # the longest that works is accepted


@pytest.mark.parametrize("passphrase", [b"a" * (MAX_PASSPHRASE_BYTES + 1), b"ab\xff"], ids=["1024-bytes", "not-utf8"])
def test_the_cli_refuses_such_a_passphrase_with_2_and_creates_nothing(tmp_path: Path, passphrase: bytes) -> None:
    env = {os.fsencode(k): os.fsencode(v) for k, v in os.environ.items()}
    env[b"PYTHONPATH"] = os.fsencode(Path(__file__).resolve().parents[2])
    env[PASSPHRASE_ENV.encode()] = passphrase
    keys = tmp_path / "signing"
    done = subprocess.run(
        [sys.executable, "-m", "bless.cli.main", "trust", "init", "--keys", str(keys)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert "internal error" not in done.stderr and "passphrase" in done.stderr
    assert not keys.exists()
