"""The ``summary.md`` of an unpublished candidate (rejected or interrupted): what a human reads first in its
evidence directory."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from bless.core.factors import ResolvedConfig
from bless.flows.run.results import RunOptions, TrialResult


def render_summary(
    resolved: ResolvedConfig,
    run_id: str,
    candidate: int,
    bootstrap: dict[str, Any],
    trials: list[TrialResult],
    reasons: tuple[str, ...],
    options: RunOptions,
    *,
    interrupted: str | None = None,
    has_tree: bool = True,
    logs: Sequence[str] | None = None,
) -> str:
    """The ``summary.md`` a human reads first in an evidence dir (``rejected/`` or ``interrupted/``).

    ``interrupted`` names the step a signal stopped (``"trial 2"``, ``"the bootstrap"``): that step
    started but has no verdict, so it is not among the finished trials, and the candidate is not
    called rejected. ``has_tree`` says whether a candidate tree is kept (none when nothing was staged,
    e.g. a bootstrap interrupted early), and ``logs`` names the engine logs kept next to it (None: the
    usual bootstrap and trial logs).
    """
    # The file list names only what is there: a reader told of a tree/ that is missing suspects lost evidence.
    cache = "the rejected cache" if interrupted is None else "the candidate cache, never judged"
    files = [f"`tree/` ({cache})"] if has_tree else []
    files.append("`evidence.json` (everything above, machine-readable)")
    if logs is None:
        files.append("`bootstrap.log` and `trial-N.log` (engine logs)")
    elif logs:
        files.append(", ".join(f"`{name}`" for name in logs) + " (engine logs)")
    files_line = "Files here: " + ", ".join(files) + "."
    if not has_tree:
        files_line += " No `tree/`: nothing was staged before the run stopped."
    progress = f"- trials finished: {len(trials)} of {options.k} planned"
    if interrupted is not None:
        progress += f"; interrupted during {interrupted}"
    title = "Rejected" if interrupted is None else "Interrupted (not a rejection)"
    lines = [
        f"# {title}: candidate {candidate} of run {run_id}",
        "",
        f"- profile: `{resolved.profile.label}`",
        f"- config hash: `{resolved.config_hash}`",
        f"{progress} (a run stops at the first failing trial)",
        "",
        "## Why",
        "",
        *[f"- {reason}" for reason in reasons],
        "",
        "## Trials",
        "",
        "| trial | verdict | start->ready s | reasons |",
        "|---|---|---|---|",
        *[
            f"| {t.index} | {'pass' if t.passed else 'FAIL'} | {t.engine.get('start_to_ready_s')} | "
            f"{'; '.join(t.reasons)[:300].replace('|', '/')} |"
            for t in trials
        ],
        "",
        "## Bootstrap",
        "",
        "```json",
        json.dumps(bootstrap, indent=2, sort_keys=True),
        "```",
        "",
        files_line,
        "",
    ]
    return "\n".join(lines)
