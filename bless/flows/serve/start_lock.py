"""One start at a time per serve name: the lock around "is the name free?" -> "create the container".

Without it two ``serve-full`` of one profile started at the same moment can both find the name free
and race each other's overlay volume and upper dir. ``locks/serve-<name>.lock`` is an flock (the
kernel drops it when its holder dies, so it is never stale). It is held from before the plan's
checks until the engine is up (or the start failed); from then on the running container holds the
name. A second start, or a ``--dry-run``, while it is held is refused at once (12).
"""

from __future__ import annotations

from types import TracebackType

from filelock import FileLock, Timeout

from bless.errors import ContainerConflictError
from bless.store import Store
from bless.system.durable import ensure_dir
from bless.system.file_locks import lock_refusal, open_file_lock

__all__ = ["StartingLock"]


class StartingLock:
    """``with StartingLock(store, name):`` holds the per-name start lock; :meth:`release` ends it early."""

    def __init__(self, store: Store, name: str) -> None:
        self.name = name
        self.path = store.paths.serve_start_lock(name)
        self._lock: FileLock | None = None

    def __enter__(self) -> StartingLock:
        try:
            ensure_dir(self.path.parent)
        except OSError as exc:
            raise lock_refusal(self.path, exc, what="start lock") from exc
        try:
            self._lock = open_file_lock(self.path, timeout=0, what="start lock")
        except Timeout:  # held: another start of this name, a conflict (12), not a store fault
            raise ContainerConflictError(
                f"another serve-full is starting {self.name!r} right now (it holds {self.path})",
                hint="wait for it to finish starting; then use it, or stop its detached serve",
                remedy="wait_for_start",
                details={"name": self.name, "lock": str(self.path)},
            ) from None
        return self

    def release(self) -> None:
        """Let the next start of this name go ahead (the running engine now holds the name)."""
        if self._lock is not None:
            lock, self._lock = self._lock, None
            lock.release()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()
