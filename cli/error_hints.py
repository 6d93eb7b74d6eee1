"""The command line's wording of the library's hints: the one table from a refusal's remedy to the flag to pass.

The library's hints are neutral (``replace the existing blessing (rebless)``): a Python caller is not told to
pass a flag. A refusal whose remedy is an option of a command carries a stable key (``BlessError.remedy``);
the error boundary (cli/boundary.py) shows the wording below instead of the library's hint, with ``--json``
and in the termination log as well. A refusal without a remedy key keeps its hint as it is.
"""

from __future__ import annotations

from collections.abc import Callable

from bless.errors import BlessError


def _config(err: BlessError) -> str:
    """The config hash a refusal names, shortened as commands accept it (HASH when it names none)."""
    config_hash = err.details.get("config_hash")
    return str(config_hash)[:16] if isinstance(config_hash, str) and config_hash else "HASH"


#: remedy key -> the command-line hint for a refusal carrying it (from its details where it names values).
COMMAND_LINE_HINTS: dict[str, Callable[[BlessError], str]] = {
    "rebless": lambda err: "use --rebless to bless again (the prior blessing is archived), or bless verify it",
    "allow_weaker": lambda err: (
        f"bless with at least --trials {err.details.get('trials_to_keep_bound', 'K')} to keep the bound, "
        "or add --allow-weaker to publish the weaker one"
    ),
    "allow_downgrade": lambda err: (
        "check the reference (a tag moved back?); to install the older blessing on purpose, pull it with "
        "bless pull --allow-downgrade"
    ),
    "wait_for_lock": lambda err: (
        "wait for that run to finish, or rerun with --wait (bless run --wait) to queue behind it; "
        "the lock is released as soon as that process exits"
    ),
    "pull_wait_for_lock": lambda err: (
        "another bless pull or bless run writes this config now; rerun bless pull without --no-wait to "
        "queue behind it (it then finds the blessing present, or installs its own)"
    ),
    "fewer_parallel": lambda err: (
        f"use --parallel {err.details.get('fit', 1)} or fewer (the default fits the GPUs present)"
    ),
    "sign_first": lambda err: f"sign it first: bless sign {_config(err)} --keys DIR",
    "allow_unknown_engine_version": lambda err: (
        f"{err.details.get('how', 'add its rules')}; or pass --allow-unknown-engine-version to use the nearest "
        f"older entry (vLLM {err.details.get('nearest')}; recorded in the manifest)"
    ),
}


def command_line_hint(err: BlessError) -> str | None:
    """What the command line tells the user to do about ``err``: its remedy's wording, else its own hint."""
    wording = COMMAND_LINE_HINTS.get(err.remedy) if err.remedy is not None else None
    return wording(err) if wording is not None else err.hint


def worded_for_command_line(err: BlessError) -> BlessError:
    """``err`` with its hint in command-line wording (the boundary's last step before showing it)."""
    err.hint = command_line_hint(err)
    return err
