"""One engine start as a context manager: spec building, start, readiness, graceful stop, removal.

Shared by bless run (bootstrap and trials) and serve-full (serving), so every
start carries our labels, pins the cache path and HOME, and is stopped the same way.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from bless.core.factors import ResolvedConfig
from bless.engines import bless_seal
from bless.engines.base import ENGINE_HOME, ENGINE_TMP, EngineAdapter
from bless.errors import EngineHttpError, NotReadyError
from bless.evidence_types import OutsideEntry, OutsideWhere, UpperEntry, outside_kind
from bless.replay.engine_client import EngineClient, wait_ready
from bless.runtime.base import ContainerSpec, ContainerStop, Mount, Runtime, Started
from bless.system.os_refusals import os_errors

DEFAULT_ENGINE_PORT = 8000
LOG_TAIL_LINES = 40
#: The private dirs of one start, under the dir its caller gives (:func:`engine_spec`'s ``private_dir``).
PRIVATE_DIRS: tuple[tuple[OutsideWhere, str, str], ...] = (("HOME", "home", ENGINE_HOME), ("TMPDIR", "tmp", ENGINE_TMP))
#: Sealed starts (trials, serving): bless's Triton cache manager (:mod:`bless.engines.bless_seal`), written by
#: bless into the private temp dir (``tmp/<SEAL_DIR>/``) and put first on the engine's PYTHONPATH.
SEAL_DIR = "bless-seal"
SEAL_MODULE_FILE = "bless_seal.py"
SEAL_MANAGER = "bless_seal:SealedCacheManager"


def compile_locations(resolved: ResolvedConfig) -> dict[str, str]:
    """The declared compile locations of a resolved config: env name -> dir relative to the cache root.

    Read from the ``engine.compile_locations`` factor, so what a start gets is what was hashed and
    what the manifest lists.
    """
    engine = resolved.factors.get("engine")
    locations = engine.get("compile_locations") if isinstance(engine, Mapping) else None
    if not isinstance(locations, Mapping):
        return {}
    return {str(name): str(subdir) for name, subdir in sorted(locations.items())}


def compile_env(resolved: ResolvedConfig, cache_root: str) -> dict[str, str]:
    """The env that points every declared compile location under ``cache_root``."""
    return {name: f"{cache_root}/{subdir}" for name, subdir in compile_locations(resolved).items()}


def seal_hook_source() -> bytes:
    """The bytes of the cache-manager module a sealed start is given (what :func:`list_private` recognises)."""
    return Path(bless_seal.__file__).read_bytes()


def is_sealed(spec: ContainerSpec) -> bool:
    """Whether ``spec`` starts its engine with bless's Triton cache manager (:func:`engine_spec`'s ``seal``)."""
    return spec.env.get("TRITON_CACHE_MANAGER") == SEAL_MANAGER


def make_private_dirs(spec: ContainerSpec) -> None:
    """Fresh, empty sources for a spec's private mounts (its HOME and temp dir): what a previous start left is gone.

    Made at the start, not when the spec is built, so that planning (``--dry-run``) creates nothing.
    Mode 0777: an image may run its engine as another user than the one that made the dirs; the
    parent is the caller's own scratch dir. A sealed start's temp dir then gets the cache-manager
    module (``tmp/bless-seal/bless_seal.py``), the one file in it that bless placed.
    """
    for mount in spec.mounts:
        if mount.kind != "private":
            continue
        path = mount.source
        with os_errors(f"preparing the engine's private dir {path}"):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif os.path.lexists(path):
                path.unlink()
            path.mkdir(parents=True)
            path.chmod(0o777)
            if mount.target == ENGINE_TMP and is_sealed(spec):
                hook_dir = path / SEAL_DIR
                hook_dir.mkdir()
                hook_dir.chmod(0o777)  # the engine's Python may write its bytecode next to the module
                (hook_dir / SEAL_MODULE_FILE).write_bytes(seal_hook_source())
                (hook_dir / SEAL_MODULE_FILE).chmod(0o444)


def _placed_by_bless(where: OutsideWhere, relative: str, path: Path, source: bytes) -> bool:
    """The seal module bless wrote into the temp dir, unchanged, or the bytecode Python cached of it."""
    if where != "TMPDIR" or not relative.startswith(f"{SEAL_DIR}/"):
        return False
    name = relative[len(SEAL_DIR) + 1 :]
    if name == SEAL_MODULE_FILE:
        try:
            return path.read_bytes() == source
        except OSError:
            return False
    stem = SEAL_MODULE_FILE.removesuffix(".py")
    return name.startswith(f"__pycache__/{stem}.") and name.endswith(".pyc") and name.count("/") == 1


def list_private(private_dir: Path) -> list[OutsideEntry]:
    """Every file and link a start left in its private HOME and temp dir (directories alone say nothing).

    Not listed: what bless placed there itself, the seal module of a sealed start (unchanged) and the
    bytecode Python caches of it; anything else under ``tmp/bless-seal/`` is the engine's write.
    """
    return list_private_roots([(where, private_dir / name) for where, name, _target in PRIVATE_DIRS])


def list_private_roots(roots: Sequence[tuple[OutsideWhere, Path]]) -> list[OutsideEntry]:
    """:func:`list_private` of the given HOME and temp dirs (a runtime's copies of them, say)."""
    found: list[OutsideEntry] = []
    source = seal_hook_source()
    for where, root in roots:
        for directory, dirs, files in os.walk(root):
            dirs.sort()
            for entry in sorted(files) + [d for d in dirs if (Path(directory) / d).is_symlink()]:
                path = Path(directory) / entry
                relative = path.relative_to(root).as_posix()
                if _placed_by_bless(where, relative, path, source):
                    continue
                try:
                    info = path.lstat()
                except OSError:
                    found.append(OutsideEntry(where=where, path=relative, kind="other"))
                    continue
                found.append(
                    OutsideEntry(where=where, path=relative, size=info.st_size, kind=outside_kind(info.st_mode))
                )
    return found


def engine_spec(
    resolved: ResolvedConfig,
    adapter: EngineAdapter,
    runtime: Runtime,
    *,
    name: str,
    labels: Mapping[str, str],
    cache_mount: Mount | None,
    image: str | None,
    extra_env: Mapping[str, str] | None = None,
    debug: bool = False,
    host_ip: str = "127.0.0.1",
    host_port: int | None = None,
    log_path: Path | None = None,
    gpu_ids: tuple[str, ...] | None = None,
    private_dir: Path | None = None,
    seal: bool = False,
) -> ContainerSpec:
    """The container spec for one engine start of ``resolved`` (argv and env from its factors).

    ``host_port`` is where the engine must be reachable on the host (serving); None picks a free one.
    Docker maps it to the fixed container port; a local engine listens on it itself. ``gpu_ids``
    pins the engine to those GPUs (a parallel trial's slot); None gives it the first ``gpu_count``.
    ``private_dir`` (a dir of this start alone) gets a fresh, empty ``home/`` and ``tmp/``, presented
    at :data:`ENGINE_HOME` and :data:`ENGINE_TMP`; every declared compile location points into the
    cache mount (into the private temp dir when there is none: a debug start). Without it the engine
    would see a HOME nobody watches: only tests of the runtimes themselves leave it out.

    ``seal`` (trials and serving, never the bootstrap, which must write its kernels as the engine
    always does): Triton's cache manager is bless's (:mod:`bless.engines.bless_seal`, placed in the
    private temp dir at the start and put first on the engine's PYTHONPATH), so that a kernel the
    blessed tree does not hold is reported in the engine's log the moment Triton looks it up; and
    ``PYTHONDONTWRITEBYTECODE=1``, so that no import writes bytecode (the seal watcher reports a
    ``.pyc`` that appears while serving).
    """
    if runtime.kind == "local" and host_port is not None:
        port, host_port = host_port, None
    else:
        port = runtime.engine_port(DEFAULT_ENGINE_PORT)
    profile = resolved.profile
    launch = adapter.launch(resolved, port=port, debug=debug, host=host_ip)
    env = {
        **launch.env,
        **compile_env(resolved, adapter.cache_mount_path if cache_mount else ENGINE_TMP),
        **(extra_env or {}),
        "HOME": adapter.home,
    }
    private: tuple[Mount, ...] = ()
    if private_dir is not None:
        private = tuple(Mount("private", private_dir / name, target) for _, name, target in PRIVATE_DIRS)
        # Python's tempfile (and so torch, Triton, vLLM) reads TMPDIR first; TMP/TEMP for the rest.
        env.update({"TMPDIR": ENGINE_TMP, "TMP": ENGINE_TMP, "TEMP": ENGINE_TMP})
    python_path: tuple[str, ...] = ()
    if seal and private_dir is not None and cache_mount is not None:
        env["TRITON_CACHE_MANAGER"] = SEAL_MANAGER
        python_path = (f"{ENGINE_TMP}/{SEAL_DIR}",)
        # No bytecode written by the engine's Python (an image installed without it, uv's default, would write
        # one per module first imported by a request): a .pyc that still appears while serving is a compile.
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    weights = tuple(Mount("ro", Path(m.source), m.target) for m in adapter.model_mounts(profile))
    gpus = (profile.hardware.gpu_count or 1) if profile.hardware.accelerator == "cuda" else None
    return ContainerSpec(
        name=name,
        command=launch.command,
        env=env,
        labels=dict(labels),
        mounts=((cache_mount,) if cache_mount else ()) + private + weights,
        image=image,
        port=port,
        host_ip=host_ip,
        host_port=host_port,
        gpus=gpus,
        gpu_ids=gpu_ids if gpus else None,
        shm_size=profile.shm_size,
        ipc_host=profile.ipc_host,
        workdir=launch.workdir,
        home=adapter.home,
        log_path=log_path,
        python_path=python_path,
    )


def log_tail(log: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log, for error messages."""
    return "\n".join(log.rstrip().splitlines()[-lines:])


@dataclass
class EngineSession:
    """Start on enter; on exit stop gracefully, capture logs and upper-layer writes, remove."""

    runtime: Runtime
    spec: ContainerSpec
    ready_timeout_s: float
    request_timeout_s: float
    stop_timeout_s: int
    remove_on_exit: bool = True
    client_host: str = "127.0.0.1"
    #: The adapter's ``completion_fields``: sent with every completion, whose reply must hold token ids.
    completion_fields: Mapping[str, Any] | None = None
    started: Started | None = None
    start_to_ready_s: float | None = None
    stop_result: ContainerStop | None = None
    log: str = ""
    upper: list[UpperEntry] = field(default_factory=list)
    #: Files the engine wrote outside the blessed tree: its private HOME and temp dir, its container.
    outside: list[OutsideEntry] = field(default_factory=list)
    _t0: float = 0.0
    _client: EngineClient | None = None
    # stop() may come from another thread too (Ctrl-C stops every parallel trial from the main thread).
    _stop_lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> EngineSession:
        make_private_dirs(self.spec)
        self._t0 = time.monotonic()
        self.started = self.runtime.start(self.spec)
        return self

    @property
    def client(self) -> EngineClient:
        """One client per start; it names the served model once readiness has told us which."""
        assert self.started is not None and self.started.host_port is not None
        if self._client is None:
            self._client = EngineClient(
                self.client_host,
                self.started.host_port,
                timeout_s=self.request_timeout_s,
                fields=self.completion_fields,
                require_token_ids=self.completion_fields is not None,
            )
        return self._client

    def is_alive(self) -> bool:
        assert self.started is not None
        return self.runtime.is_running(self.started)

    def wait_ready(self) -> float:
        """Wait for readiness; returns start->ready seconds (from the start call)."""
        assert self.started is not None
        if self.started.host_port is None and not self.is_alive():
            # Docker reads no published port from a container that exited right after its start
            # (Started.notes says so): that is an engine dying at boot, not a readiness poll.
            raise NotReadyError("the engine exited before it became ready")
        wait_ready(self.client, timeout_s=self.ready_timeout_s, is_alive=self.is_alive)
        self.start_to_ready_s = time.monotonic() - self._t0
        # OpenAI-style servers (vLLM) want the model named in every request: the one it serves.
        # A reply we cannot read leaves it unnamed; the requests themselves then say what is wrong.
        try:
            served = self.client.models()
        except EngineHttpError:
            served = []
        if served and self.client.model is None:
            self.client.model = served[0]
        return self.start_to_ready_s

    def stop(self) -> ContainerStop | None:
        """Graceful stop (idempotent, thread-safe); captures the full log and the upper-layer writes."""
        with self._stop_lock:
            if self.started is None or self.stop_result is not None:
                return self.stop_result
            stopped = self.runtime.stop(self.started, self.stop_timeout_s)
            self.log = self.runtime.logs(self.started)
            self.upper = self.runtime.upper_entries(self.started)
            self.outside = self.outside_so_far()
            self.stop_result = stopped  # last: a reader that sees it also sees the log and the upper
            return self.stop_result

    def outside_so_far(self) -> list[OutsideEntry]:
        """What the engine has written outside the blessed tree until now (the full list once stopped)."""
        if self.started is None:
            return []
        if self.stop_result is not None:
            return self.outside
        private_dirs = {m.source.parent for m in self.spec.mounts if m.kind == "private"}
        found = [entry for directory in sorted(private_dirs) for entry in list_private(directory)]
        if self.runtime.copies_mounts:
            # A runtime that copies (a pod) presents the private dirs as copies at their targets, where the
            # engine writes while it runs; its stop brings the writes back to the sources (listed above).
            where_of = {name: where for where, name, _target in PRIVATE_DIRS}
            copies = [
                (where_of[m.source.name], Path(m.target))
                for m in self.spec.mounts
                if m.kind == "private" and m.source.name in where_of
            ]
            listed = {entry.shown for entry in found}
            found += [entry for entry in list_private_roots(copies) if entry.shown not in listed]
        return found + self.runtime.filesystem_changes(self.started)

    def current_log(self) -> str:
        """The log so far (the full log once stopped)."""
        if self.started is None:
            return self.log
        return self.log if self.stop_result is not None else self.runtime.logs(self.started)

    def not_ready_message(self, exc: NotReadyError) -> str:
        """A readiness failure with the engine's exit code and log tail."""
        code = self.runtime.exit_code(self.started) if self.started else None
        exit_text = f" (exit code {code})" if code is not None else ""
        return f"{exc.message}{exit_text}; engine log tail:\n{log_tail(self.current_log())}"

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.started is None:
            return
        try:
            self.stop()
        finally:
            if self.remove_on_exit:
                self.runtime.remove(self.started)

    def evidence(self) -> dict[str, Any]:
        """Timings and stop facts for trial records."""
        return {
            "container": self.spec.name,
            "start_to_ready_s": round(self.start_to_ready_s, 3) if self.start_to_ready_s is not None else None,
            "stop_seconds": round(self.stop_result.seconds, 3) if self.stop_result else None,
            "stopped_gracefully": self.stop_result.graceful if self.stop_result else None,
            "exit_code": self.stop_result.exit_code if self.stop_result else None,
        }
