"""The shell command blocks of the README and of every page under docs/, and how the tests exercise them.

Every fenced ``bash`` block of every page (:data:`PAGES`) is checked, exactly as written: each ``bless`` /
``serve-full`` line must parse against the real command tree (every command and option exists, values convert,
files a flag requires exist), each ``bash scripts/...`` line must name a script that exists and parses
(``bash -n``), each ``python3 scripts/...`` line a Python script that exists and compiles, and ``source`` may only
activate the venv setup.sh creates. A line ending in a backslash goes on on the next one. A block marked on the
line before its fence runs for real, as a user would type it:

* ``<!-- readme-test: offline -->``: in the unit tests (no Docker, no network);
* ``<!-- readme-test: docker -->``: in the integration tests (a real Docker Engine, the reference image), with
  ``$BLESS_ROOT`` holding a blessing of ``profiles/reference-cpu.toml`` (a copy of the session's), as after
  ``scripts/main.sh``.

A block left unmarked is only checked: one that needs a GPU, a network or another host (``scp host:``) stays so.

Runs happen in a scratch directory that holds ``profiles/`` of this checkout, with ``bless`` and
``serve-full`` (and ``.venv/bin/...``) on PATH running this checkout's CLI, and ``$BLESS_ROOT`` in scratch.
"""

from __future__ import annotations

import copy
import glob
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer.main

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
#: Every page whose blocks are checked: the README first, then every Markdown page under docs/.
PAGES = [README, *sorted((REPO / "docs").rglob("*.md"))]
MARKER = re.compile(r"<!-- readme-test: (offline|docker) -->")
FENCE = re.compile(r"^```(\w*)\s*$")
PROGRAMS = {"bless": "bless.cli.main", "serve-full": "bless.cli.serve"}
#: Programs that are not bless's, which README lines may use around it (copying metadata, Docker, cleaning up).
OTHER_TOOLS = ("scp", "rsync", "cp", "mkdir", "rm", "docker", "git", "kubectl", "podman")
#: Shell redirections a line may end with (``bless k8s render ... > serve.yaml``): the operator and its target.
REDIRECTIONS = (">", ">>", "2>", "<")
#: The one file a README line may ``source``: the activation script of the venv scripts/setup.sh creates.
VENV_ACTIVATE = ".venv/bin/activate"
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Block:
    """One fenced ``bash`` block: where it starts, how it is marked (None: parse only), its text, its page."""

    line: int
    marker: str | None
    text: str
    page: str = "README.md"

    @property
    def id(self) -> str:
        """``page:line``, the block's name in test ids and messages."""
        return f"{self.page}:{self.line}"

    def commands(self) -> list[str]:
        """The block's command lines (comments and blank lines dropped; a line ending in ``\\`` joined to the next)."""
        commands: list[str] = []
        pending = ""
        for line in self.text.splitlines():
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if line.endswith("\\"):
                pending += line[:-1]
                continue
            commands.append(pending + line)
            pending = ""
        if pending:
            commands.append(pending)
        return commands


def all_blocks() -> list[Block]:
    """Every fenced ``bash`` block of every page: the README's first, then docs/ in path order."""
    return [block for page in PAGES for block in readme_blocks(page)]


