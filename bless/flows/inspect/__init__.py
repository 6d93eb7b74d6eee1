"""Reading a store's blessings without changing them: ``bless verify``, ``list``, ``show``, ``diff``, ``hash``
and ``engines``.

Each entry point returns a frozen result whose ``to_dict()`` is the command's ``--json`` document and,
where the command can end in a refusal after reporting (verify, list, engines), whose ``failure`` is
that refusal: every problem is shown before the exit code says so.

One module per command: :mod:`.verify`, :mod:`.listing`, :mod:`.show`, :mod:`.diff`, :mod:`.profile_hash`
(``hash``), :mod:`.engines`. No other flow imports this package.
"""

from __future__ import annotations

from bless.flows.inspect.diff import BlessingDiff, diff_profile
from bless.flows.inspect.engines import EngineSupport, known_engines
from bless.flows.inspect.listing import BlessingList, list_blessings
from bless.flows.inspect.profile_hash import ProfileHash, hash_profile, judge_profile
from bless.flows.inspect.show import ShownBlessing, show_blessing
from bless.flows.inspect.verify import ProgressFactory, VerifyOutcome, verify_blessing

__all__ = [
    "BlessingDiff",
    "BlessingList",
    "EngineSupport",
    "ProfileHash",
    "ProgressFactory",
    "ShownBlessing",
    "VerifyOutcome",
    "diff_profile",
    "hash_profile",
    "judge_profile",
    "known_engines",
    "list_blessings",
    "show_blessing",
    "verify_blessing",
]
