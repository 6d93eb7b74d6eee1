"""``bless run --parallel N``: trials on GPU slots at once, against a fake of OUR Runtime on 8 fake GPUs.

The fake runtime is ``tests.support.fakes.FakeRuntime`` (in-process HTTP engines); here it also
records which GPU set each engine was given and how many ran at once, and can make an engine
answer differently on one GPU. The adapter, store, scheduler and trial protocol are the real ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bless.cli.error_hints import command_line_hint
from bless.core.factors import GpuInfo, ResolvedConfig, resolve
from bless.core.profile import HardwareSpec, Profile
from bless.core.schemas import schema_errors
from bless.engines.reference import ReferenceAdapter
from bless.errors import ExitCode, GpuSelectionError, InsufficientGpuError, InterruptedByUserError
from bless.flows.run import RunOptions
from bless.flows.run.orchestrator import Orchestrator
from bless.replay.devices import GpuSlot
from bless.runtime.base import ContainerSpec, ContainerStop, Started
from bless.store import Store
from tests.support.fakes import ARTIFACT, Behavior, FakeRuntime, tokens_for
from tests.unit.run_harness import Harness, make_profile

H200 = "NVIDIA H200"
GIB = 1024


def host_gpus(count: int = 8, *, free_gib: float = 130.0, short: int | None = None) -> list[GpuInfo]:
    """``count`` H200s as nvidia-smi lists them; GPU ``short`` has only 1 GiB free."""
    return [
        GpuInfo(H200, "9.0", 140 * GIB, int((1 if i == short else free_gib) * GIB), i, f"GPU-{i:08d}-fake")
        for i in range(count)
    ]


# A Behavior answer takes (prompt, max_tokens, n-th request): it cannot see the GPU, so each start
# gets a Behavior built for its GPU set.
GpuScenario = Callable[[str, tuple[str, ...] | None, int | None], Behavior]


def slow_coherent(phase: str, gpu_ids: tuple[str, ...] | None, trial: int | None) -> Behavior:
    """A coherent engine whose requests take a moment, so parallel trials really overlap."""

    def answer(prompt: str, max_tokens: int, nth: int) -> list[int]:
        time.sleep(0.01)
        return tokens_for(prompt, max_tokens)

    return Behavior(answer=answer)


class GpuFakeRuntime(FakeRuntime):
    """FakeRuntime that sees GPU sets: records them, counts engines alive at once, refuses shared GPUs."""

    def __init__(self, by_gpu: GpuScenario = slow_coherent) -> None:
        super().__init__()
        self.by_gpu = by_gpu
        self.lock = threading.Lock()
        self.alive: dict[str, tuple[str, ...]] = {}
        self.max_alive = 0
        self.gpu_sets: dict[str, tuple[str, ...] | None] = {}

    def start(self, spec: ContainerSpec) -> Started:
        with self.lock:
            gpus = spec.gpu_ids or ()
            shared = {name for name, ids in self.alive.items() if set(ids) & set(gpus)}
            assert not shared, f"{spec.name} was given GPUs {gpus} that {shared} are using"
            trial = int(spec.name.rsplit("-t", 1)[1].split("-")[0]) if "-trial-" in spec.name else None
            self.scenario = lambda phase, candidate, trial_: self.by_gpu(phase, spec.gpu_ids, trial)
            started = super().start(spec)
            self.alive[spec.name] = gpus
            self.max_alive = max(self.max_alive, len(self.alive))
            self.gpu_sets[spec.name] = spec.gpu_ids
        return started

    def stop(self, started: Started, timeout_s: int) -> ContainerStop:
        result = super().stop(started, timeout_s)
        with self.lock:
            self.alive.pop(started.name, None)
        return result


def cuda_profile(gpu_count: int = 1, min_gib: float | None = None) -> Profile:
    profile = make_profile()
    hardware = HardwareSpec(accelerator="cuda", gpu_count=gpu_count, min_gpu_memory_gib=min_gib)
    return dataclasses.replace(profile, hardware=hardware)


def cuda_resolved(profile: Profile, runtime: FakeRuntime) -> ResolvedConfig:
    return resolve(
        profile,
        ReferenceAdapter(),
        image_resolver=runtime.resolve_image,
        hardware_probe=lambda spec: {"accelerator": "cuda", "gpu_count": spec.gpu_count or 1, "gpu_name": H200,
                                     "compute_capability": "9.0"},
    )  # fmt: skip


class ParallelHarness(Harness):
    runtime: GpuFakeRuntime

    def rejected(self) -> Path:
        (only,) = self.rejected_dirs()
        return only

    def interrupted(self) -> Path:
        (only,) = self.interrupted_dirs()
        assert self.rejected_dirs() == [], "an interrupted run is no rejection"
        return only


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., ParallelHarness]]:
    made: list[ParallelHarness] = []

    def factory(
        by_gpu: GpuScenario = slow_coherent, *, gpus: list[GpuInfo] | None = None, profile: Profile | None = None
    ) -> ParallelHarness:
        runtime = GpuFakeRuntime(by_gpu)
        resolved = cuda_resolved(profile or cuda_profile(), runtime)
        harness = ParallelHarness(Store(tmp_path / "root"), runtime, resolved, [], gpus or host_gpus())
        made.append(harness)
        return harness

    yield factory
    for harness in made:
        harness.runtime.close()


def trial_gpus(runtime: GpuFakeRuntime) -> dict[str, tuple[str, ...] | None]:
    return {name: ids for name, ids in runtime.gpu_sets.items() if "-trial-" in name}


# --- scheduling ---------------------------------------------------------------------------------------------


def test_default_parallel_fills_all_8_gpus_one_trial_each(make: Callable[..., ParallelHarness]) -> None:
    harness = make()
    result = harness.run(trials=8)

    assert result.published and len(result.slots) == 8
    gpu_sets = trial_gpus(harness.runtime)
    assert len(gpu_sets) == 8
    assert sorted(ids for ids in gpu_sets.values() if ids) == [(f"GPU-{i:08d}-fake",) for i in range(8)]
    assert harness.runtime.max_alive > 1, "trials overlapped"
    assert harness.runtime.all_stopped_and_removed()
    manifest = harness.store.find(harness.resolved.config_hash)
    assert manifest is not None
    assert manifest.trials["parallel"] == 8
    assert [r["index"] for r in manifest.trials["results"]] == list(range(1, 9))
    recorded = {r["gpus"][0]["uuid"] for r in manifest.trials["results"]}
    assert recorded == {f"GPU-{i:08d}-fake" for i in range(8)}
    assert {d["index"] for d in manifest.trials["devices"]} == set(range(8))
    # The bootstrap (where the golden outputs come from) ran on slot 0's GPU, and says so.
    assert manifest.provenance["bootstrap"]["gpus"] == [
        {"rank": 0, "index": 0, "uuid": "GPU-00000000-fake", "name": H200}
    ]
    assert all(r["gpus"][0]["rank"] == 0 for r in manifest.trials["results"])  # rank 0 ran on it
    assert all("rank" not in d for d in manifest.trials["devices"])  # the devices proven on: no rank of their own
    assert result.to_dict()["orchestration_overhead"] is None, "overlapping engine time is not an overhead ratio"
    # The schema knows the new fields: recorded ones validate, malformed ones do not.
    document = json.loads(Path(str(result.manifest_path)).read_text())
    assert schema_errors("manifest.v1", document) == []
    document["trials"]["results"][0]["gpus"] = [{"index": "0"}]
    assert schema_errors("manifest.v1", document)


def test_more_trials_than_slots_never_share_a_gpu_and_reuse_freed_slots(
    make: Callable[..., ParallelHarness],
) -> None:
    harness = make()
    result = harness.run(trials=10, parallel=3)

    assert result.published and len(result.slots) == 3
    assert 1 < harness.runtime.max_alive <= 3  # the start() assertion also refused any shared GPU
    used = {ids for ids in trial_gpus(harness.runtime).values()}
    assert used == {(f"GPU-{i:08d}-fake",) for i in range(3)}, "only the 3 slots' GPUs, each reused"
    assert len(trial_gpus(harness.runtime)) == 10


def test_tensor_parallel_2_makes_4_slots_of_2_gpus(make: Callable[..., ParallelHarness]) -> None:
    harness = make(profile=cuda_profile(gpu_count=2))
    result = harness.run(trials=4)

    assert [slot.short for slot in result.slots] == ["0,1", "2,3", "4,5", "6,7"]
    assert sorted(ids for ids in trial_gpus(harness.runtime).values() if ids) == [
        (f"GPU-{a:08d}-fake", f"GPU-{a + 1:08d}-fake") for a in (0, 2, 4, 6)
    ]


def test_parallel_1_runs_one_trial_at_a_time_on_the_first_gpu(make: Callable[..., ParallelHarness]) -> None:
    harness = make()
    assert harness.run(trials=3, parallel=1).published
    assert harness.runtime.max_alive == 1
    assert set(trial_gpus(harness.runtime).values()) == {("GPU-00000000-fake",)}


def test_asking_for_more_slots_than_gpus_is_refused_before_any_start(make: Callable[..., ParallelHarness]) -> None:
    harness = make(gpus=host_gpus(2))
    with pytest.raises(InsufficientGpuError) as caught:
        harness.run(trials=4, parallel=3)
    assert caught.value.exit_code == ExitCode.INSUFFICIENT_GPU
    assert int(caught.value.exit_code) == 52
    assert "--parallel 3 needs 3 GPUs" in caught.value.message and "--parallel 2" in (
        command_line_hint(caught.value) or ""
    )
    assert harness.runtime.containers == []


def test_a_gpu_short_of_memory_is_refused_by_index_and_uuid_before_any_start(
    make: Callable[..., ParallelHarness],
) -> None:
    harness = make(gpus=host_gpus(8, short=5), profile=cuda_profile(min_gib=40))
    with pytest.raises(InsufficientGpuError) as caught:
        harness.run(trials=8)
    assert caught.value.exit_code == 52
    assert "GPU 5 (GPU-00000005-fake) (slot 5): 1.0 GiB free" in caught.value.message
    assert "GPU 4" not in caught.value.message
    assert harness.runtime.containers == []
    # With 5 slots the short GPU is not used, and the run goes ahead.
    assert harness.run(trials=5, parallel=5).published


# --- faults -------------------------------------------------------------------------------------------------


def test_a_crashed_trial_frees_its_gpu_counts_failed_and_stops_new_starts(
    make: Callable[..., ParallelHarness],
) -> None:
    def crash_trial_3(phase: str, gpu_ids: tuple[str, ...] | None, trial: int | None) -> Behavior:
        if trial == 3:
            return Behavior(exit_at_boot=True)
        return slow_coherent(phase, gpu_ids, trial)

    harness = make(crash_trial_3)
    result = harness.run(trials=12, parallel=2)

    assert not result.published
    (candidate,) = result.candidates
    verdicts = {t.index: t.passed for t in candidate.trials}
    assert verdicts[3] is False and "exited before it became ready" in " ".join(candidate.reasons)
    # Trial 3's slot was freed and the run stopped starting new trials: at most the one running beside it ran on.
    assert max(verdicts) <= 4 and len(trial_gpus(harness.runtime)) == len(verdicts)
    assert harness.runtime.all_stopped_and_removed()
    evidence = json.loads((harness.rejected() / "evidence.json").read_text())
    assert {t["index"]: t["passed"] for t in evidence["trials"]}[3] is False


def test_interrupt_stops_every_running_trial_and_leaves_nothing_behind(
    make: Callable[..., ParallelHarness], real_sigint: None
) -> None:
    gate = threading.Barrier(4, timeout=10)

    def interrupt_when_all_replay(phase: str, gpu_ids: tuple[str, ...] | None, trial: int | None) -> Behavior:
        if phase != "trial":
            return Behavior()

        def answer(prompt: str, max_tokens: int, nth: int) -> list[int]:
            if nth == 1 and not gate.broken:
                with contextlib.suppress(threading.BrokenBarrierError):
                    gate.wait()  # all 4 trials are replaying at once
            time.sleep(0.02)
            return tokens_for(prompt, max_tokens)

        return Behavior(answer=answer, interrupt_on_request=3 if trial == 4 else None)

    harness = make(interrupt_when_all_replay)
    with pytest.raises(InterruptedByUserError) as caught:
        harness.run(trials=8, parallel=4)
    assert caught.value.exit_code == 130
    runtime = harness.runtime
    assert runtime.max_alive == 4
    assert runtime.all_stopped_and_removed(), "every running engine was stopped and removed"
    assert runtime.alive == {}
    assert harness.store.find(harness.resolved.config_hash) is None
    evidence = json.loads((harness.interrupted() / "evidence.json").read_text())
    assert evidence["reasons"] == ["interrupted"]
    assert evidence["interrupted_during"].startswith("trials ")
    assert "4" in evidence["interrupted_during"]
    assert (harness.interrupted() / "tree" / ARTIFACT).is_file()
    assert not list((harness.store.root / "staging").iterdir())


# --- cross-device agreement --------------------------------------------------------------------------------


def test_a_cache_that_answers_differently_on_gpu_1_is_rejected_naming_the_gpu(
    make: Callable[..., ParallelHarness],
) -> None:
    def other_answer_on_gpu_1(phase: str, gpu_ids: tuple[str, ...] | None, trial: int | None) -> Behavior:
        if gpu_ids == ("GPU-00000001-fake",):
            return Behavior(answer=lambda p, m, n: tokens_for(p, m, salt=1))  # coherent, but not GPU 0's answer
        return slow_coherent(phase, gpu_ids, trial)

    harness = make(other_answer_on_gpu_1, gpus=host_gpus(2))
    result = harness.run(trials=4, parallel=2)

    assert not result.published
    reasons = result.candidates[0].reasons
    cross = [r for r in reasons if r.startswith("cross-device:")]
    assert len(cross) == 1
    assert "GPU 1 (GPU-00000001-fake) answers" in cross[0] and "GPU 0 (GPU-00000000-fake)" in cross[0]
    summary = (harness.rejected() / "summary.md").read_text()
    assert "cross-device: GPU 1" in summary


def test_trials_on_the_bootstrap_gpu_only_have_no_cross_device_reason(make: Callable[..., ParallelHarness]) -> None:
    """A wrong answer on the compile GPU itself is a plain golden mismatch, not a device disagreement."""

    def wrong_everywhere(phase: str, gpu_ids: tuple[str, ...] | None, trial: int | None) -> Behavior:
        if phase == "trial":
            return Behavior(answer=lambda p, m, n: tokens_for(p, m, salt=2))
        return Behavior()

    harness = make(wrong_everywhere, gpus=host_gpus(1))
    result = harness.run(trials=2)
    assert not result.published
    assert not [r for r in result.candidates[0].reasons if r.startswith("cross-device")]
    assert any("differs from the golden output" in r for r in result.candidates[0].reasons)


def test_cpu_profiles_run_parallel_slots_without_gpus(make: Callable[..., ParallelHarness]) -> None:
    harness = make(profile=make_profile())
    harness.resolved = resolve(
        make_profile(),
        ReferenceAdapter(),
        image_resolver=harness.runtime.resolve_image,
        hardware_probe=lambda spec: {"accelerator": "cpu", "isa": "x86-64-v2"},
    )
    result = harness.run(trials=4, parallel=2)
    assert result.published and result.slots == (GpuSlot(0), GpuSlot(1))
    assert set(trial_gpus(harness.runtime).values()) == {None}
    assert harness.runtime.max_alive == 2


def test_a_typo_in_the_operators_gpu_selection_refuses_the_run_before_any_engine(
    make: Callable[..., ParallelHarness],
) -> None:
    """CUDA_VISIBLE_DEVICES=0,9 on an 8-GPU host: refused (53), never run on GPU 0 alone with the 9 skipped."""
    harness = make()
    orchestrator = Orchestrator(
        harness.resolved,
        store=harness.store,
        runtime=harness.runtime,
        adapter=ReferenceAdapter(),
        events=harness.events.append,
        gpu_probe=lambda: list(harness.gpus),
        cuda_visible_devices="0,9",
    )
    with pytest.raises(GpuSelectionError) as caught:
        orchestrator.run(RunOptions(trials=2))
    assert caught.value.exit_code == 53 and "entry 1 ('9') names no GPU of this host" in caught.value.message
    assert harness.runtime.gpu_sets == {}, "no engine started"
