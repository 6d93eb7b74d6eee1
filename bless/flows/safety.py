"""The unsafe-settings check shared by ``bless run`` and ``serve-full``."""

from __future__ import annotations

import os

from bless.engines.base import EngineAdapter
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
        hint=(
            "remove them from the profile (they exist to test bless itself; "
            f"{ALLOW_UNSAFE_ENV}=1 allows them in tests only)"
        ),
        details={"unsafe": described},
    )
