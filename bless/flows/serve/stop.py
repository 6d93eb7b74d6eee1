"""``serve-full stop NAME``: end a detached serve and clean everything it created.

A detached serve is found through its serving lease (:mod:`bless.flows.serve.lease`), which names
the engine that outlived serve-full: a Docker container (by id) or a local process (by pid and
start time). Stopping it is the same graceful stop as a foreground serve's end (SIGTERM, then
SIGKILL after the timeout); then the container and its overlay volume (Docker), the serve dir
(the overlay's upper layer and the engine log) and the lease are removed. Only what carries our
labels or our lease is ever touched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bless import labels
from bless.errors import BlessError, ContainerConflictError
from bless.flows.serve.names import serve_container_name, stop_command
from bless.flows.serve.ready import clear_ready
from bless.flows.serve.serve_dir import discard_serve_dir
from bless.fsutil import os_errors
from bless.procid import process_alive
from bless.runtime.base import ContainerInfo, ContainerSpec, Runtime, Started
from bless.runtime.local import LocalRuntime
from bless.store import Store
from bless.store.lease import Lease

__all__ = ["StopOutcome", "stop_serving"]


@dataclass(frozen=True)
class StopOutcome:
    """What ``serve-full stop`` found and removed."""

    name: str
    stopped: tuple[str, ...]
    serve_dirs_removed: tuple[str, ...]
    leases_released: int
    notes: tuple[str, ...] = ()

    @property
    def found(self) -> bool:
        return bool(self.stopped or self.serve_dirs_removed or self.leases_released)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "found": self.found,
            "stopped": list(self.stopped),
            "serve_dirs_removed": list(self.serve_dirs_removed),
            "leases_released": self.leases_released,
            "notes": list(self.notes),
        }


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
) -> StopOutcome:
    """Stop the detached serve of profile ``name`` and remove what it created (see the module docstring).

    ``docker`` is called only when a Docker container may be involved, so stopping a local engine
    needs no Docker Engine. A serve that is already gone still has its serve dir and lease removed.
    """
    # The serve's container name: plain, or tagged with this root (serve-full --name-per-root).
    containers = {serve_container_name(name), serve_container_name(name, per_root=store.root)}
    clear_ready(store, name)  # first: no readiness probe may pass while it stops
    leases = [lease for lease in store.leases.leases() if lease.name in containers]
    stopped: list[str] = []
    notes: list[str] = []
    runtime: Runtime | None = None
    local_holders = [lease for lease in leases if _local_pid(lease) is not None]
    _stop_local_engines(local_holders, local, timeout_s, stopped=stopped, notes=notes)
    if len(local_holders) < len(leases) or not leases:
        # A Docker serve (its lease names a container), or one without a lease (--debug): by our labels.
        runtime = _stop_docker_serves(name, store, docker, leases, timeout_s, stopped=stopped, notes=notes)
    removed = _remove_serve_dirs(name, store, leases, runtime, local, notes=notes)
    with os_errors(f"releasing the serving leases under {store.paths.leases}"):
        released = [lease for container in sorted(containers) for lease in store.leases.release_named(container)]
    return StopOutcome(
        name=name,
        stopped=tuple(stopped),
        serve_dirs_removed=tuple(removed),
        leases_released=len(released),
        notes=tuple(notes),
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
            if len(own) == len(found):
                stopped += runtime.cleanup_ours(ours)
            else:
                # Another root serves this profile too (under its own --name-per-root name): its
                # container and overlay volume are not ours to remove, so clean up by this root's label.
                for info in own:
                    scope = _store_root_label(info)
                    if not scope:  # made before containers recorded their root: cannot be told apart
                        notes.append(f"container {info.name} records no store root: stopped, not removed")
                        continue
                    stopped += runtime.cleanup_ours({**ours, **scope})
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
                hint=f"stop it from its own root: {stop_command(name, Path(owner_root))}",
                details={"name": info.name, "holder": "ours", "store_root": owner_root},
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
        problem = discard_serve_dir(serve_dir, runtime=runtime or local(), image=None)
        if problem:
            notes.append(problem)
        else:
            removed.append(str(serve_dir))
    return removed
