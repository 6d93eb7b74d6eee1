"""Whether a detached serve is sealed: readiness's checks of its seal watcher (:mod:`.ready` calls them).

A detached serve's record names its watcher (``watcher``); the watcher names itself in ``ready/<name>.heartbeat``
and renews that file's time after every poll. Sealed means: the watcher named runs (by pid and start time), the
heartbeat names that same process, and it was renewed within :data:`HEARTBEAT_STALE_S` (a frozen watcher, stopped
or stuck in a poll, is alive but blind). A record that says no watcher is expected while a detached engine holds
the serve (a container, or the process a handed-over serving lease names) was edited. Each is a refusal (46).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from bless.core.untrusted_text import shown
from bless.errors import NotServingError
from bless.flows.serve.lease import SERVE_FULL_ROLE
from bless.flows.serve.names import serve_container_name
from bless.store import Store
from bless.system.json_files import UnreadableJsonError, load_json_object
from bless.system.procid import process_alive

__all__ = ["HEARTBEAT_STALE_S", "refuse_detached_without_watcher", "refuse_unsealed"]

#: Seconds after which a detached serve's seal watcher that has not renewed its heartbeat counts as frozen (it
#: renews it after every poll, about every second; a poll that lists a large container's changes takes a few).
HEARTBEAT_STALE_S = 15.0


def _same_process(one: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    return all(one.get(key) == other.get(key) for key in ("pid", "host", "proc_start"))


def refuse_detached_without_watcher(store: Store, name: str, holder: Mapping[str, Any]) -> None:
    """NotServingError (46) when a record that expects no watcher is held by a detached engine.

    serve-full in the foreground watches itself; a detached engine (a container, or the process its handed-over
    serving lease names) is always watched by a watcher process, so such a record was edited or forged.
    """
    detached = "container" in holder
    if not detached:
        containers = {serve_container_name(name), serve_container_name(name, per_root=store.root)}
        try:
            leases = store.leases.leases()
        except OSError as exc:
            raise NotServingError(
                f"{name}: cannot read the serving leases to tell who holds this serve: {exc}",
                hint="check that the store root's leases/ dir is readable, then probe again",
                details={"name": name, "reason": "holder_unknown"},
            ) from None
        detached = any(
            lease.name in containers
            and lease.holder is not None
            and lease.holder.get("role") != SERVE_FULL_ROLE
            and _same_process(lease.holder, holder)
            for lease in leases
        )
    if detached:
        raise NotServingError(
            f"{name}: not sealed: the readiness record names no seal watcher, but its holder is a detached engine, "
            "which a watcher process always seals; the record was edited",
            hint="restart the serve: stop it, then serve again (a detached serve writes a record naming its watcher)",
            details={"name": name, "reason": "not_sealed"},
            remedy="restart_detached_serve",
        )


def _refuse_stale_heartbeat(store: Store, name: str, watcher: Mapping[str, Any]) -> None:
    """NotServingError (46) unless the watcher's heartbeat names it and was renewed within HEARTBEAT_STALE_S."""
    path = store.paths.ready_heartbeat(name)
    pid = watcher.get("pid")
    try:
        named = load_json_object(path)
        age = time.time() - path.stat().st_mtime
    except (UnreadableJsonError, OSError) as exc:
        named, age = None, None
        why = f"its heartbeat {path} cannot be read ({exc})"
    else:
        why = f"it has no heartbeat ({path})"
    if named is None or age is None:
        message = f"not sealed: the seal watcher (pid {pid}) of this detached serve cannot be vouched for: {why}"
    elif not _same_process(named, watcher):
        message = (
            f"not sealed: the readiness record names seal watcher pid {pid}, but the watcher's heartbeat names "
            f"pid {shown(repr(named.get('pid'))[:40])}: the record was edited"
        )
    elif age > HEARTBEAT_STALE_S:
        message = (
            f"not sealed: the seal watcher (pid {pid}) of this detached serve has not looked for {age:.0f} s "
            f"(over {HEARTBEAT_STALE_S:g} s): it is frozen (stopped, or a poll hangs), so an unproven compile "
            "would go unseen"
        )
    else:
        return
    raise NotServingError(
        f"{name}: {message}",
        hint="read its log (seal-watcher.log in the serve dir); a stopped watcher resumes on SIGCONT, else "
        "restart the serve: stop it, then serve detached",
        details={"name": name, "reason": "not_sealed"},
        remedy="restart_detached_serve",
    )


def refuse_unsealed(store: Store, name: str, watcher: Mapping[str, Any]) -> None:
    """NotServingError (46) unless the seal watcher of a detached serve runs (on this host) and looks."""
    alive = process_alive(watcher) if watcher else None
    if alive is True:
        _refuse_stale_heartbeat(store, name, watcher)
        return
    pid = watcher.get("pid")
    if not watcher:
        message = "detached serve: its seal watcher has not started yet, so an unproven compile would go unseen"
        hint, remedy = "wait a moment: a detached serve starts the watcher right after the canary", "watcher_starting"
    elif alive is False:
        message = (
            f"not sealed: the seal watcher of this detached serve (pid {pid}) is gone while its engine still "
            "answers, so an unproven compile would go unseen"
        )
        hint = "read its log (seal-watcher.log in the serve dir); restart the serve: stop it, then serve detached"
        remedy = "restart_detached_serve"
    else:
        message = (
            f"not sealed here: the seal watcher of this detached serve (pid {pid}) runs on host "
            f"{shown(str(watcher.get('host'))[:100])}, where this probe cannot see it"
        )
        hint, remedy = "ask the host that serves whether it is ready", "ready_on_serving_host"
    raise NotServingError(
        f"{name}: {message}", hint=hint, details={"name": name, "reason": "not_sealed"}, remedy=remedy
    )
