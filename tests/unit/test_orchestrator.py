"""The orchestrator's logic against fakes of OUR interfaces only (no Docker, no torch).

The runtime is ``tests.support.fakes.FakeRuntime``: its containers are tiny in-process engines answering
with token ids each test controls per phase / candidate / trial (a ``Scenario`` of ``Behavior``),
writing artifact files into the read-write staging tree on bootstrap, printing the reference
engine's real markers, and reporting the upper-layer entries a test chooses. The adapter is the
real ``ReferenceAdapter``, the store the real ``Store``, the trial protocol the real one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bless import container_labels as labels
from bless.cli.error_hints import command_line_hint
from bless.core.profile import load_profile
from bless.core.verify import verify_tree
from bless.engines.base import ENGINE_HOME, ENGINE_TMP
from bless.engines.reference import ReferenceAdapter
from bless.engines.reference_engine import markers
from bless.errors import (
    AlreadyBlessedError,
    BootstrapFailedError,
    ExitCode,
    InterruptedByUserError,
    LockHeldError,
    UnknownEngineVersionError,
    UnsafeEnvError,
    UsageError,
    WeakerBlessingError,
)
from bless.evidence_types import UpperEntry
from bless.flows.events import Event
from bless.flows.run import RunOptions, RunResult, bless_profile
from bless.flows.run.results import DEFAULT_CONFIDENCE
from bless.replay.trials import failure_rate_bound, trials_for
from bless.store import Store
from tests.support.fakes import ARTIFACT, META, Behavior, FakeRuntime, UnknownVersionAdapter, key_line, tokens_for
from tests.unit.run_harness import Harness, make_profile

REPO = Path(__file__).resolve().parents[2]
FORMER_OVERRIDE = "BLESS_ALLOW_UNSAFE_ENV_FOR_TESTS"


# --- fixtures ----------------------------------------------------------------------------------------


def h12(harness: Harness) -> str:
    return harness.config_hash[:12]


def tagged(harness: Harness, name: str) -> str:
    """A run container's name as the run gives it: the store root's tag at its end."""
    return f"{name}-{labels.store_tag(harness.store.root)}"


# --- accept --------------------------------------------------------------------------------------------


def test_unknown_engine_version_is_refused_before_any_engine_starts(make: Callable[..., Harness]) -> None:
    harness = make()
    with pytest.raises(UnknownEngineVersionError):
        harness.run(trials=1, adapter=UnknownVersionAdapter())
    assert harness.runtime.containers == [] and harness.store.find(harness.config_hash) is None


def test_allowed_unknown_version_runs_and_only_replays_get_the_force_load_env(make: Callable[..., Harness]) -> None:
    harness = make()
    result = harness.run(trials=2, adapter=UnknownVersionAdapter(), allow_unknown_engine_version=True)
    assert result.published
    boot, *trials = harness.runtime.containers
    assert "FAKE_FORCE_LOAD" not in boot.spec.env  # the bootstrap compiles: nothing to load yet
    assert [t.spec.env["FAKE_FORCE_LOAD"] for t in trials] == ["1", "1"]


def test_clean_run_publishes_manifest_with_k_trials_and_golden(make: Callable[..., Harness]) -> None:
    harness = make()
    result = harness.run(trials=3)

    assert result.published and len(result.candidates) == 1 and result.candidates[0].accepted
    assert [t.passed for t in result.candidates[0].trials] == [True, True, True]
    assert result.failure_rate_bound == pytest.approx(failure_rate_bound(3, 0.95))
    assert result.failure_rate_bound == pytest.approx(0.6316, abs=1e-4)
    manifest = harness.store.find(harness.config_hash)
    assert manifest is not None
    assert manifest.trials["planned"] == 3 and manifest.trials["passed"] == 3
    assert [r["index"] for r in manifest.trials["results"]] == [1, 2, 3]
    assert manifest.trials["failure_rate_bound"] == {"confidence": 0.95, "max_failure_rate": pytest.approx(0.631597)}
    plan = harness.resolved.profile.trials
    assert [g["prompt"] for g in manifest.golden] == list(plan.prompts)
    for golden in manifest.golden:
        assert golden["token_ids"] == tokens_for(golden["prompt"], plan.max_tokens)
        assert golden["max_tokens"] == plan.max_tokens
    assert sorted(f.path for f in manifest.cache.files) == sorted([ARTIFACT, META])
    assert list(manifest.artifacts["items"]) == [ARTIFACT, META] or set(manifest.artifacts["items"]) == {ARTIFACT, META}
    # The published tree verifies and is exactly what the bootstrap wrote.
    assert result.blessed_dir is not None
    blessed = Path(result.blessed_dir)
    assert verify_tree(blessed, manifest.cache.files, manifest.cache.dirs).ok
    assert (blessed / ARTIFACT).read_bytes() == f"compiled artifact of candidate 1 of run {result.run_id}".encode()
    # Containers: deterministic names, our labels, one rw bootstrap then K overlay trials at the same path.
    runtime = harness.runtime
    assert runtime.names() == [
        tagged(harness, f"bless-bootstrap-{h12(harness)}-c1"),
        *(tagged(harness, f"bless-trial-{h12(harness)}-c1-t{k}") for k in (1, 2, 3)),
    ]
    assert runtime.all_stopped_and_removed()
    boot, *trials = runtime.containers
    assert boot.spec.mounts[0].kind == "rw"
    assert {t.spec.mounts[0].kind for t in trials} == {"overlay"}
    assert {e.spec.mounts[0].target for e in runtime.containers} == {ReferenceAdapter.cache_mount_path}
    assert {e.spec.env["HOME"] for e in runtime.containers} == {ReferenceAdapter.home}
    assert {e.spec.env["BLESS_CANDIDATE"] for e in runtime.containers} == {"1"}
    assert {e.spec.labels[labels.CONFIG_HASH] for e in runtime.containers} == {harness.config_hash}
    assert {e.spec.labels[labels.RUN_ID] for e in runtime.containers} == {result.run_id}
    assert runtime.calls.count("ping") == 1 and runtime.normalized, "ownership is normalized after the bootstrap"
    # Leftovers are looked for among bless-run phases only (never serving containers); none here.
    assert {c[labels.PHASE] for c in runtime.listed} == {"bootstrap", "trial", "helper"}
    assert all(c[labels.CONFIG_HASH] == harness.config_hash for c in runtime.listed)
    assert runtime.cleanups == []
    # Every container names the bless process that made it (so another run can tell a leftover).
    owner = json.loads(boot.spec.labels[labels.OWNER_PROCESS])
    assert owner["pid"] == os.getpid()
    # Nothing left over in the store; the lock is free again.
    assert harness.staging_left() == [] and harness.rejected_dirs() == []
    with harness.store.lock(harness.config_hash):
        pass
    data = result.to_dict()
    assert data["published"] and data["orchestration_overhead"] is not None
    assert [e.kind for e in harness.events].count("trial-end") == 3


# --- reject --------------------------------------------------------------------------------------------


def _assert_rejected_one(harness: Harness, result: RunResult, needle: str) -> dict[str, Any]:
    assert not result.published and result.manifest_path is None
    assert harness.store.find(harness.config_hash) is None
    assert not (harness.store.root / "manifests").exists() or not list((harness.store.root / "manifests").iterdir())
    (candidate,) = result.candidates
    assert not candidate.accepted
    assert any(needle in reason for reason in candidate.reasons), candidate.reasons
    (rejected,) = harness.rejected_dirs()
    assert candidate.rejected_dir == rejected
    assert rejected.name == f"{result.run_id}-c1"
    summary = (rejected / "summary.md").read_text()
    assert needle in summary
    evidence: dict[str, Any] = json.loads((rejected / "evidence.json").read_text())
    assert evidence["config_hash"] == harness.config_hash and evidence["candidate"] == 1
    assert (rejected / "tree" / ARTIFACT).is_file()
    assert (rejected / "bootstrap.log").is_file() and (rejected / "trial-1.log").is_file()
    assert harness.runtime.all_stopped_and_removed()
    assert harness.staging_left() == []
    return evidence


def test_trial_with_a_differing_repeat_is_rejected(make: Callable[..., Harness]) -> None:
    def scenario(phase: str, candidate: int, trial: int | None) -> Behavior:
        if phase == "trial":
            # The second request of each prompt answers differently: the repeat mode diverges.
            return Behavior(answer=lambda p, m, n: tokens_for(p, m, salt=1 if n == 2 else 0))
        return Behavior()

    harness = make(scenario)
    result = harness.run(trials=3)
    evidence = _assert_rejected_one(harness, result, "2 distinct outputs")
    assert any("modes differing from 'alone': repeat" in r for r in result.candidates[0].reasons)
    # A run stops at the first failing trial.
    assert len(result.candidates[0].trials) == 1 and len(harness.runtime.containers) == 2
    (trial,) = evidence["trials"]
    assert trial["passed"] is False and trial["coherence"]["passed"] is False
    assert trial["reuse"]["passed"] is True


def test_trial_output_differing_from_golden_is_rejected(make: Callable[..., Harness]) -> None:
    def scenario(phase: str, candidate: int, trial: int | None) -> Behavior:
        if phase == "trial":  # coherent within the trial, but not what the bootstrap answered
            return Behavior(answer=lambda p, m, n: tokens_for(p, m, salt=7))
        return Behavior()

    harness = make(scenario)
    result = harness.run(trials=2)
    _assert_rejected_one(harness, result, "output differs from the golden output")


def test_new_artifact_in_the_upper_layer_is_rejected(make: Callable[..., Harness]) -> None:
    recompiled = [UpperEntry(path=f"reference/{'f' * 16}/megacache.bin", kind="new", size=4096)]

    def scenario(phase: str, candidate: int, trial: int | None) -> Behavior:
        if phase == "trial":  # outputs match, markers even claim a load: only the upper layer tells
            return Behavior(upper=recompiled)
        return Behavior()

    harness = make(scenario)
    result = harness.run(trials=3)
    evidence = _assert_rejected_one(harness, result, "new compiled artifact(s) in the upper layer")
    (trial,) = evidence["trials"]
    assert trial["coherence"]["passed"] is True
    assert trial["reuse"]["upper_new_artifacts"] == [recompiled[0].path]
    assert trial["upper"]["written"] == 1


def test_compile_marker_in_a_trial_is_rejected(make: Callable[..., Harness]) -> None:
    def scenario(phase: str, candidate: int, trial: int | None) -> Behavior:
        if phase == "trial":
            return Behavior(log=[markers.compiling("BLESS_REFERENCE_IGNORE_CACHE is set; artifact not loaded")])
        return Behavior()

    harness = make(scenario)
    result = harness.run(trials=1)
    reasons = result.candidates[0].reasons
    _assert_rejected_one(harness, result, "compile/save marker(s) in the log")
    assert any("no load marker" in r for r in reasons)


def test_trial_keying_another_artifact_is_rejected(make: Callable[..., Harness]) -> None:
    other = "fedcba9876543210"

    def scenario(phase: str, candidate: int, trial: int | None) -> Behavior:
        if phase == "trial":  # loads, answers the golden outputs, but keyed its cache differently
            target = ReferenceAdapter.cache_mount_path
            return Behavior(log=[key_line(other), markers.loaded(f"{target}/reference/{other}/megacache.bin")])
        return Behavior()

    harness = make(scenario)
    result = harness.run(trials=1)
    _assert_rejected_one(harness, result, f"the engine keyed its artifact {other}")


def test_tree_modified_during_a_trial_is_rejected(make: Callable[..., Harness]) -> None:
    def scenario(phase: str, candidate: int, trial: int | None) -> Behavior:
        return Behavior(touch_tree=phase == "trial")

    harness = make(scenario)
    result = harness.run(trials=3)
    evidence = _assert_rejected_one(harness, result, "the blessed tree changed during the run")
    assert evidence["trials"][0]["reuse"]["tree_unchanged"] is False
    assert ARTIFACT in " ".join(result.candidates[0].reasons)


# --- candidates ----------------------------------------------------------------------------------------


def test_candidates_two_first_rejected_second_published(make: Callable[..., Harness]) -> None:
    def scenario(phase: str, candidate: int, trial: int | None) -> Behavior:
        if phase == "trial" and candidate == 1:  # a "bad compile": unstable outputs when loaded
            return Behavior(answer=lambda p, m, n: tokens_for(p, m, salt=n % 2))
        return Behavior()

    harness = make(scenario)
    result = harness.run(trials=2, candidates=2)

    assert result.published
    first, second = result.candidates
    assert not first.accepted and first.rejected_dir is not None
    assert Path(first.rejected_dir, "summary.md").is_file()
    assert Path(first.rejected_dir).name == f"{result.run_id}-c1"
    assert second.accepted and second.rejected_dir is None and len(second.trials) == 2
    manifest = harness.store.find(harness.config_hash)
    assert manifest is not None
    assert manifest.provenance["candidate"] == 2
    assert Path(result.blessed_dir or "", ARTIFACT).read_bytes() == (
        f"compiled artifact of candidate 2 of run {result.run_id}".encode()
    )
    h = h12(harness)
    assert harness.runtime.names() == [
        tagged(harness, name)
        for name in (
            f"bless-bootstrap-{h}-c1",
            f"bless-trial-{h}-c1-t1",
            f"bless-bootstrap-{h}-c2",
            f"bless-trial-{h}-c2-t1",
            f"bless-trial-{h}-c2-t2",
        )
    ]
    assert [e.spec.env["BLESS_CANDIDATE"] for e in harness.runtime.containers] == ["1", "1", "2", "2", "2"]
    assert harness.runtime.all_stopped_and_removed()
    assert harness.staging_left() == []
    assert result.to_dict()["candidates"][0]["accepted"] is False


def test_candidates_all_rejected_publishes_nothing(make: Callable[..., Harness]) -> None:
    def scenario(phase: str, candidate: int, trial: int | None) -> Behavior:
        return Behavior(upper=[UpperEntry("reference/x/megacache.bin", "new", 1)] if phase == "trial" else [])

    harness = make(scenario)
    result = harness.run(trials=1, candidates=2)
    assert not result.published and [c.accepted for c in result.candidates] == [False, False]
    assert [p.name for p in harness.rejected_dirs()] == [f"{result.run_id}-c1", f"{result.run_id}-c2"]
    assert harness.store.find(harness.config_hash) is None
    refusal = result.failure
    assert refusal is not None and "--" not in (refusal.hint or "")
    # The command line words the remedy as the option to pass, naming the last candidate's evidence.
    assert command_line_hint(refusal) == (
        f"read {result.candidates[-1].rejected_dir}/summary.md; a nondeterministic engine cannot be blessed, "
        "and --candidates N tries fresh compiles"
    )


# --- the command's one call --------------------------------------------------------------------------


def test_bless_profile_works_out_k_reports_the_hash_then_runs(tmp_path: Path) -> None:
    """bless_profile loads the profile, derives K, resolves on this machine and reports the line bless run prints."""
    profile = REPO / "profiles" / "reference-cpu.toml"
    runtime = FakeRuntime()
    events: list[Event] = []
    try:
        result = bless_profile(
            profile, RunOptions(max_failure_rate=0.5), store=Store(tmp_path / "root"), runtime=runtime,
            events=events.append,
        )  # fmt: skip
    finally:
        runtime.close()
    k = trials_for(0.5, DEFAULT_CONFIDENCE)
    assert result.published and result.trials_planned == k
    label = load_profile(profile).label
    notes = [event for event in events if event.kind == "note"]
    assert notes[0].message == f"config hash {result.config_hash} ({label}); K={k}"
    assert notes[0].data == {"config_hash": result.config_hash, "trials": k}


def test_k_is_the_asked_count_else_the_profiles_else_derived_from_a_failure_rate() -> None:
    profile = make_profile()
    assert RunOptions().planned(profile).k == profile.trials.count
    assert RunOptions(trials=7).planned(profile).k == 7
    assert RunOptions(max_failure_rate=0.1, confidence=0.9).planned(profile).k == trials_for(0.1, 0.9)
    with pytest.raises(UsageError):
        RunOptions(max_failure_rate=1.5).planned(profile)
    with pytest.raises(ValueError, match="not worked out"):
        _ = RunOptions().k


# --- bootstrap failures --------------------------------------------------------------------------------


def test_bootstrap_writing_no_artifact_fails_and_keeps_evidence(make: Callable[..., Harness]) -> None:
    harness = make(lambda phase, candidate, trial: Behavior(write_artifact=False))
    with pytest.raises(BootstrapFailedError) as caught:
        harness.run(trials=3)
    assert caught.value.exit_code == ExitCode.BOOTSTRAP_FAILED
    assert int(caught.value.exit_code) == 40
    assert "wrote no compiled artifact" in caught.value.message
    assert harness.runtime.names() == [tagged(harness, f"bless-bootstrap-{h12(harness)}-c1")], (
        "no trial after a failed bootstrap"
    )
    assert harness.runtime.all_stopped_and_removed()
    assert harness.store.find(harness.config_hash) is None
    (rejected,) = harness.rejected_dirs()
    assert "wrote no compiled artifact" in (rejected / "summary.md").read_text()
    assert (rejected / "bootstrap.log").read_text().startswith(markers.USING_CACHE_DIR)
    assert json.loads((rejected / "evidence.json").read_text())["trials"] == []
    assert harness.staging_left() == []
    with harness.store.lock(harness.config_hash):
        pass


def test_engine_dying_at_boot_is_a_bootstrap_failure_with_the_log_tail(make: Callable[..., Harness]) -> None:
    harness = make(lambda phase, candidate, trial: Behavior(exit_at_boot=True))
    with pytest.raises(BootstrapFailedError) as caught:
        harness.run(trials=1)
    message = caught.value.message
    assert "exited before it became ready" in message and "(exit code 1)" in message
    assert "FATAL simulated crash (fake engine)" in message
    assert harness.runtime.all_stopped_and_removed()
    (rejected,) = harness.rejected_dirs()
    assert "FATAL simulated crash" in (rejected / "bootstrap.log").read_text()


# --- refusals ------------------------------------------------------------------------------------------


def test_existing_blessing_is_refused_without_rebless_and_archived_with_it(make: Callable[..., Harness]) -> None:
    first = make()
    published = first.run(trials=1)
    assert published.published
    before = first.store.find(first.config_hash)
    assert before is not None

    again = make()
    with pytest.raises(AlreadyBlessedError) as caught:
        again.run(trials=1)
    assert caught.value.exit_code == ExitCode.ALREADY_BLESSED
    assert int(caught.value.exit_code) == 10
    assert again.runtime.containers == [], "refused before any engine started"
    assert again.runtime.cleanups == [], "refused before touching any container"
    assert again.staging_left() == []

    rebless = make()
    result = rebless.run(trials=1, rebless=True)
    assert result.published and result.archived_manifest is not None
    archived = json.loads(Path(result.archived_manifest).read_text())
    assert archived["cache"]["dir_id"] == before.cache.dir_id
    after = rebless.store.find(rebless.config_hash)
    assert after is not None and after.provenance["run_id"] == result.run_id != published.run_id
    # The prior version stays on disk until gc.
    assert Path(published.blessed_dir or "").is_dir()


def test_rebless_with_a_weaker_bound_is_refused_unless_allowed(make: Callable[..., Harness]) -> None:
    """3/3 (63% at 95%) must not be silently replaced by 2/2 (78%): refused at once, or published with a warning."""
    first = make()
    assert first.run(trials=3).published
    before = first.store.find(first.config_hash)
    assert before is not None

    weaker = make()
    with pytest.raises(WeakerBlessingError) as caught:
        weaker.run(trials=2, rebless=True)
    assert caught.value.exit_code == ExitCode.WEAKER_BLESSING
    assert int(caught.value.exit_code) == 13
    assert "63% -> 78%" in caught.value.message and "3/3" in caught.value.message
    assert "--" not in (caught.value.hint or "") and "at least 3 trials" in (caught.value.hint or "")
    worded = command_line_hint(caught.value) or ""
    assert "--allow-weaker" in worded and "--trials 3" in worded
    assert weaker.runtime.containers == [], "refused before any engine started"
    live = weaker.store.find(weaker.config_hash)
    assert live is not None and live.cache.dir_id == before.cache.dir_id, "the stronger blessing stays live"

    allowed = make()
    result = allowed.run(trials=2, rebless=True, allow_weaker=True)
    assert result.published
    (warning,) = result.warnings
    assert "63% -> 78%" in warning and "--allow-weaker" in warning
    assert [e.message for e in allowed.events if e.kind == "warning"] == [warning]
    assert result.to_dict()["warnings"] == [warning]

    # Another confidence alone is not weaker evidence: 2 passes are 2 passes.
    same_evidence = make().run(trials=2, rebless=True, confidence=0.99)
    assert same_evidence.published and same_evidence.warnings == ()

    stronger = make().run(trials=4, rebless=True)
    assert stronger.published and stronger.warnings == ()


def test_unsafe_settings_refused_unless_the_test_override_is_set(
    make: Callable[..., Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = make_profile(BLESS_REFERENCE_NONDETERMINISTIC="1")
    refused = make(profile=profile)
    with pytest.raises(UnsafeEnvError) as caught:
        refused.run(trials=1)
    assert caught.value.exit_code == ExitCode.UNSAFE_ENV
    assert int(caught.value.exit_code) == 30
    assert "BLESS_REFERENCE_NONDETERMINISTIC=1" in caught.value.message
    assert "exist to test bless itself" in (caught.value.hint or "")
    runtime = refused.runtime
    assert runtime.containers == [] and "ping" not in runtime.calls, "refused before touching the runtime"
    assert not (refused.store.root / "locks").exists(), "refused before taking the lock"

    monkeypatch.setenv(FORMER_OVERRIDE, "1")  # no environment variable weakens a run
    with pytest.raises(UnsafeEnvError):
        make(profile=profile).run(trials=1)

    allowed = make(profile=profile)  # the fake engine ignores the knob: the run blesses
    result = allowed.run(trials=1, allow_test_knobs=True)
    assert result.published
    manifest = allowed.store.find(allowed.config_hash)
    assert manifest is not None
    recorded = json.dumps(manifest.provenance)
    assert "BLESS_REFERENCE_NONDETERMINISTIC=1" in recorded, "what was allowed is recorded"
    assert {e.spec.env["BLESS_REFERENCE_NONDETERMINISTIC"] for e in allowed.runtime.containers} == {"1"}


def test_unsafe_debug_setting_hint_does_not_call_it_a_test_knob(make: Callable[..., Harness]) -> None:
    """TORCH_COMPILE_DEBUG is an engine debug switch, not one of bless's test knobs: the hint says so."""
    with pytest.raises(UnsafeEnvError) as caught:
        make(profile=make_profile(TORCH_COMPILE_DEBUG="1")).run(trials=1, allow_test_knobs=True)
    hint = caught.value.hint or ""
    assert "remove TORCH_COMPILE_DEBUG from the profile" in hint and "serve-full --debug" in hint
    assert "test bless itself" not in hint and FORMER_OVERRIDE not in hint
    with pytest.raises(UnsafeEnvError) as both:
        make(profile=make_profile(TORCH_COMPILE_DEBUG="1", BLESS_REFERENCE_CRASH_AT_BOOT="1")).run(trials=1)
    assert "remove TORCH_COMPILE_DEBUG from the profile" in (both.value.hint or "")
    assert "remove BLESS_REFERENCE_CRASH_AT_BOOT: these knobs exist to test bless itself" in (both.value.hint or "")


