"""Foreground serving: stream the engine's log until it exits or the caller asks to stop."""

from __future__ import annotations

import threading
from collections.abc import Callable

from bless.runtime.base import Runtime, Started


def follow(
    runtime: Runtime,
    started: Started,
    sink: Callable[[str], None],
    *,
    stop: threading.Event,
    poll_s: float = 0.5,
) -> int | None:
    """Stream the engine's log to ``sink`` until it exits (returns its exit code) or ``stop`` is set (None).

    The runtime protocol has no log stream, so this polls the log and passes on what is new;
    ``stop`` is set by the caller's signal handler, so a signal never interrupts a runtime call.
    """
    offset = 0
    while True:
        running = runtime.is_running(started)
        text = runtime.logs(started)
        if len(text) < offset:
            offset = 0  # the runtime returned a shorter log (rotated): start over rather than lose lines
        if len(text) > offset:
            sink(text[offset:])
            offset = len(text)
        if not running:
            code = runtime.exit_code(started)
            return code if code is not None else -1
        if stop.wait(poll_s):
            return None
