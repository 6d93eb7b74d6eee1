"""kill -9 at every publish step leaves exactly the old blessing or the new one, never a half.

Each case runs ``Store.publish`` in a real child process whose fault hook (the store's test-only
seam, :mod:`bless.store.faults`) SIGKILLs the child just before that step, then checks the store
from the parent: before and after ``recover()``, ``find()`` returns exactly the old or the new
manifest and its blessed tree verifies clean; no temp or partial leftovers survive ``recover()``;
and the store stays usable.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from store_helpers import make_manifest, run_child, write_tree

from bless.errors import AlreadyBlessedError
from bless.manifest import Manifest
from bless.store import PARTIAL_PREFIX, PUBLISH_STEPS, TMP_MARK, Store
from bless.verify import verify_tree

# The manifest rename is the commit point: a kill before the "done" fault point leaves the old
# state; at "done" the new blessing is already committed.
COMMITTED_AT = "done"


def test_the_step_names_are_the_documented_ones() -> None:
    assert PUBLISH_STEPS == (
        "validate",
        "move-tree",
        "fsync-tree",
        "make-read-only",
        "archive-old",
        "write-manifest-tmp",
        "rename-manifest",
        "done",
    )


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


def leftovers(*roots: Path) -> list[str]:
    found = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                if TMP_MARK in name or name.startswith(PARTIAL_PREFIX):
                    found.append(os.path.join(dirpath, name))
    return found


@pytest.mark.parametrize("rebless", [False, True], ids=["first", "rebless"])
@pytest.mark.parametrize("step", PUBLISH_STEPS)
def test_kill_at_step_leaves_old_or_new(tmp_path: Path, step: str, rebless: bool) -> None:
    store = Store(tmp_path / "root")
    store.ensure_layout()
    old: Manifest | None = None
    if rebless:
        old_tree = write_tree(store.new_staging_dir("old-run") / "cache", "old")
        old = make_manifest(old_tree)
        store.publish(old_tree, old)
    new_tree = write_tree(store.new_staging_dir("new-run") / "cache", "new")
    new = make_manifest(new_tree)
    manifest_file = tmp_path / "new-manifest.json"
    manifest_file.write_bytes(new.to_json_bytes())

    child = run_child("publish", str(store.root), str(new_tree), str(manifest_file), step)
    assert child.returncode == -signal.SIGKILL, (child.returncode, child.stderr)

    expected = new if step == COMMITTED_AT else old
    assert_state(store, new.config_hash, expected)
    if rebless and old is not None:
        # The superseded (or still live) old tree is intact either way.
        assert verify_tree(store.blessed_dir(old), old.cache.files, old.cache.dirs).ok

    removed = store.recover()
    assert_state(store, new.config_hash, expected)
    assert leftovers(store.root) == []
    if step == "rename-manifest":
        assert any(TMP_MARK in path.name for path in removed), removed
    if step in ("validate", "move-tree"):
        assert new_tree.is_dir()  # not consumed before the move

    # The store stays usable: publishing the same version again works (or is already done).
    retry = write_tree(tmp_path / "retry" / "cache", "new")
    if step == COMMITTED_AT:
        with pytest.raises(AlreadyBlessedError):
            store.publish(retry, new)
    else:
        result = store.publish(retry, new)
        assert (result.archived_manifest is not None) == rebless
    assert_state(store, new.config_hash, new)
    assert leftovers(store.root) == []
