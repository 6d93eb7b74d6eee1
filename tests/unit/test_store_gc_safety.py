"""gc fails closed: a lost record of manifests dirs, symlinks planted in the store, another path to
the root, a leased tree behind a publish marker, hostile side files and odd lock files never make it
remove what a blessing or a running server needs, nor anything outside the store."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from filelock import FileLock
from typer.testing import CliRunner

from bless.cli.main import app
from bless.core.manifest import Manifest
from bless.core.verify import verify_tree
from bless.errors import ExitCode, StoreUnavailableError, VerifyFailedError
from bless.store import Store
from bless.store.layout import PUBLISHING_PREFIX
from bless.system.json_files import JSON_SIDE_FILE_MAX, UnreadableJsonError, load_json_object, read_json_object
from bless.system.trees import remove_tree
from tests.unit.store_helpers import held_lease, make_factors, make_manifest, write_tree

OLD_ID = "20240101T000000Z-000000000001"
NEW_ID = "20240102T000000Z-000000000002"


def publish(store: Store, run_id: str, variant: str, dir_id: str) -> Manifest:
    staged = write_tree(store.new_staging_dir(run_id) / "cache", variant)
    manifest = make_manifest(staged, make_factors("tiny"), dir_id=dir_id)
    store.publish(staged, manifest)
    return manifest


def superseded(tmp_path: Path) -> tuple[Store, Manifest, Manifest]:
    """A store whose first version was superseded by a rebless: gc's garbage, normally."""
    store = Store(tmp_path / "root")
    return store, publish(store, "run1", "old", OLD_ID), publish(store, "run2", "new", NEW_ID)


def make_old(path: Path, seconds: float = 7200) -> None:
    stamp = time.time() - seconds
    os.utime(path, (stamp, stamp), follow_symlinks=False)


def victim(tmp_path: Path) -> Path:
    """A directory outside the store that must survive gc, with old subdirs gc would take for its own."""
    outside = tmp_path / "victim"
    for name in ("precious", OLD_ID, "staging-run"):
        (outside / name).mkdir(parents=True)
        (outside / name / "data.txt").write_text("keep me\n")
        make_old(outside / name)
    return outside


def untouched(outside: Path) -> bool:
    return all((outside / name / "data.txt").read_text() == "keep me\n" for name in ("precious", OLD_ID, "staging-run"))


def gc_cli(root: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["--root", str(root), "gc", *args])
    return result.exit_code, result.output


# ------------------------------------------------------------------ the record of manifests dirs


@pytest.mark.parametrize("content", [b"{", b"[]", b'{"dirs": "nope"}', b'{"dirs": [1]}', b"[" * 100_000])
def test_a_corrupt_record_of_manifests_dirs_keeps_every_blessed_version(tmp_path: Path, content: bytes) -> None:
    store, old, new = superseded(tmp_path)
    record = store.root / "state" / "manifests-dirs.json"
    record.write_bytes(content)

    report = store.gc(keep=0)
    assert not any(action.path.is_relative_to(store.root / "blessed") for action in report.actions)
    assert store.blessed_dir(old).is_dir() and store.blessed_dir(new).is_dir()
    assert any(str(record) in note and "none is removed" in note for note in report.notes), report.notes
    # Rewriting it would forget the dirs it lists: publish and forget refuse until it is repaired.
    with pytest.raises(VerifyFailedError, match=r"manifests-dirs\.json") as refused:
        publish(store, "run3", "third", "20240103T000000Z-000000000003")
    assert refused.value.details["reason"] == "store_state"
    with pytest.raises(VerifyFailedError):
        store.forget_manifests_dir(tmp_path / "gone")
    assert record.read_bytes() == content


def test_a_record_that_is_a_fifo_or_a_symlink_keeps_every_blessed_version(tmp_path: Path) -> None:
    store, old, _ = superseded(tmp_path)
    record = store.root / "state" / "manifests-dirs.json"
    record.unlink()
    os.mkfifo(record)
    assert store.gc(keep=0).actions == ()
    record.unlink()
    (tmp_path / "elsewhere.json").write_text('{"version": 1, "dirs": []}')
    record.symlink_to(tmp_path / "elsewhere.json")
    assert store.gc(keep=0).actions == ()
    assert store.blessed_dir(old).is_dir()


