"""The serving lease: while serve-full (or the engine it leaves running) serves a blessed version,
``bless gc`` must not remove it, even once a rebless superseded it (:mod:`bless.store.lease`).

The lease is taken after the plan verified the tree and before the engine starts, then the plan's
identity snapshot is compared again: a gc that removed the tree before the lease existed is caught
there (exit 43), and a gc after it sees the lease. A foreground serve releases it when serving
ends; ``--detach`` hands it to the engine that keeps running (a local engine by its process
identity, so a crashed one's lease is detected as stale; a Docker container by its id, honoured
until it is released: ``Store.leases.release_named`` with the container name).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from bless.flows.serve.plan import LaunchPlan
from bless.flows.serve.snapshot import cache_changed_error
from bless.runtime.base import Started
from bless.store import Store
from bless.store.lease import Lease
from bless.system.clock import utc_now
from bless.system.os_refusals import os_errors
from bless.system.procid import process_identity

__all__ = ["SERVE_FULL_ROLE", "ServingLease", "serve_full_holder", "serving_lease"]

#: The ``role`` of a lease holder that is serve-full itself (starting, or serving in the foreground), as
#: opposed to the detached engine it hands the lease to: ``serve-full stop`` signals serve-full, which
#: stops its own engine, rather than an engine it has not handed the lease to yet.
SERVE_FULL_ROLE = "serve-full"


def serve_full_holder() -> dict[str, Any]:
    """This serve-full process as a lease holder (:func:`process_identity` and its role)."""
    return {**process_identity(), "role": SERVE_FULL_ROLE}


@dataclass
class ServingLease:
    """The lease of one serve (None for a ``--debug`` start, which serves no blessed tree)."""

    store: Store
    lease: Lease | None
    handed_over: bool = False

    def hand_over(self, started: Started, runtime_kind: str) -> None:
        """Give the lease to the engine that outlives serve-full (``--detach``): it is kept on exit."""
        if self.lease is None:
            return
        holder: dict[str, Any]
        if runtime_kind == "local" and started.id.isdigit():
            holder = process_identity(int(started.id))
        else:
            holder = {"container": started.id, "name": started.name, "host": socket.gethostname(), "started": utc_now()}
        with os_errors(f"handing the serving lease {self.lease.path} to the detached engine"):
            self.lease = self.store.leases.hand_over(self.lease, holder)
        self.handed_over = True


@contextmanager
def serving_lease(store: Store, plan_: LaunchPlan) -> Iterator[ServingLease]:
    """Hold a lease on the planned blessed version for the ``with`` body (released unless handed over).

    Raises:
        CacheChangedError: the blessed tree changed (or was removed) between verification and the lease.
    """
    manifest, snapshot = plan_.manifest, plan_.snapshot
    if manifest is None or snapshot is None:
        yield ServingLease(store, None)
        return
    with os_errors(f"taking the serving lease in {store.paths.leases}"):
        lease = store.leases.acquire(
            manifest.config_hash,
            manifest.cache.dir_id,
            name=plan_.container_name,
            serve_dir=plan_.serve_dir,
            holder=serve_full_holder(),
        )
    held = ServingLease(store, lease)
    try:
        changes = snapshot.changes()
        if changes:
            raise cache_changed_error(changes, when="before the serving lease was taken", blessed_dir=snapshot.root)
        yield held
    except BaseException:
        if not held.handed_over:
            # Say why serving failed, not why the lease stayed: a lease left behind names this
            # process, so it is stale (and ignored by gc) once this process ends.
            with suppress(OSError):
                store.leases.release(lease)
        raise
    if not held.handed_over:
        with os_errors(f"releasing the serving lease {lease.path}"):
            store.leases.release(lease)
