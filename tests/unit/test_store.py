"""Tests for bless.store on real files and real processes (locks across processes, relocation)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from bless.core.factors import config_hash
from bless.core.manifest import Manifest
from bless.core.verify import Problem, TreeCheck, verify_tree
from bless.errors import (
    AlreadyBlessedError,
    InputInvalidError,
    LockHeldError,
    ManifestDuplicateError,
    ManifestInvalidError,
    NoManifestError,
    VerifyFailedError,
)
from bless.store import PARTIAL_PREFIX, GcReport, Store, default_root
from bless.store import publish as publish_module
from bless.system.durable import TMP_MARK, atomic_write_bytes
from tests.unit.store_helpers import PREFIX_TWINS, make_factors, make_manifest, run_child, start_child, write_tree


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "root")
    s.paths.ensure_layout()
    return s


def stage(store: Store, run_id: str, variant: str) -> Path:
    """A candidate tree in a fresh staging dir, as a bless run would leave it."""
    return write_tree(store.new_staging_dir(run_id) / "cache", variant)


def assert_blessed(store: Store, manifest: Manifest) -> None:
    """find() returns exactly this manifest and its blessed tree verifies clean and read-only."""
    found = store.find(manifest.config_hash)
    assert found is not None
    assert found.to_dict() == manifest.to_dict()
    result = verify_tree(store.blessed_dir(found), found.cache.files, found.cache.dirs)
    assert result.ok, result.problems
    assert result.notices == ()


def leftovers(root: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if TMP_MARK in name or name.startswith((PARTIAL_PREFIX, ".new-")):
                found.append(os.path.join(dirpath, name))
    return found


# --------------------------------------------------------------------------------- publish


def test_publish_then_find_and_verify(store: Store) -> None:
    staged = stage(store, "run1", "a")
    manifest = make_manifest(staged)
    result = store.publish(staged, manifest)

    assert result.config_hash == manifest.config_hash
    assert result.manifest_path == store.manifests_dir / f"{manifest.config_hash}.json"
    assert result.blessed_dir == store.root / "blessed" / manifest.config_hash / manifest.cache.dir_id
    assert result.archived_manifest is None
    assert not staged.exists()  # renamed, not copied, from under root/staging
    assert_blessed(store, manifest)
    assert store.manifest_path(manifest.config_hash) == result.manifest_path

    blessed = store.blessed_dir(manifest)
    assert stat.S_IMODE(blessed.stat().st_mode) == 0o555
    for dirpath, dirnames, filenames in os.walk(blessed):
        for name in dirnames:
            assert stat.S_IMODE(os.lstat(os.path.join(dirpath, name)).st_mode) == 0o555
        for name in filenames:
            assert stat.S_IMODE(os.lstat(os.path.join(dirpath, name)).st_mode) == 0o444
    # No absolute path anywhere in the manifest: the store derives them from its root.
    assert str(store.root) not in result.manifest_path.read_text()
    assert leftovers(store.root) == []


def test_publish_from_outside_root_copies_and_keeps_source(store: Store, tmp_path: Path) -> None:
    staged = write_tree(tmp_path / "elsewhere" / "cache", "a")
    manifest = make_manifest(staged)
    store.publish(staged, manifest)
    assert_blessed(store, manifest)
    assert verify_tree(staged, manifest.cache.files, manifest.cache.dirs, expect_read_only=False).ok
    assert leftovers(store.root) == []


def test_publish_refuses_a_tree_that_differs_from_its_manifest(store: Store) -> None:
    staged = stage(store, "run1", "a")
    manifest = make_manifest(staged)
    (staged / "nested" / "index.json").write_text('{"variant": "tampered"}\n')
    (staged / "extra.bin").write_bytes(b"x")
    with pytest.raises(InputInvalidError) as info:
        store.publish(staged, manifest)
    assert "nested/index.json" in info.value.message
    assert "extra.bin" in info.value.message

    assert store.find(manifest.config_hash) is None
    assert list(store.manifests_dir.iterdir()) == []
    assert not (store.root / "blessed" / manifest.config_hash / manifest.cache.dir_id).exists()
    assert (staged / "extra.bin").exists()  # nothing moved


def test_a_tree_that_changes_during_publish_is_given_back(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    staged = stage(store, "run1", "a")
    manifest = make_manifest(staged)

    def changed_under_us(*args: object, **kwargs: object) -> TreeCheck:
        result = verify_tree(*args, **kwargs)  # type: ignore[arg-type]
        return dataclasses.replace(result, ok=False, problems=(Problem("sha256", "artifact.bin", "changed"),))

    monkeypatch.setattr(publish_module, "verify_tree", changed_under_us)
    with pytest.raises(VerifyFailedError, match=r"artifact\.bin"):
        store.publish(staged, manifest)
    assert store.find(manifest.config_hash) is None
    assert not store.blessed_dir(manifest).exists()
    # Back where it was, writable again, so the run can keep it as rejected evidence.
    assert verify_tree(staged, manifest.cache.files, manifest.cache.dirs, expect_read_only=False).ok
    assert stat.S_IMODE((staged / "artifact.bin").stat().st_mode) == 0o644
    assert leftovers(store.root) == []


def test_publish_refuses_a_tree_with_a_symlink(store: Store) -> None:
    staged = stage(store, "run1", "a")
    (staged / "link").symlink_to("artifact.bin")
    manifest = make_manifest(stage(store, "run2", "a"))
    with pytest.raises(InputInvalidError, match="link"):
        store.publish(staged, manifest)
    assert store.find(manifest.config_hash) is None


def test_publish_refuses_when_any_manifest_is_invalid(store: Store) -> None:
    (store.manifests_dir / "broken.json").write_text("{")
    staged = stage(store, "run1", "a")
    with pytest.raises(ManifestInvalidError, match=r"broken\.json"):
        store.publish(staged, make_manifest(staged))
    assert staged.exists()


def test_publish_refuses_a_file_name_taken_by_another_hash(store: Store) -> None:
    other = stage(store, "other", "o")
    other_manifest = make_manifest(other, make_factors("other"))
    store.publish(other, other_manifest)
    staged = stage(store, "run1", "a")
    manifest = make_manifest(staged)
    (store.manifests_dir / f"{other_manifest.config_hash}.json").rename(
        store.manifests_dir / f"{manifest.config_hash}.json"
    )
    with pytest.raises(ManifestInvalidError, match="another hash"):
        store.publish(staged, manifest)
    assert_blessed(store, other_manifest)


def test_republishing_the_live_version_is_refused(store: Store, tmp_path: Path) -> None:
    staged = stage(store, "run1", "a")
    manifest = make_manifest(staged)
    store.publish(staged, manifest)
    again = write_tree(tmp_path / "again", "a")
    with pytest.raises(AlreadyBlessedError):
        store.publish(again, manifest)
    assert_blessed(store, manifest)


def test_rebless_archives_the_prior_manifest(store: Store) -> None:
    old_tree = stage(store, "run1", "old")
    old = make_manifest(old_tree, created="2024-05-01T12:34:56Z")
    store.publish(old_tree, old)
    old_bytes = (store.manifests_dir / f"{old.config_hash}.json").read_bytes()

    new_tree = stage(store, "run2", "new")
    new = make_manifest(new_tree)
    assert new.config_hash == old.config_hash and new.cache.dir_id != old.cache.dir_id
    result = store.publish(new_tree, new)

    assert result.archived_manifest == (
        store.root / "archive" / old.config_hash / f"20240501T123456Z-{old.cache.tree_sha256[:12]}.json"
    )
    assert result.archived_manifest.read_bytes() == old_bytes
    assert_blessed(store, new)
    # The superseded tree stays, intact, until gc.
    old_dir = store.blessed_dir(old)
    assert verify_tree(old_dir, old.cache.files, old.cache.dirs).ok
    assert [r.path.name for r in store.records()] == [f"{new.config_hash}.json"]


def test_rebless_replaces_the_live_manifest_under_its_own_name(store: Store) -> None:
    old_tree = stage(store, "run1", "old")
    old = make_manifest(old_tree)
    store.publish(old_tree, old)
    (store.manifests_dir / f"{old.config_hash}.json").rename(store.manifests_dir / "production.json")
    new_tree = stage(store, "run2", "new")
    new = make_manifest(new_tree)
    result = store.publish(new_tree, new)
    assert result.manifest_path == store.manifests_dir / "production.json"
    assert [r.path.name for r in store.records()] == ["production.json"]
    assert_blessed(store, new)


# ---------------------------------------------------------------------------------- reject


def test_reject_keeps_evidence_and_publishes_nothing(store: Store) -> None:
    staged = stage(store, "run1", "a")
    manifest = make_manifest(staged)
    evidence = {"trials": [{"index": 1, "passed": False, "reasons": ["diverged"]}], "phase": 2}
    kept = store.reject(
        staged,
        config_hash=manifest.config_hash,
        run_id="run1",
        candidate=1,
        summary_md="# rejected\ntrial 1 diverged\n",
        evidence=evidence,
    )
    assert kept == store.root / "rejected" / manifest.config_hash / "run1-c1"
    assert (kept / "summary.md").read_text() == "# rejected\ntrial 1 diverged\n"
    assert json.loads((kept / "evidence.json").read_text()) == evidence
    assert verify_tree(kept / "tree", manifest.cache.files, manifest.cache.dirs, expect_read_only=False).ok
    assert not staged.exists()
    assert store.find(manifest.config_hash) is None
    assert not (store.root / "blessed" / manifest.config_hash).exists()
    assert leftovers(store.root) == []

    with pytest.raises(InputInvalidError, match="never overwritten"):
        store.reject(
            stage(store, "run2", "b"),
            config_hash=manifest.config_hash,
            run_id="run1",
            candidate=1,
            summary_md="",
            evidence={},
        )


def test_reject_refuses_unserializable_evidence_before_moving_anything(store: Store) -> None:
    staged = stage(store, "run1", "a")
    with pytest.raises(InputInvalidError, match="JSON"):
        store.reject(
            staged,
            config_hash=config_hash(make_factors()),
            run_id="run1",
            candidate=1,
            summary_md="x",
            evidence={"bad": object()},
        )
    assert (staged / "artifact.bin").exists()


# ------------------------------------------------------------------------- lookup rules


def test_duplicate_hash_across_two_files_is_corruption(store: Store) -> None:
    staged = stage(store, "run1", "a")
    manifest = make_manifest(staged)
    result = store.publish(staged, manifest)
    copy = store.manifests_dir / "zz-copy.json"
    shutil.copyfile(result.manifest_path, copy)
    with pytest.raises(ManifestDuplicateError) as info:
        store.find(manifest.config_hash)
    assert str(result.manifest_path) in info.value.message
    assert str(copy) in info.value.message
    assert info.value.details["paths"] == [str(result.manifest_path), str(copy)]
    assert info.value.exit_code == 23
    with pytest.raises(ManifestDuplicateError):
        store.manifest_path(manifest.config_hash)


def test_lookup_is_by_the_config_hash_field_not_the_file_name(store: Store) -> None:
    staged = stage(store, "run1", "a")
    manifest = make_manifest(staged)
    result = store.publish(staged, manifest)
    renamed = store.manifests_dir / "whatever-name.json"
    result.manifest_path.rename(renamed)
    assert_blessed(store, manifest)
    assert store.manifest_path(manifest.config_hash) == renamed


def test_invalid_manifest_fails_closed_and_records_lists_good_and_bad(store: Store) -> None:
    staged = stage(store, "run1", "a")
    manifest = make_manifest(staged)
    store.publish(staged, manifest)
    (store.manifests_dir / "broken.json").write_text('{"schema_version": 1,')
    (store.manifests_dir / ".hidden.json").write_text("not even json")  # dotfiles are skipped
    (store.manifests_dir / "README.md").write_text("not a manifest")
    (store.manifests_dir / "schema").mkdir()
    os.mkfifo(store.manifests_dir / "zz-fifo.json")  # must be reported, never opened (it would block)

    with pytest.raises(ManifestInvalidError) as info:
        store.find(manifest.config_hash)
    assert "broken.json" in info.value.message

    records = store.records()
    assert [r.path.name for r in records] == ["broken.json", f"{manifest.config_hash}.json", "zz-fifo.json"]
    bad, good, fifo = records
    assert fifo.error is not None and "not a regular file" in fifo.error.message
    assert bad.manifest is None and isinstance(bad.error, ManifestInvalidError)
    assert good.error is None and good.manifest is not None
    assert good.manifest.config_hash == manifest.config_hash


def test_find_rejects_a_malformed_hash(store: Store) -> None:
    with pytest.raises(InputInvalidError):
        store.find("../../etc/passwd")
    assert store.find("0" * 64) is None


def test_live_prefix_unique_ambiguous_and_none(store: Store) -> None:
    first, second = (make_factors(seed=seed) for seed in PREFIX_TWINS)
    h1, h2 = config_hash(first), config_hash(second)
    assert h1[:8] == h2[:8] and h1 != h2, "PREFIX_TWINS no longer collide: redo the birthday search"
    published = {}
    for index, factors in enumerate((first, second, make_factors("other"))):
        staged = stage(store, f"run{index}", f"v{index}")
        manifest = make_manifest(staged, factors)
        store.publish(staged, manifest)
        published[manifest.config_hash] = manifest

    shared = next(i for i in range(64) if h1[i] != h2[i])  # length of the common prefix
    assert store.live_prefix(h1[: shared + 1]).manifest.config_hash == h1
    assert store.live_prefix(h2.upper()).manifest.config_hash == h2
    other = next(h for h in published if h not in (h1, h2))
    assert store.live_prefix(other[:8]).manifest.config_hash == other
    found = store.live_prefix(other[:8])
    assert found.document == found.path.read_bytes(), "the bytes its manifest was parsed from (signed, checked)"

    with pytest.raises(InputInvalidError) as info:
        store.live_prefix(h1[:8])
    assert info.value.details["candidates"] == sorted([h1, h2])
    assert h1 in info.value.message and h2 in info.value.message

    missing = next(f"{i:08x}" for i in range(1000) if not any(h.startswith(f"{i:08x}") for h in published))
    with pytest.raises(NoManifestError):
        store.live_prefix(missing)
    with pytest.raises(InputInvalidError):
        store.live_prefix("abc")
    with pytest.raises(InputInvalidError):
        store.live_prefix("zzzzzzzz")


# ------------------------------------------------------------------------------- locks


def test_lock_contention_between_two_real_processes(store: Store) -> None:
    h = config_hash(make_factors())
    child = start_child("hold-lock", str(store.root), h, "1.2")
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "locked", child.stderr.read() if child.stderr else ""

        with pytest.raises(LockHeldError) as info, store.lock(h):
            pass
        assert info.value.details["holder"]["pid"] == child.pid
        assert f"pid {child.pid}" in info.value.message
        assert info.value.exit_code == 11

        # Waiting, the refusal comes from the timeout (its message says so) while the holder still holds it.
        with pytest.raises(LockHeldError, match=r"\(waited 0\.3 s\)") as waited, store.lock(h, wait=True, timeout=0.3):
            pass
        assert waited.value.details["holder"]["pid"] == child.pid
        assert child.poll() is None, "the wait ended because the holder let go, not on its timeout"

        with store.lock(h, wait=True, timeout=30):
            # We only get it once the child let go; it exits right after.
            assert child.wait(timeout=10) == 0
            holder = json.loads((store.root / "locks" / f"{h}.holder").read_text())
            assert holder["pid"] == os.getpid()
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    assert not (store.root / "locks" / f"{h}.holder").exists()


def test_lock_is_reentrant_in_one_thread_and_publish_runs_under_a_held_lock(store: Store) -> None:
    staged = stage(store, "run1", "a")
    manifest = make_manifest(staged)
    with store.lock(manifest.config_hash), store.lock(manifest.config_hash):
        store.publish(staged, manifest)
    assert_blessed(store, manifest)


def test_recover_leaves_debris_of_a_hash_whose_lock_is_held(store: Store) -> None:
    h = config_hash(make_factors())
    debris = store.manifests_dir / f".{h}{TMP_MARK}999-abcd"
    debris.write_bytes(b"{")
    child = start_child("hold-lock", str(store.root), h, "0.5")
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        assert store.recover() == []
        assert debris.exists()
        assert child.wait(timeout=10) == 0
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    assert store.recover() == [debris]
    assert not debris.exists()


# -------------------------------------------------------------------- layout variations


def test_separate_manifests_dir(tmp_path: Path) -> None:
    checkout = tmp_path / "git-checkout" / "manifests"
    store = Store(tmp_path / "root", manifests_dir=checkout)
    staged = stage(store, "run1", "a")
    manifest = make_manifest(staged)
    result = store.publish(staged, manifest)
    assert result.manifest_path == checkout / f"{manifest.config_hash}.json"
    assert_blessed(store, manifest)
    assert not (tmp_path / "root" / "manifests").exists()
    assert Store(tmp_path / "root").find(manifest.config_hash) is None
    # gc with this store keeps the live tree.
    assert store.blessed_dir(manifest) not in {a.path for a in store.gc(keep=0).actions}
    assert_blessed(store, manifest)


@pytest.mark.parametrize("how", ["copytree", "cp -a"])
def test_relocated_root_keeps_every_blessing_valid(store: Store, tmp_path: Path, how: str) -> None:
    old_tree = stage(store, "run1", "old")
    old = make_manifest(old_tree)
    store.publish(old_tree, old)
    new_tree = stage(store, "run2", "new")
    new = make_manifest(new_tree)
    store.publish(new_tree, new)
    other_tree = stage(store, "run3", "x")
    other = make_manifest(other_tree, make_factors("other"))
    store.publish(other_tree, other)

    moved = tmp_path / "moved" / "root"
    moved.parent.mkdir()
    if how == "copytree":
        shutil.copytree(store.root, moved, symlinks=True)
    else:
        subprocess.run(["cp", "-a", str(store.root), str(moved)], check=True)
    # Take the original away so nothing can silently still point at it.
    store.root.rename(tmp_path / "gone")

    relocated = Store(moved)
    assert_blessed(relocated, new)
    assert_blessed(relocated, other)
    assert relocated.blessed_dir(new).is_relative_to(moved)
    # And it stays a working store: a rebless there archives as usual.
    again = stage(relocated, "run4", "newer")
    result = relocated.publish(again, make_manifest(again))
    assert result.archived_manifest is not None


def test_default_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BLESS_ROOT", str(tmp_path / "x"))
    assert default_root() == tmp_path / "x"
    monkeypatch.setenv("BLESS_ROOT", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_root() == tmp_path / "home" / ".cache" / "bless"


def test_atomic_write_bytes_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    atomic_write_bytes(target, b"one")
    atomic_write_bytes(target, b"two", mode=0o600)
    assert target.read_bytes() == b"two"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_new_staging_dir_records_its_owner_and_refuses_reuse(store: Store) -> None:
    path = store.new_staging_dir("run-1")
    owner = json.loads((path / ".owner").read_text())
    assert owner["pid"] == os.getpid() and owner["run_id"] == "run-1"
    with pytest.raises(InputInvalidError):
        store.new_staging_dir("run-1")
    for bad in ("../x", ".hidden", "a/b", ""):
        with pytest.raises(InputInvalidError):
            store.new_staging_dir(bad)


def test_a_staging_dir_taken_by_a_racing_run_is_refused_as_taken_and_leaves_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another run creates the same id between the existence check and the rename: its dir is kept."""
    racer = store.new_staging_dir("run-1")
    monkeypatch.setattr(os.path, "lexists", lambda path: False)  # the check ran before the racer
    with pytest.raises(InputInvalidError, match="already exists"):
        store.new_staging_dir("run-1")
    assert sorted(p.name for p in store.paths.staging.iterdir()) == ["run-1"]
    assert json.loads((racer / ".owner").read_text())["pid"] == os.getpid()


