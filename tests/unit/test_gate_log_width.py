"""The gate's table in a CI log: cells fold at a readable width instead of writing lines of hundreds of columns."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from bless.cli.gate import LOG_TABLE_WIDTH
from bless.cli.main import app
from bless.errors import ExitCode
from bless.store import Store
from tests.unit.test_gate import bless, write


def test_the_gate_table_in_a_log_is_at_most_the_log_width(tmp_path: Path) -> None:
    """Not a terminal (CliRunner, like a CI log): the long profile paths and the drift reason fold."""
    store = Store(tmp_path / "root")
    profiles = tmp_path / ("a-deeply-nested-checkout-" * 6) / "profiles"
    bless(store, write(profiles, "a.toml"), tmp_path)
    drifted = write(profiles, "b.toml", layers=4, isa="x86-64-v1")
    env = {"BLESS_ROOT": None, "BLESS_MANIFESTS_DIR": None, "GITHUB_ACTIONS": None}
    args = ["gate", str(profiles / "a.toml"), str(drifted), "--manifests-dir", str(store.manifests_dir)]
    result = CliRunner(env=env).invoke(app, args)
    assert result.exit_code == ExitCode.GATE_FAILED, result.output
    table = result.stderr[: result.stderr.index("profile(s) not blessed")]
    assert "FAILED" in table and "serve.layers" in table
    widest = max(len(line) for line in table.splitlines())
    assert widest <= LOG_TABLE_WIDTH, f"a {widest}-column line in the log:\n{table}"
