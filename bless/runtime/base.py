"""The runtime interface: start an engine from a spec, watch it, stop it gracefully.

Two implementations: ``docker`` (Docker Engine through the SDK; the only module that
imports it) and ``local`` (a subprocess on this host, for GPU hosts without Docker).
bless run and serve-full only see this protocol, which is also what unit tests fake.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from bless.evidence_types import OutsideEntry, UpperEntry
from bless.system.log_follow import LogFollower

MountKind = Literal["rw", "ro", "overlay", "private"]


@dataclass(frozen=True)
class Mount:
    """A host directory presented to the engine at ``target``.

    ``rw``: read-write bind. ``ro``: read-only bind. ``overlay``: ``source`` is the
    read-only lower layer; writes land in a throw-away upper layer kept under
    ``scratch`` (the runtime creates ``scratch/upper`` and ``scratch/work``). ``private``: ``source`` is
    a fresh, empty directory of this start alone (its HOME, its temp dir), writable at ``target``;
    after the stop, whatever the engine wrote there is in ``source`` whatever the runtime (the local
    runtime's copy mode moves it back), for the caller to judge.

    ``check_copy``: a runtime that cannot mount (the local runtime's copy mode) presents ``ro`` and
    ``overlay`` mounts as a writable copy at ``target``; it calls this with the copy's path after
    copying and before the engine starts, and a raise refuses the start (the copy is removed). Serving
    uses it to verify the copy byte for byte against the manifest: the engine reads the copy, not the
    verified original. Runtimes that mount never call it.
    """

    kind: MountKind
    source: Path
    target: str
    scratch: Path | None = None
    check_copy: Callable[[Path], None] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ContainerSpec:
    """Everything needed to start one engine process."""

    name: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    labels: Mapping[str, str]
    mounts: tuple[Mount, ...] = ()
    image: str | None = None
    port: int | None = None
    host_ip: str = "127.0.0.1"
    host_port: int | None = None
    gpus: int | None = None
    #: Which GPUs (UUIDs or nvidia-smi indices), when the engine must use these and no others (a trial's slot,
    #: a serve's bound GPUs), in rank order: the runtime presents them in this order (:func:`rank_order_env`),
    #: so rank r runs on the r-th. None: the first ``gpus`` GPUs, as Docker's ``count`` gives them.
    gpu_ids: tuple[str, ...] | None = None
    shm_size: str | None = None
    ipc_host: bool = False
    workdir: str | None = None
    home: str | None = None
    log_path: Path | None = None
    #: Dirs put first on the engine's PYTHONPATH, before what it would have had: the spec's env, else the
    #: image's (Docker) or the one the local runtime passes through (bless's seal module, a sealed start).
    python_path: tuple[str, ...] = ()


def rank_order_env(spec: ContainerSpec, *, container: bool = False) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` naming ``spec.gpu_ids`` in their order, which is how both runtimes present a
    spec's GPUs in rank order: CUDA enumerates the devices it names in the order listed, and the engine puts
    local rank r on ``cuda:r``. Empty without ``gpu_ids``.

    ``container`` (its GPUs are numbered anew inside it): empty unless there are several GPUs to order and every id
    is a UUID, the one name a GPU keeps inside a container (an nvidia-smi index would name another GPU there). One
    GPU has no order to keep, and older vLLM releases read ``CUDA_VISIBLE_DEVICES`` as integers only (0.20.1 does).
    """
    ids = spec.gpu_ids or ()
    if not ids or (container and (len(ids) < 2 or not all(i.startswith(("GPU-", "MIG-")) for i in ids))):
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(ids)}


@dataclass(frozen=True)
class Started:
    """A running engine. ``host_port`` is where we reach it on ``host_ip``."""

    id: str
    name: str
    spec: ContainerSpec
    host_port: int | None
    enforced_read_only: bool = True
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContainerStop:
    """How a stop went. ``graceful`` is False when the engine had to be killed after the timeout."""

    exit_code: int | None
    graceful: bool
    seconds: float


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    status: str
    labels: Mapping[str, str] = field(default_factory=dict)


NameHolder = Literal["free", "ours", "foreign"]


class Runtime(Protocol):
    """What bless run and serve-full need from a place that runs engines."""

    kind: Literal["docker", "local"]

    @property
    def copies_mounts(self) -> bool:
        """True when read-only and overlay mounts are presented as writable copies (the local runtime
        without a mount namespace: a pod without CAP_SYS_ADMIN, a user who is not root). Such a runtime
        calls :attr:`Mount.check_copy` on each copy before the engine starts.
        """
        ...

    def ping(self) -> None:
        """Raise RuntimeUnavailableError unless the runtime can start engines now."""
        ...

    def resolve_image(self, reference: str) -> str:
        """Image reference -> image ID (``sha256:...``); ImageMissingError when absent."""
        ...

    def engine_port(self, preferred: int) -> int:
        """The port the engine should listen on inside its container (local: a free host port)."""
        ...

    def start(self, spec: ContainerSpec) -> Started:
        """Start an engine. A name held by anything (ours or foreign) is a ContainerConflictError."""
        ...

    def is_running(self, started: Started) -> bool: ...

    def exit_code(self, started: Started) -> int | None:
        """The exit code once the engine has exited, else None."""
        ...

    def logs(self, started: Started) -> str:
        """Everything the engine printed so far (stdout and stderr)."""
        ...

    def follow_log(self, started: Started) -> LogFollower:
        """What the engine prints, handed out as it grows (:mod:`bless.system.log_follow`): never the whole log."""
        ...

    def stop(self, started: Started, timeout_s: int) -> ContainerStop:
        """SIGTERM, wait up to ``timeout_s``, then kill. Never removes."""
        ...

    def remove(self, started: Started) -> None:
        """Remove a stopped engine and its overlay volume; never forced on the happy path."""
        ...

    def upper_entries(self, started: Started) -> list[UpperEntry]:
        """Paths written to the overlay's upper layer (new / rewritten / deleted); empty without overlay."""
        ...

    def filesystem_changes(self, started: Started) -> list[OutsideEntry]:
        """Files the engine changed in its container's own filesystem, outside every mount (Docker's diff).

        The local runtime has no container filesystem: its engines write only to their mounts (and to
        the private HOME and temp dir, which the caller lists itself), so it reports none.
        """
        ...

    def shm_entries(self, started: Started) -> list[OutsideEntry]:
        """Every file, link or other non-directory in the running engine's ``/dev/shm`` now (absolute paths,
        ``where="container"``); empty once it stopped (its shared memory is gone with it).

        Docker: the container's own ``/dev/shm`` (a tmpfs ``docker diff`` does not list), read by an exec in
        it. Local: ``/proc/<pid>/root/dev/shm``, the engine's own view (a private tmpfs in a mount namespace;
        in copy mode the one this process shares with it: a pod's own). The seal watcher judges them.
        """
        ...

    def name_holder(self, name: str) -> NameHolder:
        """Whether a container with this name exists, and whether it carries our labels."""
        ...

    def list_ours(self, labels: Mapping[str, str]) -> list[ContainerInfo]:
        """Our containers (owner label set) matching every label given."""
        ...

    def overlay_conflict(self, name: str) -> str | None:
        """Why a start of ``name`` would be refused by something other than a container (None: nothing)."""
        ...

    def cleanup_ours(self, labels: Mapping[str, str]) -> list[str]:
        """Stop and remove leftovers of ours matching ``labels`` (after a crash); returns their names."""
        ...

    def normalize_ownership(self, path: Path, *, image: str | None) -> None:
        """Make a tree written by an engine owned by us and readable (u+rwX, go+rX)."""
        ...
