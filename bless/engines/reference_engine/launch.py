"""Start the engine from its directory without importing bless: ``python3 <this file> [engine arguments]``.

A local start (a GPU host without Docker) runs this file, not ``python3 -m bless.engines.reference_engine``:
``-m`` imports the bless package first, and with it bless's own dependencies and about a second of imports,
which the profile's interpreter need not have (the engine needs only the standard library and torch). The
package is loaded as ``bless_reference``, the name the image gives it, and its ``__main__`` run as the program.
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
from pathlib import Path

#: The engine package's top-level name, in the image (a copy) and here (loaded from this directory).
PACKAGE_NAME = "bless_reference"


def load_package(directory: Path) -> None:
    """Import the package in ``directory`` as :data:`PACKAGE_NAME`, its modules found there (nowhere else)."""
    spec = importlib.util.spec_from_file_location(
        PACKAGE_NAME, directory / "__init__.py", submodule_search_locations=[str(directory)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the reference engine package from {directory}")
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE_NAME] = package
    spec.loader.exec_module(package)


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    # Python put this directory first on sys.path: its modules (model, server, ...) must not be top-level names.
    if sys.path and Path(sys.path[0] or ".").resolve() == here:
        del sys.path[0]
    load_package(here)
    runpy.run_module(PACKAGE_NAME, run_name="__main__", alter_sys=True)
