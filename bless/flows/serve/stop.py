"""``serve-full stop NAME``: end a detached serve and clean everything it created.

A detached serve is found through its serving lease (:mod:`bless.flows.serve.lease`), which names
the engine that outlived serve-full: a Docker container (by id) or a local process (by pid and
start time). Stopping it is the same graceful stop as a foreground serve's end (SIGTERM, then
SIGKILL after the timeout); then the container and its overlay volume (Docker), the serve dir
(the overlay's upper layer and the engine log) and the lease are removed. A serve dir holding
``unproven-compiles.jsonl`` is kept whatever the policy: it is the evidence a rebless reads (``bless gc``
ages it out). Only what carries our
labels or our lease is ever touched.

A lease may still be held by serve-full itself (a ``--detach`` start that has not handed it over yet,
or a foreground serve): that serve-full is sent SIGTERM (its pid only, never its group) and ends as on
Ctrl-C, stopping its own engine; the leases are then read again. A start that has no lease yet (still checking
and planning) holds the per-name start lock: it is asked to end the same way, and stop holds that lock until it
is done, so no start comes up behind its back (:func:`.start_lock.hold_for_stop`). Every wait is bounded, and
nothing is released or removed while a lease's holder still runs: no engine is ever left serving without its lease.
The readiness record is cleared only once the engine has stopped.

A detached serve's seal watcher (:mod:`.detached`) is ended first, before its engine: the very process its
``seal-watcher.json`` (in the serve dir a lease names) or the readiness record names, by pid and start
time, so a recycled pid is never signalled: SIGTERM, then SIGKILL if it has not exited within
:data:`WATCHER_STOP_S`. A watcher that ends the serve itself (policy ``stop``) never signals itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bless import container_labels as labels
from bless.core.json_form import JsonForm
from bless.core.untrusted_text import shown
from bless.errors import BlessError, ContainerConflictError, LockHeldError
from bless.flows.serve.lease import SERVE_FULL_ROLE
from bless.flows.serve.names import serve_container_name
from bless.flows.serve.ready import clear_ready
from bless.flows.serve.serve_dir import discard_serve_dir
from bless.flows.serve.start_lock import hold_for_stop
from bless.runtime.base import ContainerInfo, ContainerSpec, Runtime, Started
from bless.runtime.local import LocalRuntime
from bless.store import Store
from bless.store.layout import StorePaths
from bless.store.lease import Lease
from bless.system.json_files import read_json_object
from bless.system.os_refusals import os_errors
from bless.system.procid import process_alive

__all__ = ["SERVE_FULL_SLACK_S", "WATCHER_STOP_S", "StopOutcome", "stop_serving"]

#: Seconds serve-full is given beyond the stop timeout to end after SIGTERM (stop its engine, clean up).
SERVE_FULL_SLACK_S = 30
#: Seconds a detached serve's seal watcher is given to end after SIGTERM (then SIGKILL, and as long again).
WATCHER_STOP_S = 10.0
_POLL_S = 0.05


@dataclass(frozen=True)
class StopOutcome(JsonForm):
    """What ``serve-full stop`` found and removed."""

    json_keys = ("name", "found", "stopped", "serve_dirs_removed", "leases_released", "notes")

    name: str
    stopped: tuple[str, ...]
    serve_dirs_removed: tuple[str, ...]
    leases_released: int
    notes: tuple[str, ...] = ()

    @property
    def found(self) -> bool:
        return bool(self.stopped or self.serve_dirs_removed or self.leases_released)

    def json_extra(self) -> dict[str, Any]:
        """Whether anything of the serve was found."""
        return {"found": self.found}


def _alive(holder: Mapping[str, Any]) -> bool:
    return process_alive(holder) is True


def _local_pid(lease: Lease) -> int | None:
    pid = lease.holder.get("pid") if lease.holder else None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def stop_serving(
    name: str,
    *,
    store: Store,
    docker: Callable[[], Runtime],
    local: Callable[[], LocalRuntime] = LocalRuntime,
    timeout_s: int = 30,
    serve_full_slack_s: float = SERVE_FULL_SLACK_S,
    watcher_stop_s: float = WATCHER_STOP_S,
    keep_serve_dirs: bool = False,
) -> StopOutcome:
    """Stop the detached serve of profile ``name`` and remove what it created (see the module docstring).

    ``docker`` is called only when a Docker container may be involved, so stopping a local engine
    needs no Docker Engine. A serve that is already gone still has its serve dir and lease removed.
    ``keep_serve_dirs``: keep the serve dirs as evidence (a seal watcher ending the serve under the policy
    ``stop``), each named in the notes.
    """
    # The serve's container name: this root's (tagged), or plain (a serve started before names were tagged).
    containers = {serve_container_name(name), serve_container_name(name, per_root=store.root)}
    stopped: list[str] = []
    notes: list[str] = []
    # A start still checking and planning holds no lease yet: it holds the start lock, and is asked to end
    # first; the lock is then held for the whole stop, so no start begins while this one cleans up.
    with hold_for_stop(store, name, timeout_s + serve_full_slack_s, stopped=stopped):
        removed, released = _stop_locked(
            name,
            store=store,
            containers=containers,
            docker=docker,
            local=local,
            timeout_s=timeout_s,
            serve_full_slack_s=serve_full_slack_s,
            watcher_stop_s=watcher_stop_s,
            keep_serve_dirs=keep_serve_dirs,
            stopped=stopped,
            notes=notes,
        )
    return StopOutcome(
        name=name,
        stopped=tuple(stopped),
        serve_dirs_removed=tuple(removed),
        leases_released=released,
        notes=tuple(notes),
    )


def _stop_locked(
    name: str,
    *,
    store: Store,
    containers: set[str],
    docker: Callable[[], Runtime],
    local: Callable[[], LocalRuntime],
    timeout_s: int,
    serve_full_slack_s: float,
    watcher_stop_s: float,
    keep_serve_dirs: bool,
    stopped: list[str],
    notes: list[str],
) -> tuple[list[str], int]:
    """The stop under the start lock: (serve dirs removed, leases released)."""
    # A serve-full still starting (or serving in the foreground) holds the lease itself: it is asked to
    # stop (SIGTERM to its pid: it stops its own engine), then the leases are read again, since a start
    # may have handed its lease to a detached engine meanwhile.
    _end_serve_fulls(_leases(store, containers), timeout_s + serve_full_slack_s, stopped=stopped)
    leases = _leases(store, containers)
    # The seal watcher first: it must not judge, nor write the readiness record of, an engine being stopped.
    _end_watchers(_watchers(name, store, leases), watcher_stop_s, stopped=stopped, notes=notes)
    runtime: Runtime | None = None
    local_holders = [lease for lease in leases if _local_pid(lease) is not None]
    _stop_local_engines(local_holders, local, timeout_s, stopped=stopped, notes=notes)
    if len(local_holders) < len(leases) or not leases:
        # A Docker serve (its lease names a container), or one without a lease (--debug): by our labels.
        runtime = _stop_docker_serves(name, store, docker, leases, timeout_s, stopped=stopped, notes=notes)
    _refuse_live_holders(name, store, _leases(store, containers))  # no engine may run without its lease
    clear_ready(store, name)  # only now: the engine is stopped (a probe fails closed on a dead holder anyway)
    if keep_serve_dirs:
        removed: list[str] = []
        notes.extend(f"serve dir kept as evidence: {serve_dir}" for serve_dir in _serve_dirs(name, store, leases))
    else:
        removed = _remove_serve_dirs(name, store, leases, runtime, local, notes=notes)
    with os_errors(f"releasing the serving leases under {store.paths.leases}"):
        released = [lease for container in sorted(containers) for lease in store.leases.release_named(container)]
    return removed, len(released)


def _leases(store: Store, containers: set[str]) -> list[Lease]:
    return [lease for lease in store.leases.leases() if lease.name in containers]


def _serve_dirs(name: str, store: Store, leases: list[Lease]) -> list[Path]:
    """The serve dirs the leases name that are serve dirs of ``name`` under this store (no other path)."""
    found: list[Path] = []
    for lease in leases:
        if lease.serve_dir is None:
            continue
        serve_dir = Path(lease.serve_dir)
        if serve_dir.parent == store.paths.serve and serve_dir.name.startswith(f"{name}-"):
            found.append(serve_dir)
    return found


def _watchers(name: str, store: Store, leases: list[Lease]) -> list[dict[str, Any]]:
    """The seal watchers of ``name``'s detached serves, as their serve dirs and the readiness record name them."""
    found = [read_json_object(StorePaths.seal_watcher(serve_dir)) for serve_dir in _serve_dirs(name, store, leases)]
    record = read_json_object(store.paths.ready_file(name))
    watcher = record.get("watcher") if record is not None else None
    if isinstance(watcher, dict):
        found.append(watcher)
    unique: dict[tuple[object, object], dict[str, Any]] = {}
    for identity in found:
        if identity and isinstance(identity.get("pid"), int):
            unique.setdefault((identity.get("pid"), identity.get("proc_start")), identity)
    return list(unique.values())


