"""How the CLI is put together: one way to register a command, one definition of each shared option,
one error boundary, one entry point to profile resolution."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.core import TyperGroup
from typer.testing import CliRunner

import bless.cli.boundary
from bless.cli import common, render
from bless.cli.main import COMMANDS, GROUPS, app
from bless.flows import inspect as inspect_flow

REPO = Path(__file__).resolve().parents[2]

#: The shared options as ``bless.cli.common`` defines them: (help, envvar) of each.
SHARED = {
    "--json": common.JsonOption,
    "--root": common.RootOption,
    "--manifests-dir": common.ManifestsDirOption,
}


def _declared(annotated: Any) -> tuple[str | None, Any]:
    option = annotated.__metadata__[0]
    return option.help, option.envvar


def test_every_command_is_registered_the_same_way_behind_the_boundary() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    assert sorted(group.commands) == sorted([name for name, _ in COMMANDS] + [name for name, _, _ in GROUPS])
    registered: list[tuple[Any, str, Any]] = [(group.commands[name].callback, name, body) for name, body in COMMANDS]
    for group_name, _typer, commands in GROUPS:
        sub = group.commands[group_name]
        assert isinstance(sub, TyperGroup)
        assert sorted(sub.commands) == sorted(name for name, _ in commands)
        registered += [(sub.commands[name].callback, f"{group_name} {name}", body) for name, body in commands]
    for callback, name, body in registered:
        chain = []
        function: Any = callback
        while function is not None:
            chain.append(function)
            function = getattr(function, "__wrapped__", None)
        assert body in chain, f"{name} is registered from the COMMANDS table"
        # The wrapper made by bless.cli.boundary.command, around the command's own body.
        assert body.__code__.co_filename == bless.cli.boundary.__file__, name
        assert chain[-1].__code__.co_filename != bless.cli.boundary.__file__, name


def test_shared_options_are_declared_once() -> None:
    """--json, --root, --manifests-dir mean the same (help, env var) on every command that takes them."""
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    seen: set[str] = set()
    for command in [group, *group.commands.values()]:
        for param in command.params:
            for flag in set(param.opts) & set(SHARED):
                seen.add(flag)
                assert (getattr(param, "help", None), param.envvar) == _declared(SHARED[flag]), f"{command.name} {flag}"
    assert seen == set(SHARED)


def _imports_resolve(path: Path) -> bool:
    """Whether a module imports ``bless.core.factors.resolve`` (by name or through the module)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "bless.core.factors" and "resolve" in _names(node):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "bless" and "factors" in _names(node):
            return True
        if isinstance(node, ast.Import) and "bless.core.factors" in _names(node):
            return True
    return False


def _names(node: ast.Import | ast.ImportFrom) -> set[str]:
    return {alias.name for alias in node.names}


def _calls_method(name: str, path: Path) -> bool:
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
    )


def _imports_name(module: str, name: str, path: Path) -> bool:
    """Whether ``path`` imports ``name`` from ``module`` under any alias (a renamed import is still a use)."""
    return any(
        isinstance(node, ast.ImportFrom) and node.module == module and any(a.name == name for a in node.names)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
    )


def _calls(name: str, path: Path) -> bool:
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
    )


def test_profiles_are_resolved_through_one_entry_point() -> None:
    """Only bless/flows/resolve.py calls factors.resolve() or specialises an adapter for a profile's factors;
    every command resolves through resolve_for_command(), and nothing else calls resolve_profile()."""
    sources = [path for folder in ("bless", "cli") for path in sorted((REPO / folder).rglob("*.py"))]
    importers = [str(path.relative_to(REPO)) for path in sources if _imports_resolve(path)]
    assert importers == ["bless/flows/resolve.py"]
    users = {str(path.relative_to(REPO)) for path in sources if _calls("resolve_for_command", path)}
    assert users == {
        "bless/flows/gate/check.py",
        "bless/flows/run/orchestrator.py",
        "bless/flows/inspect/profile_hash.py",
        "bless/flows/serve/checks.py",
        "bless/flows/k8s.py",  # k8s render's dry form: the profile's own declared config hash
        "bless/__init__.py",
    }
    wiring = {str(path.relative_to(REPO)) for path in sources if _calls("resolve_profile", path)}
    wiring |= {
        str(path.relative_to(REPO)) for path in sources if _imports_name("bless.flows.resolve", "resolve_profile", path)
    }
    assert wiring == {"bless/flows/resolve.py"}
    # A detached serve's seal watcher rebuilds its adapter from the factors it is handed (no profile to resolve).
    specialisers = {str(path.relative_to(REPO)) for path in sources if _calls_method("for_factors", path)}
    assert specialisers == {"bless/flows/resolve.py", "cli/seal_watch.py"}


