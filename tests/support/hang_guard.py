"""A hang detector for calls that must end by themselves: not a speed check.

A test of a bounded wait proves what ended it (a refusal naming its timeout, what was stopped, what was
left running); whether it ended at all is this guard's: the call runs in a thread, and a call still
running after ``hang_s`` (far above any machine load, ten times the waits under test) fails the test
instead of hanging the suite.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: How long a call that should end by itself may run before the test calls it hung.
HANG_S = 120.0


def finishes(call: Callable[[], T], *, hang_s: float = HANG_S) -> T:
    """``call()``'s result (its exception re-raised here); fails the test when it has not returned after ``hang_s``."""
    outcome: list[T] = []
    raised: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # re-raised in the caller's thread, pytest.raises included
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(hang_s)
    assert not thread.is_alive(), f"still running after {hang_s:g} s: an unbounded wait"
    if raised:
        raise raised[0]
    return outcome[0]
