"""Process identity from ``/proc``: who holds a lock, owns a staging dir or a serving lease.

A record is ``{"pid", "host", "started", "proc_start"}``. ``proc_start`` (the start time in clock
ticks since boot) is kept beside the pid so that a recycled pid is never mistaken for the process
that wrote the record: a stale record of a crashed process is detected, not trusted.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bless.system.clock import utc_now

__all__ = ["PID_MAX", "process_alive", "process_identity"]

#: The largest pid Linux hands out (``PID_MAX_LIMIT`` on 64-bit kernels: ``/proc/sys/kernel/pid_max`` is at most this).
PID_MAX = 1 << 22


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 onward)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
        return raw[raw.rindex(")") + 2 :].split()
    except (OSError, ValueError):
        return None


def _proc_start(pid: int) -> int | None:
    """The process start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), if known."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields is not None else None
    except (ValueError, IndexError):
        return None


def _proc_state(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def process_identity(pid: int | None = None) -> dict[str, Any]:
    """A process (default: this one) as lock holders, staging owners and leases record it."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "host": socket.gethostname(), "started": utc_now(), "proc_start": _proc_start(pid)}


def process_alive(info: Mapping[str, Any]) -> bool | None:
    """Whether the process a :func:`process_identity` record names still runs.

    False when it is gone, a zombie, or its pid now belongs to another process (start time differs);
    None when this host cannot tell (a record from another host, or no usable pid).
    """
    pid = info.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    if pid > PID_MAX:
        return False  # no process has such a pid (os.kill would raise OverflowError past 2^31)
    if info.get("host") != socket.gethostname():
        return None  # another machine sharing the root: we cannot see its processes
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    if _proc_state(pid) == "Z":
        return False  # exited, not yet reaped
    recorded = info.get("proc_start")
    if isinstance(recorded, int) and not isinstance(recorded, bool):
        current = _proc_start(pid)
        if current is not None and current != recorded:
            return False  # the pid was recycled by another process
    return True
