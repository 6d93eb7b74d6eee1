"""The local runtime: the engine as a subprocess on this host (GPU hosts without Docker).

Two modes, chosen at construction:

* **mount namespace** (root on Linux, the default there): the engine runs under
  ``unshare --mount --propagation private``; a short ``sh`` prologue mounts every
  :class:`~bless.runtime.base.Mount` at its target (bind, read-only bind, or
  ``mount -t overlay`` with the upper layer in ``scratch/upper``) and then ``exec``s the
  engine, so the engine keeps the child's pid and receives our signals. The mounts
  vanish with the namespace; read-only is enforced by the kernel.
* **copy** (not root, no CAP_SYS_ADMIN as in a Kubernetes pod, or ``use_mount_namespace=False``):
  nothing can be mounted. Every mount is materialized by copying its source to its target
  (an empty or absent directory, or one holding only a partial copy of ours: see
  :mod:`bless.runtime.materialize`, which copies whole or not at all). A read-write or private
  mount's writes are brought back to its source when the engine stops (so ``bless run`` works
  in an unprivileged container).
  A read-only or overlay copy may be written by the engine: read-only is *not* enforced,
  :attr:`Started.notes` says so, :meth:`LocalRuntime.upper_entries` reports what changed by
  comparing the copy with the original, and the post-trial hash check is what protects the
  blessing; :attr:`Mount.check_copy` (serving) verifies the copy before the engine starts.

Processes run in their own session (process group), with a small allow-listed
environment plus the spec's, and HOME pinned to ``spec.home`` when given, so the engine
sees the same HOME in bootstrap, trials and serving. Output goes to ``spec.log_path``.

The graceful-stop rule mirrors Docker's (see :meth:`LocalRuntime.stop`): SIGTERM to the
process group, wait up to the timeout, then SIGKILL; graceful when we did not have to
send SIGKILL and the exit code is not 137. Exit codes follow Docker's convention:
death by signal N is reported as 128 + N (SIGTERM 143, SIGKILL 137).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bless import container_labels as bless_labels
from bless.errors import (
    BlessError,
    ContainerConflictError,
    InputInvalidError,
    RuntimeUnavailableError,
)
from bless.evidence_types import SHM_DIR, OutsideEntry, UpperEntry, outside_kind
from bless.runtime import materialize
from bless.runtime import upper as upper_layer
from bless.runtime.base import (
    ContainerInfo,
    ContainerSpec,
    ContainerStop,
    Mount,
    NameHolder,
    Started,
    rank_order_env,
)
from bless.system.log_follow import FileFollower, LogFollower, TextFollower

# What the engine inherits from our environment: enough to find binaries, libraries and
# GPUs, nothing that could carry our own configuration (or secrets) into a blessed run.
# Named CUDA variables only: a prefix would let debug switches such as CUDA_LAUNCH_BLOCKING reach the
# engine without the profile (so neither the factors nor the unsafe-env check) ever seeing them. The
# NVLink-multicast switches are host safety settings an operator sets; they change no compiled artifact.
_ENV_NAMES = (
    "PATH",
    "LANG",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_HOME",
    "CUDA_PATH",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
)
_ENV_PREFIXES = ("LC_",)


def inherited_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What a local engine inherits of ``environ`` (this process's env, say): the names above, nothing else."""
    return {key: value for key, value in environ.items() if key in _ENV_NAMES or key.startswith(_ENV_PREFIXES)}


# 128 + SIGKILL, as Docker reports a killed container.
_KILLED_EXIT_CODE = 128 + signal.SIGKILL
# Exit code of the mount prologue when a mount fails (its message is in the log).
MOUNT_SETUP_FAILED = 121
_MOUNT_FAILED_PREFIX = "bless-local: mount setup failed:"
# Exit code when the engine binary is missing inside the namespace (as sh reports it).
COMMAND_NOT_FOUND = 127
_POLL_S = 0.05
#: Seconds a SIGKILLed detached engine is given to disappear before stop_detached returns.
_KILL_WAIT_S = 10.0


def _normalized_exit(returncode: int) -> int:
    """Popen says -N for death by signal N; report 128 + N like Docker and shells do."""
    return 128 - returncode if returncode < 0 else returncode


