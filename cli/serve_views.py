"""serve-full's human views (rich, on stderr): the plan, the banners, and what each way of ending printed.

The command module (:mod:`bless.cli.serve`) parses and calls the library; these only render the
dicts it returns, so the same data feeds ``--json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.text import Text

from bless.cli import render
from bless.core.untrusted_text import shown
from bless.flows import serve
from bless.replay.devices import GpuRank

__all__ = [
    "rank_lines",
    "render_banners",
    "render_detached",
    "render_dry_run",
    "render_finished",
    "render_plan",
    "render_ready",
    "render_stopped",
]


def render_banners(console: Console, plan: Mapping[str, Any], *, no_canary: bool) -> None:
    """The loud part: a red panel for --debug, a yellow one for --no-canary, then warnings."""
    if plan["debug"]:
        console.print(render.banner(serve.DEBUG_BANNER, title="NOT BLESSED", style="bold red"))
    elif no_canary:
        console.print(render.banner(serve.NO_CANARY_BANNER, title="NO CANARY", style="bold yellow"))
    for warning in plan.get("warnings", []):
        console.print(Text.assemble(("warning", "bold yellow"), ": ", shown(warning)))


def render_plan(console: Console, plan: Mapping[str, Any]) -> None:
    """The plan as a table: what will run, from which blessing, mounted how, published where."""
    container = plan["container"]
    mount = plan["mount"]
    verification = plan["verification"]
    timings = plan["timings"]
    rows: list[tuple[str, str]] = [
        ("profile", f"{plan['profile']} ({plan['profile_name']})"),
        ("config hash", plan["config_hash"]),
        ("blessed", "yes" if plan["blessed"] else "NO (debug start)"),
    ]
    if plan["blessed"]:
        rows += [
            ("manifest", str(plan["manifest_path"])),
            ("blessed dir", str(plan["blessed_dir"])),
            (
                "verified",
                f"{verification['files_checked']} files, {render.human_bytes(verification['bytes_hashed'])} "
                f"hashed in {verification['elapsed_s']:.3f} s",
            ),
            ("canary", f"{plan['golden_prompts']} golden prompt(s)"),
        ]
    if mount is not None:
        rows.append(("mount", f"{mount['kind']}: {mount['source']} -> {mount['target']}"))
        rows.append(("presented as", mount["presented_as"]))
        if mount.get("upper_dir"):
            rows.append(("upper layer", str(mount["upper_dir"])))
    else:
        rows.append(("mount", "none (no cache)"))
    if container["host_port"] is None:  # a local engine listens on the serving address itself
        listens = f"{container['host_ip']}:{container['port']} (the engine listens there itself)"
    else:
        listens = f"{container['host_ip']}:{container['host_port']} -> {container['port']}"
    rows += [
        ("container", str(container["name"])),
        ("image", str(container["image"] or "- (the host's own python)")),
        ("command", " ".join(container["command"])),
        ("env", " ".join(f"{key}={value}" for key, value in container["env"].items()) or "-"),
        ("python path", " ".join(container.get("python_path") or ()) or "-"),
        ("publish", listens),
        ("preflight", " ".join(f"{key} {value:.3f}" for key, value in timings.items())),
    ]
    console.print(Text("serve-full plan", style="bold"))
    console.print(render.kv_table(rows))
    for line in rank_lines(plan.get("ranks")):
        console.print(render.cell(line))


def rank_lines(ranks: Any) -> list[str]:
    """One line per rank of the engine, :attr:`GpuRank.line`: ``rank 1 -> GPU 0 (GPU-91f9...)`` (the plan's or the
    readiness record's ``ranks``)."""
    return [GpuRank.from_dict(rank).line for rank in ranks or ()]


def render_dry_run(console: Console, data: Mapping[str, Any]) -> None:
    """``--dry-run``: the plan and banners; nothing was started."""
    plan = data["plan"]
    render_plan(console, plan)
    render_banners(console, plan, no_canary=bool(data.get("no_canary")))
    console.print(Text("dry run: nothing was started", style="bold green"))


def render_detached(console: Console, data: Mapping[str, Any]) -> None:
    """``--detach``: where it serves and how to stop it."""
    result = data["result"]
    name = result["container"]["name"]
    console.print(Text.assemble(("serving (detached) ", "bold green"), shown(f"{result['url']}  container {name}")))
    watcher = result.get("seal_watcher")
    if watcher:
        console.print(
            render.cell(f"sealed: seal watcher pid {watcher.get('pid')} (its log: seal-watcher.log in the serve dir)")
        )
    console.print(
        render.cell(f"stop it (and remove its container, overlay and serve dir) with: {result['stop_command']}")
    )


def render_finished(console: Console, data: Mapping[str, Any]) -> None:
    """Foreground end: how the engine stopped and what became of the upper layer."""
    finish = data["finish"]
    graceful = finish["stopped_gracefully"]
    how = "stopped gracefully" if graceful else "was killed after the stop timeout"
    console.print(
        Text.assemble(
            ("serving ended ", "bold"),
            f"({data['ended_by']}): engine {how}, exit code {finish['exit_code']}, container removed",
        )
    )
    if finish["upper_kept"]:
        console.print(
            render.cell(f"upper layer kept: {finish['upper_dir']} ({finish['upper_written']} path(s) written)")
        )
        for entry in finish["upper_entries"][:20]:
            console.print(Text(f"  {entry['kind']:<9} {shown(entry['path'])} ({entry['size']} B)", style="dim"))
    else:
        console.print(Text("upper layer discarded", style="dim"))
    for note in finish["notes"]:
        console.print(Text.assemble(("warning", "bold yellow"), ": ", shown(note)))


def render_stopped(console: Console, data: Mapping[str, Any]) -> None:
    """What ``serve-full stop`` stopped and removed."""
    if not data["found"]:
        console.print(Text(f"nothing to stop: no detached serve of {shown(data['name'])!r} found", style="bold"))
    for what in data["stopped"]:
        console.print(Text.assemble(("stopped ", "bold green"), shown(what)))
    for path in data["serve_dirs_removed"]:
        console.print(Text(f"removed {shown(path)}", style="dim"))
    for note in data["notes"]:
        console.print(Text.assemble(("warning", "bold yellow"), ": ", shown(note)))


def render_ready(console: Console, data: Mapping[str, Any]) -> None:
    """One line: what serves, where, since when."""
    console.print(
        Text.assemble(
            ("ready ", "bold green"),
            shown(f"{data['name']}: {data['host']}:{data['port']}, canary {data['canary']}, since {data['since']}"),
        )
    )
    for line in rank_lines(data.get("ranks")):
        console.print(render.cell(line))
