"""Packaging: pyproject.toml builds without setuptools deprecation warnings, and the wheel puts nothing but
``bless`` into site-packages (the checkout's ``cli/`` and ``manifests/schema/`` ship as ``bless.cli`` and
``bless/schema``), and a venv holding only that wheel runs both commands.

The wheel is built for real, offline, from a copy of the files a build reads (the build writes ``build/`` and
``*.egg-info`` next to its sources, and a test must not write into the checkout).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
#: What the build reads: metadata, the readme it embeds, and the packages (bless/cli and bless/schema are
#: symlinks into cli/ and manifests/schema/).
BUILD_INPUTS = ("pyproject.toml", "README.md", "bless", "cli", "manifests")
#: Throw-away outputs of earlier builds or tools, never inputs.
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info", ".mypy_cache", ".ruff_cache")


def test_license_is_an_spdx_string() -> None:
    """A TOML table is deprecated (setuptools >= 77 warns at every install)."""
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    requires = PYPROJECT["build-system"]["requires"]
    assert "setuptools>=77" in requires, "the SPDX string needs setuptools 77"


def test_every_directory_with_package_data_is_a_listed_package() -> None:
    """Data in a directory setuptools does not list as a package (bless/schema) is deprecated."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    includes = setuptools["packages"]["find"]["include"]
    for package, patterns in setuptools["package-data"].items():
        assert any(
            package == include or (include.endswith("*") and package.startswith(include[:-1])) for include in includes
        ), package
        directory = REPO / package.replace(".", "/")
        for pattern in patterns:
            assert "/" not in pattern, f"{package}: {pattern} reaches into a subpackage; list that one"
            assert list(directory.glob(pattern)), f"{package}: {pattern} matches nothing"


def test_the_distribution_is_bless_cache_and_the_import_name_stays_bless() -> None:
    """ "bless" on PyPI is an unrelated project (a Bluetooth LE server): installing it by that name would get it."""
    from bless._version import DISTRIBUTION

    assert PYPROJECT["project"]["name"] == DISTRIBUTION == "bless-cache"
    assert PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"] == ["bless", "bless.*"]


#: The CI gate's workflow, which users copy into their repositories.
GATE_WORKFLOW = REPO / "docs" / "ci" / "bless-gate.yml"


def test_the_ci_gate_installs_bless_by_path_and_pinned_hash_never_by_name() -> None:
    """A bare name from a package index is a dependency-confusion hole: ``bless==0.1.0`` installs another project."""
    import yaml

    workflow = yaml.safe_load(GATE_WORKFLOW.read_text(encoding="utf-8"))
    steps = [step for job in workflow["jobs"].values() for step in job["steps"]]
    installs = [step for step in steps if "pip install" in step.get("run", "")]
    assert len(installs) == 1, installs
    (install,) = installs
    lines = [line.strip() for line in install["run"].splitlines() if line.strip()]
    pip = [line for line in lines if "pip install" in line]
    assert pip == ['python -m pip install "./$BLESS_WHEEL"'], pip  # a path: pip never asks an index for bless
    check = 'echo "$BLESS_WHEEL_SHA256  $BLESS_WHEEL" | sha256sum --check --strict'
    assert lines.index(check) < lines.index(pip[0]), "the wheel's hash is checked before it is installed"
    wheel = install["env"]["BLESS_WHEEL"]
    version = re.escape(PYPROJECT["project"]["version"])
    assert re.fullmatch(r"[\w./-]+/bless_cache-" + version + r"-py3-none-any\.whl", wheel), wheel
    assert re.fullmatch(r"[0-9a-f]{64}", str(install["env"]["BLESS_WHEEL_SHA256"]))
    text = GATE_WORKFLOW.read_text(encoding="utf-8")
    assert not re.search(r"pip install\s+[\"']?bless(-cache)?\b", text), "an install by name"


def test_console_scripts_name_bless_modules() -> None:
    """The entry points must name modules the wheel installs (a top-level ``cli`` is not installed)."""
    assert PYPROJECT["project"]["scripts"] == {"bless": "bless.cli.main:main", "serve-full": "bless.cli.serve:main"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built offline with the venv's own setuptools (the dev extra pins it)."""
    version = importlib.metadata.version("setuptools")
    assert int(version.split(".")[0]) >= 77, f"setuptools {version} cannot build this project: pip install -e .[dev]"
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, symlinks=True, ignore=IGNORED)
        else:
            shutil.copy2(path, source / name)
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index", "--no-build-isolation", "-w", str(out), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (built,) = out.glob("bless_cache-*.whl")
    return built