def _end_watchers(watchers: list[dict[str, Any]], wait_s: float, *, stopped: list[str], notes: list[str]) -> None:
    """SIGTERM each live seal watcher (never this process), wait ``wait_s``, SIGKILL what is left; bounded.

    Each signal goes to the very process (pid and start time checked just before), never to its group.
    A watcher that outlives SIGKILL too is only noted: it exits by itself once its engine is gone.
    """
    live = [w for w in watchers if w["pid"] != os.getpid() and _alive(w)]
    for watcher in live:
        if _alive(watcher):
            with contextlib.suppress(ProcessLookupError):
                os.kill(watcher["pid"], signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    for watcher in live:
        pid = watcher["pid"]
        while _alive(watcher) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        if _alive(watcher):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            killed_by = time.monotonic() + wait_s
            while _alive(watcher) and time.monotonic() < killed_by:
                time.sleep(_POLL_S)
            notes.append(f"seal watcher pid {pid} did not end within {wait_s:g} s of SIGTERM and was killed")
        if _alive(watcher):
            notes.append(f"seal watcher pid {pid} still runs after SIGKILL; it ends once its engine is gone")
        else:
            stopped.append(f"seal watcher pid {pid}")


def _serve_full_pid(lease: Lease) -> int | None:
    """The pid of the serve-full that holds ``lease`` itself (starting, or in the foreground), else None.

    Its lease says so (``role``); a lease from before roles were recorded is told by its pid: a detached
    engine leads its own process group, a serve-full under a supervisor or a test harness need not.
    """
    pid = _local_pid(lease)
    if pid is None or lease.holder is None:
        return None
    if lease.holder.get("role") == SERVE_FULL_ROLE:
        return pid
    try:
        return pid if os.getpgid(pid) != pid else None
    except OSError:  # gone: nothing to signal
        return None


def _end_serve_fulls(leases: list[Lease], wait_s: float, *, stopped: list[str]) -> None:
    """SIGTERM each live serve-full that holds a lease and wait, bounded, for it to exit.

    serve-full ends on SIGTERM the way it ends on Ctrl-C: a start unwinds and stops the engine it
    started, a foreground serve stops its engine gracefully within the profile's stop timeout; both
    release the lease. Only the very process (pid and start time) is signalled, never its group, and
    never with SIGKILL: its engine runs in its own session and would outlive it without a lease.

    Raises:
        LockHeldError: a serve-full still runs after ``wait_s`` (the stop timeout plus :data:`SERVE_FULL_SLACK_S`).
    """
    holders = [
        (pid, lease)
        for lease in leases
        if (pid := _serve_full_pid(lease)) is not None and lease.holder is not None and _alive(lease.holder)
    ]
    for pid, lease in holders:
        assert lease.holder is not None
        if _alive(lease.holder):  # checked again just before: a recycled pid is never signalled
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    for pid, lease in holders:
        assert lease.holder is not None
        while _alive(lease.holder) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        if _alive(lease.holder):
            raise LockHeldError(
                f"serve-full pid {pid} still serves {lease.name} {wait_s:g} s after SIGTERM; "
                "nothing was stopped or removed",
                hint="it may be copying or verifying a large cache: retry the stop, or read its log",
                remedy="retry_stop",
                details={"pid": pid, "lease": str(lease.path)},
            )
        stopped.append(f"serve-full pid {pid}")


def _refuse_live_holders(name: str, store: Store, leases: list[Lease]) -> None:
    """Refuse (nothing released or removed) while a lease's local holder still runs or cannot be judged here."""
    for lease in leases:
        if _local_pid(lease) is None or lease.holder is None:
            continue
        alive = process_alive(lease.holder)
        if alive is None:
            raise ContainerConflictError(
                f"the engine of {name} (pid {lease.holder.get('pid')}) runs on host "
                f"{shown(str(lease.holder.get('host')))}: its lease is kept",
                hint="stop it on that host",
                remedy="stop_on_that_host",
                details={"lease": str(lease.path)},
            )
        if alive:
            raise LockHeldError(
                f"pid {lease.holder.get('pid')} still holds the serving lease of {name} after it was stopped; "
                "its lease and serve dir are kept",
                hint="retry the stop; if it persists, the process may be stuck in the kernel (ps -o stat)",
                remedy="retry_stuck_stop",
                details={"lease": str(lease.path)},
            )


def _stop_local_engines(
    local_holders: list[Lease],
    local: Callable[[], LocalRuntime],
    timeout_s: int,
    *,
    stopped: list[str],
    notes: list[str],
) -> None:
    """Stop the engine processes the leases name (on this host; another host's are only noted)."""
    for lease in local_holders:
        pid = _local_pid(lease)
        assert pid is not None and lease.holder is not None
        holder = lease.holder
        if process_alive(holder) is None:
            notes.append(f"engine pid {pid} runs on host {holder.get('host')!r}: stop it there")
            continue
        result = local().stop_detached(pid, timeout_s, partial(_alive, holder))
        if result.seconds > 0:
            stopped.append(f"pid {pid}")
            if not result.graceful:
                notes.append(f"engine pid {pid} did not stop within {timeout_s} s and was killed")


def _stop_docker_serves(
    name: str,
    store: Store,
    docker: Callable[[], Runtime],
    leases: list[Lease],
    timeout_s: int,
    *,
    stopped: list[str],
    notes: list[str],
) -> Runtime | None:
    """Stop and remove our serving containers of ``name``; the Docker runtime, when one was reached.

    Docker being unreachable is a refusal when a lease names a container, only a note otherwise.
    """
    ours = {labels.PROFILE: name, labels.PHASE: labels.PHASE_SERVE}
    runtime: Runtime | None = None
    try:
        runtime = docker()
        found = runtime.list_ours(ours)
    except BlessError as exc:
        if leases:
            raise
        notes.append(f"no Docker serve checked: {exc.message}")
        found = []
    own = _own_serves(name, store, found)
    if runtime is not None:
        try:
            _stop_containers(runtime, own, timeout_s, notes=notes)
            # This root's serves and overlay volumes, by its tag: another root's (serving this profile too,
            # or starting right now) are never ours to remove.
            stopped += runtime.cleanup_ours({**ours, labels.STORE: labels.store_tag(store.root)})
            for info in own:
                if labels.STORE in info.labels:
                    continue  # removed just above
                scope = _store_root_label(info)  # made before containers carried the store's tag
                if scope:
                    stopped += runtime.cleanup_ours({**ours, **scope})
                elif len(own) == len(found):  # made before containers recorded their root at all
                    stopped += runtime.cleanup_ours(ours)
                else:
                    notes.append(f"container {info.name} records no store root: stopped, not removed")
        except BlessError as exc:
            if leases:
                raise
            notes.append(f"no Docker serve checked: {exc.message}")
    return runtime


def _store_root_label(info: ContainerInfo) -> dict[str, str]:
    """The store-root label ``info`` records, as a filter (empty when it records none)."""
    recorded = info.labels.get(labels.STORE_ROOT)
    return {labels.STORE_ROOT: recorded} if recorded else {}


def _own_serves(name: str, store: Store, found: list[ContainerInfo]) -> list[ContainerInfo]:
    """The serves of ``name`` this store root started; refuse (12) when only another root's are found.

    Stopping another root's serve from here would leave its lease (pinning a blessed version) and
    serve dir behind. When this root serves the profile too (names tagged per root), only this
    root's are stopped and the others are left running.
    """
    own = [info for info in found if labels.other_store_root(info.labels, store.root) is None]
    if own:
        return own
    for info in found:
        owner_root = labels.other_store_root(info.labels, store.root)
        if owner_root is not None:
            raise ContainerConflictError(
                f"container {info.name!r} is the serve of another store root, {owner_root}; not stopped",
                hint="stop it from its own root",
                details={"name": info.name, "holder": "ours", "store_root": owner_root, "profile_name": name},
                remedy="stop_from_own_root",
            )
    return []


def _stop_containers(runtime: Runtime, found: list[ContainerInfo], timeout_s: int, *, notes: list[str]) -> None:
    """Stop each container gracefully within the caller's timeout.

    cleanup_ours then removes the stopped containers and their overlay volumes (its own stop would
    allow only 10 s).
    """
    for info in found:
        spec = ContainerSpec(name=info.name, command=(), env={}, labels=dict(info.labels))
        result = runtime.stop(Started(id=info.id, name=info.name, spec=spec, host_port=None), timeout_s)
        if not result.graceful and info.status == "running":
            notes.append(f"container {info.name} did not stop within {timeout_s} s and was killed")


def _remove_serve_dirs(
    name: str,
    store: Store,
    leases: list[Lease],
    runtime: Runtime | None,
    local: Callable[[], LocalRuntime],
    *,
    notes: list[str],
) -> list[str]:
    """Remove the serve dirs the leases name (only serve dirs of ``name`` under this store); those removed.

    A serve dir holding ``unproven-compiles.jsonl`` (sealed serving met a compile the blessing does not hold) is
    kept, named in the notes: it is the evidence the next ``bless run`` of the profile reads.

    ``runtime``: the Docker runtime reached while stopping, else a local one removes them.
    """
    removed: list[str] = []
    for lease in leases:
        if lease.serve_dir is None:
            continue
        serve_dir = Path(lease.serve_dir)
        if serve_dir.parent != store.paths.serve or not serve_dir.name.startswith(f"{name}-"):
            notes.append(f"lease {lease.path} names {serve_dir}, not a serve dir of {name!r}: left alone")
            continue
        if os.path.lexists(StorePaths.unproven_compiles(serve_dir)):
            # What sealed serving met, under any policy: the next bless run of the profile reads it (bless gc
            # ages it out).
            notes.append(f"serve dir kept as evidence of unproven compiles (for a rebless): {serve_dir}")
            continue
        problem = discard_serve_dir(serve_dir, runtime=runtime or local(), image=None)
        if problem:
            notes.append(problem)
        else:
            removed.append(str(serve_dir))
    return removed
