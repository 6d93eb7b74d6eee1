"""``bless run``: bless a profile (phase 1 bootstrap, phase 2 trials, publish or reject)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import FrameType
from typing import Annotated, Any

import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from bless.cli import render
from bless.cli.boundary import Report, command, stop_signals_handled
from bless.cli.common import AllowUnknownEngineVersionOption, JsonOption, ProfileOption, app_state
from bless.core.untrusted_text import shown
from bless.errors import UsageError
from bless.flows.events import Event
from bless.flows.run import RunOptions, bless_profile


@contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into KeyboardInterrupt so a run stops its engines and keeps evidence.

    Both handlers are installed explicitly (:func:`stop_signals_handled` says why).
    """

    def raise_interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    with stop_signals_handled(raise_interrupt):
        yield


class RunProgress:
    """Renders orchestrator events on stderr: one line per phase and verdict, and a live table of the
    running trials (trial, GPU, phase, elapsed) under them while any runs."""

    def __init__(self, console: Console):
        self.console = console
        self.started = time.monotonic()
        self.status = "resolving"
        # trial -> (GPU set, phase, started at), for the trials running now
        self.running: dict[tuple[int, int], tuple[str, str, float]] = {}
        self.live = Live(self, console=console, refresh_per_second=4, transient=True)

    def elapsed(self, since: float | None = None) -> str:
        seconds = int(time.monotonic() - (self.started if since is None else since))
        return f"[{seconds // 60:02d}:{seconds % 60:02d}]"

    def __rich__(self) -> RenderableType:
        """What the live region shows: the current step, then the running trials."""
        line = Text(f"{shown(self.status)} {self.elapsed()}", style="cyan")
        if not self.running:
            return line
        table = Table(box=None, padding=(0, 2), header_style="bold")
        for column in ("trial", "GPU", "phase", "elapsed"):
            table.add_column(column)
        for (candidate, trial), (gpus, phase, since) in sorted(self.running.items()):
            table.add_row(f"c{candidate} t{trial}", gpus, phase, self.elapsed(since).strip("[]"))
        return Group(line, table)

    def __call__(self, event: Event) -> None:
        key = (int(event.data.get("candidate", 0)), int(event.data.get("trial", 0)))
        if event.kind == "trial-phase":
            gpus, _, since = self.running.get(key, (str(event.data.get("gpus", "")), "", time.monotonic()))
            self.running[key] = (gpus, str(event.data.get("phase", "")), since)
        elif event.kind in ("phase", "trial-start"):
            self.status = event.message
            if event.kind == "trial-start":
                self.running[key] = (str(event.data.get("gpus", "")), "queued", time.monotonic())
            self.console.print(Text(f"{self.elapsed()} {shown(event.message)}", style="cyan"))
        elif event.kind == "trial-end":
            self.running.pop(key, None)
            result = event.data.get("result", {})
            passed = bool(result.get("passed"))
            line = Text(f"{self.elapsed()} {shown(event.message)}", style="green" if passed else "bold red")
            if event.data.get("gpus") not in (None, "", "cpu"):
                line.append(f"  GPU {event.data['gpus']}", style="dim")
            ready = result.get("start_to_ready_s")
            if ready is not None:
                line.append(f"  start->ready {ready:.1f} s", style="dim")
            self.console.print(line)
            for reason in result.get("reasons", [])[:5]:
                self.console.print(Text(f"    {shown(str(reason))}", style="red"))
        elif event.kind == "warning":
            self.console.print(
                Text.assemble(f"{self.elapsed()} ", ("warning", "bold yellow"), f": {shown(event.message)}")
            )
        else:
            self.console.print(Text(f"{self.elapsed()} {shown(event.message)}"))
        self.live.refresh()


TrialsOption = Annotated[
    int | None, typer.Option("--trials", "-k", min=1, max=1000, help="K trials (default: the profile's).")
]
MaxFailureRateOption = Annotated[
    float | None,
    typer.Option("--max-failure-rate", help="Derive K so that K/K passes bound the per-start failure rate."),
]
ConfidenceOption = Annotated[float, typer.Option("--confidence", help="Confidence of the failure-rate bound.")]
CandidatesOption = Annotated[
    int,
    typer.Option("--candidates", min=1, max=20, help="Bootstrap afresh after a rejection, up to N times."),
]
ReblessOption = Annotated[bool, typer.Option("--rebless", help="Bless again; the prior blessing is archived.")]
AllowWeakerOption = Annotated[
    bool,
    typer.Option(
        "--allow-weaker",
        help="With --rebless: publish even if fewer trials give a weaker failure-rate bound than the "
        "blessing it replaces (refused otherwise, exit 13).",
    ),
]
WaitOption = Annotated[bool, typer.Option("--wait", help="Wait for another run of this config to finish.")]
ParallelOption = Annotated[
    int | None,
    typer.Option(
        "--parallel",
        min=1,
        max=64,
        help="Trials at once, one per GPU set of hardware.gpu_count GPUs (default: as many as the GPUs "
        "present fit; CPU: 1). --parallel 1 runs them one after another.",
    ),
]


