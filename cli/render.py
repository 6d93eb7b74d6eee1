"""The rich views of the bless CLI: each draws a command's JSON document for humans on stderr.

A view takes the console and the same document ``--json`` prints, so what humans and machines see
cannot disagree. Turning outcomes into output and exit codes is :mod:`bless.cli.boundary`'s job.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from bless.cli import blessing_words
from bless.cli.blessing_words import json_text
from bless.core.coverage import CoveragePlan, describe_plan
from bless.core.manifest import factor_field
from bless.core.untrusted_text import shown
from bless.errors import EXIT_CODES

#: The one cell of every view (defined beside the words of bless show, which this module draws).
cell = blessing_words.cell

#: Verification shows a progress bar when the blessed cache is larger than this (bytes).
PROGRESS_THRESHOLD_BYTES = 100_000_000
#: At most this many writable-file warnings are printed one by one (all are in ``--json``).
MAX_NOTICES_SHOWN = 20


def err_console() -> Console:
    """A rich console on the current stderr (made per call: tests swap ``sys.stderr``)."""
    # Not a terminal (CI logs, captured output): wide enough that no hash, path or table cell wraps.
    width = None if sys.stderr.isatty() else 1000
    return Console(stderr=True, highlight=False, soft_wrap=False, width=width)


#: Banners wrap at this width: a log (not a terminal) is drawn 1000 columns wide, a banner must not be.
BANNER_WIDTH = 100


def banner(text: str, *, title: str, style: str) -> Panel:
    """A loud boxed message, at most :data:`BANNER_WIDTH` columns wide (narrower on a narrow terminal)."""
    return Panel(Text(text, style="bold"), title=title, style=style, width=BANNER_WIDTH)


# --------------------------------------------------------------------------------------------
# Small formatting helpers


def human_bytes(size: int) -> str:
    """``1536`` -> ``1.5 KiB`` (binary units; bytes below 1 KiB exact)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _table(title: str | None, *columns: str) -> Table:
    # The title as plain Text: a string would be read as rich markup ("[bold]" in a path).
    table = Table(title=Text(title) if title else None, title_justify="left", header_style="bold", expand=False)
    for name in columns:
        table.add_column(name, overflow="fold")
    return table