def test_a_missing_record_keeps_blessed_versions_until_a_publish_writes_it(tmp_path: Path) -> None:
    store, old, new = superseded(tmp_path)
    record = store.root / "state" / "manifests-dirs.json"
    assert json.loads(record.read_text())["dirs"] == []  # written even for root/manifests alone
    record.unlink()

    report = store.gc(keep=0)
    assert not any(action.path.is_relative_to(store.root / "blessed") for action in report.actions)
    assert any(str(record) in note and "missing" in note for note in report.notes), report.notes
    code, output = gc_cli(store.root)
    assert code == 0 and "missing" in output and store.blessed_dir(old).is_dir()

    third = publish(store, "run3", "third", "20240103T000000Z-000000000003")
    removed = {action.path for action in store.gc(keep=0).actions}
    assert {store.blessed_dir(old), store.blessed_dir(new)} <= removed
    assert store.blessed_dir(third).is_dir()


def test_a_store_without_blessed_versions_needs_no_record(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    (store.root / "blessed").mkdir(parents=True)
    report = store.gc(keep=0)
    assert report.notes == ()


# ----------------------------------------------------------------------------- planted symlinks


@pytest.mark.parametrize("where", ["blessed-hash", "rejected-hash", "serve", "staging", "runs", "blessed"])
def test_gc_never_follows_a_symlink_in_the_store(tmp_path: Path, where: str) -> None:
    store, old, new = superseded(tmp_path)
    outside = victim(tmp_path)
    root = store.root
    link = {
        "blessed-hash": root / "blessed" / ("e" * 64),
        "rejected-hash": root / "rejected" / ("f" * 64),
        "serve": root / "serve",
        "staging": root / "staging",
        "runs": root / "runs",
        "blessed": root / "blessed",
    }[where]
    if where == "blessed":
        (root / "blessed").rename(tmp_path / "real-blessed")
        outside = tmp_path / "real-blessed"
    elif link.exists():
        remove_tree(link)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside)

    code, output = gc_cli(root, "--keep", "0")
    assert code == 0, output
    assert "symlink" in output
    assert link.is_symlink()
    if where == "blessed":
        # The planted blessed/ leads to the real trees: gc must not remove through it either.
        assert (outside / old.config_hash / old.cache.dir_id).is_dir()
        assert (outside / new.config_hash / new.cache.dir_id).is_dir()
    else:
        assert untouched(outside)


def test_gc_leaves_symlinked_entries_and_names_that_are_not_dir_ids(tmp_path: Path) -> None:
    store, old, new = superseded(tmp_path)
    outside = victim(tmp_path)
    hash_dir = store.root / "blessed" / old.config_hash
    hash_dir.chmod(0o755)
    stray = hash_dir / "not-a-dir-id"
    stray.mkdir()
    (stray / "data.txt").write_text("mine\n")
    (hash_dir / "20240101T000000Z-00000000000f").symlink_to(outside / OLD_ID)
    serve_link = store.root / "serve" / "tiny-old"
    serve_link.parent.mkdir(parents=True, exist_ok=True)
    serve_link.symlink_to(outside / "precious")
    make_old(serve_link)

    removed = {action.path for action in store.gc(keep=0).actions}
    assert store.blessed_dir(old) in removed
    assert (stray / "data.txt").read_text() == "mine\n"
    assert serve_link.is_symlink() and untouched(outside)
    assert store.blessed_dir(new).is_dir()


def test_remove_tree_within_refuses_a_path_through_a_symlink(tmp_path: Path) -> None:
    outside = victim(tmp_path)
    base = tmp_path / "base"
    base.mkdir()
    (base / "link").symlink_to(outside)
    with pytest.raises(OSError, match="symlink"):
        remove_tree(base / "link" / "precious", within=base)
    with pytest.raises(OSError, match="symlink"):
        remove_tree(base / "link", within=base)
    assert untouched(outside)


# -------------------------------------------------------------------- leases, by identity


def test_gc_keeps_a_serve_dir_leased_through_another_path_to_the_root(tmp_path: Path) -> None:
    store, old, _ = superseded(tmp_path)
    link = tmp_path / "root-link"
    link.symlink_to(store.root)
    serve_dir = link / "serve" / "tiny-x"
    serve_dir.mkdir(parents=True)
    make_old(store.root / "serve" / "tiny-x")
    with held_lease(Store(link), old, name="srv", serve_dir=serve_dir):
        removed = {action.path for action in store.gc(keep=0).actions}
        assert store.root / "serve" / "tiny-x" not in removed
        assert serve_dir.is_dir() and store.blessed_dir(old).is_dir()


