"""kill -9 at every publish step leaves exactly the old blessing or the new one, never a half.

Each case runs ``Store.publish`` in a real child process whose fault hook (the store's test-only
seam, :mod:`bless.store.faults`) SIGKILLs the child just before that step, then checks the store
from the parent: before and after ``recover()``, ``find()`` returns exactly the old or the new
manifest and its blessed tree verifies clean; no temp or partial leftovers survive ``recover()``;
and the store stays usable.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest

from bless.core.manifest import Manifest
from bless.core.verify import verify_tree
from bless.errors import AlreadyBlessedError
from bless.store import PARTIAL_PREFIX, PUBLISH_STEPS, Store
from bless.store.layout import PUBLISHING_PREFIX
from bless.store.publish import COMMIT_STEP, MOVE_TREE, RENAME_MANIFEST, VALIDATE
from bless.system.durable import TMP_MARK
from tests.unit.store_helpers import make_manifest, run_child, write_tree


def committed_before(step: str) -> bool:
    """Whether a kill just before ``step`` finds the new blessing committed (the commit step is done)."""
    return PUBLISH_STEPS.index(step) > PUBLISH_STEPS.index(COMMIT_STEP)


def test_the_steps_are_the_points_a_publish_reaches(tmp_path: Path) -> None:
    # The crash tests below kill at each of PUBLISH_STEPS, so it must name every step a real publish
    # takes, in order: points inside a step ("move-tree:copy-file") are the ones with a colon.
    store = Store(tmp_path / "root")
    for number, variant in enumerate(("old", "new"), start=1):  # a first blessing, then a rebless
        tree = write_tree(tmp_path / f"outside-{number}" / "cache", variant)  # copied in: inner points too
        reached: list[str] = []
        store.publish(
            tree, make_manifest(tree, dir_id=f"2024010{number}T000000Z-00000000000{number}"), fault=reached.append
        )
        assert [point for point in reached if ":" not in point] == list(PUBLISH_STEPS)
        assert "move-tree:copy-file" in reached


def assert_state(store: Store, config_hash: str, expected: Manifest | None) -> None:
    """The store holds exactly ``expected`` (None: no blessing) for the hash, and it verifies."""
    found = store.find(config_hash)
    if expected is None:
        assert found is None
        return
    assert found is not None
    assert found.to_dict() == expected.to_dict()
    result = verify_tree(store.blessed_dir(found), found.cache.files, found.cache.dirs)
    assert result.ok, result.problems
    assert result.notices == ()  # read-only as published
    names = [r.path.name for r in store.records()]
    assert len(names) == 1, names


def blessed_versions(store: Store, config_hash: str) -> list[str]:
    """The blessed dir ids of a hash on disk (dot names excluded)."""
    hash_dir = store.root / "blessed" / config_hash
    return sorted(p.name for p in hash_dir.iterdir() if not p.name.startswith(".")) if hash_dir.is_dir() else []


def leftovers(*roots: Path) -> list[str]:
    found = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                if TMP_MARK in name or name.startswith((PARTIAL_PREFIX, PUBLISHING_PREFIX)):
                    found.append(os.path.join(dirpath, name))
    return found


@pytest.mark.parametrize("rebless", [False, True], ids=["first", "rebless"])
@pytest.mark.parametrize("step", PUBLISH_STEPS)
def test_kill_at_step_leaves_old_or_new(tmp_path: Path, step: str, rebless: bool) -> None:
    store = Store(tmp_path / "root")
    store.paths.ensure_layout()
    old: Manifest | None = None
    if rebless:
        old_tree = write_tree(store.new_staging_dir("old-run") / "cache", "old")
        old = make_manifest(old_tree)
        store.publish(old_tree, old)
    new_tree = write_tree(store.new_staging_dir("new-run") / "cache", "new")
    new = make_manifest(new_tree)
    manifest_file = tmp_path / "new-manifest.json"
    manifest_file.write_bytes(new.to_json_bytes())

    child = run_child("publish", str(store.root), str(new_tree), str(manifest_file), "--kill-at", step)
    assert child.returncode == -signal.SIGKILL, (child.returncode, child.stderr)

    expected = new if committed_before(step) else old
    assert_state(store, new.config_hash, expected)
    if rebless and old is not None:
        # The superseded (or still live) old tree is intact either way.
        assert verify_tree(store.blessed_dir(old), old.cache.files, old.cache.dirs).ok

    removed = store.recover()
    assert_state(store, new.config_hash, expected)
    assert leftovers(store.root) == []
    # A tree moved into blessed/ but never committed is debris: recover removes it; a superseded
    # version (the old one after a committed rebless) is gc's to remove, not recover's.
    assert blessed_versions(store, new.config_hash) == sorted(
        {m.cache.dir_id for m in (old, expected) if m is not None}
    )
    if step == RENAME_MANIFEST:
        assert any(TMP_MARK in path.name for path in removed), removed
    if step in (VALIDATE, MOVE_TREE):
        assert new_tree.is_dir()  # not consumed before the move

    # The store stays usable: publishing the same version again works (or is already done).
    retry = write_tree(tmp_path / "retry" / "cache", "new")
    if committed_before(step):
        with pytest.raises(AlreadyBlessedError):
            store.publish(retry, new)
    else:
        result = store.publish(retry, new)
        assert (result.archived_manifest is not None) == rebless
    assert_state(store, new.config_hash, new)
    assert leftovers(store.root) == []


# ------------------------------------------------------------------------------------------------
# Random fault points inside the steps (each file copied, the undo path, reject, gc), not only between
# them: the child reports the points it reaches, then a fresh store is killed at a random sample of
# them (BLESS_CRASH_SEED=<n> replays a failing sample; the seed is in every assertion message).

SEED = int(os.environ.get("BLESS_CRASH_SEED") or random.SystemRandom().randrange(1 << 32))
SAMPLE = 5


def kill_points(points: list[str]) -> list[int]:
    """1-based indices of a random sample of ``points`` (all of them when there are few)."""
    indices = list(range(1, len(points) + 1))
    return sorted(random.Random(SEED).sample(indices, min(SAMPLE, len(indices))))


def trace(*args: str) -> list[str]:
    """The fault points a child run reaches, in order (the child runs to the end)."""
    child = run_child(*args, "--trace")
    assert child.returncode == 0, child.stderr
    lines = child.stdout.splitlines()
    assert lines[-1] == "done", lines
    return [line for line in lines[:-1] if not line.startswith(("failed:", "/"))]


def publish_case(tmp_path: Path, *, rebless: bool) -> tuple[Store, Manifest | None, Manifest, Path, Path]:
    """A store (with an old blessing when ``rebless``) and a new tree OUTSIDE the store (copied in)."""
    store = Store(tmp_path / "root")
    old: Manifest | None = None
    if rebless:
        old_tree = write_tree(store.new_staging_dir("old-run") / "cache", "old")
        old = make_manifest(old_tree, dir_id="20240101T000000Z-000000000001")
        store.publish(old_tree, old)
    new_tree = write_tree(tmp_path / "outside" / "cache", "new")
    new = make_manifest(new_tree, dir_id="20240102T000000Z-000000000002")
    manifest_file = tmp_path / "new-manifest.json"
    manifest_file.write_bytes(new.to_json_bytes())
    return store, old, new, new_tree, manifest_file


def fresh(tmp_path: Path, index: int) -> Path:
    path = tmp_path / f"case-{index}"
    path.mkdir()
    return path


@pytest.mark.parametrize("undo", [False, True], ids=["commit", "undo"])
def test_kill_at_every_point_inside_publish(tmp_path: Path, undo: bool) -> None:
    # "undo": an I/O error after the tree is read-only drives the undo path, then the kill lands in it.
    extra = ("--raise-at", "archive-old") if undo else ()
    store, _, _, tree, manifest_file = publish_case(fresh(tmp_path, 0), rebless=True)
    points = trace("publish", str(store.root), str(tree), str(manifest_file), *extra)
    assert points.count("move-tree:copy-file") == 4  # one per file of the tree
    if undo:
        assert "undo" in points and RENAME_MANIFEST not in points
    for index in kill_points(points):
        store, old, new, tree, manifest_file = publish_case(fresh(tmp_path, index), rebless=True)
        assert old is not None
        child = run_child("publish", str(store.root), str(tree), str(manifest_file), *extra, "--kill-after", str(index))
        assert child.returncode == -signal.SIGKILL, (SEED, points[index - 1], child.stdout, child.stderr)
        committed = not undo and points.index("rename-manifest:before-fsync") < index
        expected = new if committed else old
        assert_state(store, new.config_hash, expected)
        store.recover()
        assert_state(store, new.config_hash, expected)
        assert leftovers(store.root) == [], (SEED, points[index - 1])
        assert blessed_versions(store, new.config_hash) == sorted({old.cache.dir_id, expected.cache.dir_id})
        assert tree.is_dir()  # copied, never consumed


@pytest.mark.parametrize(("command", "kind"), [("reject", "rejected"), ("keep-interrupted", "interrupted")])
def test_kill_at_every_point_of_reject_loses_no_evidence(tmp_path: Path, command: str, kind: str) -> None:
    """A rejection, and the evidence of an interrupted run (filed apart, written the same way)."""

    def case(index: int) -> tuple[Store, Path, str]:
        store = Store(fresh(tmp_path, index) / "root")
        tree = write_tree(store.new_staging_dir("bad-run") / "cache", "bad")
        return store, tree, make_manifest(tree).config_hash

    store, tree, config_hash = case(0)
    points = trace(command, str(store.root), str(tree), config_hash, "bad-run")
    assert points[-1] == "reject-done"
    for index in kill_points(points):
        store, tree, config_hash = case(index)
        expected = make_manifest(tree)
        child = run_child(command, str(store.root), str(tree), config_hash, "bad-run", "--kill-after", str(index))
        assert child.returncode == -signal.SIGKILL, (SEED, points[index - 1], child.stderr)
        store.recover()
        assert leftovers(store.root) == [], (SEED, points[index - 1])
        kept = store.root / kind / config_hash / "bad-run-c1"
        # The candidate is in exactly one place: still staged, or kept as evidence.
        where = [p for p in (tree, kept / "tree") if p.is_dir()]
        assert len(where) == 1, (SEED, points[index - 1], where)
        assert verify_tree(where[0], expected.cache.files, expected.cache.dirs, expect_read_only=False).ok
        other = "interrupted" if kind == "rejected" else "rejected"
        assert not any((store.root / other).rglob("*")), f"nothing is filed under {other}/"


def test_kill_at_every_point_of_gc_never_touches_the_live_blessing(tmp_path: Path) -> None:
    def case(index: int) -> tuple[Store, Manifest]:
        store = Store(fresh(tmp_path, index) / "root")
        live: Manifest | None = None
        for number, variant in enumerate(("v1", "v2", "v3"), start=1):
            tree = write_tree(store.new_staging_dir(f"run{number}") / "cache", variant)
            live = make_manifest(tree, dir_id=f"2024010{number}T000000Z-00000000000{number}")
            store.publish(tree, live)
        assert live is not None
        for number in (1, 2):
            bad = write_tree(store.new_staging_dir(f"rej{number}") / "cache", f"r{number}")
            store.reject(
                bad, config_hash=live.config_hash, run_id=f"rej{number}", candidate=1, summary_md="", evidence={}
            )
        return store, live

    store, live = case(0)
    points = trace("gc", str(store.root))
    assert points.count("gc-remove") == 4  # two superseded versions, two evidence dirs
    for index in kill_points(points):
        store, live = case(index)
        child = run_child("gc", str(store.root), "--kill-after", str(index))
        assert child.returncode == -signal.SIGKILL, (SEED, points[index - 1], child.stderr)
        assert_state(store, live.config_hash, live)
        report = store.gc(keep=0)  # the next gc finishes the job
        assert_state(store, live.config_hash, live)
        assert blessed_versions(store, live.config_hash) == [live.cache.dir_id], report
        assert not any((store.root / "rejected" / live.config_hash).iterdir())
        assert leftovers(store.root) == []