def test_lock_held_is_refused_before_any_engine(make: Callable[..., Harness]) -> None:
    harness = make()
    with harness.store.lock(harness.config_hash):
        # The lock is re-entrant per thread: contend from another thread (its own flock).
        errors: list[BaseException] = []

        def contender() -> None:
            try:
                harness.run(trials=1)
            except BaseException as exc:
                errors.append(exc)

        holder = threading.Thread(target=contender)
        holder.start()
        holder.join(10)
    (error,) = errors
    assert isinstance(error, LockHeldError) and error.exit_code == 11
    assert f"pid {os.getpid()}" in error.message
    worded = command_line_hint(error)
    assert worded is not None and "--wait" in worded, "the refusal names the way to queue behind the holder"
    assert harness.runtime.containers == []


def test_leftovers_of_dead_runs_of_this_store_are_removed_others_spared(
    make: Callable[..., Harness], tmp_path: Path
) -> None:
    harness = make()
    h = harness.config_hash
    dead_pid = _exited_pid()
    me = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "proc_start": None})
    dead = json.dumps({"host": socket.gethostname(), "pid": dead_pid, "proc_start": None})
    other_root = tmp_path / "another-store"

    def planted(run_id: str, phase: str, owner: str | None, root: Path | None = None) -> dict[str, str]:
        found = labels.labels_for(
            run_id=run_id, phase=phase, config_hash=h, profile="other", store_root=root or harness.store.root
        )
        return {**found, **({labels.OWNER_PROCESS: owner} if owner is not None else {})}

    runtime = harness.runtime
    crashed = runtime.plant(tagged(harness, f"bless-trial-{h[:12]}-c1-t2"), planted("crashed-run", "trial", dead))
    legacy = runtime.plant(tagged(harness, f"bless-bootstrap-{h[:12]}-c3"), planted("legacy-run", "bootstrap", None))
    live = runtime.plant(tagged(harness, f"bless-trial-{h[:12]}-c7-t7"), planted("two-paths-run", "trial", me))
    # Another store root's run of the same config on the same engine, its bless process gone: not ours.
    other_tag = labels.store_tag(other_root)
    foreign = runtime.plant(
        f"bless-trial-{h[:12]}-c1-t1-{other_tag}", planted("other-root-run", "trial", dead, other_root)
    )
    serving = runtime.plant("bless-serve-x", planted("serving", "serve", None))

    result = harness.run(trials=1)

    assert result.published
    assert crashed.removed and legacy.removed, "leftovers of this store's runs that are gone are removed"
    assert not live.removed and not live.stopped, "a live run's container (the same root by another path) is untouched"
    assert not foreign.removed and not foreign.stopped, "another store root's leftover is never ours to remove"
    assert not serving.removed, "serving containers are never leftovers of a bless run"
    assert {c.get(labels.RUN_ID) for c in runtime.cleanups} == {"crashed-run", "legacy-run"}
    notes = [e.message for e in harness.events if e.kind == "note"]
    assert any("removed leftover" in n and crashed.spec.name in n and legacy.spec.name in n for n in notes)
    assert any("left alone" in n and live.spec.name in n for n in notes)
    assert not any(foreign.spec.name in n for n in notes)


