"""``serve-full``: serve a profile on its blessed cache, fail closed (the typer app; ``main()``).

Humans read stderr (the plan, banners, progress, then the engine's log in the foreground);
with ``--json`` stdout carries exactly one JSON document when the command ends. Exit codes
are bless's (``bless exit-codes``): every refusal happens before a container exists.

Foreground (the default): after the canary passed, the engine's log streams to stderr until
the engine exits or serve-full gets SIGINT (Ctrl-C) or SIGTERM; then the engine is stopped
gracefully and its container removed. Ending on a signal with a graceful stop exits 0; the
engine exiting by itself is ENGINE_FAILED (44). A signal *before* the engine is ready and
canary-checked stops what was started and exits INTERRUPTED (130).

``--detach`` returns once the canary passed and leaves the engine running. ``serve-full stop NAME``
(NAME: the profile's name) stops it gracefully and removes everything the serve created: the
container and its overlay volume (Docker) or the engine's process group (local), the serve dir
and the serving lease. ``serve-full ready NAME`` is the readiness probe: exit 0 only while a
canary-checked engine serves NAME.

Every step is :func:`bless.flows.serve.serve_full`; this module parses, renders and handles signals.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import os
import signal
import sys
import threading
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, cast

import typer
from rich.console import Console
from rich.text import Text

from bless.cli import boundary, render
from bless.cli.boundary import Report, stop_signals_handled
from bless.cli.common import (
    AllowUnknownEngineVersionOption,
    JsonOption,
    ManifestsDirOption,
    ProfileOption,
    RootOption,
    VerboseOption,
    VersionOption,
    open_store,
)
from bless.cli.registry import FleetSource, MinRateOption, PlainHttpOption, TransferGraceOption
from bless.cli.serve_views import (
    render_banners,
    render_detached,
    render_dry_run,
    render_finished,
    render_plan,
    render_ready,
    render_stopped,
)
from bless.cli.trust import TrustOption, render_trust
from bless.core.profile import Profile, load_profile
from bless.flows import serve
from bless.flows.events import Event
from bless.flows.transfer import DEFAULT_LIMITS, DEFAULT_MIN_RATE
from bless.runtime import get_runtime

app = typer.Typer(
    name="serve-full",
    add_completion=True,  # --install-completion / --show-completion, as bless's
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help, as bless's (bless.cli.main says why)
    help="Serve a profile on its blessed compile cache, fail closed.",
)


class SignalGate:
    """SIGINT / SIGTERM handling for one serve.

    While starting (``raising``), the first signal raises KeyboardInterrupt so the start unwinds
    and stops what it started. While following the log, a signal only sets ``event``, so it never
    interrupts a runtime call halfway. Later signals are ignored either way: a second Ctrl-C must
    not cut the graceful stop of the first one short (the stop has its own timeout).
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self.received: str | None = None
        self.raising = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.received is None
        if first:
            self.received = signal.Signals(signum).name
        self.event.set()
        if first and self.raising:
            raise KeyboardInterrupt

    @contextmanager
    def installed(self) -> Iterator[SignalGate]:
        """Install the handlers for the ``with`` body; restore the previous ones after."""
        with stop_signals_handled(self._handle):
            yield self


# --------------------------------------------------------------------------------------------
# Rendering (stderr)


class Progress:
    """Launcher events on stderr, one line each."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __call__(self, event: Event) -> None:
        style = {"warning": "bold yellow", "ready": "green"}.get(event.kind, "cyan")
        self.console.print(render.cell(event.message, style=style))


def _write_log(text: str) -> None:
    # Raw text, not rich: engine logs may contain brackets that rich would read as markup.
    sys.stderr.write(text)
    sys.stderr.flush()


# --------------------------------------------------------------------------------------------
# The command


def _report(outcome: serve.ServeOutcome, *, detach: bool, no_canary: bool) -> Report:
    """The outcome rendered as a dry run's plan, a detached serve, or a foreground serve that ended."""
    data = outcome.to_dict()
    if outcome.dry_run:
        return Report({**data, "no_canary": no_canary}, render_dry_run)
    if detach:
        return Report(data, render_detached)
    return Report(data, render_finished, outcome.failure)


