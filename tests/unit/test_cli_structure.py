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
    assert users == {"bless/flows/gate/check.py", "bless/flows/serve/checks.py", "cli/common.py", "cli/run.py"}
    wiring = {str(path.relative_to(REPO)) for path in sources if _calls("resolve_profile", path)}
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