def test_run_containers_carry_the_store_in_their_names_and_labels(make: Callable[..., Harness]) -> None:
    harness = make()
    harness.run(trials=1)
    tag = labels.store_tag(harness.store.root)
    assert tag == labels.store_tag(harness.store.root / ".." / harness.store.root.name), "one tag per real path"
    for container in harness.runtime.containers:
        assert container.spec.name.endswith(f"-{tag}")
        assert container.spec.labels[labels.STORE] == tag
        assert container.spec.labels[labels.STORE_ROOT] == str(harness.store.root.resolve())


def _exited_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# --- interruption ---------------------------------------------------------------------------------------


def test_interrupt_mid_trial_stops_engines_keeps_evidence_releases_lock(
    make: Callable[..., Harness], real_sigint: None
) -> None:
    def scenario(phase: str, candidate: int, trial: int | None) -> Behavior:
        if phase == "trial" and trial == 2:
            return Behavior(interrupt_on_request=5)  # in the middle of trial 2's protocol
        return Behavior()

    harness = make(scenario)
    with pytest.raises(InterruptedByUserError) as caught:
        harness.run(trials=3)
    assert caught.value.exit_code == ExitCode.INTERRUPTED
    assert int(caught.value.exit_code) == 130
    assert "nothing published" in caught.value.message
    runtime = harness.runtime
    assert runtime.names()[-1] == tagged(harness, f"bless-trial-{h12(harness)}-c1-t2")
    assert runtime.all_stopped_and_removed(), "every engine stopped (gracefully) and removed"
    assert harness.store.find(harness.config_hash) is None
    # Filed apart from the rejections: nothing reading rejected/ counts it as a rejected candidate.
    assert harness.rejected_dirs() == []
    (kept,) = harness.interrupted_dirs()
    assert kept == harness.store.root / "interrupted" / harness.config_hash / kept.name
    assert str(kept.parent) in (caught.value.hint or ""), "the refusal points at the evidence"
    summary = (kept / "summary.md").read_text()
    assert "trials finished: 1 of 3 planned; interrupted during trial 2" in summary
    assert summary.startswith("# Interrupted (not a rejection): candidate 1 of run ")
    assert "Rejected" not in summary and "the rejected cache" not in summary
    evidence = json.loads((kept / "evidence.json").read_text())
    assert evidence["reasons"] == ["interrupted"] and evidence["interrupted_during"] == "trial 2"
    assert [t["passed"] for t in evidence["trials"]] == [True], "trial 1's verdict is kept"
    assert (kept / "tree" / ARTIFACT).is_file() and (kept / "trial-2.log").is_file()
    assert harness.staging_left() == []
    # The lock is free: a second run takes it and blesses.
    second = make()
    assert second.run(trials=1).published


