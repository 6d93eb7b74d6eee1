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
    lookup_live,
    lookup_manifest,
    reading_store,
    resolve_profile_file,
)
from bless.cli.fleet import (
    TRUST_COMMANDS,
    TrustOption,
    pull_command,
    push_command,
    render_trust,
    sign_command,
    trust_app,
    trust_report,
)
from bless.cli.gate import gate_command
from bless.cli.k8s import K8S_COMMANDS, k8s_app
from bless.cli.run import run_command
from bless.core.factors import change_to_dict, diff_factors
from bless.core.manifest import Manifest
from bless.core.untrusted_text import shown
from bless.engines.known_versions import local_vllm_status, supported_engines
from bless.errors import (
    InputInvalidError,
    ManifestDuplicateError,
    ManifestInvalidError,
    UsageError,
    VerifyFailedError,
)
from bless.flows.resolve import ProfileResolution
from bless.flows.trust_policy import trust_verdict
from bless.probes import probe_python_environment
from bless.store import manifest_summary

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
    judged = resolve_profile_file(profile, offline=offline, declared_hardware=declared_hardware)
    return Report({**judged.resolved.to_dict(), "hardware_source": judged.hardware_source}, render.render_resolved)


# --------------------------------------------------------------------------------------------
# diff


def _manifest_side(manifest: Manifest) -> dict[str, Any]:
    return {
        "kind": "manifest",
        "config_hash": manifest.config_hash,
        "profile_name": manifest.profile_name,
        "created": manifest.created,
    }


def _profile_side(judged: ProfileResolution) -> dict[str, Any]:
    resolved = judged.resolved
    return {
        "kind": "profile",
        "profile": resolved.profile.label,
        "config_hash": resolved.config_hash,
        "hardware_source": judged.hardware_source,
    }


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
    if profile is not None and hash_b is not None:
        raise UsageError(
            "give either --profile P and one hash, or two hashes, not both",
            hint="bless diff --profile P HASH, or bless diff HASH_A HASH_B",
        )
    if profile is None and hash_b is None:
        raise UsageError(
            "nothing to compare HASH_A with",
            hint="bless diff --profile P HASH, or bless diff HASH_A HASH_B",
        )
    store = reading_store(ctx)
    blessed = lookup_manifest(store, hash_a)
    a_side = _manifest_side(blessed)
    if profile is not None:
        judged = resolve_profile_file(profile, offline=offline, declared_hardware=declared_hardware)
        b_side, b_factors = _profile_side(judged), judged.resolved.factors
    else:
        assert hash_b is not None
        other = lookup_manifest(store, hash_b)
        b_side, b_factors = _manifest_side(other), other.factors
    changes = [change_to_dict(change) for change in diff_factors(blessed.factors, b_factors)]
    data = {"a": a_side, "b": b_side, "identical": not changes, "changes": changes}
    return Report(data, render.render_diff)


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
    store = reading_store(ctx)
    index = store.listing()
    manifests: list[dict[str, Any]] = []
    invalid: list[dict[str, Any]] = []
    for record in index.records:
        summary = record.summary or (manifest_summary(record.manifest) if record.manifest is not None else None)
        if summary is None:
            error = record.error or ManifestInvalidError(f"{record.path}: unreadable")
            invalid.append({"path": str(record.path), "error": error.to_dict()})
            continue
        row = {key: value for key, value in summary.items() if key != "dir_id"}
        manifests.append({"config_hash": row.pop("config_hash"), "path": str(record.path), **row})
    duplicates = {config_hash: [str(path) for path in paths] for config_hash, paths in index.duplicates().items()}
    data = {
        "root": str(store.root),
        "manifests_dir": str(store.manifests_dir),
        "manifests": manifests,
        "invalid": invalid,
        "duplicates": duplicates,
    }
    failure: ManifestInvalidError | ManifestDuplicateError | None = None
    if invalid:
        failure = ManifestInvalidError(
            f"{len(invalid)} manifest file(s) in {shown(str(store.manifests_dir))} are invalid: "
            + ", ".join(shown(item["path"]) for item in invalid),
            hint="restore them from the store's archive or version control, or move them out of the "
            "manifests dir; until then every lookup (verify, serve-full) refuses",
            details={"invalid": [item["path"] for item in invalid]},
        )
    elif duplicates:
        failure = ManifestDuplicateError(
            f"{len(duplicates)} config hash(es) are claimed by more than one manifest file",
            hint="keep the right file of each and move the other(s) out of the manifests dir",
            details={"duplicates": duplicates},
        )
    return Report(data, render.render_list, failure)


# --------------------------------------------------------------------------------------------
# show


@command
def show_command(
    ctx: typer.Context,
    config_hash: Annotated[str, typer.Argument(help="Config hash, or a unique prefix of at least 8 hex digits.")],
    json_output: JsonOption = False,
) -> Report:
    """Show one blessing: summary, trials, golden outputs and provenance (--json: the whole manifest)."""
    store = reading_store(ctx)
    manifest = lookup_manifest(store, config_hash)
    path = store.manifest_path(manifest.config_hash)
    data = {
        **manifest.to_dict(),
        "manifest_path": str(path) if path is not None else None,
        "blessed_dir": str(store.blessed_dir(manifest)),
    }
    return Report(data, render.render_manifest)


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
    store = reading_store(ctx)
    live = lookup_live(store, config_hash)
    manifest = live.manifest
    verdict = trust_verdict(store, manifest, trust, data=live.document)
    blessed_dir = store.blessed_dir(manifest)
    console = render.err_console()
    with render.hashing_progress(console, manifest.cache.total_size, enabled=True) as progress:
        result = store.verify_blessing(manifest, progress=progress)
    data = {
        "ok": result.ok,
        "config_hash": manifest.config_hash,
        "blessed_dir": str(blessed_dir),
        "result": result.to_dict(),
        "trust": trust_report(verdict),
    }
    failure = None
    if not result.ok:
        failure = VerifyFailedError.from_result(result, blessed_dir, config_hash=manifest.config_hash)
    return Report(data, _render_verify, failure)


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
    store = reading_store(ctx)
    forgotten = [
        str(directory)
        for directory in forget_manifests_dir or ()
        if not dry_run and store.forget_manifests_dir(directory)
    ]
    report = store.gc(keep=keep, dry_run=dry_run)
    data = {
        "forgotten_manifests_dirs": forgotten,
        "dry_run": report.dry_run,
        "actions": [
            {
                "path": str(action.path),
                "reason": action.reason,
                "bytes": action.bytes,
                "interrupted_during": action.interrupted_during,
            }
            for action in report.actions
        ],
        "total_bytes": report.total_bytes,
        "notes": list(report.notes),
    }
    return Report(data, render.render_gc)


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
    local = local_vllm_status(python, probe_python_environment)
    data = {"engines": supported_engines(), "local": local}
    failure = None
    if "error" in local:
        # Not "nothing installed": nothing could be asked, so an "ok" answer would be a false all-clear.
        failure = InputInvalidError(
            f"cannot check the vLLM and torch of --python {python}: {local['error']}",
            hint="pass an interpreter that runs here (the local runtime's, e.g. --python .venv/bin/python)",
            details={"python": python},
        )
    return Report(data, render.render_engines, failure)


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
