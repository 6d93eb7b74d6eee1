"""bless run's coverage: the plan refused or warned before any engine starts, the requests of the bootstrap and of
every trial, and what the manifest records (fakes of our own Runtime; the real ReferenceAdapter and Store)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest

from bless.core.coverage import CoverageFamily, CoveragePlan
from bless.core.factors import ResolvedConfig
from bless.core.profile import Profile
from bless.core.unproven_evidence import EVIDENCE_MAX_BYTES, FULL_EVENT
from bless.engines.reference import ReferenceAdapter
from bless.errors import CoverageIncompleteError, ExitCode
from tests.support.fakes import ARTIFACT
from tests.unit.run_harness import Harness, make_profile


def bucket_profile(mode: str = "auto", buckets: list[int] | None = None) -> Profile:
    profile = make_profile()
    serve: dict[str, Any] = {**profile.serve, "shape_buckets": [8, 16, 32] if buckets is None else buckets}
    return dataclasses.replace(profile, serve=serve, coverage=mode)  # type: ignore[arg-type]


def test_bootstrap_and_every_trial_send_one_request_per_class_and_the_manifest_records_it(
    make: Callable[..., Harness],
) -> None:
    harness = make(profile=bucket_profile())
    result = harness.run(trials=2)
    assert result.published
    boot, *trials = harness.runtime.containers
    assert boot.token_prompts == [1, 9, 17]  # the shortest prompt of each bucket, after the golden prompts
    assert [t.token_prompts for t in trials] == [[1, 9, 17], [1, 9, 17]]  # each trial replays the load
    manifest = harness.store.find(harness.config_hash)
    assert manifest is not None and manifest.coverage is not None
    assert manifest.coverage["mode"] == "auto" and manifest.coverage["gaps"] == []
    (family,) = manifest.coverage["plan"]["families"]
    assert family["name"] == "shape_buckets" and [c["token_count"] for c in family["classes"]] == [1, 9, 17]
    assert manifest.coverage["bootstrap"]["token_counts"] == [1, 9, 17]
    assert [r["coverage"]["token_counts"] for r in manifest.trials["results"]] == [[1, 9, 17], [1, 9, 17]]
    assert any(e.kind == "note" and "coverage: shape_buckets: 3 class(es)" in e.message for e in harness.events)


def test_coverage_off_drives_nothing_records_the_plan_and_warns(make: Callable[..., Harness]) -> None:
    harness = make(profile=bucket_profile(mode="off"))
    result = harness.run(trials=1)
    assert result.published
    assert all(c.token_prompts == [] for c in harness.runtime.containers)
    assert any("coverage off: 3 class(es)" in w for w in result.warnings)
    manifest = harness.store.find(harness.config_hash)
    assert manifest is not None and manifest.coverage is not None
    assert manifest.coverage["mode"] == "off" and "bootstrap" not in manifest.coverage


def test_without_lazy_families_nothing_is_sent(make: Callable[..., Harness]) -> None:
    harness = make(profile=bucket_profile(buckets=[]))
    assert harness.run(trials=1).published
    assert all(c.token_prompts == [] for c in harness.runtime.containers)


class GapAdapter(ReferenceAdapter):
    """The reference adapter whose coverage model cannot enumerate a family it says serving reaches (a gap)."""

    def coverage_plan(self, resolved: ResolvedConfig) -> CoveragePlan:
        gap = CoverageFamily("mystery_jit", True, False, "the engine compiles it per shape, rules unknown", "x")
        return CoveragePlan("reference", "m", (gap,))


def test_require_refuses_a_gap_with_47_before_any_engine_starts(make: Callable[..., Harness]) -> None:
    harness = make(profile=bucket_profile(mode="require"))
    with pytest.raises(CoverageIncompleteError) as caught:
        harness.run(trials=1, adapter=GapAdapter())
    assert caught.value.exit_code == ExitCode.COVERAGE_INCOMPLETE and int(ExitCode.COVERAGE_INCOMPLETE) == 47
    assert "mystery_jit: the engine compiles it per shape, rules unknown" in caught.value.message
    assert harness.runtime.containers == [] and harness.store.find(harness.config_hash) is None


def test_auto_publishes_with_the_gap_recorded_and_warned(make: Callable[..., Harness]) -> None:
    harness = make(profile=bucket_profile())
    result = harness.run(trials=1, adapter=GapAdapter())
    assert result.published
    assert any("coverage gap" in w and "mystery_jit" in w for w in result.warnings)
    manifest = harness.store.find(harness.config_hash)
    assert manifest is not None and manifest.coverage is not None
    assert manifest.coverage["gaps"] == ["mystery_jit: the engine compiles it per shape, rules unknown"]


def _served(harness: Harness, *events: dict[str, Any], name: str | None = None, tag: str = "a") -> None:
    """A kept serve dir of the profile with ``events`` in its unproven-compiles.jsonl, as a sealed serve leaves it."""
    serve_dir = harness.store.paths.serve / f"{name or harness.resolved.profile.name}-20261126T120000Z-abcde{tag}"
    serve_dir.mkdir(parents=True)
    hash_ = harness.config_hash
    lines = [
        json.dumps({"event": "unproven_compile", "source": "triton-cache-manager", "config_hash": hash_, **e})
        for e in events
    ]
    (serve_dir / "unproven-compiles.jsonl").write_text("".join(line + "\n" for line in lines))


def test_a_rebless_checks_what_earlier_serves_met_and_records_it(make: Callable[..., Harness]) -> None:
    harness = make(profile=bucket_profile())
    _served(harness, {"kernel": "reference_bucket_8", "key": "k" * 52}, {"path": ARTIFACT})
    _served(harness, {"kernel": "other_profiles_kernel", "key": "o" * 52}, name="another")  # not this profile's
    _served(harness, {"kernel": "another_config", "key": "c" * 52, "config_hash": "0" * 64}, name=None, tag="b")
    result = harness.run(trials=1)
    assert result.published
    assert any("1 of the 2 compile(s) earlier serves" in w and "reference_bucket_8" in w for w in result.warnings)
    manifest = harness.store.find(harness.config_hash)
    assert manifest is not None and manifest.coverage is not None
    served = manifest.coverage["from_serves"]
    assert (served["recorded"], served["held"]) == (2, 1)  # the artifact path is in the tree, the kernel is not
    assert served["missing"] == [
        f"kernel reference_bucket_8 (key {'k' * 52}), seen by serve {served['missing'][0].split('serve ')[-1]}"
    ]
    assert "other_profiles_kernel" not in json.dumps(manifest.coverage)  # another profile's serve
    assert "another_config" not in json.dumps(manifest.coverage)  # a serve of another configuration


def test_require_rejects_a_candidate_that_still_lacks_what_a_serve_met(make: Callable[..., Harness]) -> None:
    harness = make(profile=bucket_profile(mode="require"))
    _served(harness, {"kernel": "reference_bucket_8", "key": "k" * 52})
    result = harness.run(trials=1)
    assert not result.published
    (candidate,) = result.candidates
    assert candidate.trials == () and "still not in the candidate" in candidate.reasons[0]
    assert [c.spec.labels["org.bless.phase"] for c in harness.runtime.containers] == ["bootstrap"]


def test_require_only_warns_about_what_no_tree_can_hold(make: Callable[..., Harness]) -> None:
    harness = make(profile=bucket_profile(mode="require"))
    _served(harness, {"source": "watcher", "path": "HOME/.triton/cache/x/k.cubin"})
    result = harness.run(trials=1)
    assert result.published
    assert any("HOME/.triton/cache/x/k.cubin" in w for w in result.warnings)


def _oversized(harness: Harness) -> None:
    """A kept serve dir whose evidence is over the bound a serve writes (an old seal's flood of misses)."""
    _served(harness, {"kernel": "reference_bucket_8", "key": "k" * 52})
    (evidence,) = harness.store.paths.serve.glob("*/unproven-compiles.jsonl")
    line = evidence.read_text()
    with evidence.open("a") as out:
        out.write(line * (EVIDENCE_MAX_BYTES // len(line) + 1))


def test_require_refuses_evidence_of_a_serve_it_cannot_read_in_full_before_any_engine_starts(
    make: Callable[..., Harness],
) -> None:
    harness = make(profile=bucket_profile(mode="require"))
    _oversized(harness)
    with pytest.raises(CoverageIncompleteError) as caught:
        harness.run(trials=1)
    assert caught.value.exit_code == ExitCode.COVERAGE_INCOMPLETE
    assert "cannot be read in full" in caught.value.message and "unproven-compiles.jsonl" in caught.value.message
    assert harness.runtime.containers == [] and harness.store.find(harness.config_hash) is None


def test_require_refuses_a_bad_line_and_a_full_file_of_this_configuration(make: Callable[..., Harness]) -> None:
    harness = make(profile=bucket_profile(mode="require"))
    _served(harness, {"kernel": "reference_bucket_8", "key": "k" * 52})
    (evidence,) = harness.store.paths.serve.glob("*/unproven-compiles.jsonl")
    with evidence.open("a") as out:
        out.write('{"event":"unproven_compile","kernel":"torn\n')
    with pytest.raises(CoverageIncompleteError, match="no unproven-compile event"):
        harness.run(trials=1)
    evidence.write_text(json.dumps({"event": FULL_EVENT, "config_hash": harness.config_hash, "recorded": 9}) + "\n")
    with pytest.raises(CoverageIncompleteError, match="it says it is full"):
        harness.run(trials=1)


def test_auto_warns_about_evidence_it_cannot_read_and(make: Callable[..., Harness]) -> None:
    harness = make(profile=bucket_profile())
    _oversized(harness)
    result = harness.run(trials=1)
    assert result.published
    assert any("cannot be read in full" in w and "unproven-compiles.jsonl" in w for w in result.warnings)
    assert any(e.kind == "warning" and "cannot be read in full" in e.message for e in harness.events), "an event"
