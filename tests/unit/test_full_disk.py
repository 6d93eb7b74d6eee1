"""Every writer refuses a full (or read-only) disk cleanly: exit 15, nothing committed, the old blessing intact.

The disks are real: small tmpfs mounts (``size=``), filled up at a fault point of the writer's own
seam, or remounted read-only. Mounting needs root (CAP_SYS_ADMIN); elsewhere these tests are skipped.
Pulls are from the in-memory registry (``tests/support/registry_simulator.py``); the disk filling up
mid-download from a real one as well.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bless.errors import ExitCode, NoSpaceError
from bless.flows.pull import pull_blessing
from bless.flows.push import push_blessing
from bless.oci.client import parse_reference
from bless.store import Store
from bless.trust import check_blessing, init_repository, sign_blessing
from tests.support.fakes import Behavior, FakeRuntime, tokens_for
from tests.support.registry_simulator import ALSO_REAL, AnyRegistry
from tests.support.trust_keys import TEST_KEYS
from tests.unit.run_harness import Harness, make_profile, make_resolved
from tests.unit.store_helpers import make_manifest, write_tree
from tests.unit.test_fleet_registry import NEW_ID, OLD_ID, assert_untouched, bless_version, provision


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (unmounted at the end)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> None:
    """Write zeros into ``directory`` until its file system says it is full."""
    fd = os.open(directory / f"filler-{len(list(directory.iterdir()))}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * (64 << 10))
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def fill_at(point: str, directory: Path) -> Callable[[str], None]:
    """A fault hook that fills ``directory``'s file system when the writer reaches ``point``."""

    def hook(reached: str) -> None:
        if reached == point:
            fill(directory)

    return hook


def refused(info: pytest.ExceptionInfo[NoSpaceError]) -> str:
    assert info.value.exit_code == ExitCode.NO_SPACE
    assert int(ExitCode.NO_SPACE) == 15
    return info.value.diagnostics()


# --------------------------------------------------------------------------------------------- pull


def test_pull_checks_free_space_before_downloading(tmp_path: Path, registry: AnyRegistry) -> None:
    origin = Store(tmp_path / "origin")
    new = bless_version(origin, tmp_path, "big", NEW_ID)  # a 1 MiB file and a few small ones
    push_blessing(origin, new, parse_reference(registry.ref("c/t:new")), transport=registry.transport)
    with small_disk(tmp_path / "disk", "1536k") as disk:
        host = Store(disk / "host")
        with pytest.raises(NoSpaceError, match="needs") as info:
            pull_blessing(host, parse_reference(registry.ref("c/t:new")), transport=registry.transport)
        assert "nothing was downloaded" in refused(info)
        assert_untouched(host, None)


@ALSO_REAL
def test_pull_refuses_a_disk_that_fills_up_mid_download(tmp_path: Path, registry: AnyRegistry) -> None:
    origin = Store(tmp_path / "origin")
    old = bless_version(origin, tmp_path, "a", OLD_ID)
    push_blessing(origin, old, parse_reference(registry.ref("c/t:old")), transport=registry.transport)
    new = bless_version(origin, tmp_path, "big", NEW_ID)
    push_blessing(origin, new, parse_reference(registry.ref("c/t:new")), transport=registry.transport)
    with small_disk(tmp_path / "disk", "8m") as disk:
        host = Store(disk / "host")
        pull_blessing(host, parse_reference(registry.ref("c/t:old")), transport=registry.transport)
        filled: list[bool] = []

        def fill_once(_size: int) -> None:  # past the free-space check: the first bytes have arrived
            if not filled:
                filled.append(True)
                fill(disk)

        with pytest.raises(NoSpaceError, match="No space left") as info:
            pull_blessing(
                host,
                parse_reference(registry.ref("c/t:new")),
                transport=registry.transport,
                progress=fill_once,
                workers=1,
            )
        refused(info)
        for filler in disk.glob("filler-*"):
            filler.unlink()
        assert_untouched(host, old)


def test_pull_into_a_read_only_store_is_refused(tmp_path: Path, registry: AnyRegistry) -> None:
    origin = Store(tmp_path / "origin")
    old = bless_version(origin, tmp_path, "a", OLD_ID)
    push_blessing(origin, old, parse_reference(registry.ref("c/t:old")), transport=registry.transport)
    new = bless_version(origin, tmp_path, "b", NEW_ID)
    push_blessing(origin, new, parse_reference(registry.ref("c/t:new")), transport=registry.transport)
    with small_disk(tmp_path / "disk", "8m") as disk:
        host = Store(disk / "host")
        pull_blessing(host, parse_reference(registry.ref("c/t:old")), transport=registry.transport)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        with pytest.raises(NoSpaceError, match="Read-only") as info:
            pull_blessing(host, parse_reference(registry.ref("c/t:new")), transport=registry.transport)
        assert "read-only" in refused(info)
        live = host.find(old.config_hash)
        assert live is not None and live.cache.dir_id == OLD_ID


