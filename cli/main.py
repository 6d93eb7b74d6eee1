"""``bless``: bless, verify and inspect compiled caches (the typer app and its commands).

Each command parses its options, calls ``bless``, and returns a :class:`bless.cli.boundary.Report`; the
error boundary (:mod:`bless.cli.boundary`) writes it (JSON on stdout with ``--json``, rich on stderr
otherwise) and turns failures into the exit codes of ``bless exit-codes``. Every command is a
function wrapped in :func:`bless.cli.boundary.command`, registered on the app in one table at the end
(``run`` and ``gate`` live in their own modules, registered the same way).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from bless.cli import render
from bless.cli.boundary import Report, command, run_app
from bless.cli.common import (
    AppState,
    JsonOption,
    ManifestsDirOption,
    ProfileOption,
    RootOption,
    VerboseOption,
    VersionOption,
    app_state,
    reading_store,
)
from bless.cli.gate import gate_command
from bless.cli.k8s import K8S_COMMANDS, k8s_app
from bless.cli.registry import pull_command, push_command
from bless.cli.run import run_command
from bless.cli.trust import TRUST_COMMANDS, TrustOption, render_trust, sign_command, trust_app
from bless.errors import UsageError
from bless.flows.gc import collect_garbage
from bless.flows.inspect import (
    diff_profile,
    hash_profile,
    known_engines,
    list_blessings,
    show_blessing,
    verify_blessing,
)

app = typer.Typer(
    name="bless",
    help=(
        "Bless and verify compiled torch.compile caches for LLM serving, fail closed. "
        "Humans read stderr; with --json, stdout carries exactly one JSON document. "
        "Exit codes: bless exit-codes."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # --install-completion / --show-completion: typer's shell completion (bash, zsh, fish, PowerShell)
    add_completion=True,
    # Plain help: rich markup would eat bracketed words ("[hardware]"), and typer's rich help
    # prints a "<bool>" type on every flag.
    rich_markup_mode=None,
)

OfflineOption = Annotated[
    bool,
    typer.Option("--offline", help="No network lookups: a Hugging Face revision must already be a 40-hex commit."),
]
DeclaredHardwareOption = Annotated[
    bool,
    typer.Option(
        "--declared-hardware",
        help="Use only the profile's [hardware] declaration, never this machine's (a complete declaration is "
        "used anyway; this refuses an incomplete one instead of probing).",
    ),
]


@app.callback()
def main_options(
    ctx: typer.Context,
    root: RootOption = None,
    manifests_dir: ManifestsDirOption = None,
    verbose: VerboseOption = False,
    version: VersionOption = False,
) -> None:
    """Bless and verify compiled torch.compile caches for LLM serving, fail closed."""
    # What the entry point preset (main()'s parameters), completed by the global options.
    ctx.obj = dataclasses.replace(app_state(ctx), root=root, manifests_dir=manifests_dir, verbose=verbose)


# --------------------------------------------------------------------------------------------
# hash


@command
def hash_command(
    ctx: typer.Context,
    profile: ProfileOption,
    offline: OfflineOption = False,
    declared_hardware: DeclaredHardwareOption = False,
    json_output: JsonOption = False,
) -> Report:
    """Resolve a profile on this machine and print its config hash and canonical factors.

    Only an image given by tag needs the container runtime (to read its ID); a pinned
    sha256: image ID resolves without Docker.

    Hardware comes from the profile's [hardware] declaration when it is complete (on any machine, GPU
    profiles on a CPU-only host included), else from probing this machine; the output says which.
    """
    hashed = hash_profile(profile, offline=offline, declared_hardware=declared_hardware)
    return Report(hashed.to_dict(), render.render_resolved)


# --------------------------------------------------------------------------------------------
# diff


@command
def diff_command(
    ctx: typer.Context,
    hash_a: Annotated[str, typer.Argument(help="Config hash (or unique prefix, >= 8 hex) of a blessing.")],
    hash_b: Annotated[
        str | None, typer.Argument(help="A second blessing's hash or prefix (when --profile is not given).")
    ] = None,
    profile: Annotated[
        Path | None,
        typer.Option("--profile", "-p", help="Compare this profile (as resolved here) with HASH_A."),
    ] = None,
    offline: OfflineOption = False,
    declared_hardware: DeclaredHardwareOption = False,
    json_output: JsonOption = False,
) -> Report:
    """Show which factors differ: a profile against a blessing, or two blessings.

    bless diff --profile P HASH compares the blessing HASH (blessed) with what P resolves to
    here (current); bless diff HASH_A HASH_B compares two blessings. Exit 0 whether or not
    they differ: diff reports, it does not judge.
    """
    compared = diff_profile(
        reading_store(ctx),
        hash_a,
        hash_b,
        profile=profile,
        offline=offline,
        declared_hardware=declared_hardware,
    )
    return Report(compared.to_dict(), render.render_diff)


# --------------------------------------------------------------------------------------------
# list


@command
def list_command(ctx: typer.Context, json_output: JsonOption = False) -> Report:
    """List the blessings of the store.

    Invalid manifest files are listed too, in a separate section with their error, and make the
    exit code MANIFEST_INVALID (22) after every valid blessing has been shown: lookups fail closed
    while an invalid manifest is present. Two files claiming one config hash exit
    MANIFEST_DUPLICATE (23).
    """
    listing = list_blessings(reading_store(ctx))
    return Report(listing.to_dict(), render.render_list, listing.failure)


# --------------------------------------------------------------------------------------------
# show


@command
def show_command(
    ctx: typer.Context,
    config_hash: Annotated[str, typer.Argument(help="Config hash, or a unique prefix of at least 8 hex digits.")],
    json_output: JsonOption = False,
) -> Report:
    """Show one blessing: summary, trials, golden outputs and provenance (--json: the whole manifest)."""
    shown_blessing = show_blessing(reading_store(ctx), config_hash)
    return Report(shown_blessing.to_dict(), render.render_manifest)


# --------------------------------------------------------------------------------------------
# verify


@command
def verify_command(
    ctx: typer.Context,
    config_hash: Annotated[str, typer.Argument(help="Config hash, or a unique prefix of at least 8 hex digits.")],
    trust: TrustOption = None,
    json_output: JsonOption = False,
) -> Report:
    """Verify a blessed cache against its manifest: every file's size and sha256, nothing extra.

    Exit 0 when it matches (writable files are warnings), VERIFY_FAILED (21) with every problem
    listed otherwise; NO_MANIFEST (20) for an unknown hash. With --trust DIR the manifest must
    also be a validly signed, unexpired, current TUF target (exit 60-66 otherwise).
    """
    console = render.err_console()
    outcome = verify_blessing(
        reading_store(ctx),
        config_hash,
        trust_dir=trust,
        progress=lambda total_bytes: render.hashing_progress(console, total_bytes, enabled=True),
    )
    return Report(outcome.to_dict(), _render_verify, outcome.failure)


def _render_verify(console: Console, data: Mapping[str, Any]) -> None:
    render.render_verify(console, data)
    render_trust(console, data["trust"])


# --------------------------------------------------------------------------------------------
# gc


@command
def gc_command(
    ctx: typer.Context,
    keep: Annotated[
        int,
        typer.Option("--keep", min=0, help="Also keep the N newest unreferenced versions / evidence dirs per hash."),
    ] = 0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would be removed.")] = False,
    forget_manifests_dir: Annotated[
        list[Path] | None,
        typer.Option(
            "--forget-manifests-dir",
            help="A manifests dir this store published to that is gone for good: stop consulting it (repeatable).",
        ),
    ] = None,
    json_output: JsonOption = False,
) -> Report:
    """Remove what no blessing needs: superseded versions, old evidence, dead staging, stale serve dirs and logs.

    Never touches what a manifest references in any manifests dir this store has published to
    (they are recorded in the store); keeps every blessed version while one of them cannot be read;
    keeps what a running server holds a lease on (a crashed server's lease is dropped); refuses
    (22) while any manifest there is invalid.
    """
    collected = collect_garbage(
        reading_store(ctx), keep=keep, dry_run=dry_run, forget_manifests_dirs=forget_manifests_dir or ()
    )
    return Report(collected.to_dict(), render.render_gc)


# --------------------------------------------------------------------------------------------
# exit-codes


@command
def exit_codes_command(
    ctx: typer.Context,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print the Markdown table of docs/reference/exit-codes.md instead.")
    ] = False,
    json_output: JsonOption = False,
) -> Report:
    """Show the table of exit codes (stable: scripts may rely on them).

    The table is for reading and goes to stderr, as all human output does; for a file or a pipe use
    --json (one JSON document) or --markdown (the table of docs/reference/exit-codes.md), which write to stdout.
    """
    if markdown and json_output:
        raise UsageError("--markdown and --json are exclusive")
    data = {"exit_codes": render.exit_code_rows()}
    if markdown:
        return Report(data, lambda _console, _data: typer.echo(render.exit_codes_markdown(), nl=False))
    return Report(data, render.render_exit_codes)


# --------------------------------------------------------------------------------------------
# engines


@command
def engines_command(
    ctx: typer.Context,
    python: Annotated[
        str, typer.Option("--python", help="Interpreter whose vLLM and torch to check (the local runtime's).")
    ] = "python3",
    json_output: JsonOption = False,
) -> Report:
    """List the engine versions bless has rules for (GPU-proven or from source), and the local vLLM/torch.

    Exit 0 whatever is installed: a vLLM without rules is refused by run and serve-full (33), not here.
    An interpreter that cannot be run (a wrong --python) is INPUT_INVALID (3), after the table.
    """
    engines = known_engines(python)
    return Report(engines.to_dict(), render.render_engines, engines.failure)


#: Every command of ``bless``, in the order ``bless --help`` lists them.
COMMANDS = (
    ("hash", hash_command),
    ("diff", diff_command),
    ("list", list_command),
    ("show", show_command),
    ("verify", verify_command),
    ("sign", sign_command),
    ("push", push_command),
    ("pull", pull_command),
    ("run", run_command),
    ("gc", gc_command),
    ("gate", gate_command),
    ("engines", engines_command),
    ("exit-codes", exit_codes_command),
)
for _name, _command in COMMANDS:
    app.command(_name)(_command)
#: Command groups (``bless trust init``): each registers its own commands the same way.
GROUPS = (("trust", trust_app, TRUST_COMMANDS), ("k8s", k8s_app, K8S_COMMANDS))
for _name, _group, _commands in GROUPS:
    app.add_typer(_group, name=_name)


def main(*, allow_test_knobs: bool = False, argv: list[str] | None = None) -> NoReturn:
    """Entry point of the ``bless`` console script (which calls it without arguments).

    ``allow_test_knobs`` lets ``bless run`` accept the reference engine's test knobs. No option or
    environment variable sets it: only a Python caller can, and only bless's own integration tests
    do (``tests/integration/knobs_entry.py``), so nothing around a production run can weaken it.
    ``argv`` (default: ``sys.argv[1:]``) is the command line after ``bless``.
    """
    args = sys.argv[1:] if argv is None else argv
    run_app(app, args, prog_name="bless", obj=AppState(allow_test_knobs=allow_test_knobs))


if __name__ == "__main__":
    main()