def _helps() -> dict[str, str]:
    """``--help`` of bless, each of its commands, and serve-full, as a user's terminal shows them."""
    import bless.cli.serve

    runner = CliRunner(env={"COLUMNS": "200"})
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    helps = {}
    for args in [[], *([name] for name in group.commands)]:
        result = runner.invoke(app, [*args, "--help"])
        assert result.exit_code == 0, result.output
        helps[" ".join(["bless", *args])] = result.output
    result = runner.invoke(bless.cli.serve.app, ["--help"])
    assert result.exit_code == 0, result.output
    helps["serve-full"] = result.output
    return helps


def test_help_shows_no_type_on_flags_and_keeps_bracketed_words() -> None:
    helps = _helps()
    for name, text in helps.items():
        assert "<bool>" not in text, f"{name} --help shows a type on a flag"
    assert "profile's [hardware] declaration" in helps["bless hash"], "rich markup must not eat [hardware]"
    assert "--allow-weaker" in helps["bless run"]


def test_banners_stay_narrow_in_logs(capsys: pytest.CaptureFixture[str]) -> None:
    """stderr that is not a terminal is drawn 1000 columns wide; a --debug banner must still read as a box."""
    from bless.cli.serve_views import render_banners

    render_banners(render.err_console(), {"debug": True, "warnings": []}, no_canary=False)
    render_banners(render.err_console(), {"debug": False, "warnings": []}, no_canary=True)
    lines = capsys.readouterr().err.splitlines()
    assert any("NOT BLESSED" in line for line in lines) and any("NO CANARY" in line for line in lines)
    assert max(len(line) for line in lines) <= render.BANNER_WIDTH


