"""Test knobs: environment variables that make the engine misbehave on purpose, to test bless itself.

They are UNSAFE for serving. serve-full must refuse to start a blessed engine with any of them set
(the adapter lists them as unsafe). Parsing is strict: a value that is not understood is an error, never a
silent default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

NONDETERMINISTIC = "BLESS_REFERENCE_NONDETERMINISTIC"
IGNORE_CACHE = "BLESS_REFERENCE_IGNORE_CACHE"
POISON_CANDIDATES = "BLESS_REFERENCE_POISON_CANDIDATES"
CRASH_AT_BOOT = "BLESS_REFERENCE_CRASH_AT_BOOT"
NEVER_READY = "BLESS_REFERENCE_NEVER_READY"
# Writes a kernel into a Triton-style JIT cache under HOME at every start, as a library that compiles
# outside the engine's cache dir does (vLLM's Triton kernels went to ~/.triton before bless owned HOME).
JIT_OUTSIDE = "BLESS_REFERENCE_JIT_OUTSIDE"
# Injected by bless's orchestrator (the bootstrap candidate number); read only with POISON_CANDIDATES.
CANDIDATE = "BLESS_CANDIDATE"

KNOB_NAMES: tuple[str, ...] = (
    NONDETERMINISTIC,
    IGNORE_CACHE,
    POISON_CANDIDATES,
    CRASH_AT_BOOT,
    NEVER_READY,
    JIT_OUTSIDE,
)

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


class KnobError(ValueError):
    """A knob is set to a value that cannot be understood."""


@dataclass(frozen=True)
class Knobs:
    """The parsed test knobs; the default instance is the safe, production behaviour."""

    nondeterministic: bool = False
    ignore_cache: bool = False
    poison_candidates: frozenset[int] = frozenset()
    candidate: int | None = None
    crash_at_boot: bool = False
    never_ready: bool = False
    jit_outside: bool = False

    @property
    def poison_on_save(self) -> bool:
        """Whether an artifact saved by this process is marked poisoned (this candidate is listed)."""
        return self.candidate is not None and self.candidate in self.poison_candidates


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise KnobError(f"{name}={env[name]!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def _int(name: str, raw: str) -> int:
    try:
        return int(raw.strip(), 10)
    except ValueError:
        raise KnobError(f"{name}: {raw!r} is not an integer") from None


def parse_knobs(env: Mapping[str, str]) -> Knobs:
    """Read the test knobs from an environment mapping; raises KnobError on a malformed value."""
    poison_raw = env.get(POISON_CANDIDATES, "").strip()
    poison = frozenset(_int(POISON_CANDIDATES, part) for part in poison_raw.split(",") if part.strip())
    candidate: int | None = None
    # BLESS_CANDIDATE is always injected by the orchestrator; it only matters with a poison list, so it is
    # not even parsed otherwise (a production start must not fail on it).
    if poison and env.get(CANDIDATE, "").strip():
        candidate = _int(CANDIDATE, env[CANDIDATE])
    return Knobs(
        nondeterministic=_flag(env, NONDETERMINISTIC),
        ignore_cache=_flag(env, IGNORE_CACHE),
        poison_candidates=poison,
        candidate=candidate,
        crash_at_boot=_flag(env, CRASH_AT_BOOT),
        never_ready=_flag(env, NEVER_READY),
        jit_outside=_flag(env, JIT_OUTSIDE),
    )


def active_knobs(knobs: Knobs) -> list[str]:
    """One ``NAME=value`` description per knob that is in effect (for the loud warning at boot)."""
    active: list[str] = []
    if knobs.nondeterministic:
        active.append(f"{NONDETERMINISTIC}=1")
    if knobs.ignore_cache:
        active.append(f"{IGNORE_CACHE}=1")
    if knobs.poison_candidates:
        listed = ",".join(str(c) for c in sorted(knobs.poison_candidates))
        active.append(f"{POISON_CANDIDATES}={listed} ({CANDIDATE}={knobs.candidate})")
    if knobs.crash_at_boot:
        active.append(f"{CRASH_AT_BOOT}=1")
    if knobs.never_ready:
        active.append(f"{NEVER_READY}=1")
    if knobs.jit_outside:
        active.append(f"{JIT_OUTSIDE}=1")
    return active
