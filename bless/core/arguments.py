"""The checks a public call makes on its options before any work: each bad value is a :class:`UsageError` (2).

The command line's parser refuses most bad values before a call is made; a Python caller passes anything,
so ``bless.run_blessing`` and the other calls check their options here first (the wrong type, a NUL byte or
an over-long path, a negative count, NaN), never starting an engine, reading a key or touching the store
for an option that would be refused later.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

from bless.core.untrusted_text import shown
from bless.errors import UsageError

#: Linux's limits: a path's bytes (PATH_MAX, with its NUL) and one name's bytes (NAME_MAX).
PATH_MAX = 4095
NAME_MAX = 255
#: The longest text option (a reference, a config hash prefix) a call takes.
TEXT_MAX = 4096

T = TypeVar("T")


def _refuse(name: str, expected: str, value: object) -> UsageError:
    got = shown(repr(value)) if isinstance(value, str | bytes | int | float) else type(value).__name__
    return UsageError(f"{name} must be {expected}, not {got}", hint=f"pass {name} as {expected}")


def path(name: str, value: object) -> Path:
    """A path option: a ``str`` or ``os.PathLike[str]``, not empty, without NUL bytes, within Linux's limits."""
    if not isinstance(value, str | os.PathLike):
        raise _refuse(name, "a path (str or os.PathLike)", value)
    text = os.fspath(value)
    if not isinstance(text, str):
        raise _refuse(name, "a path of text (str), not bytes", value)
    if not text:
        raise UsageError(f"{name} is empty", hint=f"pass {name} as the path of a directory or file")
    if "\0" in text:
        raise UsageError(f"{name} holds a NUL byte: {shown(repr(text))}", hint="no path holds one: check its source")
    encoded = text.encode("utf-8", "surrogateescape")
    if len(encoded) > PATH_MAX or any(len(part) > NAME_MAX for part in encoded.split(b"/")):
        raise UsageError(
            f"{name} is longer than the system allows ({len(encoded)} bytes; at most {PATH_MAX}, {NAME_MAX} per name)",
            hint=f"pass a shorter {name}",
        )
    return Path(text)


def optional_path(name: str, value: object) -> Path | None:
    return None if value is None else path(name, value)


def text(name: str, value: object) -> str:
    """A text option (a reference, a hash prefix): a non-empty ``str`` without NUL bytes."""
    if not isinstance(value, str):
        raise _refuse(name, "a str", value)
    if not value.strip():
        raise UsageError(f"{name} is empty", hint=f"pass {name}")
    if "\0" in value or len(value) > TEXT_MAX:
        raise UsageError(
            f"{name} holds a NUL byte or is over {TEXT_MAX} characters", hint=f"pass {name} as printed by bless"
        )
    return value


def flag(name: str, value: object) -> bool:
    """A yes/no option: ``True`` or ``False`` (a truthy string or 1 is refused: it hides a mix-up)."""
    if not isinstance(value, bool):
        raise _refuse(name, "True or False", value)
    return value


def optional_flag(name: str, value: object) -> bool | None:
    return None if value is None else flag(name, value)


def count(name: str, value: object, *, minimum: int = 1, maximum: int | None = None) -> int:
    """A whole number in ``[minimum, maximum]`` (a bool is no number here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse(name, "an int", value)
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f"at least {minimum}" if maximum is None else f"{minimum} to {maximum}"
        raise UsageError(f"{name} must be {bounds}, not {value}", hint=f"pass {name} as {bounds}")
    return value


def optional_count(name: str, value: object, *, minimum: int = 1, maximum: int | None = None) -> int | None:
    return None if value is None else count(name, value, minimum=minimum, maximum=maximum)


def fraction(name: str, value: object) -> float:
    """A finite number strictly between 0 and 1 (a confidence, a failure rate): NaN and infinities are refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _refuse(name, "a float", value)
    if not math.isfinite(value) or not 0 < value < 1:
        raise UsageError(f"{name} must lie strictly between 0 and 1, not {value}", hint=f"pass {name} as e.g. 0.95")
    return float(value)


