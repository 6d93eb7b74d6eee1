"""pyproject.toml builds without setuptools deprecation warnings (checked on the file: building needs the network)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def test_license_is_an_spdx_string() -> None:
    """A TOML table is deprecated (setuptools >= 77 warns at every install)."""
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    requires = PYPROJECT["build-system"]["requires"]
    assert "setuptools>=77" in requires, "the SPDX string needs setuptools 77"


def test_every_directory_with_package_data_is_a_listed_package() -> None:
    """Data in a directory setuptools does not list as a package (manifests/schema) is deprecated."""
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
