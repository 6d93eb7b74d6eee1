"""Signing keys that never sit unencrypted on disk: keys in an HSM (SoftHSM2 through PKCS#11), encrypted file keys.

The HSM tests need Debian's softhsm2 and opensc (pkcs11-tool) and the hsm extra (python-pkcs11); they skip
without them, and fail instead under ``BLESS_REQUIRE_HSM=1`` (scripts/test.sh: setup.sh installs them).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bless.errors import ExitCode, TrustInvalidError, UsageError
from bless.trust import KeySources, init_repository, sign_blessing
from bless.trust.keys import HSM_PIN_ENV, PASSPHRASE_ENV, parse_signer_option
from tests.support.trust_keys import TEST_KEYS
from tests.unit.store_helpers import make_manifest, write_tree
from tests.unit.test_cli_trust import blessed_store, invoke

SOFTHSM_LIB = Path("/usr/lib/softhsm/libsofthsm2.so")
PIN = "1234"
#: The token's keys (PKCS#11 CKA_ID -> what they are for); securesystemslib's URI names the id: hsm:<id>?label=.
ROOT_ID, TARGETS_ID, NEXT_TARGETS_ID = 2, 3, 4


def hsm_uri(key_id: int) -> str:
    return f"hsm:{key_id}?label=bless"


def _hsm_missing() -> str | None:
    for tool in ("softhsm2-util", "pkcs11-tool"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (apt-get install softhsm2 opensc; scripts/setup.sh does)"
    if not SOFTHSM_LIB.is_file():
        return f"{SOFTHSM_LIB} is missing (apt-get install softhsm2)"
    if importlib.util.find_spec("pkcs11") is None:
        return "python-pkcs11 is missing (pip install -e '.[hsm]'; the dev extra pulls it in)"
    return None


@pytest.fixture(scope="module")
def softhsm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A SoftHSM2 token labelled bless (user PIN 1234) holding ECDSA P-256 keys 2, 3 and 4, in a temp dir.

    One token for the module: the PKCS#11 library reads SOFTHSM2_CONF once per process.
    """
    missing = _hsm_missing()
    if missing:
        if os.environ.get("BLESS_REQUIRE_HSM") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    base = tmp_path_factory.mktemp("softhsm")
    (base / "tokens").mkdir()
    conf = base / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {base / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n")
    env = {**os.environ, "SOFTHSM2_CONF": str(conf)}

    def run(*args: str) -> None:
        subprocess.run(args, env=env, check=True, capture_output=True, timeout=60)

    run("softhsm2-util", "--init-token", "--free", "--label", "bless", "--pin", PIN, "--so-pin", "5678")
    for key_id in (ROOT_ID, TARGETS_ID, NEXT_TARGETS_ID):
        run(
            "pkcs11-tool", "--module", str(SOFTHSM_LIB), "--token-label", "bless", "--login", "--pin", PIN,
            "--keypairgen", "--key-type", "EC:prime256v1", "--id", f"{key_id:02x}", "--label", f"key{key_id}",
        )  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SOFTHSM2_CONF", str(conf))
        patch.setenv("PYKCS11LIB", str(SOFTHSM_LIB))
        patch.setenv(HSM_PIN_ENV, PIN)
        yield base


def _verify(root: Path, config_hash: str, trust: Path) -> tuple[int, dict[str, Any]]:
    code, data, _ = invoke(root, "verify", config_hash, "--trust", str(trust), "--json")
    return code, data


def test_hsm_keys_init_sign_rotate_and_verify(softhsm: Path, tmp_path: Path) -> None:
    """Root and targets keys in the token: no root or targets key file; the client accepts their signatures."""
    root, _, manifest = blessed_store(tmp_path)
    keys = tmp_path / "signing"
    code, data, stderr = invoke(
        root, "trust", "init", "--keys", str(keys), "--json",
        "--signer", f"root={hsm_uri(ROOT_ID)}", "--signer", f"targets={hsm_uri(TARGETS_ID)}",
    )  # fmt: skip
    assert code == 0, stderr
    assert data["signers"] == {"root": [hsm_uri(ROOT_ID)], "targets": [hsm_uri(TARGETS_ID)]}
    names = sorted(path.name.split("-")[0] for path in (keys / "keys").glob("*.pem"))
    assert names == ["snapshot", "timestamp"]  # only the online roles are files, and those are encrypted
    for path in (keys / "keys").glob("*.pem"):
        assert path.read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    root_json = json.loads((keys / "metadata" / "root.json").read_text())
    for role in ("root", "targets"):
        (keyid,) = root_json["signed"]["roles"][role]["keyids"]
        assert root_json["signed"]["keys"][keyid]["scheme"] == "ecdsa-sha2-nistp256"
    host = tmp_path / "host"
    host.mkdir()
    shutil.copy(keys / "metadata" / "root.json", host / "root.json")

    # Without the token's key, targets cannot be signed: a clear refusal, nothing written.
    code, _, stderr = invoke(root, "sign", manifest.config_hash, "--keys", str(keys))
    assert code == ExitCode.TRUST_INVALID, stderr
    assert "no private key of role targets" in stderr and "--signer targets=URI" in stderr
    code, data, stderr = invoke(
        root, "sign", manifest.config_hash, "--keys", str(keys), "--signer", f"targets={hsm_uri(TARGETS_ID)}", "--json"
    )
    assert code == 0, stderr
    assert data["signatures"]["targets"] == {"signed": 1, "threshold": 1}
    code, verdict = _verify(root, manifest.config_hash, keys / "metadata")
    assert code == 0, verdict
    assert verdict["trust"]["signed"] is True
    assert _verify(root, manifest.config_hash, host)[0] == 0  # a host with only the root: from what it trusted

    # Rotate targets to another token key: the old root's key signs the new root; hosts follow.
    code, _, stderr = invoke(
        root, "trust", "rotate", "--keys", str(keys), "--role", "targets",
        "--signer", f"root={hsm_uri(ROOT_ID)}", "--new-signer", hsm_uri(NEXT_TARGETS_ID),
    )  # fmt: skip
    assert code == 0, stderr
    code, _, stderr = invoke(
        root, "sign", manifest.config_hash, "--keys", str(keys), "--signer", f"targets={hsm_uri(TARGETS_ID)}"
    )
    assert code == ExitCode.TRUST_INVALID, stderr  # the rotated-out key is no key of the new root
    assert "holds none of the 1 key(s) the root lists for role targets" in stderr
    code, _, stderr = invoke(
        root, "sign", manifest.config_hash, "--keys", str(keys), "--signer", f"targets={hsm_uri(NEXT_TARGETS_ID)}"
    )
    assert code == 0, stderr
    code, verdict = _verify(root, manifest.config_hash, keys / "metadata")
    assert code == 0, verdict
    assert verdict["trust"]["versions"]["root"] == 2


def test_a_wrong_pin_or_a_missing_key_is_refused_before_anything_is_written(
    softhsm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    keys = tmp_path / "signing"
    code, _, stderr = invoke(root, "trust", "init", "--keys", str(keys), "--signer", f"targets={hsm_uri(9)}")
    assert code == ExitCode.TRUST_INVALID, stderr
    assert "cannot read the public key of signer hsm:9?label=bless" in stderr and "PYKCS11LIB" in stderr
    assert not keys.exists()

    assert invoke(root, "trust", "init", "--keys", str(keys), "--signer", f"targets={hsm_uri(TARGETS_ID)}")[0] == 0
    tree = write_tree(tmp_path / "tree")
    manifest = make_manifest(tree)
    before = (keys / "metadata" / "targets.json").read_bytes()
    monkeypatch.setenv(HSM_PIN_ENV, "0000")
    with pytest.raises(TrustInvalidError, match="holds none of the 1 key"):
        sign_blessing(
            keys,
            manifest,
            manifest.to_json_bytes(),
            sources=KeySources(
                {"targets": (hsm_uri(TARGETS_ID),)}, TEST_KEYS.passphrase, secrets_handler=lambda _msg: "0000"
            ),
        )
    assert (keys / "metadata" / "targets.json").read_bytes() == before


def test_trust_init_refuses_unencrypted_file_keys_unless_asked(tmp_path: Path) -> None:
    root = tmp_path / "root"
    keys = tmp_path / "signing"
    code, _, stderr = invoke_without_passphrase(root, "trust", "init", "--keys", str(keys))
    assert code == ExitCode.USAGE, stderr
    assert "would be written unencrypted" in stderr and PASSPHRASE_ENV in stderr and "--unencrypted-keys" in stderr
    assert not keys.exists()
    with pytest.raises(UsageError, match="unencrypted"):
        init_repository(keys)  # the library too: a passphrase, a signer, or an explicit unencrypted=True

    code, data, stderr = invoke_without_passphrase(root, "trust", "init", "--keys", str(keys), "--unencrypted-keys")
    assert code == 0, stderr
    assert "NOT encrypted" in stderr
    for path in (keys / "keys").glob("*.pem"):
        assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    # Such a repository (and one made before bless encrypted keys) still signs, with a warning per key.
    root_store, _, manifest = blessed_store(tmp_path / "s")
    code, data, stderr = invoke_without_passphrase(
        root_store, "sign", manifest.config_hash, "--keys", str(keys), "--json"
    )
    assert code == 0, stderr
    assert len([w for w in data["warnings"] if "is not encrypted" in w]) == 4


def test_encrypted_file_keys_need_their_passphrase(tmp_path: Path) -> None:
    root, _, manifest = blessed_store(tmp_path)
    keys = tmp_path / "signing"
    assert invoke(root, "trust", "init", "--keys", str(keys))[0] == 0  # invoke gives BLESS_KEY_PASSPHRASE
    files = list((keys / "keys").glob("*.pem"))
    assert len(files) == 4
    assert all(path.read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----") for path in files)
    code, _, stderr = invoke_without_passphrase(root, "sign", manifest.config_hash, "--keys", str(keys))
    assert code == ExitCode.TRUST_INVALID
    assert "is encrypted and no passphrase was given" in stderr
    code, _, stderr = invoke_with_env(
        root, {PASSPHRASE_ENV: "wrong"}, "sign", manifest.config_hash, "--keys", str(keys)
    )
    assert code == ExitCode.TRUST_INVALID
    assert "the passphrase does not open it" in stderr
    code, data, stderr = invoke(root, "sign", manifest.config_hash, "--keys", str(keys), "--json")
    assert code == 0, stderr
    assert data["warnings"] == []
    assert _verify(root, manifest.config_hash, keys / "metadata")[0] == 0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("targets", "bad --signer"),
        ("owner=hsm:2", "unknown TUF role 'owner'"),
        ("targets=gopher:2", "has no scheme bless knows"),
    ],
)
def test_bad_signer_options_are_usage_errors(tmp_path: Path, value: str, message: str) -> None:
    code, _, stderr = invoke(tmp_path / "root", "trust", "init", "--keys", str(tmp_path / "k"), "--signer", value)
    assert code == ExitCode.USAGE
    assert message in stderr
    with pytest.raises(UsageError, match="given twice"):
        parse_signer_option(["targets=hsm:2", "targets=hsm:2"])


def test_a_kms_signer_without_its_client_library_is_refused_with_the_extra_to_install(tmp_path: Path) -> None:
    try:
        importlib.import_module("google.cloud.kms")
    except ImportError:
        pass  # what the test needs: securesystemslib's gcpkms signer cannot load its client
    else:
        pytest.skip("google-cloud-kms is installed here")
    uri = "gcpkms:projects/p/locations/l/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1"
    code, _, stderr = invoke(
        tmp_path / "root", "trust", "init", "--keys", str(tmp_path / "k"), "--signer", f"root={uri}"
    )
    assert code == ExitCode.TRUST_INVALID
    assert "securesystemslib[gcpkms]" in stderr
    assert not (tmp_path / "k").exists()


def invoke_without_passphrase(root: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    return invoke_with_env(root, {}, *args)


def invoke_with_env(root: Path, env: dict[str, str], *args: str) -> tuple[int, dict[str, Any], str]:
    """:func:`invoke` with BLESS_KEY_PASSPHRASE set to ``env``'s value, or unset."""
    from typer.testing import CliRunner

    from bless.cli.main import app

    runner = CliRunner(
        env={"COLUMNS": "250", "BLESS_ROOT": None, "BLESS_TRUST": None, PASSPHRASE_ENV: env.get(PASSPHRASE_ENV)}
    )
    result = runner.invoke(app, ["--root", str(root), *args])
    document = json.loads(result.stdout) if "--json" in args and result.stdout.strip() else {}
    return result.exit_code, document, result.stderr
