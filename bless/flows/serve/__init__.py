"""``serve-full``: start an engine on its blessed cache, or refuse with a reason. Fail closed.

:func:`~bless.flows.serve.plan.plan` makes every decision and every refusal before anything is created: runtime
reachable, image present, GPU memory (where the profile states a need), no unsafe debug
settings, the serving container name free, the profile resolved to its config hash, a
valid unique manifest for that hash, and every blessed file verified (size and sha256,
nothing extra, no symlinks). :func:`start` then starts the engine with the blessed tree as
the read-only lower layer of an overlay (or a read-only bind where the adapter allows), at
the same path and with the same HOME as when it was blessed, waits until it is ready,
re-checks the blessed files, and sends the canary: every golden prompt of the manifest
must reproduce its golden token ids exactly. :func:`follow` streams the engine's log and
:func:`finish` stops it gracefully, removes the container and discards (or keeps) the
overlay's upper layer.

What is and is not guaranteed between verify and mount
------------------------------------------------------

serve-full hashes every blessed file, then hands the *directory* to the container runtime,
which mounts it a moment later. Nothing can make those two steps one atomic operation, so
the guarantee rests on three things:

* **The blessed directory is read-only and owned as published.** ``bless run`` publishes
  every blessed tree with files ``0444`` and directories ``0555``, owned by the user who
  blessed it, and nothing in bless ever writes there again. A process that is neither that
  user nor root cannot change, add, remove or rename anything in it. serve-full warns when
  it finds a write bit set.
* **A cheap identity re-check after the container is up.** Before hashing, serve-full
  records each blessed file's and directory's device, inode, size, mtime, ctime, mode and
  owner. It compares them again right after verification and again once the engine is
  ready (before the canary). Any difference (a file rewritten, replaced by a rename,
  truncated, re-moded, an entry added or removed in a directory) stops the container and
  fails with exit 43, naming the files. ``ctime`` cannot be set back from user space, so
  restoring an mtime with ``touch`` does not hide a rewrite.
* **The canary.** The served engine must reproduce the blessed golden token ids exactly
  before serve-full reports success.

What is *not* guaranteed:

* **root on the host can still swap files** between the hash and the mount in ways the
  re-check cannot see (for instance by writing the block device directly, or by changing
  a file and resetting the clock). bless protects against accidents and against other
  users, not against the machine's administrator.
* **The overlay's lower layer is not copied.** The engine reads the blessed files in
  place, through the overlay. A change to the blessed tree *after* the re-check (while the
  engine runs) is not detected by serve-full; re-run ``bless verify`` to audit a running
  blessing. The engine's own writes never reach the blessed tree: they land in the
  upper layer, which is discarded when serving ends (kept with ``--keep-upper`` or after a
  canary failure, as evidence of what the engine tried to write).
* ``--debug`` starts are not blessed at all: no manifest is looked up, no cache is
  mounted, the engine runs eager, and the result says ``"blessed": false``.

One module per step: :mod:`.serve_full` (serve-full: every step in one call, :func:`serve_full`), :mod:`.start_lock`
(one start per profile name at a time), :mod:`.names` (the container name and the stop command),
:mod:`.snapshot` (the identity re-check), :mod:`.checks` (what serve-full reads of the world, in the order
of its refusals: runtime, image, GPUs, container name, live manifest, the verified blessing), :mod:`.plan` (the
launch plan, built from the checks' facts alone), :mod:`.start` (start,
re-check, canary: :mod:`bless.replay.canary`), :mod:`.follow`, :mod:`.finish`, :mod:`.stop` (``serve-full
stop NAME``), :mod:`.serve_dir` (where a start keeps its upper layer and evidence), :mod:`.lease`
(the serving lease that keeps ``bless gc`` off the served tree), :mod:`.ready` (the readiness
record a probe checks: ``serve-full ready NAME``), :mod:`.seal` (sealed serving: every compile the
blessing does not hold, seen while serving and handled by the ``unproven_compile`` policy), and :mod:`.detached`
with :mod:`.watch_doc` (the seal watcher process of a ``--detach`` serve, and the document it is handed).

This package is library code: it never prints or exits; progress goes to an event sink and
every refusal is a :class:`~bless.errors.BlessError` with its own exit code.
"""

from __future__ import annotations

from bless.flows.serve.checks import check_gpu_memory, check_name_free
from bless.flows.serve.finish import FinishResult, finish
from bless.flows.serve.follow import follow
from bless.flows.serve.lease import ServingLease, serving_lease
from bless.flows.serve.names import serve_container_name, stop_command
from bless.flows.serve.plan import DEBUG_BANNER, LaunchPlan, plan
from bless.flows.serve.ready import ReadyRecord, check_ready, clear_ready, mark_ready
from bless.flows.serve.serve_dir import CANARY_FILE, ENGINE_LOG, PRIVATE_DIR, discard_serve_dir
from bless.flows.serve.serve_full import Fetched, ServeHooks, ServeOutcome, ServeRequest, serve_full
from bless.flows.serve.snapshot import Snapshot, Stamp, StampChange, cache_changed_error, describe_change
from bless.flows.serve.start import NO_CANARY_BANNER, LaunchResult, start
from bless.flows.serve.start_lock import StartingLock
from bless.flows.serve.stop import StopOutcome, stop_serving
from bless.replay.canary import CanaryCheck, CanaryResult, run_canary

__all__ = [
    "CANARY_FILE",
    "DEBUG_BANNER",
    "ENGINE_LOG",
    "NO_CANARY_BANNER",
    "PRIVATE_DIR",
    "CanaryCheck",
    "CanaryResult",
    "Fetched",
    "FinishResult",
    "LaunchPlan",
    "LaunchResult",
    "ReadyRecord",
    "ServeHooks",
    "ServeOutcome",
    "ServeRequest",
    "ServingLease",
    "Snapshot",
    "Stamp",
    "StampChange",
    "StartingLock",
    "StopOutcome",
    "cache_changed_error",
    "check_gpu_memory",
    "check_name_free",
    "check_ready",
    "clear_ready",
    "describe_change",
    "discard_serve_dir",
    "finish",
    "follow",
    "mark_ready",
    "plan",
    "run_canary",
    "serve_container_name",
    "serve_full",
    "serving_lease",
    "start",
    "stop_command",
    "stop_serving",
]
