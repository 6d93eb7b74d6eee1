"""serve-full as one library call (bless.flows.serve.serve_full): the steps in order, with our fakes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from bless.core import manifest as manifest_module
from bless.errors import NoManifestError
from bless.flows import serve
from bless.store import Store
from bless.trust import UNSIGNED_NOTE, init_repository, sign_blessing
from tests.support.fakes import FakeEngineServer, openai_engine
from tests.support.trust_keys import TEST_KEYS
from tests.unit.test_serve import GOLDEN, _blessed_plan


def _engine() -> FakeEngineServer:
    replies = {str(g["prompt"]): list(g["token_ids"]) for g in GOLDEN}
    return FakeEngineServer(openai_engine(lambda prompt, n: replies.get(prompt, [0])[:n]))


def test_foreground_serves_until_stop_then_ends_gracefully(store: Store, tmp_path: Path) -> None:
    seen: list[str] = []
    with _engine() as server:
        the_plan, runtime = _blessed_plan(store, tmp_path, server.port)
        hooks = serve.ServeHooks(signal_name=lambda: "SIGTERM")

        def on_plan(plan_dict: Mapping[str, Any]) -> None:
            seen.append("plan")
            assert "start" not in runtime.calls, "the plan is shown before anything starts"

        def on_serving(result: serve.LaunchResult) -> None:
            seen.append("serving")
            assert serve.check_ready(store, the_plan.profile.name).canary == "passed"
            hooks.stop.set()  # as the signal handler does

        hooks.on_plan, hooks.on_serving = on_plan, on_serving
        request = serve.ServeRequest(profile=the_plan.profile, store=store)
        outcome = serve.serve_full(request, runtime=runtime, adapter=the_plan.adapter, hooks=hooks)
    assert seen == ["plan", "serving"]
    assert outcome.failure is None and outcome.ended_by == "SIGTERM"
    assert outcome.finish is not None and outcome.finish.stop is not None and outcome.finish.stop.graceful
    assert outcome.to_dict()["plan"]["trust"] == {"signed": False, "note": UNSIGNED_NOTE}
    assert store.leases.leases() == [], "serving ended: the lease is released"


def test_dry_run_starts_nothing(store: Store, tmp_path: Path) -> None:
    with _engine() as server:
        the_plan, runtime = _blessed_plan(store, tmp_path, server.port)
        request = serve.ServeRequest(profile=the_plan.profile, store=store, dry_run=True)
        outcome = serve.serve_full(request, runtime=runtime, adapter=the_plan.adapter)
    assert outcome.dry_run and outcome.result is None and "start" not in runtime.calls
    assert outcome.plan["config_hash"] == the_plan.config_hash


def test_a_pulled_blessing_that_is_not_the_profiles_is_refused_before_anything_starts(
    store: Store, tmp_path: Path
) -> None:
    with _engine() as server:
        the_plan, runtime = _blessed_plan(store, tmp_path, server.port)
        fetched = serve.Fetched(reference="r@sha256:" + "0" * 64, config_hash="f" * 64, dir_id="x", report={})
        request = serve.ServeRequest(profile=the_plan.profile, store=store, fetch=lambda s: fetched)
        with pytest.raises(NoManifestError, match="holds blessing ffffffffffffffff"):
            serve.serve_full(request, runtime=runtime, adapter=the_plan.adapter)
    assert "start" not in runtime.calls


def test_the_pull_runs_first_and_its_report_is_in_the_plan(store: Store, tmp_path: Path) -> None:
    with _engine() as server:
        the_plan, runtime = _blessed_plan(store, tmp_path, server.port)
        assert the_plan.manifest is not None
        fetched = serve.Fetched(
            reference="r@sha256:" + "0" * 64,
            config_hash=the_plan.manifest.config_hash,
            dir_id=the_plan.manifest.cache.dir_id,
            report={"installed": False},
        )
        calls: list[Store] = []

        def fetch(into: Store) -> serve.Fetched:
            calls.append(into)
            return fetched

        request = serve.ServeRequest(profile=the_plan.profile, store=store, dry_run=True, fetch=fetch)
        outcome = serve.serve_full(request, runtime=runtime, adapter=the_plan.adapter)
    assert calls == [store] and outcome.plan["from"] == {"installed": False}


def test_a_signed_serve_parses_the_live_manifest_once_and_checks_the_signature_on_those_bytes(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _engine() as server:
        the_plan, runtime = _blessed_plan(store, tmp_path, server.port)
        assert the_plan.manifest is not None and the_plan.manifest_path is not None
        keys = tmp_path / "keys"
        init_repository(keys, sources=TEST_KEYS)
        sign_blessing(keys, the_plan.manifest, the_plan.manifest_path.read_bytes(), sources=TEST_KEYS)
        parsed: list[str] = []
        real = manifest_module.manifest_from_dict

        def counting(document: Any, *, where: str = "manifest") -> manifest_module.Manifest:
            parsed.append(where)
            return real(document, where=where)

        monkeypatch.setattr(manifest_module, "manifest_from_dict", counting)
        fresh = Store(store.root)  # nothing validated yet in this process's reader
        request = serve.ServeRequest(profile=the_plan.profile, store=fresh, dry_run=True, trust_dir=keys / "metadata")
        outcome = serve.serve_full(request, runtime=runtime, adapter=the_plan.adapter)
    assert outcome.plan["trust"]["signed"] is True
    assert len(parsed) == 1, parsed
