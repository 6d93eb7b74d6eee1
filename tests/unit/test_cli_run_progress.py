"""``bless run``'s progress on stderr: the live table shows every running trial at once."""

from __future__ import annotations

import io

from rich.console import Console

from bless.cli.run import RunProgress
from bless.flows.events import Event


def rendered(progress: RunProgress) -> str:
    out = io.StringIO()
    Console(file=out, width=120, force_terminal=False, color_system=None).print(progress.__rich__())
    return out.getvalue()


def start(trial: int, gpus: str) -> Event:
    return Event("trial-start", f"candidate 1: trial {trial}/4 on GPU {gpus}", {"candidate": 1, "trial": trial,
                                                                              "of": 4, "gpus": gpus})  # fmt: skip


def test_live_table_lists_every_running_trial_with_gpu_phase_and_elapsed() -> None:
    progress = RunProgress(Console(file=io.StringIO(), width=120))
    progress(start(1, "0"))
    progress(start(2, "1"))
    progress(Event("trial-phase", "trial 1: loading", {"candidate": 1, "trial": 1, "phase": "loading", "gpus": "0"}))
    progress(Event("trial-phase", "trial 2: replaying", {"candidate": 1, "trial": 2, "phase": "replaying",
                                                        "gpus": "1"}))  # fmt: skip
    table = rendered(progress)
    for column in ("trial", "GPU", "phase", "elapsed"):
        assert column in table
    lines = [line.split() for line in table.splitlines()]
    assert ["c1", "t1", "0", "loading", "00:00"] in lines
    assert ["c1", "t2", "1", "replaying", "00:00"] in lines
    # A finished trial leaves the table; the other stays.
    result = {"passed": True, "reasons": [], "start_to_ready_s": 1.0}
    progress(Event("trial-end", "trial 1/4: pass", {"candidate": 1, "trial": 1, "gpus": "0", "result": result}))
    table = rendered(progress)
    assert "t1" not in table and "t2" in table
    progress(Event("trial-end", "trial 2/4: pass", {"candidate": 1, "trial": 2, "gpus": "1", "result": result}))
    assert "phase" not in rendered(progress), "no table once nothing runs"


def test_the_resolution_note_prints_as_the_line_bless_run_always_printed() -> None:
    out = io.StringIO()
    progress = RunProgress(Console(file=out, width=200, force_terminal=False, color_system=None))
    progress(Event("note", "config hash " + "ab" * 32 + " (reference-cpu); K=3", {"trials": 3}))
    assert out.getvalue().splitlines()[0] == "[00:00] config hash " + "ab" * 32 + " (reference-cpu); K=3"