DetachOption = Annotated[
    bool, typer.Option("--detach", "-d", help="Return once the canary passed; the container keeps running.")
]
DryRunOption = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Check everything and print the plan; start nothing. With --from, the pull still installs "
        "the blessing (and its trust state) into the store, so the plan checks what would be served.",
    ),
]
DebugOption = Annotated[
    bool,
    typer.Option(
        "--debug", help="Start WITHOUT the cache (eager, compile off): not a blessed start; no manifest needed."
    ),
]
NoCanaryOption = Annotated[bool, typer.Option("--no-canary", help="Skip the golden-output canary (reported loudly).")]
NamePerRootOption = Annotated[
    bool,
    typer.Option(
        "--name-per-root",
        help="Accepted and ignored: every serve's container is named bless-serve-NAME-<tag of the store root>.",
        hidden=True,
    ),
]
KeepUpperOption = Annotated[
    bool, typer.Option("--keep-upper", help="Keep the overlay's upper layer (what the engine wrote) and list it.")
]
ListenHostOption = Annotated[
    str | None,
    typer.Option(
        "--host",
        help="Publish the engine on this address instead of the profile's serving.host (0.0.0.0 in a pod).",
    ),
]
ListenPortOption = Annotated[
    int | None,
    typer.Option(
        "--port",
        min=0,
        max=65535,
        help="Publish the engine on this port instead of the profile's serving.port; 0: a free port (printed, and "
        "in serve-full ready NAME --json), so serves side by side on a shared host never collide.",
    ),
]


class UnprovenCompileChoice(enum.StrEnum):
    """``--unproven-compile``'s values: the profile's ``[serving] unproven_compile`` policies."""

    refuse = "refuse"
    record = "record"
    stop = "stop"


UnprovenCompileOption = Annotated[
    UnprovenCompileChoice | None,
    typer.Option(
        "--unproven-compile",
        help="What to do when the engine compiles something the blessing does not hold while serving, "
        "instead of the profile's serving.unproven_compile (default refuse): refuse (readiness fails, "
        "serve-full ready exits 46; the engine keeps answering), record (log and count only), stop "
        "(graceful stop, exit 48). Every such compile is logged at once and kept in the serve dir.",
    ),
]
FromOption = Annotated[
    str | None,
    typer.Option(
        "--from",
        help="Pull the blessing from this OCI reference first (no-op when present), then serve it as usual.",
    ),
]


@dataclass(frozen=True)
class ServeFullOptions:
    """serve-full's command line, stated once: each field is one option, with its typer declaration and default.

    :func:`serve_full`'s signature is built from these fields (:func:`_signature_of_options`), and the
    library's request from them (:meth:`request`): a field named as a :class:`serve.ServeRequest` field passes
    through unchanged.
    """

    profile: ProfileOption
    root: RootOption = None
    manifests_dir: ManifestsDirOption = None
    detach: DetachOption = False
    dry_run: DryRunOption = False
    debug: DebugOption = False
    no_canary: NoCanaryOption = False
    keep_upper: KeepUpperOption = False
    allow_unknown_engine_version: AllowUnknownEngineVersionOption = False
    name_per_root: NamePerRootOption = False
    listen_host: ListenHostOption = None
    listen_port: ListenPortOption = None
    unproven_compile: UnprovenCompileOption = None
    from_ref: FromOption = None
    trust: TrustOption = None
    plain_http: PlainHttpOption = None
    min_rate: MinRateOption = DEFAULT_MIN_RATE
    transfer_grace: TransferGraceOption = DEFAULT_LIMITS.grace_s
    json_output: JsonOption = False
    verbose: VerboseOption = False
    version: VersionOption = False

    def served_profile(self) -> Profile:
        """The profile file, published on ``--host`` / ``--port`` and under ``--unproven-compile`` where given.

        None of them is hashed: where the engine is published, and what to do about a compile the blessing
        does not hold, are the operator's to choose (a pod listens on its own addresses).
        """
        loaded = load_profile(self.profile)
        loaded = dataclasses.replace(
            loaded,
            serving_host=self.listen_host if self.listen_host is not None else loaded.serving_host,
            serving_port=self.listen_port if self.listen_port is not None else loaded.serving_port,
        )
        if self.unproven_compile is not None:
            loaded = dataclasses.replace(loaded, unproven_compile=self.unproven_compile.value)
        return loaded

    def request(self, profile: Profile, console: Console) -> serve.ServeRequest:
        """What the operator asked for, as the library takes it (``console``: where a ``--from`` pull reports)."""
        source = FleetSource(self.from_ref, self.trust, self.plain_http, self.min_rate, self.transfer_grace)
        return serve.ServeRequest(
            profile=profile,
            store=open_store(self.root, self.manifests_dir),
            trust_dir=source.trust,
            fetch=source.fetcher(console),
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            **{name: getattr(self, name) for name in _PASSED_THROUGH},
        )


