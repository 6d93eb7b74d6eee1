"""bless trust init / rotate, bless sign and bless verify --trust through the CLI (real keys, real store)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bless.cli.main import app
from bless.core.manifest import Manifest
from bless.errors import ExitCode
from bless.store import Store
from bless.trust.keys import PASSPHRASE_ENV
from tests.support.trust_keys import TEST_PASSPHRASE
from tests.unit.store_helpers import make_manifest, write_tree


def invoke(root: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    runner = CliRunner(env={"COLUMNS": "250", "BLESS_ROOT": None, "BLESS_TRUST": None, PASSPHRASE_ENV: TEST_PASSPHRASE})
    result = runner.invoke(app, ["--root", str(root), *args])
    document = json.loads(result.stdout) if "--json" in args and result.stdout.strip() else {}
    return result.exit_code, document, result.stderr


def blessed_store(tmp_path: Path) -> tuple[Path, Store, Manifest]:
    """A store under ``tmp_path/root`` holding one published blessing of a small tree."""
    root = tmp_path / "root"
    store = Store(root)
    tree = write_tree(tmp_path / "tree")
    manifest = make_manifest(tree)
    store.publish(tree, manifest)
    return root, store, manifest


def test_init_sign_verify_with_trust_and_without(tmp_path: Path) -> None:
    root, _, manifest = blessed_store(tmp_path)
    keys = tmp_path / "keys"

    code, data, _ = invoke(root, "trust", "init", "--keys", str(keys), "--json")
    assert code == 0, data
    assert os.stat(next((keys / "keys").glob("targets-*.pem"))).st_mode & 0o777 == 0o600
    code, data, _ = invoke(root, "trust", "init", "--keys", str(keys), "--json")
    assert code == ExitCode.TRUST_EXISTS

    host_trust = tmp_path / "host"
    host_trust.mkdir()
    shutil.copy(keys / "metadata" / "root.json", host_trust / "root.json")

    # Without --trust: today's behaviour, and the output says the blessing is unsigned.
    code, data, stderr = invoke(root, "verify", manifest.config_hash[:12], "--json")
    assert code == 0
    assert data["trust"] == {"signed": False, "note": "unsigned: no --trust given, signatures were not checked"}
    code, _, stderr = invoke(root, "verify", manifest.config_hash[:12])
    assert "unsigned" in stderr

    # --trust with the signing repository's metadata, before signing: unsigned, refused.
    code, data, _ = invoke(root, "verify", manifest.config_hash, "--trust", str(keys / "metadata"), "--json")
    assert code == ExitCode.UNSIGNED, data

    code, data, stderr = invoke(
        root, "sign", manifest.config_hash[:12], "--keys", str(keys), "--expires", "7d", "--json"
    )
    assert code == 0, stderr
    assert data["versions"]["targets"] == 2

    code, data, _ = invoke(root, "verify", manifest.config_hash, "--trust", str(keys / "metadata"), "--json")
    assert code == 0, data
    assert data["trust"]["signed"] is True and data["trust"]["versions"]["targets"] == 2
    # A host that only has the root now re-verifies from what it trusted (kept in <root>/trust).
    code, data, _ = invoke(root, "verify", manifest.config_hash, "--trust", str(host_trust), "--json")
    assert code == 0, data

    code, data, _ = invoke(root, "trust", "rotate", "--keys", str(keys), "--role", "timestamp", "--json")
    assert code == 0 and data["versions"]["root"] == 2
    code, data, _ = invoke(root, "verify", manifest.config_hash, "--trust", str(keys / "metadata"), "--json")
    assert code == 0 and data["trust"]["versions"]["root"] == 2

    code, _, stderr = invoke(root, "sign", manifest.config_hash, "--keys", str(keys), "--expires", "forever")
    assert code == ExitCode.USAGE and "30d" in stderr


def test_a_manifest_edited_after_signing_is_refused(tmp_path: Path) -> None:
    root, store, manifest = blessed_store(tmp_path)
    keys = tmp_path / "keys"
    assert invoke(root, "trust", "init", "--keys", str(keys))[0] == 0
    assert invoke(root, "sign", manifest.config_hash, "--keys", str(keys))[0] == 0
    path = store.manifest_path(manifest.config_hash)
    assert path is not None
    document = json.loads(path.read_text())
    document["golden"][0]["text"] = "edited"  # still a valid manifest of the same config hash
    path.chmod(0o644)
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    code, data, _ = invoke(root, "verify", manifest.config_hash, "--trust", str(keys / "metadata"), "--json")
    assert code == ExitCode.TARGET_MISMATCH, data


def test_model_signing_bundle_checks_with_the_outside_tool(tmp_path: Path) -> None:
    pytest.importorskip("model_signing")
    root, store, manifest = blessed_store(tmp_path)
    keys = tmp_path / "keys"
    assert invoke(root, "trust", "init", "--keys", str(keys))[0] == 0
    code, data, stderr = invoke(root, "sign", manifest.config_hash, "--keys", str(keys), "--model-signing", "--json")
    assert code == 0, stderr
    bundle = data["model_signing"]
    assert isinstance(bundle, dict)
    assert os.stat(keys / "keys" / "model-signing-p256.key").st_mode & 0o777 == 0o600
    # The outside tool (the model_signing CLI) checks the blessed tree against the bundle...
    command = [sys.executable, "-m", "model_signing", *bundle["verify_command"].split()[1:]]
    assert subprocess.run(command, capture_output=True, text=True, check=False).returncode == 0
    # ...and refuses it once a file differs.
    blessed = store.blessed_dir(manifest)
    target = blessed / "nested" / "index.json"
    blessed.joinpath("nested").chmod(0o755)
    target.chmod(0o644)
    target.write_text('{"variant": "changed"}\n')
    assert subprocess.run(command, capture_output=True, text=True, check=False).returncode != 0


def test_signing_and_rotation_still_work_after_a_model_signing(tmp_path: Path) -> None:
    """The Model Signing pair lives in DIR/keys; bless must not take its public half for a TUF private key."""
    pytest.importorskip("model_signing")
    root, _, manifest = blessed_store(tmp_path)
    keys = tmp_path / "keys"
    assert invoke(root, "trust", "init", "--keys", str(keys))[0] == 0
    code, _, stderr = invoke(root, "sign", manifest.config_hash, "--keys", str(keys), "--model-signing")
    assert code == 0, stderr
    public = keys / "keys" / "model-signing-p256.pub.pem"
    assert public.stat().st_mode & 0o777 == 0o644
    code, _, stderr = invoke(root, "sign", manifest.config_hash, "--keys", str(keys))
    assert code == 0, stderr
    code, _, stderr = invoke(root, "sign", manifest.config_hash, "--keys", str(keys), "--model-signing")
    assert code == 0, stderr
    for role in ("targets", "root"):
        code, data, stderr = invoke(root, "trust", "rotate", "--keys", str(keys), "--role", role, "--json")
        assert code == 0, stderr
    assert data["versions"]["root"] == 3
    code, data, _ = invoke(root, "verify", manifest.config_hash, "--trust", str(keys / "metadata"), "--json")
    assert code == 0, data


def test_verify_does_not_switch_to_another_repositorys_rotated_root(tmp_path: Path) -> None:
    """The store's rollback state survives --trust pointing at another signing repository, whatever its version."""
    root, _, manifest = blessed_store(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    for keys in (a, b):
        assert invoke(root, "trust", "init", "--keys", str(keys))[0] == 0
        assert invoke(root, "sign", manifest.config_hash, "--keys", str(keys))[0] == 0
    assert invoke(root, "sign", manifest.config_hash, "--keys", str(a))[0] == 0  # A's timestamp v3
    code, data, _ = invoke(root, "verify", manifest.config_hash, "--trust", str(a / "metadata"), "--json")
    assert code == 0 and data["trust"]["versions"]["timestamp"] == 3
    code, _, stderr = invoke(root, "verify", manifest.config_hash, "--trust", str(b / "metadata"))
    assert code == ExitCode.TRUST_INVALID, stderr
    assert invoke(root, "trust", "rotate", "--keys", str(b), "--role", "targets")[0] == 0
    code, _, stderr = invoke(root, "verify", manifest.config_hash, "--trust", str(b / "metadata"))
    assert code == ExitCode.TRUST_INVALID, stderr
    assert "another root chain" in stderr and str(root / "trust") in stderr and "Traceback" not in stderr
    code, data, _ = invoke(root, "verify", manifest.config_hash, "--trust", str(a / "metadata"), "--json")
    assert code == 0 and data["trust"]["versions"] == {"root": 1, "timestamp": 3, "snapshot": 3, "targets": 3}


def test_root_expiry_is_set_at_init_and_at_rotation_not_at_sign(tmp_path: Path) -> None:
    """A rotation writes a new root version: its expiry is --root-expires there too (it is not a sign option)."""
    root = tmp_path / "root"
    keys = tmp_path / "keys"

    def root_days() -> float:
        signed = json.loads((keys / "metadata" / "root.json").read_text())["signed"]
        expires = datetime.strptime(signed["expires"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        return (expires - datetime.now(UTC)).total_seconds() / 86400

    assert invoke(root, "trust", "init", "--keys", str(keys), "--root-expires", "730d")[0] == 0
    assert 729 < root_days() <= 730
    code, data, stderr = invoke(
        root, "trust", "rotate", "--keys", str(keys), "--role", "targets", "--root-expires", "730d", "--json"
    )
    assert code == 0, stderr
    assert data["versions"]["root"] == 2 and 729 < root_days() <= 730
    code, _, stderr = invoke(root, "trust", "rotate", "--keys", str(keys), "--role", "root", "--root-expires", "1y")
    assert code == ExitCode.USAGE and "30d" in stderr
    code, _, _ = invoke(root, "sign", "0" * 64, "--keys", str(keys), "--root-expires", "730d")
    assert code == ExitCode.USAGE  # no such option of bless sign: the README must not promise one


# --- trust files are side files: no FIFO waited on, nothing read whole -------------------------------------

#: Runs the rest of argv under a 2 GiB address-space limit, so a reader of /dev/zero fails there (MemoryError).
LIMITED = (
    "import os, resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def run_bless(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """bless as a real process, under a memory limit and a timeout (a hang fails the test, not the suite)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "COLUMNS": "250"}
    env[PASSPHRASE_ENV] = TEST_PASSPHRASE
    env.pop("BLESS_ROOT", None)
    env.pop("BLESS_TRUST", None)
    return subprocess.run(
        [sys.executable, "-c", LIMITED, "-m", "bless.cli.main", "--root", str(root), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def signed_and_verified_once(tmp_path: Path) -> tuple[Path, Manifest, Path]:
    """A signed blessing, verified once under --trust (so <root>/trust holds the host's state)."""
    root, _, manifest = blessed_store(tmp_path)
    keys = tmp_path / "keys"
    assert invoke(root, "trust", "init", "--keys", str(keys))[0] == 0
    assert invoke(root, "sign", manifest.config_hash, "--keys", str(keys))[0] == 0
    assert invoke(root, "verify", manifest.config_hash, "--trust", str(keys / "metadata"))[0] == 0
    return root, manifest, keys


@pytest.mark.parametrize(
    ("where", "name", "kind"),
    [
        ("state", "timestamp.json", "fifo"),
        ("trust", "root.json", "fifo"),
        ("state", "snapshot.json", "zero"),
        ("state", "targets.json", "huge"),
        ("trust", "targets.json", "huge"),
    ],
)
def test_odd_trust_files_are_refused_without_blocking_or_reading_them_whole(
    tmp_path: Path, where: str, name: str, kind: str
) -> None:
    root, manifest, keys = signed_and_verified_once(tmp_path)
    directory = root / "trust" if where == "state" else keys / "metadata"
    target = directory / name
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "zero":
        target.symlink_to("/dev/zero")
    else:
        with target.open("wb") as handle:  # sparse: a gigabyte that costs no disk
            handle.truncate(1 << 30)
    proc = run_bless(root, "verify", manifest.config_hash, "--trust", str(keys / "metadata"))
    assert proc.returncode == ExitCode.TRUST_INVALID, proc.stderr[-2000:]
    why = {"fifo": "is a FIFO, not a regular file", "zero": "is a character device, not a regular file"}
    assert why.get(kind, "bytes it may be") in proc.stderr


# --- a signing repository that cannot be used here is the environment's fault: never "internal error" (1) ----


def test_trust_init_below_a_file_is_trust_invalid(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x\n")
    code, _, stderr = invoke(tmp_path / "root", "trust", "init", "--keys", str(tmp_path / "file" / "keys"))
    assert code == ExitCode.TRUST_INVALID, stderr
    assert "Not a directory" in stderr and "internal error" not in stderr


def test_trust_init_with_keys_a_file_is_trust_invalid(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "keys").write_text("x\n")
    code, _, stderr = invoke(tmp_path / "root", "trust", "init", "--keys", str(keys))
    assert code == ExitCode.TRUST_INVALID, stderr
    assert str(keys / "keys") in stderr and "internal error" not in stderr


def test_signing_with_the_repository_lock_a_directory_is_trust_invalid(tmp_path: Path) -> None:
    root, _, manifest = blessed_store(tmp_path)
    keys = tmp_path / "keys"
    assert invoke(root, "trust", "init", "--keys", str(keys))[0] == 0
    (keys / ".lock").mkdir()
    code, _, stderr = invoke(root, "sign", manifest.config_hash, "--keys", str(keys))
    assert code == ExitCode.TRUST_INVALID, stderr
    assert "lock of the signing repository" in stderr and "a directory" in stderr
    assert "internal error" not in stderr


def test_signing_into_metadata_this_user_cannot_write_is_trust_invalid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A metadata write refused for permissions (the tests run as root, who is never refused: faked here)."""
    root, _, manifest = blessed_store(tmp_path)
    keys = tmp_path / "keys"
    assert invoke(root, "trust", "init", "--keys", str(keys))[0] == 0

    def refused(path: Path, data: bytes) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr("bless.trust.repository.atomic_write_bytes", refused)
    code, _, stderr = invoke(root, "sign", manifest.config_hash, "--keys", str(keys))
    assert code == ExitCode.TRUST_INVALID, stderr
    assert "targets.json" in stderr and "Permission denied" in stderr and "internal error" not in stderr


def test_model_signing_with_its_bundle_dir_a_file_is_trust_invalid(tmp_path: Path) -> None:
    pytest.importorskip("model_signing")
    root, _, manifest = blessed_store(tmp_path)
    keys = tmp_path / "keys"
    assert invoke(root, "trust", "init", "--keys", str(keys))[0] == 0
    (keys / "model-signing").write_text("x\n")
    code, _, stderr = invoke(root, "sign", manifest.config_hash, "--keys", str(keys), "--model-signing")
    assert code == ExitCode.TRUST_INVALID, stderr
    assert str(keys / "model-signing") in stderr and "internal error" not in stderr