def kv_table(rows: Sequence[tuple[str, str]]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(cell(key), cell(value))
    return table


def _warn(console: Console, message: str) -> None:
    console.print(Text.assemble(("warning", "bold yellow"), ": ", shown(message)))


# --------------------------------------------------------------------------------------------
# hash


def _factor_tree(tree: Tree, value: Mapping[str, Any]) -> None:
    for key in sorted(value):
        item = value[key]
        if isinstance(item, Mapping) and item:
            _factor_tree(tree.add(cell(key, style="bold")), item)
        else:
            tree.add(Text.assemble((shown(key), "cyan"), " = ", json_text(item)))


def render_resolved(console: Console, data: Mapping[str, Any]) -> None:
    """``bless hash``: the config hash, the hashed factors, and the recorded (not hashed) env."""
    console.print(Text.assemble("config hash ", (str(data["config_hash"]), "bold")))
    console.print(cell(f"profile     {data['profile']}", style="dim"))
    source = data.get("hardware_source")
    if source is not None:
        where = "declared in the profile's [hardware]" if source == "declared" else "probed on this machine"
        console.print(cell(f"hardware    {where}", style="dim"))
    tree = Tree(Text("factors (canonical, hashed)", style="bold"))
    _factor_tree(tree, data["factors"])
    console.print(tree)
    ignored: Mapping[str, str] = data["ignored_env"]
    if ignored:
        table = _table("env recorded but not hashed (ignored or secret)", "name", "value")
        for name in sorted(ignored):
            table.add_row(cell(name), cell(ignored[name]))
        console.print(table)
    else:
        console.print(Text("no env is left out of the hash", style="dim"))


# --------------------------------------------------------------------------------------------
# diff


def _side(change: Mapping[str, Any], side: str) -> Text:
    if change[f"{side}_absent"]:
        return Text("(absent)", style="dim")
    return Text(json_text(change[side]))


def render_diff(console: Console, data: Mapping[str, Any]) -> None:
    """``bless diff``: field / a / b, or ``identical``."""
    a, b = data["a"], data["b"]
    current = b["kind"] == "profile"
    head_a, head_b = ("blessed", "current") if current else ("a", "b")
    console.print(Text.assemble((f"{head_a}: ", "bold"), shown(_describe_side(a))))
    console.print(Text.assemble((f"{head_b}: ", "bold"), shown(_describe_side(b))))
    changes: Sequence[Mapping[str, Any]] = data["changes"]
    if not changes:
        console.print(Text("identical", style="bold green"))
        return
    table = _table(f"{len(changes)} factor(s) differ", "field", head_a, head_b)
    for change in changes:
        table.add_row(cell(change["field"], style="cyan"), _side(change, "before"), _side(change, "after"))
    console.print(table)


def _describe_side(side: Mapping[str, Any]) -> str:
    if side["kind"] == "profile":
        hardware = {"declared": ", hardware as declared", "probed": ", hardware probed here"}.get(
            side.get("hardware_source") or "", ""
        )
        return f"profile {side['profile']} (hashes to {side['config_hash']}{hardware})"
    return f"manifest {side['config_hash']} ({side['profile_name']}, created {side['created']})"


# --------------------------------------------------------------------------------------------
# list


def render_list(console: Console, data: Mapping[str, Any]) -> None:
    """``bless list``: the valid blessings, then invalid files and duplicate hashes as warnings."""
    manifests: Sequence[Mapping[str, Any]] = data["manifests"]
    if manifests:
        table = _table(
            f"blessings in {shown(data['manifests_dir'])}",
            "hash", "engine", "model", "profile", "created", "trials", "size",
        )  # fmt: skip
        for item in manifests:
            duplicate = item["config_hash"] in data["duplicates"]
            table.add_row(
                cell(item["config_hash"][:16], style="bold red" if duplicate else "bold"),
                cell(item["engine"]),
                cell(item["model"]),
                cell(item["profile_name"]),
                cell(item["created"]),
                Text(f"{item['trials_passed']}/{item['trials_planned']}"),
                Text(human_bytes(item["total_size"])),
            )
        console.print(table)
    else:
        console.print(cell(f"no valid blessings in {data['manifests_dir']}", style="dim"))
    invalid: Sequence[Mapping[str, Any]] = data["invalid"]
    if invalid:
        table = _table("invalid manifest files (ignored by lookups, which fail closed)", "file", "error")
        for item in invalid:
            table.add_row(cell(item["path"], style="yellow"), cell(item["error"]["message"]))
        console.print(table)
    for config_hash, paths in sorted(data["duplicates"].items()):
        _warn(console, f"config hash {config_hash} is claimed by {len(paths)} files: {', '.join(paths)}")


# --------------------------------------------------------------------------------------------
# show


def render_manifest(console: Console, data: Mapping[str, Any]) -> None:
    """``bless show``: summary, trials, golden outputs, provenance."""
    cache = data["cache"]
    factors = data["factors"]
    model_id = factor_field(factors, "model", "id")
    revision = factor_field(factors, "model", "revision") or factor_field(factors, "model", "content_sha256")
    engine = factor_field(factors, "engine", "name")
    rows = [
        ("config hash", str(data["config_hash"])),
        ("profile", str(data["profile_name"])),
        ("engine", str(engine) if engine is not None else "?"),
        ("model", f"{model_id if model_id is not None else '?'}" + (f"@{revision}" if revision else "")),
        ("created", str(data["created"])),
        ("tool version", str(data["tool"]["version"])),
        ("size", f"{human_bytes(cache['total_size'])} ({cache['total_size']} bytes)"),
        ("files", f"{len(cache['files'])} files, {len(cache['dirs'])} directories"),
        ("tree sha256", str(cache["tree_sha256"])),
        ("mount path", str(cache["mount_path"])),
        ("artifacts", ", ".join(str(item) for item in data["artifacts"].get("items", [])) or "(none)"),
        ("manifest", str(data["manifest_path"])),
        ("blessed dir", str(data["blessed_dir"])),
    ]
    blessing_words.kv_lines(console, rows)
    trials = data["trials"]
    blessing_words.render_coverage_in_words(console, factors, trials)
    # Titles as lines of their own: a table's title is padded to the table's width.
    console.print(Text(f"trials: {trials['passed']}/{trials['planned']} passed", style="bold"))
    table = _table(None, "#", "verdict", "start->ready", "reasons")
    for result in trials.get("results", []):
        ready = result.get("start_to_ready_s")
        table.add_row(
            cell(result.get("index", "?")),
            Text("pass", style="green") if result.get("passed") else Text("FAIL", style="bold red"),
            Text(f"{ready:.1f} s" if isinstance(ready, int | float) else "-"),
            cell("; ".join(str(reason) for reason in result.get("reasons", [])) or "-"),
        )
    console.print(table)
    for line in describe_proven_gpus(factors, trials, data.get("provenance")):
        console.print(cell(line))
    bound = trials.get("failure_rate_bound")
    if isinstance(bound, Mapping):
        console.print(
            Text(
                f"failure rate <= {bound.get('max_failure_rate')} at confidence {bound.get('confidence')}",
                style="dim",
            )
        )
    _render_coverage(console, data.get("coverage"))
    console.print(Text("golden outputs", style="bold"))
    golden = _table(None, "prompt", "max tokens", "text", "token ids")
    for item in data["golden"]:
        golden.add_row(
            cell(item["prompt"]),
            cell(item["max_tokens"]),
            _golden_text(item),
            Text(_token_ids(item.get("token_ids")), style="dim"),
        )
    console.print(golden)
    provenance = data["provenance"]
    console.print(Text("provenance", style="bold"))
    blessing_words.kv_lines(console, blessing_words.flat(provenance) or [("", "(none)")], indent="  ")


def describe_proven_gpus(factors: Mapping[str, Any], trials: Mapping[str, Any], provenance: Any = None) -> list[str]:
    """How many GPUs a blessing was proven on, and which GPU each rank of the bootstrap and of each trial ran on.

    A blessing records logical ranks (serve-full runs them on any GPUs of the product, docs/concepts/serve-full.md,
    "Device binding"); the lines say where the proof ran: ``rank 0: GPU 1 (GPU-...)``. A manifest written before
    ranks were recorded lists each trial's GPUs in the order recorded, without ranks.
    """
    if factor_field(factors, "hardware", "accelerator") != "cuda":
        return []
    per_engine = factor_field(factors, "hardware", "gpu_count") or 1
    name = factor_field(factors, "hardware", "gpu_name") or "GPU"
    devices = [device for device in trials.get("devices") or [] if isinstance(device, Mapping)]
    if not devices:
        return [f"GPUs: {per_engine} {name} per engine; which GPUs the trials ran on was not recorded"]
    listed = ", ".join(f"{device.get('index')} ({device.get('uuid')})" for device in devices)
    lines = [f"GPUs: {per_engine} {name} per engine, proven on {len(devices)} in all: {listed}"]
    bootstrap = provenance.get("bootstrap") if isinstance(provenance, Mapping) else None
    ranked = _ranks(bootstrap.get("gpus") if isinstance(bootstrap, Mapping) else None)
    if ranked:
        lines.append(f"  bootstrap: {ranked}")
    orders: dict[str, list[str]] = {}
    for result in trials.get("results", []):
        gpus = result.get("gpus") if isinstance(result, Mapping) else None
        if not isinstance(gpus, list) or not gpus:
            continue
        ranked = _ranks(gpus)
        if not ranked:  # recorded before ranks were
            ranked = "GPUs " + ",".join(str(gpu.get("index")) for gpu in gpus if isinstance(gpu, Mapping))
            ranked += " (in this order)"
        orders.setdefault(ranked, []).append(str(result.get("index", "?")))
    for ranked, numbers in orders.items():
        if ranked.startswith("GPUs "):
            lines.append(f"  {ranked}: trial(s) {', '.join(numbers)}")
        else:
            lines.append(f"  trial(s) {', '.join(numbers)}: {ranked}")
    return lines


def _ranks(gpus: Any) -> str | None:
    """``rank 0: GPU 1 (GPU-...), rank 1: GPU 0 (GPU-...)``, or None unless every record names its rank."""
    if not isinstance(gpus, list) or not gpus:
        return None
    if not all(isinstance(gpu, Mapping) and isinstance(gpu.get("rank"), int) for gpu in gpus):
        return None
    ordered = sorted(gpus, key=lambda gpu: int(gpu["rank"]))
    return ", ".join(f"rank {gpu['rank']}: GPU {gpu.get('index')} ({gpu.get('uuid')})" for gpu in ordered)


def _render_coverage(console: Console, coverage: Any) -> None:
    """What the blessing covers beyond its start, in words: each lazily compiled family and how it was reached."""
    if not isinstance(coverage, Mapping):
        console.print(Text("coverage: not recorded (a blessing made before coverage was recorded)", style="yellow"))
        return
    try:
        plan = CoveragePlan.from_dict(coverage["plan"])
        lines = describe_plan(plan)
        drives = len(plan.drives)
    except (KeyError, TypeError, ValueError):
        console.print(Text("coverage: recorded, but not in a form this bless reads", style="yellow"))
        return
    mode = str(coverage.get("mode"))
    bootstrap = coverage.get("bootstrap")
    sent = (
        f"{bootstrap.get('requests')} request(s) in {bootstrap.get('seconds')} s, replayed by every trial"
        if isinstance(bootstrap, Mapping)
        else "none sent"
    )
    console.print(Text(f"coverage (mode {mode}): {sent}", style="bold"))
    for line in lines:
        style = "bold red" if ": GAP," in line else ("dim" if ": not reachable here" in line else "")
        console.print(Text("  ", style=style).append_text(cell(line)))
    if mode == "off" and drives:
        console.print(Text(f"  coverage was off: {drives} class(es) were not driven", style="bold red"))


#: Token ids shown per golden output (all of them are in ``--json``).
MAX_TOKEN_IDS_SHOWN = 24


def _golden_text(item: Mapping[str, Any]) -> Text:
    """A golden output's text as a reader can see it: quoted, non-printables escaped.

    Byte-level engines (the reference engine) produce arbitrary bytes; their text holds U+FFFD where
    the bytes were not UTF-8, so the token ids are what identifies the output: said in the cell.
    """
    text = str(item.get("text", ""))
    out = Text(f'"{shown(text)}"')
    if "\ufffd" in text and item.get("token_ids"):
        out.append(" (not UTF-8 text: compared by token ids)", style="dim")
    return out


def _token_ids(ids: Any) -> str:
    if not isinstance(ids, list) or not ids:
        return "-"
    head = " ".join(str(token) for token in ids[:MAX_TOKEN_IDS_SHOWN])
    return head + (f" ... ({len(ids)} in all)" if len(ids) > MAX_TOKEN_IDS_SHOWN else "")


# --------------------------------------------------------------------------------------------
# verify


@contextmanager
def hashing_progress(console: Console, total_bytes: int, *, enabled: bool) -> Iterator[Callable[[int], None] | None]:
    """A thread-safe ``progress(nbytes)`` callback drawing a bar on stderr, or None when not shown.

    ``verify_tree`` calls it from its hashing threads; a lock guards the running total.
    """
    if not enabled or total_bytes <= PROGRESS_THRESHOLD_BYTES:
        yield None
        return
    lock = threading.Lock()
    done = 0
    with Progress(
        TextColumn("verifying"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("verify", total=total_bytes)

        def advance(nbytes: int) -> None:
            nonlocal done
            with lock:
                done += nbytes
                progress.update(task, completed=done)

        yield advance


def render_verify(console: Console, data: Mapping[str, Any]) -> None:
    """``bless verify``: every problem in a table, writable files as warnings, or a one-line pass."""
    result = data["result"]
    problems: Sequence[Mapping[str, str]] = result["problems"]
    notices: Sequence[Mapping[str, str]] = result["notices"]
    if problems:
        table = _table(f"{len(problems)} problem(s) in {shown(data['blessed_dir'])}", "kind", "path", "detail")
        for problem in problems:
            table.add_row(cell(problem["kind"], style="red"), cell(problem["path"]), cell(problem["detail"]))
        console.print(table)
    for notice in notices[:MAX_NOTICES_SHOWN]:
        _warn(console, f"{notice['path']}: {notice['detail']}")
    if len(notices) > MAX_NOTICES_SHOWN:
        _warn(console, f"... and {len(notices) - MAX_NOTICES_SHOWN} more writable entries (all are in --json)")
    if not problems:
        console.print(
            Text.assemble(
                ("verified", "bold green"),
                f" {data['config_hash']}: {result['files_checked']} files, "
                f"{human_bytes(result['bytes_hashed'])} hashed in {result['elapsed_s']:.2f} s "
                f"({shown(data['blessed_dir'])})",
            )
        )


# --------------------------------------------------------------------------------------------
# gc


def render_gc(console: Console, data: Mapping[str, Any]) -> None:
    """``bless gc``: what was (or would be) removed, and the total."""
    actions: Sequence[Mapping[str, Any]] = data["actions"]
    verb = "would reclaim" if data["dry_run"] else "reclaimed"
    if actions:
        title = "gc (dry run: nothing removed)" if data["dry_run"] else "gc"
        table = _table(title, "path", "reason", "size")
        for action in actions:
            table.add_row(cell(action["path"]), cell(action["reason"]), Text(human_bytes(action["bytes"])))
        console.print(table)
        console.print(Text.assemble((verb, "bold"), f" {human_bytes(data['total_bytes'])} in {len(actions)} item(s)"))
        for action in actions:
            if action.get("interrupted_during"):
                removed = "would remove" if data["dry_run"] else "removed"
                _warn(
                    console,
                    f"{removed} the evidence of an interrupted run (during {action['interrupted_during']}): "
                    f"{action['path']}",
                )
    else:
        console.print(Text("nothing to collect", style="bold green"))
    for note in data["notes"]:
        _warn(console, note)


# --------------------------------------------------------------------------------------------
# exit codes


def exit_code_rows() -> list[dict[str, Any]]:
    """``bless.errors.EXIT_CODES`` as JSON rows: code, name, meaning."""
    return [{"code": int(code), "name": code.name, "meaning": meaning} for code, meaning in EXIT_CODES]


def exit_codes_markdown() -> str:
    """The README's exit-code table, generated from ``bless.errors.EXIT_CODES``."""
    lines = ["| code | name | meaning |", "| ---: | --- | --- |"]
    lines += [f"| {row['code']} | `{row['name']}` | {row['meaning']} |" for row in exit_code_rows()]
    return "\n".join(lines) + "\n"


def render_engines(console: Console, data: Mapping[str, Any]) -> None:
    """``bless engines``: the known versions, then the local interpreter's vLLM and torch."""
    table = _table(
        "engine versions bless has rules for", "engine", "version", "torch pin", "rules from", "coverage model"
    )
    words = {"gpu": "source + GPU run", "source": "source only, not GPU-proven", "none": "none (gaps)"}
    for engine in data["engines"]:
        for row in engine["versions"]:
            proven = {"gpu": "source + GPU run", "source": "source only"}.get(row["proven"], "ships with bless")
            coverage = words.get(row.get("coverage", ""), "its own")
            table.add_row(engine["name"], row["version"], row.get("torch", ""), proven, coverage)
    console.print(table)
    local = data["local"]
    if "error" in local:
        console.print(Text.assemble(("local: ", "bold"), f"cannot read {local['python']}: {local['error']}"))
        return
    # A missing torch is None in the data (JSON null); a reader sees words, not a Python repr.
    torch = local["torch"] or "not installed"
    if not local["vllm"]:
        console.print(Text.assemble(("local: ", "bold"), f"{local['python']}: no vLLM installed (torch {torch})"))
        return
    if local["known"]:
        verdict = Text("known", style="green")
    elif local["rules"]:
        verdict = Text(
            f"UNKNOWN: refused without --allow-unknown-engine-version (would use vLLM {local['rules']}'s rules)",
            style="bold yellow",
        )
    else:
        verdict = Text("UNKNOWN and older than every supported release: refused", style="bold red")
    line = Text.assemble(("local: ", "bold"), f"{local['python']}: vLLM {local['vllm']}, torch {torch}: ")
    line.append_text(verdict)
    if local["torch_matches_pin"] is False:
        line.append(" (torch differs from that release's pin)", style="yellow")
    console.print(line)


def render_exit_codes(console: Console, data: Mapping[str, Any]) -> None:
    """``bless exit-codes``: the table."""
    table = _table("bless exit codes", "code", "name", "meaning")
    for row in data["exit_codes"]:
        table.add_row(Text(str(row["code"]), style="bold"), Text(row["name"]), Text(row["meaning"]))
    console.print(table)