def duration(name: str, value: object) -> timedelta:
    """A positive :class:`~datetime.timedelta`."""
    if not isinstance(value, timedelta):
        raise _refuse(name, "a datetime.timedelta", value)
    if value <= timedelta(0):
        raise UsageError(f"{name} must be positive, not {value}", hint=f"pass {name} as e.g. timedelta(days=7)")
    return value


def secret(name: str, value: object) -> bytes | None:
    """A passphrase: ``bytes`` or None (a ``str`` is refused: its encoding would be a guess)."""
    if value is not None and not isinstance(value, bytes):
        raise _refuse(name, "bytes (e.g. 'text'.encode())", value)
    return value


def instance(name: str, value: object, kind: type[T], what: str) -> T:
    """An object of ``kind`` (a store, a profile, a runtime)."""
    if not isinstance(value, kind):
        raise _refuse(name, what, value)
    return value


def optional_instance(name: str, value: object, kind: type[T], what: str) -> T | None:
    return None if value is None else instance(name, value, kind, what)


def callback(name: str, value: object) -> Callable[..., object] | None:
    """A callable, or None."""
    if value is not None and not callable(value):
        raise _refuse(name, "a callable or None", value)
    return value


@dataclass(frozen=True)
class BlessOptions:
    """How :func:`bless.run_blessing` goes, as one value (as python-tuf's ``UpdaterConfig`` is for its updater):
    build it once, pass it to every run. Each field is the keyword of the same name; the call checks them."""

    #: K, 1 to 1000 (None: the profile's ``[trials] count``).
    trials: int | None = None
    #: Of the failure-rate bound, strictly between 0 and 1 (None: 0.95).
    confidence: float | None = None
    #: Bootstraps to try after a rejection, 1 to 20.
    candidates: int = 1
    #: Replace an existing blessing (else AlreadyBlessedError, 10).
    rebless: bool = False
    #: With ``rebless``: publish even with a weaker failure-rate bound (else WeakerBlessingError, 13).
    allow_weaker: bool = False
    #: Queue behind another writer of the config (else LockHeldError, 11).
    wait: bool = False
    #: Bless with an engine version bless has no rules for (else UnknownEngineVersionError, 33).
    allow_unknown_engine_version: bool = False
    #: Trials at once, at least 1 (None: as many as the GPUs fit; CPU: 1).
    parallel: int | None = None


@dataclass(frozen=True)
class ServeOptions:
    """How :func:`bless.serve` goes, as one value; each field is the keyword of the same name."""

    #: Make every check and start nothing: the result holds the plan.
    dry_run: bool = False
    #: Return once the engine is ready and canary-checked (else serve until ``hooks.stop`` is set).
    detach: bool = False
    #: Check the engine's answers against the blessing's golden outputs before serving (False: skip it, loudly).
    canary: bool = True
    #: Serve with an engine version bless has no rules for.
    allow_unknown_engine_version: bool = False
    #: The trust repository (or its ``metadata/``): the blessing must be a validly signed, current target.
    trust_dir: str | os.PathLike[str] | None = None
    #: Pull the blessing from this registry reference first (a no-op when present).
    from_reference: str | None = None
    #: Talk to the registry over plain HTTP (None: only for localhost).
    plain_http: bool | None = None


def one_of(name: str, options: object, kind: type[T], keywords: T) -> T:
    """The options of a call given as ``options=`` (an instance of ``kind``) or as keywords, not both."""
    if options is None:
        return keywords
    given = instance(name, options, kind, f"a bless.{kind.__name__}")
    if keywords != kind():
        raise UsageError(
            f"give {name}= or its keywords, not both",
            hint=f"put every option into the bless.{kind.__name__}, or pass them all as keywords",
        )
    return given
