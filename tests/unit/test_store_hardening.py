"""Store hardening: gc across manifests dirs, exact names, explicit modes, lookups that read little."""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bless.cli.main import app
from bless.core.manifest import Manifest
from bless.core.verify import verify_tree
from bless.errors import InputInvalidError, ManifestDuplicateError, ManifestInvalidError, VerifyFailedError
from bless.store import Store
from bless.store.scan import ManifestReader
from bless.system.procid import process_identity
from tests.unit.store_helpers import make_factors, make_manifest, start_child, write_tree


def stage(store: Store, run_id: str, variant: str) -> Path:
    return write_tree(store.new_staging_dir(run_id) / "cache", variant)


def publish(store: Store, run_id: str, variant: str, name: str = "tiny", dir_id: str | None = None) -> Manifest:
    staged = stage(store, run_id, variant)
    manifest = make_manifest(staged, make_factors(name), dir_id=dir_id)
    store.publish(staged, manifest)
    return manifest


def intact(store: Store, manifest: Manifest) -> bool:
    return verify_tree(store.blessed_dir(manifest), manifest.cache.files, manifest.cache.dirs).ok


# ------------------------------------------------------------ gc and separate manifests dirs


def test_gc_without_the_manifests_dir_keeps_trees_it_references(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout" / "manifests"
    root = tmp_path / "root"
    with_dir = Store(root, checkout)
    old = publish(with_dir, "run1", "old", dir_id="20240101T000000Z-000000000001")
    new = publish(with_dir, "run2", "new", dir_id="20240102T000000Z-000000000002")

    # The documented workflow: gc run without --manifests-dir must not delete the live tree.
    report = Store(root).gc(keep=0)
    removed = {action.path for action in report.actions}
    assert with_dir.blessed_dir(new) not in removed
    assert intact(with_dir, new)
    # The superseded version is still garbage, found through the recorded dir.
    assert with_dir.blessed_dir(old) in removed


def test_gc_keeps_every_version_while_a_recorded_manifests_dir_is_unreadable(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout" / "manifests"
    root = tmp_path / "root"
    with_dir = Store(root, checkout)
    old = publish(with_dir, "run1", "old", dir_id="20240101T000000Z-000000000001")
    new = publish(with_dir, "run2", "new", dir_id="20240102T000000Z-000000000002")
    checkout.rename(tmp_path / "elsewhere")

    report = Store(root).gc(keep=0)
    assert not any(action.path.is_relative_to(root / "blessed") for action in report.actions)
    assert any(str(checkout) in note and "--forget-manifests-dir" in note for note in report.notes)
    assert with_dir.blessed_dir(old).is_dir() and with_dir.blessed_dir(new).is_dir()

    # Once the operator says that dir is gone for good, gc goes back to normal.
    assert Store(root).forget_manifests_dir(checkout)
    removed = {action.path for action in Store(root).gc(keep=0).actions}
    assert {with_dir.blessed_dir(old), with_dir.blessed_dir(new)} <= removed


def test_gc_refuses_while_a_manifest_in_a_recorded_dir_is_invalid(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    root = tmp_path / "root"
    manifest = publish(Store(root, checkout), "run1", "a")
    (checkout / "broken.json").write_text("{")
    with pytest.raises(ManifestInvalidError, match=r"broken\.json"):
        Store(root).gc(keep=0)
    assert intact(Store(root), manifest)


# ------------------------------------------------------------------------------ exact names


@pytest.mark.parametrize("suffix", ["\n", "\r\n", " "])
def test_a_dir_id_with_a_trailing_newline_is_refused(tmp_path: Path, suffix: str) -> None:
    store = Store(tmp_path / "root")
    manifest = make_manifest(write_tree(tmp_path / "tree"))
    bad = dataclasses.replace(
        manifest, cache=dataclasses.replace(manifest.cache, dir_id=manifest.cache.dir_id + suffix)
    )
    with pytest.raises(ManifestInvalidError, match="dir_id"):
        store.blessed_dir(bad)
    bad_hash = dataclasses.replace(manifest, config_hash=manifest.config_hash + suffix)
    with pytest.raises(ManifestInvalidError, match="config hash"):
        store.blessed_dir(bad_hash)


def test_hashes_and_run_ids_with_a_trailing_newline_are_refused(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    with pytest.raises(InputInvalidError):
        store.find("a" * 64 + "\n")
    with pytest.raises(InputInvalidError):
        store.new_staging_dir("run\n")
    assert not (tmp_path / "root" / "staging" / "run\n").exists()


# -------------------------------------------------------------------- modes, whatever the umask


@pytest.fixture
def open_umask() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.usefixtures("open_umask")
def test_store_dirs_and_files_ignore_the_umask(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    manifest = publish(store, "run1", "a")
    for directory in ("", "manifests", "blessed", "staging", "archive", "rejected", "locks", "state"):
        assert mode(store.root / directory) == 0o755, directory
    assert mode(store.root / "blessed" / manifest.config_hash) == 0o755
    assert mode(store.blessed_dir(manifest)) == 0o555
    assert mode(store.root / "locks" / f"{manifest.config_hash}.lock") == 0o644
    path = store.manifest_path(manifest.config_hash)
    assert path is not None and mode(path) == 0o644
    rejected = store.reject(
        stage(store, "run2", "b"),
        config_hash=manifest.config_hash,
        run_id="run2",
        candidate=1,
        summary_md="",
        evidence={},
    )
    assert mode(rejected) == 0o755 and mode(rejected.parent) == 0o755


# ------------------------------------------------------------- lookups validate only candidates


class CountingReader(ManifestReader):
    """The real reader, recording which files it read cheaply and which it validated."""

    def __init__(self) -> None:
        super().__init__()
        self.claimed: list[str] = []
        self.loaded: list[str] = []

    def claim(self, path: Path) -> str | None:
        self.claimed.append(path.name)
        return super().claim(path)

    def read(self, path: Path) -> tuple[Manifest, bytes]:
        self.loaded.append(path.name)
        return super().read(path)


def test_a_lookup_does_not_validate_an_unrelated_large_manifest(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    big_tree = store.new_staging_dir("big") / "cache"
    for index in range(2000):
        (big_tree / f"d{index % 20}").mkdir(parents=True, exist_ok=True)
        (big_tree / f"d{index % 20}" / f"f{index}.bin").write_bytes(b"x")
    big = make_manifest(big_tree, make_factors("big"))
    store.publish(big_tree, big)
    small = publish(store, "small", "a", name="small")
    big_name, small_name = f"{big.config_hash}.json", f"{small.config_hash}.json"

    # Warm: the publisher told the index what each file claims; the big file is not even opened.
    reader = CountingReader()
    found = Store(store.root, reader=reader).find(small.config_hash)
    assert found is not None and found.config_hash == small.config_hash
    assert reader.loaded == [small_name]
    assert big_name not in reader.claimed

    # Cold (no index cache): the big file's claim is read, but it is not schema-validated.
    for cache in (store.root / "state").glob("claims-*.json"):
        cache.unlink()
    reader = CountingReader()
    assert Store(store.root, reader=reader).find(small.config_hash) is not None
    assert reader.loaded == [small_name]
    assert big_name in reader.claimed

    # And the claim read then is remembered for the next command.
    reader = CountingReader()
    assert Store(store.root, reader=reader).find(small.config_hash) is not None
    assert reader.claimed == [] and reader.loaded == [small_name]

    # Content is the truth: a changed file is read again, and a copy claiming the hash is caught.
    (store.manifests_dir / "zz-copy.json").write_bytes((store.manifests_dir / small_name).read_bytes())
    with pytest.raises(ManifestDuplicateError, match="claim config hash"):
        Store(store.root).find(small.config_hash)


@pytest.mark.parametrize("where", ["root", "manifests", "manifest", "blessed", "hash dir", "tree"])
def test_verify_refuses_a_store_writable_by_others(tmp_path: Path, where: str) -> None:
    store = Store(tmp_path / "root")
    manifest = publish(store, "run1", "a")
    store.check_permissions(manifest)  # as published: fine
    manifest_path = store.manifest_path(manifest.config_hash)
    assert manifest_path is not None
    target = {
        "root": store.root,
        "manifests": store.manifests_dir,
        "manifest": manifest_path,
        "blessed": store.root / "blessed",
        "hash dir": store.root / "blessed" / manifest.config_hash,
        "tree": store.blessed_dir(manifest),
    }[where]
    target.chmod(mode(target) | stat.S_IWOTH)
    with pytest.raises(VerifyFailedError, match="writable by other") as info:
        store.check_permissions(manifest)
    assert info.value.exit_code == 21
    assert info.value.details["reason"] == "store_permissions"
    assert str(target) in info.value.message

    runner = CliRunner()
    result = runner.invoke(app, ["--root", str(store.root), "verify", manifest.config_hash, "--json"])
    assert result.exit_code == 21, result.output
    assert "chmod go-w" in result.output


def test_verify_refuses_a_group_writable_manifests_dir_and_a_symlinked_blessed_dir(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    manifest = publish(store, "run1", "a")
    store.manifests_dir.chmod(0o775)
    with pytest.raises(VerifyFailedError, match="writable by its group"):
        store.check_permissions(manifest)
    store.manifests_dir.chmod(0o755)
    (store.root / "blessed").rename(tmp_path / "real-blessed")
    (store.root / "blessed").symlink_to(tmp_path / "real-blessed")
    with pytest.raises(VerifyFailedError, match="symlink"):
        store.check_permissions(manifest)


def test_a_blessed_tree_replaced_by_a_symlink_is_named_as_such(tmp_path: Path) -> None:
    """Its mode is fine; saying "writable by other users" sent the operator to chmod the wrong thing."""
    store = Store(tmp_path / "root")
    manifest = publish(store, "run1", "a")
    tree = store.blessed_dir(manifest)
    tree.parent.chmod(0o755)
    tree.rename(tmp_path / "elsewhere")
    tree.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(VerifyFailedError, match="replaced by a symlink") as info:
        store.check_permissions(manifest)
    assert "writable by other users" not in info.value.message
    assert "chmod" not in (info.value.hint or "")
    assert str(tree) in info.value.message


def test_listing_does_not_open_a_manifest_validated_before_and_unchanged(tmp_path: Path) -> None:
    """bless list took 69 s beside a 1M-entry manifest: a file validated once and unchanged is not read again."""
    store = Store(tmp_path / "root")
    big_tree = store.new_staging_dir("big") / "cache"
    for index in range(2000):
        (big_tree / f"d{index % 20}").mkdir(parents=True, exist_ok=True)
        (big_tree / f"d{index % 20}" / f"f{index}.bin").write_bytes(b"x")
    big = make_manifest(big_tree, make_factors("big"))
    store.publish(big_tree, big)
    small = publish(store, "small", "a", name="small")
    big_name = f"{big.config_hash}.json"

    # Published here: the publisher validated both, so the listing opens neither.
    reader = CountingReader()
    listed = Store(store.root, reader=reader).listing()
    assert reader.loaded == [] and reader.claimed == []
    rows = {r.summary["config_hash"]: r.summary for r in listed.records if r.summary is not None}
    assert rows[big.config_hash]["files"] == 2000 and rows[small.config_hash]["dir_id"] == small.cache.dir_id

    # Copied in (a git checkout): validated once, by the first listing, then not again.
    (store.manifests_dir / big_name).rename(tmp_path / big_name)
    shutil.copyfile(tmp_path / big_name, store.manifests_dir / big_name)
    for rounds, expected in ((1, [big_name]), (2, [])):
        reader = CountingReader()
        Store(store.root, reader=reader).listing()
        assert reader.loaded == expected, rounds

    # Changed: read again, and an invalid one is listed as invalid.
    (store.manifests_dir / big_name).write_text("{}")
    reader = CountingReader()
    listed = Store(store.root, reader=reader).listing()
    assert reader.loaded == [big_name]
    assert [r.path.name for r in listed.invalid] == [big_name]


def test_one_store_validates_an_unchanged_manifest_once(tmp_path: Path) -> None:
    """show and verify look a blessing up two or three times: a 1M-file manifest was validated each time."""
    store = Store(tmp_path / "root")
    manifest = publish(store, "run1", "a")
    first = store.find(manifest.config_hash)
    assert first is not None
    assert store.find(manifest.config_hash) is first, "the same validation, remembered"
    path = store.manifest_path(manifest.config_hash)
    assert path is not None
    path.chmod(path.stat().st_mode)  # a new ctime: another identity, read again
    again = store.find(manifest.config_hash)
    assert again is not first and again == first


# ------------------------------------------------------------------------------- serving leases


def make_old(path: Path, seconds: float) -> None:
    stamp = time.time() - seconds
    os.utime(path, (stamp, stamp))


def test_gc_keeps_a_superseded_tree_while_a_server_holds_a_lease_and_drops_a_crashed_servers_lease(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "root")
    served = publish(store, "run1", "old", dir_id="20240101T000000Z-000000000001")
    serve_dir = store.root / "serve" / "tiny-20240101T000000Z-abc123"
    serve_dir.mkdir(parents=True)
    make_old(serve_dir, 7200)
    server = start_child("hold-lease", str(store.root), served.config_hash, str(serve_dir), "60")
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "leased"
        live = publish(store, "run2", "new", dir_id="20240102T000000Z-000000000002")  # rebless supersedes it

        report = store.gc(keep=0)
        assert report.actions == ()
        assert any("being served by 'child'" in note for note in report.notes), report.notes
        assert intact(store, served) and intact(store, live)
        assert serve_dir.is_dir()  # the running serve's scratch dir too
        (lease,) = store.leases.leases(served.config_hash)
        assert lease.alive is True and lease.serve_dir == str(serve_dir)
    finally:
        server.kill()  # a crash: the lease file stays behind
        server.wait()

    (stale,) = store.leases.leases(served.config_hash)
    assert stale.alive is False
    removed = {action.path for action in store.gc(keep=0).actions}
    assert {stale.path, store.blessed_dir(served), serve_dir} <= removed
    assert intact(store, live)
    assert store.leases.leases() == []


def test_a_lease_whose_pid_was_recycled_is_stale_and_one_from_another_host_is_honoured(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    served = publish(store, "run1", "old", dir_id="20240101T000000Z-000000000001")
    publish(store, "run2", "new", dir_id="20240102T000000Z-000000000002")
    recycled = {**process_identity(), "proc_start": -1}  # this pid, but another process's start time
    store.leases.acquire(served.config_hash, served.cache.dir_id, name="recycled", holder=recycled)
    elsewhere = {**process_identity(), "host": "another-host"}
    remote = store.leases.acquire(served.config_hash, served.cache.dir_id, name="remote", holder=elsewhere)
    assert {lease.name: lease.alive for lease in store.leases.leases()} == {"recycled": False, "remote": None}

    report = store.gc(keep=0)
    assert store.blessed_dir(served).is_dir()  # the other host's server may be serving it
    assert [lease.name for lease in store.leases.leases()] == ["remote"]
    assert any("being served by 'remote'" in note for note in report.notes)

    store.leases.release(remote)
    assert store.blessed_dir(served) in {action.path for action in store.gc(keep=0).actions}


def test_gc_removes_stale_serve_dirs_and_the_logs_of_removed_versions(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    first_tree = stage(store, "run1", "old")
    first = make_manifest(first_tree, dir_id="20240101T000000Z-000000000001")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "bootstrap.log").write_text("compiled\n")
    first_logs = store.keep_run_logs("run1", store.publish(first_tree, first), [logs / "bootstrap.log"])
    second_tree = stage(store, "run2", "new")
    second = make_manifest(second_tree, dir_id="20240102T000000Z-000000000002")
    second_logs = store.keep_run_logs("run2", store.publish(second_tree, second), [logs / "bootstrap.log"])
    unrecorded_old = store.root / "runs" / "legacy-old"
    unrecorded_new = store.root / "runs" / "legacy-new"
    for path in (unrecorded_old, unrecorded_new):
        path.mkdir()
        (path / "bootstrap.log").write_text("x\n")
    make_old(unrecorded_old, 40 * 24 * 3600)
    stale_serve = store.root / "serve" / "tiny-20240101T000000Z-aaaaaa"
    fresh_serve = store.root / "serve" / "tiny-20240102T000000Z-bbbbbb"
    for path in (stale_serve, fresh_serve):
        (path / "upper").mkdir(parents=True)
        (path / "engine.log").write_text("served\n")
    make_old(stale_serve, 7200)

    planned = {action.path for action in store.gc(keep=0, dry_run=True).actions}
    assert planned == {store.blessed_dir(first), first_logs, unrecorded_old, stale_serve}
    assert all(path.exists() for path in planned)
    removed = {action.path for action in store.gc(keep=0).actions}
    assert removed == planned
    assert not any(path.exists() for path in removed)
    assert second_logs.is_dir() and unrecorded_new.is_dir() and fresh_serve.is_dir()
    assert intact(store, second)


def test_a_detached_servers_lease_is_handed_to_the_engine_and_released_by_name(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    served = publish(store, "run1", "old", dir_id="20240101T000000Z-000000000001")
    publish(store, "run2", "new", dir_id="20240102T000000Z-000000000002")
    engine = start_child("hold-lock", str(store.root), "0" * 64, "60")  # any long-lived process
    try:
        assert engine.stdout is not None and engine.stdout.readline().strip() == "locked"
        lease = store.leases.acquire(served.config_hash, served.cache.dir_id, name="bless-serve-tiny")
        lease = store.leases.hand_over(lease, process_identity(engine.pid))
        assert lease.alive is True and lease.holder is not None and lease.holder["pid"] == engine.pid
        store.gc(keep=0)
        assert intact(store, served)  # serve-full exited, but its engine still runs
        assert [released.path for released in store.leases.release_named("bless-serve-tiny")] == [lease.path]
        assert store.blessed_dir(served) in {action.path for action in store.gc(keep=0).actions}
    finally:
        engine.kill()
        engine.wait()


def test_a_lookup_never_creates_directories_in_the_store(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    manifest = make_manifest(write_tree(tmp_path / "tree"))
    (checkout / f"{manifest.config_hash}.json").write_bytes(manifest.to_json_bytes())
    root = tmp_path / "root"
    root.mkdir()
    assert Store(root, checkout).find(manifest.config_hash) == manifest
    assert list(root.iterdir()) == []  # e.g. root reading a user's store must not leave root-owned dirs


def test_push_refuses_a_blessing_whose_tree_is_group_writable(tmp_path: Path) -> None:
    """Push verifies like verify does: a tree others can replace is refused before any upload."""
    from bless.flows.push import push_blessing
    from bless.oci.client import parse_reference

    store = Store(tmp_path / "root")
    manifest = publish(store, "run1", "a")
    tree = store.blessed_dir(manifest)
    tree.chmod(mode(tree) | stat.S_IWGRP)
    # Nothing listens there: the refusal must come before any connection.
    with pytest.raises(VerifyFailedError, match="writable by its group") as info:
        push_blessing(store, manifest, parse_reference("127.0.0.1:9/caches/tiny:v1"), plain_http=True)
    assert info.value.exit_code == 21
    assert info.value.details["reason"] == "store_permissions"


@pytest.mark.parametrize("bit", [stat.S_ISGID, stat.S_ISVTX, stat.S_ISUID], ids=["setgid", "sticky", "setuid"])
@pytest.mark.parametrize("where", ["manifest", "blessed", "hash dir"])
def test_verify_refuses_a_special_bit_on_a_store_path_bless_makes_exactly(tmp_path: Path, where: str, bit: int) -> None:
    store = Store(tmp_path / "root")
    manifest = publish(store, "run1", "a")
    manifest_path = store.manifest_path(manifest.config_hash)
    assert manifest_path is not None
    target = {
        "manifest": manifest_path,
        "blessed": store.root / "blessed",
        "hash dir": store.root / "blessed" / manifest.config_hash,
    }[where]
    target.chmod(mode(target) | bit)
    with pytest.raises(VerifyFailedError, match="setuid, setgid or sticky") as info:
        store.check_permissions(manifest)
    assert info.value.exit_code == 21
    assert info.value.details["reason"] == "store_permissions"
    assert str(target) in info.value.message
    assert "chmod u-s,g-s,-t" in (info.value.hint or "")


@pytest.mark.parametrize("bit", [stat.S_ISGID, stat.S_ISVTX], ids=["setgid", "sticky"])
@pytest.mark.parametrize("where", ["root", "manifests"])
def test_a_setgid_or_sticky_store_root_or_manifests_dir_is_accepted(tmp_path: Path, where: str, bit: int) -> None:
    """An operator's setgid shared directory: the bit lets nobody replace an entry, the write bits decide that."""
    store = Store(tmp_path / "root")
    manifest = publish(store, "run1", "a")
    target = store.root if where == "root" else store.manifests_dir
    target.chmod(mode(target) | bit)
    store.check_permissions(manifest)
    target.chmod(mode(target) | stat.S_IWOTH)  # writable by others stays refused, bit or not
    with pytest.raises(VerifyFailedError, match="writable by other"):
        store.check_permissions(manifest)
