#!/usr/bin/env python3
"""Write a vLLM release's tuned fused-MoE tables into ``bless/engines/vllm/moe_configs.json``.

vLLM ships its tuned tile configurations as ``vllm/model_executor/layers/fused_moe/configs/*.json``, one file per
``E=..,N=..,device_name=..[,dtype=..][,block_shape=[..]]`` (``get_config_file_name`` in ``fused_moe.py``). The
coverage model reads the ones its rules apply to:

* unquantized weights (bf16/fp16): no dtype part, no block-shape part;
* block-quantized FP8 (``dtype=fp8_w8a8,block_shape=[128,128]``), the layout of DeepSeek-style FP8 checkpoints.

Each table is kept as vLLM reads it (``get_moe_configs``): the keys in file order (vLLM picks the nearest key with
``min``, so the first on a tie) and ``triton_version`` dropped. The release's entry is replaced whole; the other
releases' entries and ``_about`` stay as they are. Output is compact JSON, as stored.

Usage (from the repository root; no network)::

    python3 scripts/vllm_moe_tables.py /path/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
    python3 scripts/vllm_moe_tables.py /tmp/src026 --release 0.26.0      # an unpacked wheel
    python3 scripts/vllm_moe_tables.py WHEEL --check                      # exit 1 when the stored entry differs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "bless" / "engines" / "vllm" / "moe_configs.json"
CONFIGS = "vllm/model_executor/layers/fused_moe/configs"
#: The tuned files the coverage model reads: unquantized, or block-quantized FP8 with 128x128 blocks.
FP8_BLOCK_SUFFIX = ",dtype=fp8_w8a8,block_shape=[128,128]"
TABLE_FILE = re.compile(r"E=\d+,N=\d+,device_name=[^,/]+(?:" + re.escape(FP8_BLOCK_SUFFIX) + r")?\.json")
WHEEL_NAME = re.compile(r"vllm-(?P<version>[0-9][^-]*)-.*\.whl")


class TablesError(Exception):
    """A source that is not a vLLM wheel or tree, or a tuned file vLLM could not read."""


def _members(source: Path) -> Iterator[tuple[str, bytes]]:
    """(file name, bytes) of every file under the release's ``configs/`` directory."""
    if source.is_file():
        with zipfile.ZipFile(source) as wheel:
            for info in wheel.infolist():
                directory, _, name = info.filename.rpartition("/")
                if directory == CONFIGS and name:
                    yield name, wheel.read(info)
        return
    # The directory holding vllm/, or vllm/ itself.
    root = source.parent if source.name == "vllm" and not (source / CONFIGS).is_dir() else source
    configs = root / CONFIGS
    if not configs.is_dir():
        raise TablesError(f"{source}: no {CONFIGS}/ under it (give a wheel, or the directory holding vllm/)")
    for path in sorted(configs.iterdir()):
        if path.is_file():
            yield path.name, path.read_bytes()


def read_table(name: str, data: bytes) -> dict[str, Any]:
    """One tuned file as ``get_moe_configs`` reads it: keys in file order, ``triton_version`` dropped."""
    try:
        table = json.loads(data)
    except ValueError as exc:
        raise TablesError(f"{name}: not JSON ({exc})") from exc
    if not isinstance(table, dict):
        raise TablesError(f"{name}: not a JSON object")
    table.pop("triton_version", None)
    for key, config in table.items():
        if not key.isdigit() or not isinstance(config, dict):
            raise TablesError(f"{name}: entry {key!r} is not a token count with a configuration")
    return table


def release_tables(source: Path) -> dict[str, dict[str, Any]]:
    """Every tuned table the coverage model reads, by file name (sorted)."""
    tables = {name: read_table(name, data) for name, data in _members(source) if TABLE_FILE.fullmatch(name)}
    if not tables:
        raise TablesError(f"{source}: no tuned fused-MoE table found under {CONFIGS}/")
    return dict(sorted(tables.items()))


def release_of(source: Path, given: str | None) -> str:
    """The release key: ``--release``, else the version in the wheel's file name."""
    if given:
        return given
    match = WHEEL_NAME.fullmatch(source.name)
    if not match:
        raise TablesError(f"{source}: name the release with --release (not a vllm-<version>-*.whl file)")
    return match["version"]


def updated(stored: dict[str, Any], release: str, tables: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``stored`` with the release's entry replaced (a new release goes last)."""
    result = dict(stored)
    result[release] = {"wheel": f"vllm-{release}", "tables": tables}
    return result


def serialize(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":")) + "\n"


def write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        Path(tmp).chmod(0o644)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a vLLM wheel, or the directory an unpacked wheel's vllm/ is in")
    parser.add_argument("--release", help="the release key (default: the version in the wheel's file name)")
    parser.add_argument("--data", type=Path, default=DATA, help=f"the data file (default {DATA.relative_to(REPO)})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the stored entry differs")
    args = parser.parse_args(argv)
    try:
        release = release_of(args.source, args.release)
        tables = release_tables(args.source)
    except (TablesError, OSError, zipfile.BadZipFile) as exc:
        print(f"vllm_moe_tables: {exc}", file=sys.stderr)
        return 2
    stored: dict[str, Any] = json.loads(args.data.read_text(encoding="utf-8"))
    fp8 = sum(name.endswith(f"{FP8_BLOCK_SUFFIX}.json") for name in tables)
    counts = f"{len(tables) - fp8} unquantized + {fp8} block-FP8 tables"
    if args.check:
        same = stored.get(release) == {"wheel": f"vllm-{release}", "tables": tables}
        print(f"{release}: {counts}: {'as stored' if same else 'DIFFERS from the stored entry'}")
        return 0 if same else 1
    write_atomically(args.data, serialize(updated(stored, release, tables)))
    print(f"{release}: wrote {counts} into {args.data}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