def test_interrupt_in_the_first_trial_says_that_trial_started(make: Callable[..., Harness], real_sigint: None) -> None:
    """Not "0 trials run" once trial 1 has started: the summary names the step the signal stopped."""

    def scenario(phase: str, candidate: int, trial: int | None) -> Behavior:
        return Behavior(interrupt_on_request=2) if phase == "trial" else Behavior()

    harness = make(scenario)
    with pytest.raises(InterruptedByUserError):
        harness.run(trials=3)
    assert harness.rejected_dirs() == []
    (kept,) = harness.interrupted_dirs()
    summary = (kept / "summary.md").read_text()
    assert "trials finished: 0 of 3 planned; interrupted during trial 1" in summary
    assert json.loads((kept / "evidence.json").read_text())["interrupted_during"] == "trial 1"


# --- writes outside the blessed tree ---------------------------------------------------------------------


def test_a_kernel_compiled_outside_the_blessing_is_rejected_named_and_kept(make: Callable[..., Harness]) -> None:
    kernel = ".triton/cache/ABC/kernel.cubin"

    def scenario(phase: str, candidate: int, trial: int | None) -> Behavior:
        # Every start JIT-compiles into its HOME; the blessed artifact itself is loaded as it should be.
        return Behavior(outside={("HOME", kernel): b"\x7fELF", ("TMPDIR", "bless-inductor-x/fx"): b"noise"})

    harness = make(scenario)
    result = harness.run(trials=3)
    evidence = _assert_rejected_one(harness, result, f"compiled outside the blessing: HOME/{kernel}")
    assert evidence["bootstrap"]["outside"]["compiled"] == 1, "the bootstrap's write is recorded, not judged"
    (trial,) = evidence["trials"]
    outside = trial["reuse"]["outside"]
    assert (outside["written"], outside["noise"], outside["compiled"]) == (2, 1, 1)
    assert outside["compiled_files"] == [f"HOME/{kernel}: a Triton-style JIT cache under HOME"]
    assert trial["reuse"]["load_markers"] >= 1 and not trial["reuse"]["upper_new_artifacts"]
    (rejected,) = harness.rejected_dirs()
    assert (rejected / "trial-1-outside" / "home" / kernel).read_bytes() == b"\x7fELF", "the file is evidence"