def test_the_wheel_installs_only_bless(wheel: Path) -> None:
    """Top-level ``cli`` and ``manifests`` would collide with other projects' packages of those names."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = next(name.split("/")[0] for name in names if name.endswith(".dist-info/METADATA"))
        top_level = archive.read(f"{dist_info}/top_level.txt").decode().split()
        metadata = archive.read(f"{dist_info}/METADATA").decode()
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
    assert re.search(r"^Name: bless-cache$", metadata, re.MULTILINE), metadata[:500]
    assert dist_info == f"bless_cache-{PYPROJECT['project']['version']}.dist-info", dist_info
    assert {name.split("/")[0] for name in names} == {"bless", dist_info}
    assert top_level == ["bless"]
    assert re.search(r"^bless = bless\.cli\.main:main$", entry_points, re.MULTILINE), entry_points
    assert re.search(r"^serve-full = bless\.cli\.serve:main$", entry_points, re.MULTILINE), entry_points
    # the command line and the schemas, under bless, with their contents (not the symlinks themselves)
    assert {"bless/cli/__init__.py", "bless/cli/main.py", "bless/cli/serve.py"} <= set(names)
    assert {"bless/schema/profile.v1.json", "bless/schema/manifest.v1.json"} <= set(names)
    # the vLLM adapter's per-release data: its rules and the tuned fused-MoE tables of its coverage model
    assert {"bless/engines/vllm/versions.json", "bless/engines/vllm/moe_configs.json"} <= set(names)
    # the API is typed for its users' checkers (PEP 561): docs/reference/python-api.md
    assert "bless/py.typed" in names
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]


def test_a_venv_with_only_the_wheel_runs_both_commands(wheel: Path, tmp_path: Path) -> None:
    """bless and serve-full from a venv that holds the wheel and nothing of the checkout.

    The dependencies come from this interpreter's site-packages (a ``.pth`` line: installing them would need
    the network); that directory's own ``.pth`` files, the editable install's finder among them, are not
    processed for a directory added that way, so ``bless`` can only come from the wheel.
    """
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    paths = sysconfig.get_paths()
    (site / "deps-of-the-test.pth").write_text(f"{paths['purelib']}\n{paths['platlib']}\n", encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | {"COLUMNS": "200"}
    elsewhere = tmp_path / "elsewhere"  # not the checkout: its directory must not be on the path
    elsewhere.mkdir()

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120, check=False)

    for program, usage in (("bless", "Usage: bless [OPTIONS] COMMAND"), ("serve-full", "Usage: serve-full [OPTIONS]")):
        result = run(str(venv / "bin" / program), "--help")
        assert result.returncode == 0, result.stderr[-3000:]
        assert usage in result.stdout
    probe = run(
        str(python),
        "-c",
        "import importlib.metadata as m, importlib.util, sysconfig, bless, bless.cli.main, bless.core.schemas\n"
        "print(bless.__file__)\n"
        "print(m.version('bless-cache'), sorted(d.metadata['Name'] for d in m.distributions("
        "path=[sysconfig.get_paths()['purelib']])))\n"
        "print(sorted(bless.core.schemas.validator('profile.v1').schema['properties']))\n"
        "print([name for name in ('cli', 'manifests') if importlib.util.find_spec(name) is not None])\n",
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    origin, installed, schema_fields, strays = probe.stdout.splitlines()
    # the venv's own site-packages holds one distribution, bless-cache (its metadata is what --version reads)
    assert installed == f"{PYPROJECT['project']['version']} ['bless-cache']", installed
    assert Path(origin).is_relative_to(venv), origin
    assert "'runtime'" in schema_fields, schema_fields  # the profile schema, read from the wheel's bless/schema
    assert strays == "[]", "a top-level cli or manifests package is importable from the wheel's venv"
    version = PYPROJECT["project"]["version"]
    for program in ("bless", "serve-full"):
        said = run(str(venv / "bin" / program), "--version")
        assert (said.returncode, said.stdout) == (0, f"{program} {version}\n"), said.stderr[-3000:]
    codes = run(str(venv / "bin" / "bless"), "exit-codes", "--json")
    assert codes.returncode == 0 and '"ok": true' in codes.stdout, codes.stderr[-3000:]


def test_the_checkout_refuses_cli_as_a_top_level_package() -> None:
    """``PYTHONPATH=checkout python3 -m cli.main`` would load a second copy of the CLI: it names the right module."""
    env = os.environ | {"PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "--help"], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
    assert "use python3 -m bless.cli.main" in result.stderr
    fine = subprocess.run(
        [sys.executable, "-m", "bless.cli.main", "--help"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert fine.returncode == 0 and "Usage: bless" in fine.stdout, fine.stderr[-3000:]


#: How the old top-level names were reached: imports, ``-m`` runs, entry points, module paths in strings.
SELF = Path(__file__).resolve()
OLD_NAMES = re.compile(r"^\s*(from|import) (cli|manifests)\b|-m cli\.|[\"'`]cli\.(main|serve)\b|:func:`cli\.", re.M)


def test_nothing_in_the_checkout_reaches_the_old_top_level_names() -> None:
    """Scripts, tests, docs and the README name bless.cli (the old names fail, or mislead, once installed)."""
    offenders = []
    for folder in ("bless", "cli", "scripts", "tests", "docs"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix not in (".py", ".sh", ".md", ".yml", ".toml") or not path.is_file() or path == SELF:
                continue
            if OLD_NAMES.search(path.read_text(encoding="utf-8", errors="replace")):
                offenders.append(path.relative_to(REPO).as_posix())
    for name in ("README.md", "pyproject.toml"):
        if OLD_NAMES.search((REPO / name).read_text(encoding="utf-8")):
            offenders.append(name)
    assert offenders == []
