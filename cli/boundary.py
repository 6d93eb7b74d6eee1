"""The one error boundary of the bless CLI: outcomes in, output and exit codes out.

Every command body returns a :class:`Report`: the JSON-ready document and a renderer that draws the
same document for humans. :func:`command` (``bless``'s commands) and :func:`execute` (``serve-full``)
run the body and are the only place that turns outcomes into output and exit codes:

* stdout carries exactly one JSON document with ``--json`` (``{"ok": true, ...}`` on success,
  ``{"ok": false, ..., "error": {...}}`` on failure) and nothing at all without it;
* stderr carries everything for humans: tables, progress bars, warnings, and a failure's
  ``diagnostics()`` (red title, then what to do);
* a :class:`~bless.errors.BlessError` exits with its ``exit_code``; Ctrl-C exits 130; any other
  exception is a bug: exit 1 with one line (the traceback only with ``--verbose``).

:func:`run_app` is the entry points' side of the same promise: a command line click refuses before
any command body runs (a missing option, ``--trials 0``) is reported as click prints it on stderr,
and with ``--json`` also as the same JSON error document a :class:`~bless.errors.UsageError` gives.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import stat
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, NoReturn, ParamSpec

import typer
from rich.console import Console
from rich.text import Text

try:  # typer >= 0.2x ships its own copy of click, whose exceptions are not click's
    from typer._click.exceptions import ClickException
    from typer._click.exceptions import UsageError as ClickUsageError
except ImportError:  # older typer runs on click itself
    from click.exceptions import ClickException  # type: ignore[assignment]
    from click.exceptions import UsageError as ClickUsageError  # type: ignore[assignment]

from bless.cli.common import MANIFESTS_DIR_FLAG, ROOT_FLAG, AppState
from bless.cli.error_hints import worded_for_command_line
from bless.cli.render import err_console
from bless.core.untrusted_text import json_safe, shown
from bless.errors import BlessError, ExitCode, InterruptedByUserError, UsageError


@contextmanager
def stop_signals_handled(handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """Install ``handler`` for SIGINT and SIGTERM for the ``with`` body; restore the previous ones after.

    Both are installed explicitly: a process started with SIGINT ignored (``bless run ... &`` from a
    script) inherits the ignore, and Python then never installs its own Ctrl-C handler.
    """
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


P = ParamSpec("P")

INTERNAL_HINT = "rerun with --verbose for the traceback"


@dataclass(frozen=True)
class Report:
    """What a command produced: its JSON document, how to draw it for humans, and an optional failure.

    ``failure`` is reported after the document (which still goes out, marked ``"ok": false``):
    that is how ``verify`` shows every problem and ``list`` every valid blessing before failing.
    """

    data: Mapping[str, Any]
    human: Callable[[Console, Mapping[str, Any]], None]
    failure: BlessError | None = None


def command(body: Callable[P, Report]) -> Callable[P, None]:
    """Wrap a typer command body in the error boundary (see the module docstring).

    The body's ``json_output`` and ``ctx`` keyword arguments (typer passes parameters by keyword)
    say whether ``--json`` was given and where the global ``--verbose`` is.
    """

    @functools.wraps(body)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        json_output = bool(kwargs.get("json_output", False))
        # Duck-typed: typer may hand over a plain click Context rather than typer.Context.
        state = getattr(kwargs.get("ctx"), "obj", None)
        verbose = isinstance(state, AppState) and state.verbose
        code = execute(functools.partial(body, *args, **kwargs), json_output=json_output, verbose=verbose)
        if code != ExitCode.OK:
            raise typer.Exit(code)

    return run


#: Where a failure's reason also goes, for whoever watches the process from outside: Kubernetes shows
#: the file named by a container's ``terminationMessagePath`` (``/dev/termination-log``) in
#: ``kubectl describe pod``. The rendered manifests set it; unset, nothing is written.
TERMINATION_LOG_ENV = "BLESS_TERMINATION_LOG"
#: Kubernetes keeps at most 4096 bytes of a termination message.
TERMINATION_LOG_MAX = 4096


def write_termination_log(code: int, title: str, message: str, hint: str | None) -> None:
    """Write ``exit CODE (title): message`` and the hint to ``$BLESS_TERMINATION_LOG``, if set.

    Best effort by design: the message is a copy of what stderr already said, so a path that cannot be
    written is ignored rather than turned into a second failure.
    """
    path = os.environ.get(TERMINATION_LOG_ENV)
    if not path:
        return
    text = f"bless exit {code} ({title}): {message}"
    if hint:
        text += f"\nWhat to do: {hint}"
    data = text.encode("utf-8", errors="replace")
    if len(data) > TERMINATION_LOG_MAX:
        data = data[: TERMINATION_LOG_MAX - 4] + b"\n..."
    # Never follow a link (its target would be overwritten), never wait (a FIFO nobody reads would hang
    # every refusal), and write only into a regular file: the kubelet's is one.
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with contextlib.suppress(OSError):
        fd = os.open(path, flags, 0o644)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.ftruncate(fd, 0)
                os.write(fd, data)
        finally:
            os.close(fd)


def execute(body: Callable[[], Report], *, json_output: bool, verbose: bool, termination_log: bool = True) -> int:
    """Run ``body``, write its output, and return the process exit code.

    A failure's reason is also written to ``$BLESS_TERMINATION_LOG`` when it is set, unless
    ``termination_log`` is False: a readiness probe runs in the serving container with its environment,
    and its "not yet" must not overwrite why the container itself ends.
    """
    code, failure = _execute(body, json_output=json_output, verbose=verbose)
    if failure is not None and termination_log:
        write_termination_log(code, failure.title, failure.message, failure.hint)
    return code


def _execute(body: Callable[[], Report], *, json_output: bool, verbose: bool) -> tuple[int, BlessError | None]:
    console = err_console()
    report: Report | None = None
    try:
        report = body()
        if report.failure is not None:
            worded_for_command_line(report.failure)
        if json_output:
            emit_json(document(report.data, report.failure), lenient=report.failure is not None)
        else:
            report.human(console, report.data)
    except (typer.Exit, typer.Abort):
        raise
    except KeyboardInterrupt:
        err: BlessError = InterruptedByUserError(
            "stopped by Ctrl-C", hint="run the command again to finish; the store never shows a half blessing"
        )
        return _fail(console, err, json_output=json_output, verbose=False), err
    except BlessError as exc:
        return _fail(console, worded_for_command_line(exc), json_output=json_output, verbose=verbose), exc
    except Exception as exc:
        code = _internal(console, exc, json_output=json_output, verbose=verbose)
        return code, BlessError(f"{type(exc).__name__}: {exc}", hint=INTERNAL_HINT)
    if report.failure is not None:
        print_diagnostics(console, report.failure, verbose=verbose)
        return int(report.failure.exit_code), report.failure
    return int(ExitCode.OK), None


def document(data: Mapping[str, Any], failure: BlessError | None = None) -> dict[str, Any]:
    """The ``--json`` document: ``ok`` first, the data, and the error when there is one."""
    doc: dict[str, Any] = {"ok": failure is None}
    doc.update((key, value) for key, value in data.items() if key != "ok")
    if failure is not None:
        doc["error"] = failure.to_dict()
    return doc


def emit_json(doc: Mapping[str, Any], *, lenient: bool = False) -> None:
    """Write one JSON document (and a newline) to stdout. Serialization happens before any write.

    ``lenient`` (error documents) writes values JSON cannot hold (a Path in some error's details)
    as strings: a failure must always be reported, never turned into a second one. A string that
    is not valid Unicode (a file name that is not UTF-8) is written the way humans see it
    (:func:`bless.core.untrusted_text.json_safe`), so stdout is always valid UTF-8 JSON.
    """
    text = json.dumps(json_safe(doc), indent=2, ensure_ascii=False, allow_nan=False, default=str if lenient else None)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def print_diagnostics(console: Console, err: BlessError, *, verbose: bool) -> None:
    """A failure's ``diagnostics()`` for humans: the title in red, the hint highlighted.

    Lines are split on newlines only, and every line is shown escaped (:func:`bless.core.untrusted_text.shown`):
    messages carry names from disk and engine log lines, whose control characters, carriage
    returns or line separators must not draw or erase lines of their own.
    """
    lines = [shown(line) for line in err.diagnostics().split("\n")] or [err.title]
    for index, line in enumerate(lines):
        text = Text()
        if index == 0 and line.startswith(f"{err.title}:"):
            text.append(err.title, style="bold red")
            text.append(line[len(err.title) :])
        elif line.startswith("What to do:"):
            text.append("What to do:", style="bold yellow")
            text.append(line[len("What to do:") :])
        else:
            text.append(line)
        console.print(text)
    if verbose and err.details:
        console.print(Text("details: " + shown(json.dumps(err.details, ensure_ascii=False, default=str)), style="dim"))


def _fail(console: Console, err: BlessError, *, json_output: bool, verbose: bool) -> int:
    if verbose and err.__traceback__ is not None:
        console.print(Text("".join(traceback.format_exception(err)), style="dim"))
    print_diagnostics(console, err, verbose=verbose)  # last: the reason is what the eye lands on
    if json_output:
        emit_json(document({}, err), lenient=True)
    return int(err.exit_code)


def _internal(console: Console, exc: Exception, *, json_output: bool, verbose: bool) -> int:
    summary = shown(f"{type(exc).__name__}: {exc}")
    if verbose:
        console.print(Text("".join(traceback.format_exception(exc)), style="dim"))
        console.print(Text.assemble(("internal error", "bold red"), f": {summary}"))
    else:
        console.print(Text.assemble(("internal error", "bold red"), f": {summary} ({INTERNAL_HINT})"))
    if json_output:
        error = {
            "error": type(exc).__name__,
            "title": "internal error",
            "exit_code": int(ExitCode.INTERNAL),
            "message": str(exc),
            "hint": INTERNAL_HINT,
            "details": {},
        }
        emit_json({"ok": False, "error": error}, lenient=True)
    return int(ExitCode.INTERNAL)


#: Options that name the store: click makes an empty value ``Path('')``, the current directory, so ``--root
#: "$UNSET_VARIABLE"`` would bless, serve or lock there without a word (an empty $BLESS_ROOT already counts as unset).
STORE_PATH_OPTIONS = (ROOT_FLAG, MANIFESTS_DIR_FLAG)


def empty_store_path_option(args: list[str]) -> str | None:
    """The first of :data:`STORE_PATH_OPTIONS` given an empty value in ``args`` (``--root ''``, ``--root=``)."""
    for index, arg in enumerate(args):
        if arg == "--":  # what follows are arguments, not options
            return None
        name, equals, value = arg.partition("=")
        if name not in STORE_PATH_OPTIONS:
            continue
        if (equals and not value) or (not equals and index + 1 < len(args) and args[index + 1] == ""):
            return name
    return None


def run_app(app: typer.Typer, args: list[str], *, prog_name: str, obj: object | None = None) -> NoReturn:
    """Run a typer app as a console script's entry point, and exit with its code.

    Click's standalone mode would print a parse error (a missing option, ``--trials 0``) and exit 2
    with nothing on stdout, breaking the promise of exactly one JSON document under ``--json``: here
    click runs non-standalone, and such an error is shown as click shows it (usage, then the error)
    and, when ``--json`` is among ``args``, also written as a JSON error document.
    """
    try:
        if (empty := empty_store_path_option(args)) is not None:
            raise ClickUsageError(
                f"{empty} is empty, which would name the current directory: give a directory, or leave the option "
                "out for the default"
            )
        code = app(args=args, prog_name=prog_name, obj=obj, standalone_mode=False)
    except ClickException as exc:
        exc.show()  # unchanged for humans: the usage line, the try-help line and the error
        refusal = _click_error(exc, prog_name)
        if "--json" in args:
            emit_json(document({}, refusal), lenient=True)
        write_termination_log(exc.exit_code, refusal.title, refusal.message, refusal.hint)
        sys.exit(exc.exit_code)
    except typer.Abort:
        # What standalone click does for an aborted prompt (bless has none; kept for completeness).
        err_console().print(Text("Aborted!", style="bold red"))
        sys.exit(int(ExitCode.INTERNAL))
    # Non-standalone click returns the command's return value (None) or a typer.Exit's code.
    sys.exit(code if isinstance(code, int) else int(ExitCode.OK))


def _click_error(exc: ClickException, prog_name: str) -> BlessError:
    """Click's refusal as our error: USAGE (2) for a bad command line, as our own UsageError reports it."""
    message = exc.format_message()
    ctx = getattr(exc, "ctx", None)  # a UsageError knows the (sub)command it refused
    command_path = getattr(ctx, "command_path", None) or prog_name
    if exc.exit_code == ExitCode.USAGE:
        return UsageError(message, hint=f"{command_path} --help shows the options and arguments")
    return BlessError(message, hint=INTERNAL_HINT)  # exit 1, as click exits for its other errors