@functools.cache
def _mount_namespace_possible() -> bool:
    """Root on Linux with unshare(1) and mount(8), and a private mount namespace can really be made.

    Being root is not enough: in a container without CAP_SYS_ADMIN (a Kubernetes pod, an unprivileged
    ``docker run``) unshare fails with "operation not permitted", and the engine would then fail at its
    first mount. One ``unshare --mount true`` tells (a few milliseconds, once per process).
    """
    if not (
        sys.platform.startswith("linux")
        and os.geteuid() == 0
        and shutil.which("unshare") is not None
        and shutil.which("mount") is not None
    ):
        return False
    try:
        probe = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "true"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def _missing_dirs(target: Path) -> list[Path]:
    """The directories ``mkdir -p target`` would create, outermost first."""
    missing: list[Path] = []
    current = target
    while not os.path.lexists(current) and current != current.parent:
        missing.append(current)
        current = current.parent
    return list(reversed(missing))


def _collect_writes(spec: ContainerSpec) -> None:
    """Copy mode: bring what the engine wrote at each writable target back to its source.

    A ``private`` target started empty: its entries move into the (empty) source. A ``rw`` target started
    as a copy of its source (the bootstrap's staged tree): the source's entries are replaced by the
    target's, so the source ends as the engine left the target, deletions included. In namespace mode
    (and under Docker) the source is bind-mounted at the target, so the writes are already there; callers
    read a writable mount's result from its source in every mode.
    """
    for mount in spec.mounts:
        target = Path(mount.target)
        if mount.kind not in ("private", "rw") or target.resolve() == mount.source.resolve() or not target.is_dir():
            continue
        # Private sources may hold what bless placed for the engine (a sealed start's module): the target
        # holds it too, as the engine left it, so the source is emptied first, as a rw one is.
        if mount.kind in ("rw", "private"):
            for child in sorted(mount.source.iterdir()):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        for child in sorted(target.iterdir()):
            with contextlib.suppress(OSError):
                shutil.move(str(child), str(mount.source / child.name))


@dataclass
class _Proc:
    """One engine we started: its process and what we must undo on remove."""

    started: Started
    popen: subprocess.Popen[bytes]
    log_path: Path
    # Materialized copies (copy mode): (target, we created the target dir itself).
    copies: list[tuple[Path, bool]] = field(default_factory=list)
    # Mount-point directories that did not exist before (namespace mode), outermost first.
    created_dirs: list[Path] = field(default_factory=list)
    # Set once the process was reaped (its pid may then belong to someone else).
    reaped: bool = False


