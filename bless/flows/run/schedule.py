"""Phase 2's scheduling: K trials, up to one per GPU slot at a time (``--parallel N``), stopped together.

Each trial runs in a worker thread on its own slot (see bless/replay/devices.py). A failed trial stops new
ones from starting (those running finish and count); Ctrl-C, or an exception in a trial, stops every
running engine at once and waits for the trials to unwind before it is raised again. What one trial
does is :mod:`bless.flows.run.trial`.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from bless.flows.engine_start import EngineSession
from bless.flows.events import Event, EventSink
from bless.flows.run.results import TrialResult
from bless.replay.devices import GpuSlot

#: Runs trial N on a slot and returns its verdict (called in a worker thread).
TrialRunner = Callable[[int, GpuSlot], TrialResult]


class TrialSchedule:
    """The trials of one candidate on the run's slots, and the engines running now (to stop on Ctrl-C)."""

    def __init__(self, slots: tuple[GpuSlot, ...], events: EventSink):
        """``events`` must be safe to call from several threads (the orchestrator's is)."""
        self.slots = slots
        self.events = events
        self._lock = threading.Lock()
        self._running: dict[int, EngineSession] = {}
        self._cancelled = False
        #: The trials an interruption would stop now (``trial 3``, ``trials 2, 3``), for the rejection's
        #: summary; None until the first trials are started.
        self.step: str | None = None

    def run(self, candidate: int, trials: int, run_trial: TrialRunner, results: list[TrialResult]) -> None:
        """Run ``trials`` trials, up to one per slot at a time, appending each verdict to ``results``.

        A failed trial frees its slot and stops new trials from starting (those running finish
        and count: more evidence for the rejection). Any exception in this thread (Ctrl-C
        arrives here) or in a trial stops every running engine, waits for the trials to unwind,
        and is raised again.
        """
        upcoming = deque(range(1, trials + 1))
        free = deque(self.slots)
        running: dict[Future[TrialResult], tuple[int, GpuSlot]] = {}
        with ThreadPoolExecutor(max_workers=len(self.slots), thread_name_prefix="bless-trial") as pool:
            try:
                while True:
                    stop_starting = any(not result.passed for result in results)
                    while free and upcoming and not stop_starting:
                        trial, slot = upcoming.popleft(), free.popleft()
                        self.events(Event("trial-start", f"candidate {candidate}: trial {trial}/{trials}"
                                          + (f" on {slot.label}" if slot.gpus else ""),
                                          {"candidate": candidate, "trial": trial, "of": trials,
                                           "slot": slot.index, "gpus": slot.short}))  # fmt: skip
                        # Named before the trial can start: a Ctrl-C during its first request must not read as
                        # an interruption of the bootstrap.
                        self.step = _running_step([*running.values(), (trial, slot)])
                        running[pool.submit(run_trial, trial, slot)] = (trial, slot)
                    self.step = _running_step(running.values())
                    if not running:
                        return
                    done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                    for future in done:
                        trial, slot = running.pop(future)
                        free.append(slot)
                        result = future.result()
                        results.append(result)
                        verdict = "pass" if result.passed else "FAIL"
                        self.events(Event("trial-end", f"trial {trial}/{trials}: {verdict}",
                                          {"candidate": candidate, "trial": trial, "slot": slot.index,
                                           "gpus": slot.short, "result": result.to_dict()}))  # fmt: skip
            except BaseException:
                self._stop_running_trials()
                _wait_out(running)
                raise

    def register(self, index: int, session: EngineSession) -> bool:
        """Track trial ``index``'s started engine so an interruption can stop it.

        Returns False, tracking nothing, when the trials are being stopped: the trial must not go on.
        """
        with self._lock:
            if self._cancelled:
                return False
            self._running[index] = session
            return True

    def unregister(self, index: int) -> None:
        """Forget trial ``index``'s engine (it has been stopped, or never was tracked)."""
        with self._lock:
            self._running.pop(index, None)

    def _stop_running_trials(self) -> None:
        """Stop every running trial's engine at once (Ctrl-C, or a trial raised); later starts stop themselves."""
        with self._lock:
            self._cancelled = True
            sessions = list(self._running.values())
        threads = [threading.Thread(target=_stop_quietly, args=(session,), daemon=True) for session in sessions]
        for thread in threads:
            thread.start()
        for thread in threads:
            _join_quietly(thread)


def _running_step(running: Iterable[tuple[int, GpuSlot]]) -> str:
    """``trial 3`` / ``trials 2, 3``: the trials an interruption would stop, for the rejection's summary."""
    trials = sorted(trial for trial, _ in running)
    if not trials:
        return "the trials (none running)"
    return ("trial " if len(trials) == 1 else "trials ") + ", ".join(str(trial) for trial in trials)


def _stop_quietly(session: EngineSession) -> None:
    """Stop one engine from a helper thread; its own trial reports whatever went wrong."""
    with contextlib.suppress(Exception):  # the trial's own stop, in its thread, raises it again
        session.stop()


def _join_quietly(thread: threading.Thread) -> None:
    """Join, even through another Ctrl-C: the engines must be stopped before the run gives up."""
    while thread.is_alive():
        try:
            thread.join()
        except KeyboardInterrupt:
            continue


def _wait_out(running: Mapping[Future[TrialResult], object]) -> None:
    """Wait for every running trial to unwind (their engines are being stopped), through more Ctrl-Cs."""
    pending = set(running)
    while pending:
        try:
            _, pending = wait(pending, timeout=0.5)
        except KeyboardInterrupt:
            continue
