"""The pull's decision (present, install, refused downgrade) over one lookup of the live manifest.

:func:`decide_pull` on its own (no I/O), then whole pulls against the in-memory registry with a store
that counts its lookups of the live manifest: one per pull, whatever the pull decides.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from bless.core.manifest import Manifest
from bless.errors import DowngradeError, LockHeldError
from bless.flows.pull import pull_blessing
from bless.flows.pull.decision import decide_pull
from bless.flows.push import push_blessing
from bless.oci.client import parse_reference
from bless.store import LiveManifest, Store
from tests.support.registry_simulator import AnyRegistry
from tests.unit.test_fleet_registry import NEW_ID, OLD_ID, bless_version


class CountingStore(Store):
    """The real store, counting lookups of a live manifest (``find`` and ``manifest_path`` go through ``live``)."""

    lookups = 0

    def live(self, config_hash: str) -> LiveManifest | None:
        self.lookups += 1
        return super().live(config_hash)


@pytest.fixture
def versions(tmp_path: Path) -> tuple[Manifest, Manifest]:
    """Two blessings of one config: the older one, and a rebless made a day later."""
    origin = Store(tmp_path / "versions")
    return bless_version(origin, tmp_path, "a", OLD_ID), bless_version(origin, tmp_path, "b", NEW_ID)


def test_the_very_blessing_live_is_present(versions: tuple[Manifest, Manifest]) -> None:
    old, _new = versions
    decision = decide_pull(old, old, allow_downgrade=False)
    assert decision.action == "present" and decision.live is old


def test_nothing_live_or_an_older_one_live_installs(versions: tuple[Manifest, Manifest]) -> None:
    old, new = versions
    assert decide_pull(None, old, allow_downgrade=False).action == "install"
    over_old = decide_pull(old, new, allow_downgrade=False)
    assert over_old.action == "install" and over_old.live is old  # its files are linked, not downloaded


def test_an_older_blessing_over_a_newer_one_is_refused_unless_allowed(versions: tuple[Manifest, Manifest]) -> None:
    old, new = versions
    with pytest.raises(DowngradeError) as refused:
        decide_pull(new, old, allow_downgrade=False)
    assert refused.value.details == {"live": NEW_ID, "pulled": OLD_ID}
    assert decide_pull(new, old, allow_downgrade=True).action == "install"


def test_the_same_dir_id_with_another_tree_is_installed_not_present(versions: tuple[Manifest, Manifest]) -> None:
    old, new = versions
    same_id = replace(new, cache=replace(new.cache, dir_id=old.cache.dir_id))
    assert decide_pull(old, same_id, allow_downgrade=False).action == "install"


def test_each_pull_looks_the_live_manifest_up_once(tmp_path: Path, registry: AnyRegistry) -> None:
    """A fresh install, a present blessing, a rebless over an older one and a refused downgrade: one lookup each."""
    origin = Store(tmp_path / "origin")
    refs = {}
    for variant, dir_id in (("a", OLD_ID), ("b", NEW_ID)):
        refs[dir_id] = parse_reference(registry.ref(f"caches/tiny:{variant}"))
        push_blessing(
            origin, bless_version(origin, tmp_path, variant, dir_id), refs[dir_id], transport=registry.transport
        )
    host = CountingStore(tmp_path / "host")

    def lookups(dir_id: str, *, outcome: str) -> int:
        host.lookups = 0
        if outcome == "refused":
            with pytest.raises(DowngradeError):
                pull_blessing(host, refs[dir_id], transport=registry.transport)
        else:
            pulled = pull_blessing(host, refs[dir_id], transport=registry.transport)
            assert pulled.installed is (outcome == "installed")
        return host.lookups

    assert lookups(OLD_ID, outcome="installed") == 1
    assert lookups(OLD_ID, outcome="present") == 1
    assert lookups(NEW_ID, outcome="installed") == 1  # a rebless: the live one's files linked, not looked up again
    assert lookups(OLD_ID, outcome="refused") == 1
    assert lookups(NEW_ID, outcome="present") == 1


def test_a_present_blessing_needs_no_lock_and_a_held_lock_is_refused_without_wait(
    tmp_path: Path, registry: AnyRegistry
) -> None:
    """Another writer holds the config's lock: present is still a no-op; anything else waits, or is refused."""
    origin = Store(tmp_path / "origin")
    old = bless_version(origin, tmp_path, "a", OLD_ID)
    ref_old = parse_reference(registry.ref("caches/tiny:old"))
    push_blessing(origin, old, ref_old, transport=registry.transport)
    host = CountingStore(tmp_path / "host")
    fresh = CountingStore(tmp_path / "fresh")
    holding, release = threading.Event(), threading.Event()

    def hold(store: Store) -> None:
        with store.lock(old.config_hash):
            holding.set()
            release.wait(30)

    pull_blessing(host, ref_old, transport=registry.transport)
    for store in (host, fresh):
        holder = threading.Thread(target=hold, args=(store,))
        holder.start()
        try:
            assert holding.wait(30)
            store.lookups = 0
            if store is host:
                assert not pull_blessing(store, ref_old, transport=registry.transport, wait=False).installed
            else:
                with pytest.raises(LockHeldError):
                    pull_blessing(store, ref_old, transport=registry.transport, wait=False)
            assert store.lookups == 1
        finally:
            release.set()
            holder.join(30)
            holding.clear()
            release.clear()