def test_a_rebless_pull_links_unchanged_files_and_a_failed_publish_keeps_them_read_only(
    tmp_path: Path, registry: AnyRegistry
) -> None:
    origin = Store(tmp_path / "origin")
    host = Store(tmp_path / "host")
    old = bless_version(origin, tmp_path, "a", OLD_ID)
    push_blessing(origin, old, parse_reference(registry.ref("c/t:old")), transport=registry.transport)
    pull_blessing(host, parse_reference(registry.ref("c/t:old")), transport=registry.transport)
    tree = write_tree(tmp_path / "tree-rebless", "a")
    (tree / "big.bin").write_bytes(b"a" * 4096)
    (tree / "nested" / "index.json").write_text('{"variant": "changed"}\n')
    new = make_manifest(tree, dir_id=NEW_ID)
    origin.publish(tree, new)
    push_blessing(origin, new, parse_reference(registry.ref("c/t:new")), transport=registry.transport)
    old_dir = host.blessed_dir(old)

    def fail(point: str) -> None:
        if point == "archive-old":
            raise RuntimeError("injected failure after the tree moved")

    with pytest.raises(RuntimeError, match="injected"):
        pull_blessing(host, parse_reference(registry.ref("c/t:new")), transport=registry.transport, fault=fail)
    # Giving the tree back made its files writable, but not the live version's it shares inodes with.
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o444 for p in old_dir.rglob("*") if p.is_file())
    assert_untouched(host, old)

    pulled = pull_blessing(host, parse_reference(registry.ref("c/t:new")), transport=registry.transport)
    assert pulled.installed and pulled.blobs_downloaded == 1  # only the changed file
    new_dir = host.blessed_dir(new)
    kernel = "nested/deep/kernel.so"
    assert (new_dir / kernel).stat().st_ino == (old_dir / kernel).stat().st_ino, "an unchanged file is linked"
    assert (new_dir / "nested/index.json").stat().st_ino != (old_dir / "nested/index.json").stat().st_ino


# ------------------------------------------------------------------------------ publish, sign, trust


def test_publish_refuses_a_full_disk_and_gives_the_tree_back(tmp_path: Path) -> None:
    """bless run's commit: the disk fills up before the manifest is written; the old blessing stays live."""
    with small_disk(tmp_path / "disk", "4m") as disk:
        store = Store(disk / "root")
        old_tree = write_tree(disk / "root" / "staging" / "old", "a")
        old = make_manifest(old_tree, dir_id=OLD_ID)
        store.publish(old_tree, old)
        new_tree = write_tree(disk / "root" / "staging" / "new", "b")
        new = make_manifest(new_tree, dir_id=NEW_ID)
        with pytest.raises(NoSpaceError, match="publishing") as info:
            store.publish(new_tree, new, fault=fill_at("write-manifest-tmp", disk))
        refused(info)
        for filler in disk.glob("filler-*"):
            filler.unlink()
        live = store.find(old.config_hash)
        assert live is not None and live.cache.dir_id == OLD_ID
        assert new_tree.is_dir(), "the staged tree is given back"


def test_trust_init_and_sign_refuse_a_full_disk(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "2m") as disk:
        store = Store(tmp_path / "root")
        manifest = make_manifest(write_tree(tmp_path / "tree"))
        store.publish(tmp_path / "tree", manifest)
        keys = disk / "keys"
        init_repository(keys, sources=TEST_KEYS)
        fill(disk)
        with pytest.raises(NoSpaceError, match="signing repository") as info:
            sign_blessing(keys, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
        refused(info)
        with pytest.raises(NoSpaceError, match="trust repository") as info:
            init_repository(disk / "other-keys", sources=TEST_KEYS)
        refused(info)


def test_recording_trusted_metadata_refuses_a_full_disk(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    init_repository(keys, sources=TEST_KEYS)
    trust = provision(tmp_path, keys)
    with small_disk(tmp_path / "disk", "2m") as disk:
        store = Store(disk / "root")
        tree = write_tree(disk / "root" / "staging" / "t")
        manifest = make_manifest(tree)
        store.publish(tree, manifest)
        sign_blessing(keys, manifest, manifest.to_json_bytes(), sources=TEST_KEYS)
        fill(disk)
        with pytest.raises(NoSpaceError, match="trusted metadata") as info:
            check_blessing(
                manifest,
                manifest.to_json_bytes(),
                trust_dir=keys / "metadata",
                state_dir=store.paths.trust,
                lock_path=store.paths.trust_lock,
            )
        refused(info)
    assert trust.is_dir()


# ------------------------------------------------------------------------------------------------- run


def test_a_disk_filling_up_during_a_run_is_refused_not_a_crash(tmp_path: Path) -> None:
    """The engine log a run keeps as evidence meets a full disk: 15 (it was "internal error", exit 1)."""
    with small_disk(tmp_path / "disk", "4m") as disk:
        filled: list[bool] = []

        def fills_the_disk(prompt: str, max_tokens: int, nth: int) -> list[int]:
            if not filled:
                filled.append(True)
                fill(disk)
            return tokens_for(prompt, max_tokens)

        runtime = FakeRuntime(lambda phase, candidate, trial: Behavior(answer=fills_the_disk))
        try:
            harness = Harness(Store(disk / "root"), runtime, make_resolved(make_profile(), runtime), [])
            with pytest.raises(NoSpaceError, match="engine log") as info:
                harness.run(trials=1)
        finally:
            runtime.close()
        refused(info)
        assert filled


def test_a_run_on_a_full_disk_is_refused_at_its_staging_dir(tmp_path: Path) -> None:
    """The staging dir's owner record meets the full disk: 15 (it was "invalid input", exit 3)."""
    with small_disk(tmp_path / "disk", "1m") as disk:
        store = Store(disk / "root")
        store.paths.ensure_layout()
        fill(disk)
        with pytest.raises(NoSpaceError, match="staging dir") as info:
            store.new_staging_dir("run1")
        refused(info)
        assert list(store.paths.staging.iterdir()) == []
