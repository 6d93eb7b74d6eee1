"""The CliRunner the unit tests drive the command line with."""

from __future__ import annotations

import inspect

from typer.testing import CliRunner

#: Wide, so rich never folds a path or a hash across lines in assertions; no store from the caller's environment.
BASE_ENV: dict[str, str | None] = {"COLUMNS": "250", "BLESS_ROOT": None, "BLESS_MANIFESTS_DIR": None}


def cli_runner(**extra_env: str | None) -> CliRunner:
    """A runner keeping stderr apart from stdout, with :data:`BASE_ENV` and ``extra_env`` (None unsets)."""
    env = {**BASE_ENV, **extra_env}
    if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters:  # click < 8.2
        return CliRunner(env=env, mix_stderr=False)  # type: ignore[call-arg,unused-ignore]
    return CliRunner(env=env)  # click >= 8.2 (and typer's own runner) keep stderr apart
