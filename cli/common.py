"""Plumbing shared by the bless commands: the global options, the store, lookups by hash.

Everything here is a thin call into ``bless``; nothing prints.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

import bless
from bless._version import DISTRIBUTION
from bless.store import Store, default_root
from bless.store.layout import require_manifests_dir

# The promise is about stdout only: under --json, stderr carries just progress, warnings and errors,
# and most commands have none of those on success.
JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Write exactly one JSON document to stdout, instead of the human output; stderr keeps only "
        "progress, warnings and error messages, if any.",
    ),
]
# No dir_okay=False: a directory is refused by load_profile as INPUT_INVALID (3), like a missing file,
# not by click as a usage error (2).
ProfileOption = Annotated[Path, typer.Option("--profile", "-p", help="Profile TOML file.")]
#: The options that name the store (the command line refuses an empty one: cli.boundary).
ROOT_FLAG, MANIFESTS_DIR_FLAG = "--root", "--manifests-dir"
RootOption = Annotated[
    Path | None,
    typer.Option(
        ROOT_FLAG, envvar="BLESS_ROOT", help="Store root (default: $BLESS_ROOT, else ~/.cache/bless).", file_okay=False
    ),
]
ManifestsDirOption = Annotated[
    Path | None,
    typer.Option(
        MANIFESTS_DIR_FLAG,
        envvar="BLESS_MANIFESTS_DIR",
        help="Directory of live manifests (default: <root>/manifests), e.g. a git checkout.",
        file_okay=False,
    ),
]
AllowUnknownEngineVersionOption = Annotated[
    bool,
    typer.Option(
        "--allow-unknown-engine-version",
        help="Run an engine version bless has no rules for (refused otherwise, exit 33): the nearest older "
        "known version's rules are used and recorded (bless engines lists the known versions).",
    ),
]
VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="Show tracebacks of internal errors and error details.")
]


def installed_version() -> str:
    """bless's version: the installed distribution's, else (a checkout run without installing) the package's own."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return bless.__version__


def print_version(ctx: typer.Context, value: bool) -> None:
    """``--version``: ``PROGRAM VERSION`` on stdout, then exit 0 (eager: before any other option is checked).

    Plain text even with ``--json`` on the line, as ``--help``: both answer about the program, not a command.
    """
    if value:
        typer.echo(f"{ctx.find_root().info_name} {installed_version()}")
        raise typer.Exit()


VersionOption = Annotated[
    bool,
    typer.Option("--version", callback=print_version, is_eager=True, help="Print the version and exit."),
]


@dataclass(frozen=True)
class AppState:
    """The global options of ``bless`` (set by the app callback, read by every command).

    ``root`` None means :func:`bless.store.default_root` (``$BLESS_ROOT`` or ``~/.cache/bless``);
    ``manifests_dir`` None means ``<root>/manifests``. ``allow_test_knobs`` is no option: only a
    Python caller of :func:`bless.cli.main.main` sets it (bless's own integration tests).
    """

    root: Path | None = None
    manifests_dir: Path | None = None
    verbose: bool = False
    allow_test_knobs: bool = False

    def store(self) -> Store:
        """The store these options name. Creating it touches nothing on disk."""
        return open_store(self.root, self.manifests_dir)


def open_store(root: Path | None, manifests_dir: Path | None = None) -> Store:
    """The store of ``--root`` (None: :func:`bless.store.default_root`). Creating it touches nothing on disk."""
    return Store(root if root is not None else default_root(), manifests_dir)


def app_state(ctx: typer.Context) -> AppState:
    """The :class:`AppState` of this invocation (defaults when the callback did not run)."""
    obj = ctx.obj
    return obj if isinstance(obj, AppState) else AppState()


def check_manifests_dir(store: Store) -> None:
    """Refuse (USAGE, 2) when the store's manifests dir does not exist, naming it.

    Used where the directory was named on purpose (``--manifests-dir`` or ``$BLESS_MANIFESTS_DIR``,
    or any dir ``bless gate`` is pointed at): a typo there must not read as "nothing is blessed".
    """
    require_manifests_dir(store.manifests_dir)


def reading_store(ctx: typer.Context) -> Store:
    """The store of a command that reads blessings (list, show, verify, diff, gc, sign, push).

    A manifests dir given explicitly must exist (:func:`check_manifests_dir`); the default
    ``<root>/manifests`` may be missing (a fresh store: nothing blessed yet). ``bless run``
    uses :meth:`AppState.store` instead: publishing creates the directory.
    """
    state = app_state(ctx)
    store = state.store()
    if state.manifests_dir is not None:
        check_manifests_dir(store)
    return store


def command_store(ctx: typer.Context, *, root: Path | None, manifests_dir: Path | None) -> Store:
    """The store of a command that also takes ``--root`` / ``--manifests-dir`` after its name.

    Precedence: the command's own option given on its command line, then the global option
    (``bless --root R CMD``), then the environment variable, then the default. The command's option
    reads the same environment variable as the global one, so a value the command's option got
    from the environment must not override a global option given on the command line.
    """
    state = app_state(ctx)

    def given(name: str, value: Path | None) -> bool:
        # By name: typer ships its own copy of click, whose ParameterSource is not click's.
        source = ctx.get_parameter_source(name)
        return value is not None and source is not None and source.name == "COMMANDLINE"

    chosen_root = root if given("root", root) else state.root if state.root is not None else root
    chosen_manifests = (
        manifests_dir
        if given("manifests_dir", manifests_dir)
        else state.manifests_dir
        if state.manifests_dir is not None
        else manifests_dir
    )
    return AppState(root=chosen_root, manifests_dir=chosen_manifests).store()