# ------------------------------------------------------------------------- recover / gc


def test_recover_removes_debris_but_never_a_live_tree(store: Store) -> None:
    staged = stage(store, "run1", "a")
    manifest = make_manifest(staged)
    store.publish(staged, manifest)
    h = manifest.config_hash

    partial = store.root / "blessed" / h / f"{PARTIAL_PREFIX}20240101T000000Z-0123456789ab-dead"
    write_tree(partial, "p")
    for path in [partial, *partial.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    manifest_tmp = store.manifests_dir / f".{h}{TMP_MARK}1-beef"
    manifest_tmp.write_bytes(b"{}")
    (store.root / "archive" / h).mkdir(parents=True)
    archive_tmp = store.root / "archive" / h / f".x.json{TMP_MARK}1-beef"
    archive_tmp.write_bytes(b"{}")
    rejected_partial = store.root / "rejected" / h / f"{PARTIAL_PREFIX}run9-c2-cafe"
    write_tree(rejected_partial / "tree", "r")

    removed = store.recover()
    assert set(removed) == {partial, manifest_tmp, archive_tmp, rejected_partial}
    assert leftovers(store.root) == []
    # The interrupted reject is completed, not deleted: it is evidence.
    assert (store.root / "rejected" / h / "run9-c2" / "tree" / "artifact.bin").exists()
    assert_blessed(store, manifest)
    assert store.recover() == []


def _age(path: Path, seconds_ago: float) -> None:
    stamp = time.time() - seconds_ago
    os.utime(path, (stamp, stamp))


def test_gc_keep_and_dry_run_never_touch_live(store: Store) -> None:
    versions = []
    for index, variant in enumerate(("v1", "v2", "v3")):
        staged = stage(store, f"run{index}", variant)
        manifest = make_manifest(staged, dir_id=f"2024010{index + 1}T000000Z-{index:012x}")
        store.publish(staged, manifest)
        versions.append(manifest)
    live = versions[-1]
    h = live.config_hash
    rejected = []
    for index in range(3):
        kept = store.reject(
            stage(store, f"rej{index}", f"r{index}"),
            config_hash=h,
            run_id=f"rej{index}",
            candidate=1,
            summary_md="no",
            evidence={},
        )
        _age(kept, 1000 - index)  # rej0 oldest
        rejected.append(kept)
    dead = Path(run_child("make-staging", str(store.root), "dead-run").stdout.strip())
    assert dead.is_dir()
    mine = store.new_staging_dir("my-run")
    old_dirs = [store.blessed_dir(m) for m in versions[:2]]

    report = store.gc(keep=0, dry_run=True)
    assert isinstance(report, GcReport) and report.dry_run
    planned = {a.path for a in report.actions}
    assert planned >= {*old_dirs, *rejected, dead}
    assert store.blessed_dir(live) not in planned and mine not in planned
    assert all(a.bytes > 0 for a in report.actions if a.path in old_dirs)
    assert all(p.exists() for p in planned)  # dry run removed nothing

    report = store.gc(keep=1)
    removed = {a.path for a in report.actions}
    assert removed == {old_dirs[0], rejected[0], rejected[1], dead}
    assert old_dirs[1].exists() and rejected[2].exists() and mine.exists()
    assert not any(p.exists() for p in removed)
    assert_blessed(store, live)

    report = store.gc(keep=0)
    assert {a.path for a in report.actions} == {old_dirs[1], rejected[2]}
    assert_blessed(store, live)
    assert mine.exists()
    assert store.gc(keep=0).actions == ()


def test_gc_refuses_while_a_manifest_is_invalid(store: Store) -> None:
    old_tree = stage(store, "run1", "old")
    old = make_manifest(old_tree)
    store.publish(old_tree, old)
    (store.manifests_dir / "broken.json").write_text("[]")
    with pytest.raises(ManifestInvalidError):
        store.gc(keep=0)
    assert store.blessed_dir(old).exists()


def test_gc_names_the_evidence_of_an_interrupted_run_it_removes(store: Store) -> None:
    """An interrupted run's evidence is no rejection; gc must not remove it without saying so.

    It is filed under interrupted/; a bless from before that filed it under rejected/, marked by its
    ``interrupted_during``, and gc names that one the same way.
    """
    from typer.testing import CliRunner

    from bless.cli.main import app

    staged = stage(store, "run1", "a")
    manifest = make_manifest(staged)
    store.publish(staged, manifest)

    def keep(run_id: str, interrupted: str | None, *, legacy: bool = False) -> Path:
        staged = stage(store, run_id, run_id)
        evidence = {"interrupted_during": interrupted}
        return store.reject(
            staged,
            config_hash=manifest.config_hash,
            run_id=run_id,
            candidate=1,
            summary_md="x",
            evidence=evidence,
            interrupted=interrupted is not None and not legacy,
        )

    stopped = keep("stopped", "trial 2")
    assert stopped.parent == store.root / "interrupted" / manifest.config_hash
    legacy = keep("older", "the bootstrap", legacy=True)
    assert legacy.parent == store.root / "rejected" / manifest.config_hash
    rejected = keep("bad", None)

    runner = CliRunner()
    shown = runner.invoke(app, ["--root", str(store.root), "gc", "--dry-run"], env={"COLUMNS": "400"})
    assert shown.exit_code == 0, shown.output
    assert f"interrupted run (during trial 2): {stopped}" in shown.output
    assert f"interrupted run (during the bootstrap): {legacy}" in shown.output
    assert f"interrupted run (during trial 2): {rejected}" not in shown.output

    result = runner.invoke(app, ["--root", str(store.root), "gc", "--json"])
    assert result.exit_code == 0, result.output
    actions = {a["path"]: a for a in json.loads(result.stdout)["actions"]}
    assert actions[str(stopped)]["interrupted_during"] == "trial 2"
    assert "interrupted during trial 2" in actions[str(stopped)]["reason"]
    assert actions[str(legacy)]["interrupted_during"] == "the bootstrap"
    assert actions[str(rejected)]["interrupted_during"] is None
    assert not stopped.exists() and not legacy.exists() and not rejected.exists()


def test_the_evidence_of_an_interrupted_run_is_filed_apart_from_the_rejections(store: Store) -> None:
    staged = stage(store, "run1", "a")
    manifest = make_manifest(staged)
    evidence = {"reasons": ["interrupted"], "interrupted_during": "trial 2"}
    kept = store.reject(
        staged,
        config_hash=manifest.config_hash,
        run_id="run1",
        candidate=1,
        summary_md="# stopped\n",
        evidence=evidence,
        interrupted=True,
    )
    assert kept == store.root / "interrupted" / manifest.config_hash / "run1-c1"
    assert not (store.root / "rejected" / manifest.config_hash).exists(), "no rejection was filed"
    assert (kept / "summary.md").read_text() == "# stopped\n"
    assert json.loads((kept / "evidence.json").read_text()) == evidence
    assert verify_tree(kept / "tree", manifest.cache.files, manifest.cache.dirs, expect_read_only=False).ok
    assert not staged.exists() and store.find(manifest.config_hash) is None
    assert stat.S_IMODE(os.lstat(store.root / "interrupted").st_mode) == 0o755
    assert leftovers(store.root) == []
    with pytest.raises(InputInvalidError, match=r"interrupted run .* never overwritten"):
        store.reject(
            stage(store, "run2", "b"),
            config_hash=manifest.config_hash,
            run_id="run1",
            candidate=1,
            summary_md="",
            evidence={},
            interrupted=True,
        )


def test_gc_keeps_the_newest_interrupted_runs_as_it_keeps_rejections_counted_apart(store: Store) -> None:
    """--keep N keeps N of each: a run of Ctrl-Cs never pushes the last real rejection out."""
    staged = stage(store, "run0", "a")
    manifest = make_manifest(staged)
    store.publish(staged, manifest)
    h = manifest.config_hash

    def keep(kind: str, run_id: str, age_s: float) -> Path:
        evidence = {"interrupted_during": "trial 1"} if kind == "interrupted" else {}
        path = store.reject(stage(store, run_id, run_id), config_hash=h, run_id=run_id, candidate=1, summary_md="",
                            evidence=evidence, interrupted=kind == "interrupted")  # fmt: skip
        stamp = time.time() - age_s
        os.utime(path, (stamp, stamp))
        return path

    old_rejection = keep("rejected", "rej-old", 400)
    new_rejection = keep("rejected", "rej-new", 300)
    old_stops = [keep("interrupted", f"stop{n}", 200 - n) for n in range(3)]
    newest_stop = keep("interrupted", "stop-new", 10)

    report = store.gc(keep=1)
    removed = {action.path: action for action in report.actions}
    assert set(removed) == {old_rejection, *old_stops}
    assert removed[old_rejection].interrupted_during is None
    assert all(removed[p].interrupted_during == "trial 1" for p in old_stops)
    assert all("(not a rejection)" in removed[p].reason for p in old_stops)
    assert new_rejection.is_dir() and newest_stop.is_dir()

    store.gc(keep=0)
    assert not any((store.root / "interrupted" / h).iterdir()) and not any((store.root / "rejected" / h).iterdir())


def test_recover_completes_the_evidence_of_an_interrupted_run_a_crash_cut_short(store: Store) -> None:
    h = make_manifest(stage(store, "run1", "a")).config_hash
    partial = store.root / "interrupted" / h / f"{PARTIAL_PREFIX}run9-c2-cafe"
    write_tree(partial / "tree", "r")
    temp = store.root / "interrupted" / h / "run8-c1" / f".evidence.json{TMP_MARK}1-beef"
    write_tree(temp.parent / "tree", "s")
    temp.write_bytes(b"{")

    assert set(store.recover()) == {partial, temp}
    assert (store.root / "interrupted" / h / "run9-c2" / "tree" / "artifact.bin").exists(), "completed, not deleted"
    assert not (store.root / "rejected" / h).exists()
    assert leftovers(store.root) == []