def test_named_noise_outside_the_tree_passes_and_every_start_gets_a_fresh_private_home(
    make: Callable[..., Harness],
) -> None:
    def scenario(phase: str, candidate: int, trial: int | None) -> Behavior:
        return Behavior(outside={("TMPDIR", "bless-inductor-x/fxgraph/entry"): b"scratch"})

    harness = make(scenario)
    result = harness.run(trials=3)
    assert result.published
    homes = set()
    for container in harness.runtime.containers:
        private = {m.target: m for m in container.spec.mounts if m.kind == "private"}
        assert set(private) == {ENGINE_HOME, ENGINE_TMP}
        assert container.spec.env["HOME"] == ENGINE_HOME and container.spec.env["TMPDIR"] == ENGINE_TMP
        homes.add(private[ENGINE_HOME].source)
    assert len(homes) == len(harness.runtime.containers), "no two starts share a HOME"
    trial = result.candidates[-1].trials[0].to_dict()
    assert trial["reuse"]["outside"]["noise"] == 1 and trial["reuse"]["outside"]["compiled"] == 0


def test_a_container_filesystem_change_nobody_named_fails_the_trial(make: Callable[..., Harness]) -> None:
    def scenario(phase: str, candidate: int, trial: int | None) -> Behavior:
        return Behavior(container_changes=["/root/.cache/some-jit/kernel.bin"] if phase == "trial" else [])

    harness = make(scenario)
    result = harness.run(trials=3)
    evidence = _assert_rejected_one(harness, result, "compiled outside the blessing: /root/.cache/some-jit/kernel.bin")
    assert evidence["trials"][0]["reuse"]["outside"]["compiled"] == 1