def readme_blocks(path: Path = README) -> list[Block]:
    """Every fenced ``bash`` block of one page (the README by default), with the marker on the line before its fence."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        if fence.group(1) == "bash":
            marked = MARKER.fullmatch(lines[index - 1].strip()) if index else None
            page = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)
            text = "\n".join(lines[index + 1 : end])
            blocks.append(Block(index + 1, marked.group(1) if marked else None, text, page))
        index = end + 1
    return blocks


def _parser_of(app: typer.Typer) -> Any:
    """The app's click command tree with every callback (commands and groups, at every level) a no-op:
    parsing runs, nothing else does. A README line like ``bless trust init --keys DIR`` must not
    create DIR when it is only checked."""
    return _quiet(typer.main.get_command(app))


def _quiet(command: Any) -> Any:
    quiet = copy.copy(command)
    quiet.callback = lambda *args, **kwargs: None
    commands = getattr(command, "commands", None)
    if commands is not None:
        quiet.commands = {name: _quiet(sub) for name, sub in commands.items()}
    return quiet


def check_parses(line: str) -> None:
    """Raise (AssertionError, or click's usage error) unless ``line`` is a command the checkout accepts.

    A pipeline (``bless k8s render ... | kubectl apply -f -``) is checked command by command; redirections
    are not arguments of the command and are left out.
    """
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    tokens = list(lexer)
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token == "|":
            _check_command(words, line)
            words = []
        elif token in REDIRECTIONS or (token.isdigit() and tokens[index + 1 : index + 2] == [">"]):
            index += 2 if token in REDIRECTIONS else 3  # the operator (and its fd) and the target
            continue
        else:
            words.append(token)
        index += 1
    _check_command(words, line)


def _check_command(words: list[str], line: str) -> None:
    """One command of a line (its words, as the shell splits them)."""
    assigned = False
    while words and ASSIGNMENT.match(words[0]):
        words.pop(0)
        assigned = True
    if assigned and not words:
        return  # a shell variable for the lines after it (REG="$(cat DIR/registry.addr)")
    assert words, f"no command in {line!r}"
    program, args = Path(words[0]).name, words[1:]
    if words[0] == "bash":
        script = REPO / args[0]
        assert script.is_file(), f"{line!r}: no {args[0]} in the checkout"
        subprocess.run(["bash", "-n", str(script)], check=True)
        return
    if program == "python3" and args and args[0].startswith("scripts/"):
        script = REPO / args[0]
        assert script.is_file(), f"{line!r}: no {args[0]} in the checkout"
        compile(script.read_text(encoding="utf-8"), str(script), "exec")
        return
    if words[0] in ("source", "."):
        # Only the venv that setup.sh makes is ever activated: the README must not promise another.
        assert args == [VENV_ACTIVATE], f"{line!r}: the README activates {VENV_ACTIVATE}, which setup.sh creates"
        assert "-m venv .venv" in (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8"), "setup.sh makes no .venv"
        return
    if program in OTHER_TOOLS:
        return  # not ours: its options are its own documentation's business
    assert program in PROGRAMS, f"{line!r}: the README test knows bless, serve-full, scripts and {OTHER_TOOLS}"
    expanded: list[str] = []
    for arg in args:
        if any(char in arg for char in "*?["):
            matches = sorted(glob.glob(arg, root_dir=REPO))
            assert matches, f"{line!r}: {arg} matches nothing in the checkout"
            expanded += matches
        else:
            expanded.append(arg)
    module = __import__(PROGRAMS[program], fromlist=["app"])
    # serve-full dispatches its one subcommand (serve-full stop NAME) to its own app.
    app, expanded = module.command_for(expanded) if hasattr(module, "command_for") else (module.app, expanded)
    cwd = Path.cwd()
    os.chdir(REPO)  # relative paths in the README are relative to a checkout
    try:
        code = _parser_of(app).main(expanded, prog_name=program, standalone_mode=False)
    finally:
        os.chdir(cwd)
    assert code in (None, 0), f"{line!r}: exit {code}"


def run_block(block: Block, scratch: Path, *, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``block`` with bash as a user would (set -e: the first failing command ends it)."""
    bin_dir = scratch / "bin"
    venv_bin = scratch / ".venv" / "bin"
    for directory in (bin_dir, venv_bin):
        directory.mkdir(parents=True, exist_ok=True)
        for name, module in PROGRAMS.items():
            shim = directory / name
            shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n', encoding="utf-8")
            shim.chmod(0o755)
    profiles = scratch / "profiles"
    if not profiles.exists():
        profiles.symlink_to(REPO / "profiles")
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("BLESS_MANIFESTS_DIR", "GITHUB_ACTIONS") and not key.startswith("PYTEST")
    }
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(REPO),
        BLESS_ROOT=str(scratch / "store"),
        COLUMNS="200",
    )
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", block.text],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