def test_recovery_keeps_a_leased_tree_behind_a_publish_marker(tmp_path: Path) -> None:
    store, old, new = superseded(tmp_path)
    marker = store.root / "blessed" / old.config_hash / f"{PUBLISHING_PREFIX}{old.cache.dir_id}"
    marker.write_bytes(b"")
    with held_lease(store, old, name="srv"):
        store.gc(keep=5)
        assert verify_tree(store.blessed_dir(old), old.cache.files, old.cache.dirs).ok
    assert verify_tree(store.blessed_dir(new), new.cache.files, new.cache.dirs).ok


# ------------------------------------------------------------------------------ side files


def nested(depth: int = 100_000) -> bytes:
    return b"[" * depth + b"]" * depth


def test_the_side_file_reader_refuses_what_could_hang_or_crash_it(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_bytes(nested())
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    huge = tmp_path / "huge.json"
    with huge.open("wb") as handle:
        handle.truncate(JSON_SIDE_FILE_MAX + 1)
    results: dict[str, object] = {}

    def read_all() -> None:
        for path in (deep, fifo, zero, huge):
            results[path.name] = read_json_object(path)

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "the reader blocked (a FIFO?)"
    assert results == {"deep.json": None, "fifo.json": None, "zero.json": None, "huge.json": None}
    for path in (deep, fifo, zero, huge):
        with pytest.raises(UnreadableJsonError):
            load_json_object(path)
    assert load_json_object(tmp_path / "missing.json") is None


def test_hostile_claims_caches_and_lease_files_do_not_break_commands(tmp_path: Path) -> None:
    store, old, new = superseded(tmp_path)
    claims = sorted((store.root / "state").glob("claims-*.json"))
    assert claims
    for path in claims:
        path.write_bytes(nested())
    runner = CliRunner()
    for command in (["list"], ["verify", new.config_hash]):
        result = runner.invoke(app, ["--root", str(store.root), *command])
        assert result.exit_code == 0, result.output
    # A lease that cannot be read is honoured: what it may protect stays.
    lease_dir = store.root / "leases" / old.config_hash / old.cache.dir_id
    lease_dir.mkdir(parents=True)
    (lease_dir / "0123456789abcdef.json").write_bytes(nested())
    code, output = gc_cli(store.root, "--keep", "0")
    assert code == 0, output
    assert store.blessed_dir(old).is_dir()


# ------------------------------------------------------------------------------ lock files


@pytest.mark.parametrize("kind", ["symlink", "directory"])
def test_an_odd_lock_file_is_a_documented_refusal(tmp_path: Path, kind: str) -> None:
    store, old, _ = superseded(tmp_path)
    lock = store.root / "locks" / f"{old.config_hash}.lock"
    lock.unlink()
    if kind == "symlink":
        lock.symlink_to(tmp_path / "elsewhere")
    else:
        lock.mkdir()
    code, output = gc_cli(store.root)
    assert code == ExitCode.STORE_UNAVAILABLE, output
    assert kind in output and "remove" in output
    assert "internal error" not in output


def test_odd_lease_guard_and_record_locks_are_documented_refusals(tmp_path: Path) -> None:
    store, old, _ = superseded(tmp_path)
    guard = store.root / "leases" / old.config_hash / ".lock"
    guard.parent.mkdir(parents=True, exist_ok=True)
    guard.unlink(missing_ok=True)
    guard.symlink_to(tmp_path / "elsewhere")
    code, output = gc_cli(store.root)
    assert code == ExitCode.STORE_UNAVAILABLE, output
    assert "symlink" in output and "internal error" not in output

    record_lock = store.root / "state" / "manifests-dirs.json.lock"
    record_lock.unlink(missing_ok=True)
    record_lock.mkdir()
    with pytest.raises(StoreUnavailableError, match="directory") as refused:
        publish(store, "run3", "third", "20240103T000000Z-000000000003")
    assert refused.value.details["reason"] == "store_lock"


def test_a_lock_that_cannot_be_opened_is_a_documented_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _, _ = superseded(tmp_path)

    def denied(self: FileLock, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(self.lock_file))

    monkeypatch.setattr(FileLock, "acquire", denied)
    code, output = gc_cli(store.root, "--dry-run")
    assert code == ExitCode.STORE_UNAVAILABLE, output
    assert "Permission denied" in output and "internal error" not in output