def test_commands_without_a_registry_do_not_import_the_registry_client() -> None:
    """bless and serve-full start without oras/requests: only push, pull and --from import them."""
    import subprocess
    import sys

    code = (
        "import sys, bless.cli.main, bless.cli.serve\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('oras', 'requests')"
        " or m in ('bless.oci.client', 'bless.flows.pull', 'bless.flows.push', 'bless.flows.k8s'))\n"
        "print(loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout


# --- parse -> one call -> render ------------------------------------------------------------------------

#: The cli helpers a command may call to turn its options into arguments: the store its options name,
#: the keys (passphrase, PIN) they reach, transfer limits, and a profile file resolved here (hash, diff).
PARSE_HELPERS = {
    "app_state",
    "check_manifests_dir",
    "command_store",
    "key_access",
    "open_store",
    "reading_store",
    "transfer_limits",
}
#: The cli helpers that draw a result: the Report the boundary renders, consoles, progress, the exit-code table,
#: serve-full's plan, banners and trust verdict, and the signal handling around a run or a serve.
RENDER_HELPERS = {
    "Progress",
    "Report",
    "RunProgress",
    "SignalGate",
    "_report",
    "err_console",
    "exit_code_rows",
    "exit_codes_markdown",
    "hashing_progress",
    "pull_report",
    "render_banners",
    "render_gate",
    "render_plan",
    "render_trust",
    "signals_as_interrupt",
}
#: Commands whose data is a constant of the library, with no call to make.
NO_CALL = {"exit-codes": "the table is bless.errors.EXIT_CODES, drawn by render.exit_code_rows"}


def _registered_bodies() -> list[tuple[str, Any]]:
    """(name, body) of every ``bless`` command, sub-commands included, as the COMMANDS tables register them,
    and serve-full's body (it runs under ``boundary.execute``; its options are parsed into ServeFullOptions)."""
    import bless.cli.serve

    bodies: list[tuple[str, Any]] = [(name, body) for name, body in COMMANDS]
    bodies += [(f"{group} {name}", body) for group, _typer, commands in GROUPS for name, body in commands]
    bodies += [
        ("serve-full", bless.cli.serve._serve),
        ("serve-full stop", bless.cli.serve._stop),
        ("serve-full ready", bless.cli.serve._ready),
    ]
    return bodies


def _qualified(function: Any) -> str:
    return f"{getattr(function, '__module__', '')}.{getattr(function, '__qualname__', '')}"


def _callees(body: Any) -> list[Any]:
    """What ``body`` calls by a global name (``f(...)``) or through a module (``render.f(...)``).

    Calls on values (``result.to_dict()``) and on names local to the body are not calls into a module.
    """
    import builtins
    import importlib
    import inspect
    import textwrap
    import types

    body = inspect.unwrap(body)  # the command's own body, not the boundary's wrapper around it
    tree = ast.parse(textwrap.dedent(inspect.getsource(body)))
    # Names imported inside the body (push and pull import the registry flows lazily) count as globals.
    names = dict(body.__globals__)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            names.update({alias.asname or alias.name: getattr(module, alias.name) for alias in node.names})
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        target: Any = None
        if isinstance(func, ast.Name):
            target = names.get(func.id, getattr(builtins, func.id, None))
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = names.get(func.value.id)
            if isinstance(owner, types.ModuleType):
                target = getattr(owner, func.attr, None)
        if target is not None:
            found.append(target)
    return found


def _library_calls(name: str, body: Any) -> list[str]:
    """The library entry points ``body`` calls; fails on a cli helper that is neither parse nor render."""
    from bless.errors import BlessError

    calls = []
    for target in _callees(body):
        module = getattr(target, "__module__", "") or ""
        if not module.startswith("bless."):
            continue  # builtins, typer: glue
        if isinstance(target, type) and (issubclass(target, BlessError) or not module.startswith("bless.cli")):
            continue  # a refusal of the options, or a value handed to the call (RunOptions, RoleKeys)
        if module.startswith("bless.cli"):
            assert target.__name__ in PARSE_HELPERS | RENDER_HELPERS, (
                f"{name}: {target.__name__} is no parse/render helper"
            )
            continue
        calls.append(_qualified(target))
    return calls


def test_every_command_parses_makes_one_library_call_and_renders() -> None:
    """A command's body parses its options, calls one entry point of the library, and renders the result."""
    bodies = _registered_bodies()
    assert {name for name, _ in bodies} >= {
        "verify",
        "list",
        "show",
        "diff",
        "gc",
        "engines",
        "hash",
        "run",
        "serve-full",
        "serve-full stop",
        "serve-full ready",
    }
    for name, body in bodies:
        calls = _library_calls(name, body)
        expected = 0 if name in NO_CALL else 1
        assert len(calls) == expected, f"bless {name} calls {calls}: parse -> one library call -> render"


def test_the_one_call_check_sees_a_second_library_call() -> None:
    """The check above is not vacuous: a body making two library calls, or calling an unlisted cli helper, fails."""

    def two_calls(ctx: Any) -> Any:
        store = common.reading_store(ctx)
        return inspect_flow.list_blessings(store), inspect_flow.show_blessing(store, "0" * 64)

    assert len(_library_calls("two", two_calls)) == 2

    def unlisted(ctx: Any) -> Any:
        return common.installed_version()

    with pytest.raises(AssertionError, match="no parse/render helper"):
        _library_calls("unlisted", unlisted)


def test_the_command_line_reaches_the_registry_layer_only_through_the_flows() -> None:
    """cli/ -> flows -> oci: the transfer limits' defaults come from ``bless.flows.transfer``."""
    offenders = sorted(
        f"{path.name}: {node.module}"
        for path in (REPO / "cli").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bless.oci")
    )
    assert offenders == []
