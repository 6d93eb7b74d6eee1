"""The unsafe-settings check shared by ``bless run`` and ``serve-full``.

Debug and cache-disabling settings are always refused: a start with them is not the one blessed. So are
settings that move where compiled state is written (``TORCHINDUCTOR_CACHE_DIR``, ``HOME``, ``TMPDIR``, ...:
:func:`bless.engines.base.relocating_settings`): what is compiled there would be neither blessed nor watched.
The reference engine's test knobs (``UnsafeSetting.test_knob``) are refused too, unless the caller
passes ``allow_test_knobs=True``: a parameter of the library, never read from the environment or
the command line, so that nothing around a production run can weaken it. bless's own integration
tests pass it through :func:`bless.cli.main.main` (see docs/concepts/bless-run.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from bless.core.factors import ResolvedConfig
from bless.engines.base import EngineAdapter, UnsafeSetting
from bless.errors import UnsafeEnvError


def check_unsafe(resolved: ResolvedConfig, adapter: EngineAdapter, *, allow_test_knobs: bool = False) -> list[str]:
    """Refuse unsafe settings of what will run (the resolved factors and env); returns what was allowed.

    With ``allow_test_knobs`` only test knobs pass.
    """
    profile = resolved.profile
    unsafe = adapter.unsafe_settings(resolved)
    refused = [u for u in unsafe if not (allow_test_knobs and u.test_knob)]
    if not refused:
        return [u.describe() for u in unsafe]
    described = [u.describe() for u in refused]
    raise UnsafeEnvError(
        f"{profile.label} sets: " + "; ".join(described),
        hint=unsafe_hint(refused),
        details={"unsafe": described},
    )


def unsafe_hint(unsafe: Sequence[UnsafeSetting]) -> str:
    """What to do, for the kinds of unsafe settings found: debug/cache-disabling ones, test knobs."""
    hints = []
    settings = [u.name for u in unsafe if not u.test_knob and not u.relocates]
    knobs = [u.name for u in unsafe if u.test_knob]
    moved = [u.name for u in unsafe if u.relocates]
    if moved:
        hints.append(
            f"remove {', '.join(moved)} from the profile's [env]: bless sets every compile location (into the blessed "
            "tree), HOME and the temp dir (fresh and watched at each start) itself, so that every compiled file is "
            "blessed or seen"
        )
    if settings:
        hints.append(
            f"remove {', '.join(settings)} from the profile: a debug or cache-disabling setting makes a start "
            "that is not the one blessed (to debug, serve-full --debug starts the engine without the cache)"
        )
    if knobs:
        hints.append(
            f"remove {', '.join(knobs)}: these knobs exist to test bless itself, and no bless or serve-full "
            "command accepts them"
        )
    return "; ".join(hints)
