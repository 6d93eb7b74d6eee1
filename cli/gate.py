"""``bless gate``: CI gating. Every profile must hash to a valid, unique blessed manifest.

Humans get a table on stderr; ``--json`` writes one document on stdout; ``--junit FILE`` writes a
JUnit XML report (one testcase per profile); under GitHub Actions (``GITHUB_ACTIONS=true``, and
not with ``--json``) each failure is also an ``::error file=<profile>::`` annotation on stdout.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from bless.cli import render
from bless.cli.boundary import Report, command
from bless.cli.common import JsonOption, ManifestsDirOption, RootOption, check_manifests_dir, command_store
from bless.core.untrusted_text import shown
from bless.flows.gate import gate_profiles

#: The gate's table in a CI log (not a terminal) is at most this wide: its cells fold instead of writing lines of
#: hundreds of columns (a long drift reason, a deep profile path).
LOG_TABLE_WIDTH = 160


def render_gate(console: Console, data: Mapping[str, Any]) -> None:
    """The gate table (profile, hash, status, reason), notes, a summary; annotations under GitHub Actions."""
    rows: Sequence[Mapping[str, Any]] = data["rows"]
    title = render.cell(f"bless gate: {data['manifests_dir']}")
    table = Table(title=title, title_justify="left", header_style="bold", expand=False)
    for column in ("profile", "hash", "status", "reason"):
        table.add_column(column, overflow="fold")
    for row in rows:
        ok = row["status"] == "blessed"
        reason = row["reason"]
        if row["hardware"] == "probed":
            reason += " (hardware probed on this machine)"
        table.add_row(
            render.cell(row["profile"]),
            render.cell((row["config_hash"] or "-")[:16]),
            Text("blessed" if ok else "FAILED", style="bold green" if ok else "bold red"),
            render.cell(reason),
        )
    console.print(table, width=None if console.is_terminal else min(console.width, LOG_TABLE_WIDTH))
    for row in rows:
        for note in row["notes"]:
            console.print(Text.assemble(("note", "bold yellow"), shown(f": {row['profile']}: {note}")))
    failed = data["failed"]
    if data["passed"]:
        console.print(Text(f"all {data['profiles']} profile(s) blessed", style="bold green"))
    else:
        console.print(Text(f"{failed} of {data['profiles']} profile(s) not blessed", style="bold red"))
    if os.environ.get("GITHUB_ACTIONS") == "true":
        annotations = data.get("_annotations", [])
        if annotations:
            sys.stdout.write("\n".join(annotations) + "\n")
            sys.stdout.flush()


@command
def gate_command(
    ctx: typer.Context,
    profiles: Annotated[
        list[Path] | None,
        typer.Argument(help="Profile TOML files (default: profiles/*.toml in the current directory).", dir_okay=False),
    ] = None,
    manifests_dir: ManifestsDirOption = None,
    root: RootOption = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Also verify the blessed files; a profile whose files the store root does not hold fails (21).",
        ),
    ] = False,
    allow_unverified: Annotated[
        bool,
        typer.Option(
            "--allow-unverified",
            help="With --verify: a profile whose cache files are not in the store root passes on its manifest (noted).",
        ),
    ] = False,
    junit: Annotated[
        Path | None, typer.Option("--junit", help="Write a JUnit XML report here (one testcase per profile).")
    ] = None,
    json_output: JsonOption = False,
) -> Report:
    """Gate profiles for CI: each must hash to a valid, unique blessed manifest.

    Resolved offline: an image must be a pinned sha256 ID unless Docker is reachable to read a tag's ID.

    Hardware comes from the profile's declaration when complete, else this machine is probed (the row says so).

    A failing row names the factors that drifted against the nearest blessing.

    Exit 0 only when every profile is blessed, GATE_FAILED (24) otherwise. Example CI workflow: docs/ci/bless-gate.yml
    """

    store = command_store(ctx, root=root, manifests_dir=manifests_dir)
    # Even the default: a gate always means a published set, and a typo in CI must not read as "nothing is blessed".
    check_manifests_dir(store)
    outcome = gate_profiles(profiles or (), store, verify=verify, junit=junit, allow_unverified=allow_unverified)

    def human(console: Console, shown: Mapping[str, Any]) -> None:
        render_gate(console, {**shown, "_annotations": outcome.annotations})

    return Report(outcome.to_dict(), human, outcome.failure)