@command
def run_command(
    ctx: typer.Context,
    profile: ProfileOption,
    trials: TrialsOption = None,
    max_failure_rate: MaxFailureRateOption = None,
    confidence: ConfidenceOption = 0.95,
    candidates: CandidatesOption = 1,
    rebless: ReblessOption = False,
    allow_weaker: AllowWeakerOption = False,
    wait: WaitOption = False,
    allow_unknown_engine_version: AllowUnknownEngineVersionOption = False,
    parallel: ParallelOption = None,
    json_output: JsonOption = False,
) -> Report:
    """Bless a profile: bootstrap its compile cache, prove it with K trials, publish or reject.

    Exit 0 when published; TRIALS_FAILED (41) when every candidate was rejected (evidence kept
    under <root>/rejected/); INTERRUPTED (130) on Ctrl-C or SIGTERM (evidence kept under
    <root>/interrupted/); see bless exit-codes for every refusal.
    """
    if not 0 < confidence < 1:
        raise UsageError(f"--confidence must lie strictly between 0 and 1, not {confidence}")
    if trials is not None and max_failure_rate is not None:
        raise UsageError("give either --trials or --max-failure-rate, not both")
    state = app_state(ctx)
    options = RunOptions(
        trials=trials,
        max_failure_rate=max_failure_rate,
        confidence=confidence,
        candidates=candidates,
        rebless=rebless,
        wait_lock=wait,
        allow_weaker=allow_weaker,
        allow_unknown_engine_version=allow_unknown_engine_version,
        allow_test_knobs=state.allow_test_knobs,
        parallel=parallel,
    )
    store = state.store()
    progress = RunProgress(render.err_console())
    with signals_as_interrupt(), progress.live:
        result = bless_profile(
            profile,
            options,
            store=store,
            events=progress,
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        )
    return Report(result.to_dict(), render_run, result.failure)


def _outside(counts: Any) -> str:
    """``noise/compiled`` file counts written outside the blessed tree (``-`` when not recorded)."""
    if not isinstance(counts, Mapping):
        return "-"
    return f"{counts.get('noise', 0)}/{counts.get('compiled', 0)}"


def render_run(console: Console, data: Mapping[str, Any]) -> None:
    """Trials table, then the published hash (or the rejection)."""
    table = Table(title="trials", title_justify="left")
    for column in (
        "candidate",
        "trial",
        "GPU",
        "verdict",
        "start->ready s",
        "torch.compile s",
        "requests",
        "outside (noise/compiled)",
        "reasons",
    ):
        table.add_column(column)
    for candidate in data["candidates"]:
        boot = candidate["bootstrap"]
        table.add_row(
            str(candidate["index"]),
            "bootstrap",
            _gpus(boot.get("gpus")),
            "-",
            _num(boot.get("start_to_ready_s")),
            _num(boot.get("timings", {}).get("torch_compile_s")),
            str(boot.get("requests", "")),
            _outside(boot.get("outside")),
            "",
        )
        for trial in candidate["trials"]:
            table.add_row(
                str(candidate["index"]),
                str(trial["index"]),
                _gpus(trial.get("gpus")),
                Text("pass", style="green") if trial["passed"] else Text("FAIL", style="bold red"),
                _num(trial.get("start_to_ready_s")),
                _num(trial.get("timings", {}).get("torch_compile_s")),
                str((trial.get("coherence") or {}).get("requests", "")),
                _outside((trial.get("reuse") or {}).get("outside")),
                render.cell("; ".join(trial["reasons"])[:200]),
            )
    console.print(table)
    overhead = data.get("orchestration_overhead")
    if data.get("parallel", 1) > 1:
        console.print(f"trials ran {data['parallel']} at a time on: " + "; ".join(s["label"] for s in data["slots"]))
    console.print(
        f"wall {data['wall_seconds']:.1f} s, engine {data['engine_seconds']:.1f} s"
        + (f", orchestration overhead {overhead:.1%}" if overhead is not None else "")
    )
    if data["published"]:
        console.print(Text.assemble(("published ", "bold green"), (data["config_hash"], "bold")))
        console.print(render.cell(f"manifest: {data['manifest_path']}"))
        console.print(
            f"failure-rate bound: <= {data['failure_rate_bound']:.1%} per start at {data['confidence']:.0%} "
            f"confidence ({data['trials_planned']}/{data['trials_planned']} trials passed)"
        )
        if data.get("archived_manifest"):
            console.print(render.cell(f"prior blessing archived: {data['archived_manifest']}"))
    for warning in data.get("warnings", []):
        console.print(Text.assemble(("warning", "bold yellow"), f": {shown(warning)}"))


def _gpus(records: Any) -> str:
    """``0`` / ``2,3`` with the first UUID's head (``0 GPU-5d2c1a4e``); ``-`` on CPU."""
    if not isinstance(records, list) or not records:
        return "-"
    indices = ",".join(str(record.get("index")) for record in records)
    uuid = str(records[0].get("uuid") or "")
    return f"{indices} {uuid[:12]}" if uuid else indices


def _num(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, int | float) else "-"
