"""Subprocess entry point: one boot of the reference engine's compile (load or compile, warm-up, save), no server.

Usage (run with PYTHONPATH at the repo root):
    reference_boot_child.py INDUCTOR_DIR CACHE_DIR    prints one JSON line: loaded, saved, the markers

One process per boot: torch keeps compiled code in memory, so a second boot in one process would hit that
instead of the artifact. Inductor's dir is set before torch is imported, as the engine's CLI does.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    inductor_dir, cache_dir = Path(sys.argv[1]), Path(sys.argv[2])
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_dir)
    from bless.engines.reference_engine.artifact import boot_compiled
    from bless.engines.reference_engine.knobs import Knobs
    from bless.engines.reference_engine.model import ModelArgs, build_model

    args = ModelArgs()
    lines: list[str] = []
    boot = boot_compiled(build_model(args, "cpu"), args, "cpu", cache_dir, Knobs(), emit=lines.append)
    print(json.dumps({"loaded": boot.loaded, "saved": boot.saved, "markers": lines}))


if __name__ == "__main__":
    main()
