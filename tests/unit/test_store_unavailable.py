"""A store that cannot be used here (a file where a directory belongs, a lock that cannot be opened) is
the environment's fault: exit 17, naming the path, never "internal error (a bug)", "invalid manifest"
or "verification failed"."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from bless.cli.main import app
from bless.errors import ExitCode, StoreUnavailableError
from bless.flows.serve.start_lock import StartingLock
from bless.store import Store
from bless.system.os_refusals import os_errors
from bless.trust import init_repository
from tests.support.trust_keys import TEST_KEYS
from tests.unit.store_helpers import make_factors, make_manifest, write_tree

HASH = "a" * 64


def cli(root: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["--root", str(root), *args])
    return result.exit_code, result.output


def test_gc_with_locks_a_file_is_store_unavailable(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "locks").write_text("not a dir\n")
    code, output = cli(root, "gc")
    assert code == ExitCode.STORE_UNAVAILABLE, output
    assert "locks" in output and "internal error" not in output


@pytest.mark.parametrize("command", [["gc"], ["list"]])
def test_a_root_below_a_file_is_store_unavailable(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "file").write_text("x\n")
    code, output = cli(tmp_path / "file" / "root", *command)
    assert code == ExitCode.STORE_UNAVAILABLE, output
    assert "invalid manifest" not in output and "internal error" not in output


@pytest.mark.parametrize("kind", ["symlink", "directory"])
def test_an_odd_lock_file_is_store_unavailable(tmp_path: Path, kind: str) -> None:
    store = Store(tmp_path / "root")
    staged = write_tree(store.new_staging_dir("run1") / "cache", "a")
    manifest = make_manifest(staged, make_factors("tiny"), dir_id="20240101T000000Z-000000000001")
    store.publish(staged, manifest)
    lock = store.root / "locks" / f"{manifest.config_hash}.lock"
    lock.unlink()
    if kind == "symlink":
        lock.symlink_to(tmp_path / "elsewhere")
    else:
        lock.mkdir()
    code, output = cli(store.root, "gc")
    assert code == ExitCode.STORE_UNAVAILABLE, output
    assert kind in output and "verification failed" not in output


def test_the_serve_start_lock_below_a_file_is_store_unavailable(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    store.root.mkdir()
    (store.root / "locks").write_text("x\n")
    with pytest.raises(StoreUnavailableError, match="start lock"), StartingLock(store, "engine"):
        pass


def test_a_leases_dir_that_is_a_file_is_store_unavailable(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    store.root.mkdir()
    store.paths.leases.write_text("x\n")
    with pytest.raises(StoreUnavailableError, match="leases"), os_errors(f"taking a lease in {store.paths.leases}"):
        store.leases.acquire(HASH, "20240101T000000Z-000000000001", name="engine")


def test_publishing_into_a_blessed_dir_that_is_a_file_is_store_unavailable(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    staged = write_tree(store.new_staging_dir("run1") / "cache", "a")
    manifest = make_manifest(staged, make_factors("tiny"), dir_id="20240101T000000Z-000000000001")
    (store.paths.blessed / manifest.config_hash).write_text("x\n")
    with pytest.raises(StoreUnavailableError, match="publishing"):
        store.publish(staged, manifest)


def test_keeping_rejected_evidence_that_cannot_be_written_is_store_unavailable(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    staged = write_tree(store.new_staging_dir("run1") / "cache", "a")

    def directory_in_the_way(point: str) -> None:
        # A directory where summary.md goes: the write's rename fails (EISDIR), as on a hostile store.
        if point == "reject-write-summary":
            (partial,) = (store.paths.rejected / HASH).glob(".partial-*")
            (partial / "summary.md").mkdir()

    with pytest.raises(StoreUnavailableError, match="rejected evidence"):
        store.reject(
            staged,
            config_hash=HASH,
            run_id="run1",
            candidate=0,
            summary_md="no\n",
            evidence={},
            fault=directory_in_the_way,
        )


def test_verify_trust_with_the_trust_lock_a_directory_is_store_unavailable(tmp_path: Path) -> None:
    """``<root>/trust.lock`` (StorePaths.trust_lock) opened like every store lock: a directory there is 17."""
    store = Store(tmp_path / "root")
    staged = write_tree(store.new_staging_dir("run1") / "cache", "a")
    manifest = make_manifest(staged, make_factors("tiny"), dir_id="20240101T000000Z-000000000001")
    store.publish(staged, manifest)
    keys = tmp_path / "keys"
    init_repository(keys, sources=TEST_KEYS)
    store.paths.trust_lock.mkdir()
    code, output = cli(store.root, "verify", manifest.config_hash, "--trust", str(keys / "metadata"))
    assert code == ExitCode.STORE_UNAVAILABLE, output
    assert "trust.lock" in output and "a directory" in output and "internal error" not in output
