"""The trial schedule names the running trials before any of them can start (an interruption's summary reads it)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

from bless.flows.run import schedule as schedule_module
from bless.flows.run.results import TrialResult
from bless.flows.run.schedule import TrialSchedule
from bless.replay.devices import GpuSlot


class InlineExecutor:
    """Runs each submitted trial at once in the submitting thread: the worst case of a trial that starts (and
    sends its requests) before the scheduler's next line runs, made deterministic."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "") -> None:
        self.max_workers = max_workers

    def __enter__(self) -> InlineExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def submit(self, fn: Callable[..., TrialResult], *args: Any) -> Future[TrialResult]:
        future: Future[TrialResult] = Future()
        future.set_result(fn(*args))
        return future


def test_a_trial_sees_itself_named_as_the_running_step_from_its_first_instruction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(schedule_module, "ThreadPoolExecutor", InlineExecutor)
    scheduled = TrialSchedule((GpuSlot(0),), lambda event: None)
    seen: list[str | None] = []

    def run_trial(index: int, slot: GpuSlot) -> TrialResult:
        seen.append(scheduled.step)  # what a Ctrl-C arriving now would report
        return TrialResult(index, True, (), None, None, {}, {}, {}, slot)

    results: list[TrialResult] = []
    scheduled.run(1, 3, run_trial, results)
    assert seen == ["trial 1", "trial 2", "trial 3"]
    assert [result.index for result in results] == [1, 2, 3]