class LocalRuntime:
    """Engines as local subprocesses (implements :class:`bless.runtime.base.Runtime`).

    ``use_mount_namespace``: ``None`` (default) uses a private mount namespace when
    possible (root on Linux with ``unshare`` and ``mount``), else the copy mode; ``True``
    requires it (RuntimeUnavailableError when impossible); ``False`` forces copy mode.
    The registry of engines is per instance: ``name_holder``, ``list_ours`` and
    ``cleanup_ours`` see only what this instance started.
    """

    # The protocol's attribute type, so LocalRuntime is a Runtime (attributes are invariant).
    kind: Literal["docker", "local"] = "local"

    def __init__(self, *, use_mount_namespace: bool | None = None) -> None:
        self._required_namespace = use_mount_namespace is True
        possible = _mount_namespace_possible()
        self.uses_mount_namespace = possible if use_mount_namespace is None else use_mount_namespace
        self._procs: dict[str, _Proc] = {}
        # Ports handed to engines not removed yet: parallel trials pick theirs before any binds it,
        # and the kernel may hand the same free port out twice in a row.
        self._ports_handed_out: set[int] = set()
        self._ports_lock = threading.Lock()
        # Mount targets of our live engines (namespace mode), and mount-point dirs our engines created.
        # Parallel engines mount at the same target, each in its own namespace; removing one must not
        # rmdir a mount point another still uses: Linux then detaches that engine's mount.
        self._mounts_lock = threading.Lock()
        self._targets_in_use: Counter[Path] = Counter()
        self._dirs_to_remove: set[Path] = set()

    # -- about this runtime ---------------------------------------------------------

    @property
    def copies_mounts(self) -> bool:
        """Without a mount namespace, read-only and overlay mounts are writable copies (see the module)."""
        return not self.uses_mount_namespace

    @property
    def notes(self) -> tuple[str, ...]:
        """What this runtime can and cannot guarantee here (for preflight reports)."""
        if self.uses_mount_namespace:
            return ("local runtime: private mount namespace; read-only and overlay mounts are enforced",)
        return (
            "local runtime without a mount namespace (not root, or disabled): read-only and overlay "
            "mounts are writable copies at their targets, read-only is NOT enforced; the post-trial "
            "hash check is what protects a blessing",
        )

    def ping(self) -> None:
        """Always usable, unless a mount namespace was required and cannot be had."""
        if self.uses_mount_namespace and not _mount_namespace_possible():
            raise RuntimeUnavailableError(
                "the local runtime was asked for a private mount namespace, which needs root on Linux "
                "with unshare(1) and mount(8)",
                hint="run as root, or let the local runtime fall back to copies (read-only not enforced)",
            )

    def resolve_image(self, reference: str) -> str:
        """The local runtime runs no images."""
        raise InputInvalidError(
            f"the local runtime takes no image (got {reference!r}): the engine runs on this host",
            hint="use the docker runtime for image-based profiles, or drop the image for runtime 'local'",
        )

    def engine_port(self, preferred: int) -> int:
        """A free TCP port on 127.0.0.1 for the engine to listen on directly.

        ``preferred`` is ignored: engines of several runs may share this host. The port
        is free when chosen and never one already handed to an engine of this instance that
        was not removed yet (parallel trials); another process could take it before the
        engine binds, which then shows up as an engine that fails to start.
        """
        del preferred
        with self._ports_lock:
            while True:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind(("127.0.0.1", 0))
                    port: int = sock.getsockname()[1]
                if port not in self._ports_handed_out:
                    self._ports_handed_out.add(port)
                    return port

    # -- start ----------------------------------------------------------------------

    def _environment(self, spec: ContainerSpec) -> dict[str, str]:
        env = inherited_env(os.environ)
        env.setdefault("PATH", os.defpath)
        # Without a pinned HOME the engine gets ours, which is at least the same every run.
        home = spec.home if spec.home is not None else os.environ.get("HOME")
        env.update(spec.env)
        if spec.python_path:
            env["PYTHONPATH"] = ":".join([*spec.python_path, *filter(None, [env.get("PYTHONPATH")])])
        if home is not None:
            env["HOME"] = home
        if spec.gpu_ids:
            # This engine's GPU set and no other, in rank order, whatever the host's CUDA_VISIBLE_DEVICES said.
            env.update(rank_order_env(spec))
        elif spec.gpus and spec.gpus > 0 and "CUDA_VISIBLE_DEVICES" not in env:
            # Docker's count=N gives the first N GPUs; do the same on a bare host.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(spec.gpus))
        return env

    def _check_spec(self, spec: ContainerSpec) -> Path:
        if not spec.command:
            raise BlessError(f"engine {spec.name!r}: empty command", hint="this is a bug in the caller")
        if not bless_labels.is_ours(dict(spec.labels)):
            raise BlessError(
                f"refusing to start engine {spec.name!r} without the owner label {bless_labels.OWNER}",
                hint="this is a bug in the caller: build labels with bless.container_labels.labels_for()",
            )
        if spec.log_path is None:
            raise BlessError(
                f"engine {spec.name!r}: the local runtime needs spec.log_path for the engine's output",
                hint="this is a bug in the caller",
            )
        if spec.port is not None and spec.host_port is not None and spec.host_port != spec.port:
            raise InputInvalidError(
                f"engine {spec.name!r}: the local runtime cannot publish port {spec.port} "
                f"as {spec.host_port}; the engine listens on the host directly",
                hint="use engine_port() for both, or the docker runtime",
            )
        for mount in spec.mounts:
            if not Path(mount.target).is_absolute():
                raise InputInvalidError(
                    f"mount target {mount.target!r} must be an absolute path", hint="fix the mount target"
                )
            if not mount.source.exists():
                raise InputInvalidError(f"mount source {mount.source} does not exist", hint="check the source")
        existing = self._procs.get(spec.name)
        if existing is not None:
            alive = self._peek(existing) is None
            raise ContainerConflictError(
                f"an engine of ours named {spec.name!r} "
                + ("is still running" if alive else "has exited but was not removed yet"),
                hint="stop and remove it first, or wait for it to finish",
                details={"name": spec.name, "holder": "ours"},
            )
        return spec.log_path

    def _namespace_argv(self, spec: ContainerSpec, proc_dirs: list[Path]) -> list[str]:
        """``unshare ... sh -c '<mount prologue>; exec "$@"' sh <command...>``."""
        steps: list[str] = []

        def step(command: str, what: str) -> None:
            message = shlex.quote(f"{_MOUNT_FAILED_PREFIX} {what}")
            steps.append(f"{command} || {{ echo {message} >&2; exit {MOUNT_SETUP_FAILED}; }}")

        # Parents before children, so a mount inside another mount's target lands on top.
        for mount in sorted(spec.mounts, key=lambda m: len(Path(m.target).parts)):
            source = mount.source.resolve()
            target = mount.target
            proc_dirs.extend(d for d in _missing_dirs(Path(target)) if d not in proc_dirs)
            q_source, q_target = shlex.quote(str(source)), shlex.quote(target)
            step(f"mkdir -p {q_target}", f"mkdir {target}")
            if mount.kind in ("rw", "private"):
                step(f"mount --bind {q_source} {q_target}", f"bind {source} at {target}")
            elif mount.kind == "ro":
                step(f"mount --bind {q_source} {q_target}", f"bind {source} at {target}")
                step(f"mount -o remount,bind,ro {q_target}", f"remount {target} read-only")
            else:
                upper, work = self._overlay_dirs(mount, source)
                options = f"lowerdir={source},upperdir={upper},workdir={work}"
                step(
                    f"mount -t overlay overlay -o {shlex.quote(options)} {q_target}",
                    f"overlay of {source} at {target}",
                )
        # Its own shared memory, as a container's: nothing of the host's /dev/shm is seen or left behind, and
        # what the engine puts there is what the seal watcher lists (shm_entries).
        size = f",size={spec.shm_size.removesuffix('b')}" if spec.shm_size else ""  # tmpfs: bytes have no suffix
        step(
            f"mount -t tmpfs -o {shlex.quote(f'mode=1777,nosuid,nodev{size}')} bless-shm {SHM_DIR}",
            f"a private tmpfs at {SHM_DIR}",
        )
        if spec.workdir is not None:
            step(f"cd {shlex.quote(spec.workdir)}", f"cd {spec.workdir}")
        # exec of a missing binary would only say "not found" with sh's wording; say ours.
        steps.append(
            'command -v "$1" >/dev/null 2>&1 || '
            f'{{ echo "bless-local: engine command not found: $1" >&2; exit {COMMAND_NOT_FOUND}; }}'
        )
        script = "\n".join([*steps, 'exec "$@"'])
        # unshare(1) without --fork execs sh, which execs the engine: one pid throughout.
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *spec.command]

    @staticmethod
    def _overlay_dirs(mount: Mount, source: Path) -> tuple[Path, Path]:
        if mount.scratch is None:
            raise InputInvalidError(
                f"overlay mount at {mount.target} has no scratch directory for its upper layer",
                hint="set Mount.scratch to a host directory (the runtime creates upper/ and work/ in it)",
            )
        scratch = mount.scratch.resolve()
        upper_layer.check_overlay_path(source, "lower dir")
        upper_layer.check_overlay_path(scratch, "scratch dir")
        upper, work = upper_layer.make_overlay_dirs(scratch)
        return upper, work

    def _materialize(self, spec: ContainerSpec, copies: list[tuple[Path, bool]]) -> tuple[str, ...]:
        """Copy mode: present each mount at its target without mounting; returns notes.

        Every copy made is appended to ``copies`` at once, so a failure midway can be undone.
        """
        notes: list[str] = []
        for mount in spec.mounts:
            source = mount.source.resolve()
            target = Path(mount.target)
            if target.resolve() == source and mount.kind in ("rw", "private"):
                continue  # already where the engine writes
            if target.resolve() == source:
                raise RuntimeUnavailableError(
                    f"without a mount namespace a {mount.kind} mount needs a target other than its source "
                    f"({source}): the engine would write into the original",
                    hint="run as root (private mount namespace), or choose another target",
                )
            # Whole or not at all (materialize.py): a full disk is 15 with nothing left behind, and a
            # partial copy a killed start left is cleared rather than refused as "not empty".
            copies.append((target, materialize.copy_whole(source, target)))
            if mount.kind in ("rw", "private"):
                continue  # writable on purpose: stop() brings the engine's writes back to the source
            if mount.check_copy is not None:
                mount.check_copy(target)  # a raise refuses the start; start() removes the copies
            notes.append(
                f"read-only layer NOT enforced: {target} is a writable copy of {source} "
                "(no mount namespace); writes are reported by comparing the copy with the original, "
                "and the post-trial hash check is what protects the blessing"
            )
        return tuple(notes)

    def start(self, spec: ContainerSpec) -> Started:
        """Spawn the engine in its own session with its output in ``spec.log_path``."""
        log_path = self._check_spec(spec)
        if self._required_namespace:
            self.ping()
        env = self._environment(spec)
        created_dirs: list[Path] = []
        copies: list[tuple[Path, bool]] = []
        notes: tuple[str, ...] = ()
        cwd: str | None = None
        targets = [Path(mount.target) for mount in spec.mounts] if self.uses_mount_namespace else []
        try:
            if self.uses_mount_namespace:
                with self._mounts_lock:
                    self._targets_in_use.update(targets)  # before the spawn: its prologue mounts there
                argv = self._namespace_argv(spec, created_dirs)
            else:
                notes = self._materialize(spec, copies)
                argv = list(spec.command)
                cwd = spec.workdir
            try:
                log_path.parent.mkdir(parents=True, exist_ok=True)
                with log_path.open("wb") as log:
                    popen = subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        cwd=cwd,
                        start_new_session=True,
                    )
            except OSError as exc:
                raise RuntimeUnavailableError(
                    f"cannot start engine {spec.name!r} ({argv[0]}): {exc}",
                    hint="check the engine command, its working directory and the log path",
                ) from exc
        except BaseException:
            self._undo_copies(copies)
            self._release_mount_points(targets, created_dirs)
            raise
        started = Started(
            id=str(popen.pid),
            name=spec.name,
            spec=spec,
            host_port=spec.port,
            enforced_read_only=self.uses_mount_namespace or not any(m.kind in ("ro", "overlay") for m in spec.mounts),
            notes=notes,
        )
        self._procs[spec.name] = _Proc(
            started=started,
            popen=popen,
            log_path=log_path,
            copies=copies,
            created_dirs=created_dirs,
        )
        return started

    # -- watching -------------------------------------------------------------------

    def _proc(self, started: Started) -> _Proc | None:
        proc = self._procs.get(started.name)
        if proc is None or proc.started.id != started.id:
            return None
        return proc

    @staticmethod
    def _peek(proc: _Proc) -> int | None:
        """The exit code if the engine has exited, without reaping it.

        Not reaping keeps the pid (and so the process group id) reserved until stop or
        remove, so killing leftovers of the group can never hit an unrelated process.
        """
        if proc.popen.returncode is not None:
            return _normalized_exit(proc.popen.returncode)
        if not hasattr(os, "waitid"):  # pragma: no cover - e.g. macOS builds without waitid
            code = proc.popen.poll()
            return None if code is None else _normalized_exit(code)
        try:
            info = os.waitid(os.P_PID, proc.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            # Reaped elsewhere (should not happen): let Popen fetch what it can.
            code = proc.popen.poll()
            return None if code is None else _normalized_exit(code)
        if info is None:
            return None
        if info.si_code == os.CLD_EXITED:
            return info.si_status
        return 128 + info.si_status

    @staticmethod
    def _reap(proc: _Proc) -> int:
        """Kill what is left of the group (as a container dies with its PID 1), then reap."""
        if not proc.reaped:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.popen.pid, signal.SIGKILL)
            proc.popen.wait()
            proc.reaped = True
        return _normalized_exit(proc.popen.returncode)

    def is_running(self, started: Started) -> bool:
        proc = self._proc(started)
        return proc is not None and self._peek(proc) is None

    def exit_code(self, started: Started) -> int | None:
        """The exit code (128 + N for signal N) once exited; None while running or unknown."""
        proc = self._proc(started)
        return None if proc is None else self._peek(proc)

    def shm_entries(self, started: Started) -> list[OutsideEntry]:
        """The engine's ``/dev/shm`` as it sees it (``/proc/<pid>/root/dev/shm``) while its process lives.

        In a mount namespace that is the private tmpfs the prologue mounts; in copy mode, the ``/dev/shm``
        this process shares with the engine (a pod's own; on a shared host, every process's: what others
        write there counts too, fail closed). Read by pid, so the detached watcher (another process) reads
        it as well.
        """
        if not started.id.isdigit():
            return []
        root = Path(f"/proc/{started.id}/root") / SHM_DIR.lstrip("/")
        entries: list[OutsideEntry] = []
        try:
            walked = list(os.walk(root))
        except OSError:
            return []
        for directory, dirs, files in walked:
            for name in sorted(files) + sorted(d for d in dirs if (Path(directory) / d).is_symlink()):
                path = Path(directory) / name
                shown = f"{SHM_DIR}/{path.relative_to(root).as_posix()}"
                try:
                    info = path.lstat()
                except OSError:
                    continue  # gone between the walk and the look
                entries.append(
                    OutsideEntry(where="container", path=shown, size=info.st_size, kind=outside_kind(info.st_mode))
                )
        return entries

    def logs(self, started: Started) -> str:
        """The log file so far (stdout and stderr interleaved)."""
        log_path = started.spec.log_path
        if log_path is None:
            return ""
        try:
            return log_path.read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def follow_log(self, started: Started) -> LogFollower:
        """The log file, followed from where the last read stopped (rotation and truncation handled)."""
        log_path = started.spec.log_path
        return FileFollower(log_path) if log_path is not None else TextFollower(lambda: b"")

    # -- stopping -------------------------------------------------------------------

    def stop(self, started: Started, timeout_s: int) -> ContainerStop:
        """SIGTERM to the process group, wait ``timeout_s``, then SIGKILL the group. Never removes.

        ``graceful`` is True when the engine exited before the timeout (we never sent
        SIGKILL) and its exit code is not 137 (killed by someone else). An engine that had
        already exited is reported as it exited (seconds 0). Processes left in the group
        after the engine exits are killed, as Docker does when a container's PID 1 exits.
        An engine this instance does not know reports ``exit_code=None, graceful=False``.
        """
        proc = self._proc(started)
        if proc is None:
            return ContainerStop(exit_code=None, graceful=False, seconds=0.0)
        began = time.monotonic()
        killed = False
        seconds = 0.0
        if self._peek(proc) is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGTERM)
            deadline = began + timeout_s
            while self._peek(proc) is None and time.monotonic() < deadline:
                time.sleep(_POLL_S)
            if self._peek(proc) is None:
                killed = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                while self._peek(proc) is None:
                    time.sleep(_POLL_S)
            seconds = time.monotonic() - began
        code = self._reap(proc)
        if not self.uses_mount_namespace:
            _collect_writes(started.spec)
        return ContainerStop(exit_code=code, graceful=not killed and code != _KILLED_EXIT_CODE, seconds=seconds)

    def stop_detached(self, pid: int, timeout_s: int, is_alive: Callable[[], bool]) -> ContainerStop:
        """Stop an engine another process started (``serve-full --detach`` then ``serve-full stop``).

        The same rule as :meth:`stop` on the engine's process group (the engine leads its own
        session, so the group id is its pid): SIGTERM, wait ``timeout_s``, then SIGKILL. The
        engine is not our child, so its exit code is unknown (None); ``is_alive`` says whether
        the very process (pid and start time) still runs, so a recycled pid is never signalled.
        """
        began = time.monotonic()
        if not is_alive():
            return ContainerStop(exit_code=None, graceful=True, seconds=0.0)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = began + timeout_s
        while is_alive() and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        killed = is_alive()
        if killed:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            # Bounded too: a process in uninterruptible sleep outlives SIGKILL for a while; the caller
            # checks is_alive again and refuses rather than wait for ever.
            killed_by = time.monotonic() + _KILL_WAIT_S
            while is_alive() and time.monotonic() < killed_by:
                time.sleep(_POLL_S)
        return ContainerStop(exit_code=None, graceful=not killed, seconds=time.monotonic() - began)

    def remove(self, started: Started) -> None:
        """Forget a stopped engine; undo copies and mount-point dirs we created.

        A running engine is a ContainerConflictError (stop it first). The overlay upper
        layer stays: the caller keeps it as evidence or deletes it.
        """
        proc = self._proc(started)
        if proc is None:
            return
        if self._peek(proc) is None:
            raise ContainerConflictError(
                f"engine {started.name!r} is still running; it must be stopped before removal",
                hint="stop it first",
            )
        self._reap(proc)
        self._undo_copies(proc.copies)
        del self._procs[started.name]
        if self.uses_mount_namespace:
            self._release_mount_points([Path(m.target) for m in started.spec.mounts], proc.created_dirs)
        with self._ports_lock:
            self._ports_handed_out.discard(started.spec.port or 0)

    def _release_mount_points(self, targets: list[Path], created_dirs: list[Path]) -> None:
        """An engine is gone: remove the mount-point dirs our engines created that no live engine uses.

        Only empty ones (after a namespace is gone its mount points are empty again), deepest first;
        one still under another engine's mount target waits for that engine's removal.
        """
        with self._mounts_lock:
            self._targets_in_use.subtract(targets)
            self._targets_in_use = +self._targets_in_use  # drop zero counts
            self._dirs_to_remove.update(created_dirs)
            for directory in sorted(self._dirs_to_remove, key=lambda d: len(d.parts), reverse=True):
                if any(target == directory or directory in target.parents for target in self._targets_in_use):
                    continue
                with contextlib.suppress(OSError):
                    directory.rmdir()
                self._dirs_to_remove.discard(directory)

    @staticmethod
    def _undo_copies(copies: list[tuple[Path, bool]]) -> None:
        """Delete materialized copies: the dir itself if we created it, else its contents."""
        for target, created in reversed(copies):
            with contextlib.suppress(OSError):
                if created:
                    shutil.rmtree(target)
                else:
                    materialize.clear_contents(target)
        copies.clear()

    # -- evidence -------------------------------------------------------------------

    def upper_entries(self, started: Started) -> list[UpperEntry]:
        """Writes over the read-only layers; call it before :meth:`remove`.

        Namespace mode: each overlay's ``scratch/upper`` (see upper.scan_upper). Copy mode:
        each read-only or overlay copy compared with its original by content (see
        upper.diff_trees): in that mode a "read-only" mount was writable, so its writes
        are reported too.
        """
        per_mount: list[tuple[str, list[UpperEntry]]] = []
        for mount in started.spec.mounts:
            if self.uses_mount_namespace and mount.kind == "overlay" and mount.scratch is not None:
                scanned = upper_layer.scan_upper(mount.scratch.resolve() / "upper", mount.source.resolve())
                per_mount.append((mount.target, scanned))
            elif not self.uses_mount_namespace and mount.kind in ("ro", "overlay"):
                diffed = upper_layer.diff_trees(Path(mount.target), mount.source.resolve())
                per_mount.append((mount.target, diffed))
        return upper_layer.combine(per_mount) if per_mount else []

    def filesystem_changes(self, started: Started) -> list[OutsideEntry]:
        """None: a local engine has no container filesystem (its private HOME and temp dir are listed by the caller)."""
        del started
        return []

    # -- ownership of names ---------------------------------------------------------

    def name_holder(self, name: str) -> NameHolder:
        """``ours`` while this instance holds the name (until remove); never ``foreign``."""
        return "ours" if name in self._procs else "free"

    def overlay_conflict(self, name: str) -> str | None:
        """Nothing but an engine of this instance holds a local name (see :meth:`name_holder`)."""
        del name
        return None

    def _ours(self, labels: Mapping[str, str]) -> list[_Proc]:
        return [
            proc
            for proc in self._procs.values()
            if bless_labels.is_ours(dict(proc.started.spec.labels))
            and all(proc.started.spec.labels.get(k) == v for k, v in labels.items())
        ]

    def list_ours(self, labels: Mapping[str, str]) -> list[ContainerInfo]:
        return [
            ContainerInfo(
                id=proc.started.id,
                name=proc.started.name,
                status="running" if self._peek(proc) is None else "exited",
                labels=dict(proc.started.spec.labels),
            )
            for proc in self._ours(labels)
        ]

    def cleanup_ours(self, labels: Mapping[str, str]) -> list[str]:
        """Stop (timeout 10 s) and remove the engines of this instance matching ``labels``."""
        removed: list[str] = []
        for proc in self._ours(labels):
            self.stop(proc.started, 10)
            self.remove(proc.started)
            removed.append(proc.started.name)
        return removed

    # -- permissions ----------------------------------------------------------------

    def normalize_ownership(self, path: Path, *, image: str | None) -> None:
        """The engine ran as us, so its files are ours: ``chmod -R u+rwX,go+rX`` is enough."""
        del image
        upper_layer.normalize_own_tree(path)