#: The options the request takes as they are: the fields both dataclasses name (``profile`` is a path here, the
#: loaded profile there).
_PASSED_THROUGH = tuple(
    sorted(
        ({field.name for field in dataclasses.fields(serve.ServeRequest)} - {"profile"})
        & {field.name for field in dataclasses.fields(ServeFullOptions)}
    )
)


def _signature_of_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` declared to typer with one keyword parameter per :class:`ServeFullOptions` field, in order."""
    hints = typing.get_type_hints(ServeFullOptions, include_extras=True)
    parameters = [
        inspect.Parameter(
            field.name,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=hints[field.name],
            default=inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default,
        )
        for field in dataclasses.fields(ServeFullOptions)
    ]
    cast(Any, command).__signature__ = inspect.Signature(parameters, return_annotation=None)
    return command


@app.command()
@_signature_of_options
def serve_full(**given: Any) -> None:
    """Serve a profile on its blessed cache: refuse unless it hashes to a blessed, verified manifest.

    Every refusal happens before a container exists, with its own exit code (bless exit-codes).

    Then: the blessed tree as a read-only overlay lower layer, readiness, a re-check of the blessed files,
    and the canary against the golden outputs.

    Foreground: the engine's log streams to stderr until Ctrl-C / SIGTERM (graceful stop, exit 0).

    --detach returns after the canary; stop it (and clean up after it) with: serve-full stop NAME
    (NAME: the profile's name).
    """
    options = ServeFullOptions(**given)
    code = boundary.execute(partial(_serve, options), json_output=options.json_output, verbose=options.verbose)
    raise typer.Exit(code)


def _serve(options: ServeFullOptions) -> Report:
    """serve-full with these options: the plan and banners rendered, signals handled, the outcome reported."""
    loaded = options.served_profile()
    console = render.err_console()
    gate = SignalGate()

    def on_plan(plan_dict: Mapping[str, Any]) -> None:
        render_plan(console, plan_dict)
        if "trust" in plan_dict:
            render_trust(console, plan_dict["trust"])
        render_banners(console, plan_dict, no_canary=options.no_canary)

    def on_serving(result: serve.LaunchResult) -> None:
        gate.raising = False  # from here a signal only asks to stop; the stop itself is never interrupted
        console.print(
            Text.assemble(
                ("serving on ", "bold green"),
                f"{result.url} (container {result.container_name}); Ctrl-C or SIGTERM stops it",
            )
        )

    hooks = serve.ServeHooks(
        events=Progress(console),
        on_plan=on_plan,
        on_serving=on_serving,
        write_log=_write_log,
        stop=gate.event,
        signal_name=lambda: gate.received,
    )
    request = options.request(loaded, console)
    with gate.installed():
        outcome = serve.serve_full(request, hooks=hooks)
    return _report(outcome, detach=options.detach, no_canary=options.no_canary)


# --------------------------------------------------------------------------------------------
# serve-full stop NAME


def _subcommand_app(name: str, help_text: str) -> typer.Typer:
    """A ``serve-full NAME ...`` subcommand's app: plain help and no completion of its own, as serve-full's."""
    return typer.Typer(
        name=f"serve-full {name}",
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        help=help_text,
    )


stop_app = _subcommand_app("stop", "Stop a detached serve and remove what it created.")


def _stop(name: str, root: Path | None, timeout_s: int) -> Report:
    store = open_store(root)
    outcome = serve.stop_serving(name, store=store, docker=partial(get_runtime, "docker"), timeout_s=timeout_s)
    return Report(outcome.to_dict(), render_stopped)


@stop_app.command()
def stop(
    name: Annotated[
        str,
        typer.Argument(help="The profile's name (the serve runs as bless-serve-NAME-<tag of the store root>)."),
    ],
    root: RootOption = None,
    timeout_s: Annotated[
        int, typer.Option("--timeout", min=1, help="Seconds to wait for a graceful stop before SIGKILL.")
    ] = 30,
    json_output: JsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Stop the detached serve NAME gracefully, then remove its container and overlay volume (Docker) or
    process group (local), its serve dir and its serving lease. A serve dir with unproven-compile evidence is kept
    (bless gc ages it out). Nothing found to stop is not an error.
    """
    code = boundary.execute(partial(_stop, name, root, timeout_s), json_output=json_output, verbose=verbose)
    raise typer.Exit(code)


# --------------------------------------------------------------------------------------------
# serve-full ready NAME

ready_app = _subcommand_app("ready", "Succeed only while a canary-checked engine serves NAME (a readiness probe).")


def _ready(name: str, root: Path | None, accept_skipped_canary: bool) -> Report:
    store = open_store(root)
    record = serve.check_ready(
        store, name, accept_skipped_canary=accept_skipped_canary, docker=partial(get_runtime, "docker")
    )
    return Report(record.to_dict(), render_ready)


@ready_app.command()
def ready(
    name: Annotated[str, typer.Argument(help="The profile's name.")],
    root: RootOption = None,
    accept_skipped_canary: Annotated[
        bool,
        typer.Option("--no-canary", help="Also count a serve started with --no-canary as ready (not proven)."),
    ] = False,
    json_output: JsonOption = False,
    verbose: VerboseOption = False,
) -> None:
    """Exit 0 only while serve-full serves NAME from this store with its canary passed, its serving process
    (or detached container, looked up by id) alive and its engine answering; else exit 46 (not serving)
    saying why: a record this probe cannot judge is not ready. For exec readiness probes:
    no traffic reaches an engine that was not verified and canary-checked.
    """
    code = boundary.execute(
        partial(_ready, name, root, accept_skipped_canary),
        json_output=json_output,
        verbose=verbose,
        termination_log=False,  # a probe's "not yet" must never overwrite why the container ends
    )
    raise typer.Exit(code)


#: serve-full's subcommands: serve-full itself takes only options, so a first argument naming one of
#: these cannot mean anything else.
SUBCOMMANDS = {"stop": stop_app, "ready": ready_app}


def command_for(args: list[str]) -> tuple[typer.Typer, list[str]]:
    """The app that handles ``args`` and its arguments: ``stop NAME ...`` and ``ready NAME ...`` are subcommands."""
    chosen = SUBCOMMANDS.get(args[0]) if args else None
    if chosen is not None:
        return chosen, args[1:]
    return app, args


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``serve-full`` console script (``stop NAME`` and ``ready NAME`` are its subcommands)."""
    args = sys.argv[1:] if argv is None else argv
    chosen, rest = command_for(args)
    prog_name = f"serve-full {args[0]}" if chosen is not app else "serve-full"
    boundary.run_app(chosen, rest, prog_name=prog_name)


if __name__ == "__main__":
    main()
