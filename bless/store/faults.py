"""The crash-test seam: named points where a test may kill a writer (never set in production).

A writer operation (publish, reject, recover, gc) takes an optional ``fault`` callable and calls it
with the name of each point just before the step it names, and at finer points inside the steps
(each file copied, made read-only, removed). Production code passes nothing: no environment
variable or setting can reach it. The crash tests run the operation in a child process whose
``fault`` SIGKILLs the child at a chosen point. The publish steps are
:data:`bless.store.publish.PUBLISH_STEPS`, beside the calls that name them.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["GC_STEPS", "REJECT_STEPS", "FaultHook", "no_fault"]

#: Called with a fault point's name; a test's hook may kill the process there.
FaultHook = Callable[[str], None]

#: The steps of :meth:`Store.reject`, in order.
REJECT_STEPS: tuple[str, ...] = (
    "reject-start",
    "reject-move-tree",
    "reject-write-summary",
    "reject-write-evidence",
    "reject-rename",
    "reject-done",
)

#: The steps of :meth:`Store.gc` (after recovery), in order.
GC_STEPS: tuple[str, ...] = ("gc-start", "gc-remove", "gc-done")


def no_fault(point: str) -> None:
    """The production hook: does nothing."""
