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

from bless.errors import ContainerConflictError, StoreUnavailableError
from bless.store import Store
from bless.store.fsutil import FILE_MODE, ensure_dir, full_disk_error

__all__ = ["StartingLock"]


class StartingLock:
    """``with StartingLock(store, name):`` holds the per-name start lock; :meth:`release` ends it early."""

    def __init__(self, store: Store, name: str) -> None:
        self.name = name
        self.path = store.paths.locks / f"serve-{name}.lock"
        self._lock = FileLock(str(self.path), mode=FILE_MODE)
        self._held = False

    def __enter__(self) -> StartingLock:
        try:
            ensure_dir(self.path.parent)
            self._lock.acquire(timeout=0)
        except Timeout:  # a TimeoutError, hence an OSError: handled first
            raise ContainerConflictError(
                f"another serve-full is starting {self.name!r} right now (it holds {self.path})",
                hint=f"wait for it to finish starting; then use it, or stop it with serve-full stop {self.name}",
                details={"name": self.name, "lock": str(self.path)},
            ) from None
        except OSError as exc:
            refusal = full_disk_error(exc, f"taking the start lock {self.path} failed")
            raise refusal or StoreUnavailableError(
                f"taking the start lock {self.path} failed: {exc.strerror or exc}",
                hint="check that the store root and its locks/ are directories this user can write",
            ) from exc
        self._held = True
        return self

    def release(self) -> None:
        """Let the next start of this name go ahead (the running engine now holds the name)."""
        if self._held:
            self._held = False
            self._lock.release()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()
