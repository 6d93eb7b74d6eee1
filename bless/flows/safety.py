"""The unsafe-settings check shared by ``bless run`` and ``serve-full``."""

from __future__ import annotations

import os
from collections.abc import Sequence

from bless.engines.base import EngineAdapter, UnsafeSetting
from bless.errors import UnsafeEnvError
from bless.profile import Profile

ALLOW_UNSAFE_ENV = "BLESS_ALLOW_UNSAFE_ENV_FOR_TESTS"


def check_unsafe(profile: Profile, adapter: EngineAdapter) -> list[str]:
    """Refuse unsafe settings unless the documented test-only override is set; returns what was allowed."""
    unsafe = adapter.unsafe_settings(profile)
    if not unsafe:
        return []
    described = [u.describe() for u in unsafe]
    if os.environ.get(ALLOW_UNSAFE_ENV) == "1":
        return described
    raise UnsafeEnvError(
        f"{profile.label} sets: " + "; ".join(described),
        hint=unsafe_hint(unsafe),
        details={"unsafe": described},
    )


def unsafe_hint(unsafe: Sequence[UnsafeSetting]) -> str:
    """What to do, for the kinds of unsafe settings found: debug/cache-disabling ones, test knobs."""
    hints = []
    settings = [u.name for u in unsafe if not u.test_knob]
    knobs = [u.name for u in unsafe if u.test_knob]
    if settings:
        hints.append(
            f"remove {', '.join(settings)} from the profile: a debug or cache-disabling setting makes a start "
            "that is not the one blessed (to debug, serve-full --debug starts the engine without the cache)"
        )
    if knobs:
        hints.append(
            f"remove {', '.join(knobs)}: these knobs exist to test bless itself "
            f"({ALLOW_UNSAFE_ENV}=1 allows them in bless's own tests only)"
        )
    return "; ".join(hints)
