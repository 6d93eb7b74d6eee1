"""CLI: ``python3 -m bless_reference`` (in an image), ``python3 .../reference_engine/launch.py`` (a local start)
or ``python3 -m bless.engines.reference_engine``.

Boot order matters and is the reason for the lazy imports below: parse arguments and knobs, point
``TORCHINDUCTOR_CACHE_DIR`` at a scratch dir outside the cache dir, and only then import torch. The HTTP
port is opened only after the compile and warm-up are done, so "connection refused" during boot is normal.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import shutil
import signal
import sys
import tempfile
import threading
import traceback
import uuid
import warnings
from collections.abc import MutableMapping
from concurrent.futures import Future
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from . import ENGINE_VERSION, markers
from .knobs import CRASH_AT_BOOT, JIT_OUTSIDE, KnobError, Knobs, active_knobs, parse_knobs
from .lazy import ShapeKernels, manager_class, parse_buckets

if TYPE_CHECKING:  # imported for real only once the Inductor dir is settled (see the module docstring)
    from .artifact import BootResult
    from .server import App

INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_USAGE = 2
EXIT_CRASH_KNOB = 3
# How long a graceful stop waits for completions already accepted.
DRAIN_TIMEOUT_S = 10.0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (argparse exits 2 on a usage error, as usual)."""
    parser = argparse.ArgumentParser(
        prog="bless_reference",
        description=f"bless reference engine {ENGINE_VERSION}: tiny byte-level transformer, "
        "torch.compile artifact persisted in --cache-dir, OpenAI-compatible HTTP subset.",
    )
    parser.add_argument("--cache-dir", type=Path, help="mounted compile cache (required unless --no-compile)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--no-compile", action="store_true", help="eager mode: no torch.compile, no cache")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (see the ready marker)")
    parser.add_argument("--served-model-name", default="reference-tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--max-seq-len", type=int, default=64)
    parser.add_argument(
        "--shape-buckets",
        default="",
        help="comma-separated prompt-length buckets whose kernels compile lazily, on first use (e.g. 8,16,32)",
    )
    return parser


def is_inside(path: Path, root: Path) -> bool:
    """Whether ``path`` is ``root`` or below it, after resolving symlinks and ``..`` (need not exist)."""
    return path.resolve().is_relative_to(root.resolve())


def setup_inductor_dir(cache_dir: Path | None, env: MutableMapping[str, str]) -> tuple[Path, bool]:
    """Make sure Inductor's scratch dir is set and outside the cache dir; returns ``(dir, created_by_us)``.

    Inductor writes (and on a warm load even rewrites) its own cache files there; inside the mounted
    cache that would pollute a blessed tree or fail on a read-only mount. Raises ValueError on a conflict.
    """
    current = env.get(INDUCTOR_ENV, "").strip()
    created = not current
    # A fresh dir per process: a previous run's local Inductor cache must never turn a cold compile into a
    # hit, or the counters would stop telling a real artifact load from a recompile.
    path = Path(tempfile.mkdtemp(prefix="bless-inductor-")) if created else Path(current)
    if cache_dir is not None and is_inside(path, cache_dir):
        if created:
            shutil.rmtree(path, ignore_errors=True)
        source = "the temp dir chosen for it (check TMPDIR)" if created else f"{INDUCTOR_ENV}={current}"
        raise ValueError(f"Inductor's scratch dir must be outside --cache-dir {cache_dir}, but {source} is inside")
    env[INDUCTOR_ENV] = str(path)
    return path, created


def write_jit_outside(home: Path) -> Path:
    """What :data:`~.knobs.JIT_OUTSIDE` does: a kernel in a Triton-style cache under ``home``, new at every start.

    Triton names its cache entries by a hash of the kernel; a fresh name per start is what a JIT
    that compiles at every start (a cache nobody kept) leaves behind.
    """
    kernel = home / ".triton" / "cache" / uuid.uuid4().hex / "reference_kernel.cubin"
    kernel.parent.mkdir(parents=True, exist_ok=True)
    kernel.write_bytes(b"\x7fELF reference test kernel\n")
    return kernel


class _Stop:
    """Signal state: set by SIGTERM/SIGINT; shuts the HTTP server down from a helper thread."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.server: Any = None

    def handler(self, signum: int, frame: FrameType | None) -> None:
        # Only set flags here: printing from a signal handler can re-enter a stdout write of the main thread.
        self.event.set()
        server = self.server
        if server is not None:
            # shutdown() blocks until serve_forever returns, and serve_forever runs on this (main) thread.
            threading.Thread(target=server.shutdown, name="bless-shutdown", daemon=True).start()


def _fatal(message: str, code: int = EXIT_FATAL) -> int:
    markers.emit(markers.fatal(message))
    return code


def main(argv: list[str] | None = None) -> int:
    """Run the engine until SIGTERM/SIGINT; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        knobs = parse_knobs(os.environ)
    except KnobError as exc:
        return _fatal(f"bad test knob: {exc}", EXIT_USAGE)
    for description in active_knobs(knobs):
        markers.emit(markers.KNOB_ACTIVE + description)
    if knobs.crash_at_boot:
        markers.emit(markers.fatal(f"simulated crash at boot ({CRASH_AT_BOOT}=1, test knob)"))
        sys.stderr.write(
            f"Traceback (most recent call last):\nRuntimeError: simulated engine crash at boot ({CRASH_AT_BOOT}=1)\n"
        )
        sys.stderr.flush()
        return EXIT_CRASH_KNOB
    if not 1 <= args.port <= 65535 and args.port != 0:
        return _fatal(f"--port must be 0..65535, got {args.port}", EXIT_USAGE)
    if args.shape_buckets:
        try:
            parse_buckets(args.shape_buckets)
            manager_class(os.environ)
        except (ValueError, ImportError, AttributeError) as exc:
            return _fatal(f"shape buckets: {exc}", EXIT_USAGE)
    if knobs.jit_outside:
        try:
            kernel = write_jit_outside(Path.home())
        except OSError as exc:
            return _fatal(f"{JIT_OUTSIDE}: cannot write the kernel under HOME: {exc}")
        markers.emit(f"{markers.MARKER_PREFIX}JIT kernel written outside the cache dir (test knob): {kernel}")

    cache_dir: Path | None = None
    inductor_dir: Path | None = None
    created = False
    if args.no_compile:
        markers.emit(markers.EAGER)
    else:
        if args.cache_dir is None:
            return _fatal("--cache-dir is required unless --no-compile is given", EXIT_USAGE)
        cache_dir = args.cache_dir.absolute()
        try:
            inductor_dir, created = setup_inductor_dir(cache_dir, os.environ)
        except (ValueError, OSError) as exc:
            return _fatal(str(exc))
        markers.emit(f"{markers.INDUCTOR_DIR}{inductor_dir}")

    stop = _Stop()
    # Diagnostics for a stuck engine: `kill -USR1 <pid>` dumps every thread's stack to stderr.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGTERM, stop.handler)
    signal.signal(signal.SIGINT, stop.handler)
    try:
        return _run(args, knobs, cache_dir, stop, inductor_dir if created else None)
    finally:
        if created and inductor_dir is not None:
            shutil.rmtree(inductor_dir, ignore_errors=True)


def _shutting_down_now(cleanup: Path | None = None) -> None:
    """Exit 0 at once during boot; the compile may still run on a daemon thread, which must not be joined."""
    markers.emit(markers.SHUTTING_DOWN)
    if cleanup is not None:
        shutil.rmtree(cleanup, ignore_errors=True)
    sys.stderr.flush()
    os._exit(EXIT_OK)


def _run(args: argparse.Namespace, knobs: Knobs, cache_dir: Path | None, stop: _Stop, scratch: Path | None) -> int:
    """Build, compile (or not), serve; ``scratch`` is the Inductor dir to delete on an early exit."""
    # torch is imported only now, after TORCHINDUCTOR_CACHE_DIR is settled. The NumPy warning is noise:
    # images without numpy are fine for this engine.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    # fp32 stays fp32 on purpose (no TF32): fewer numeric surprises in golden outputs.
    warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores")
    import torch

    from .artifact import boot_compiled
    from .model import ModelArgs, build_model, generate, random_noise_hook
    from .server import App, InferenceWorker

    model_args = ModelArgs(
        seed=args.seed,
        layers=args.layers,
        d_model=args.d_model,
        heads=args.heads,
        max_seq_len=args.max_seq_len,
    )
    try:
        model_args.validate()
    except ValueError as exc:
        return _fatal(str(exc), EXIT_USAGE)
    device: str = args.device
    if device == "cuda" and not torch.cuda.is_available():
        return _fatal("--device cuda but torch sees no CUDA device")

    if knobs.never_ready:
        return _never_ready(stop)

    worker = InferenceWorker()
    model = build_model(model_args, device)
    nondeterministic = knobs.nondeterministic

    if cache_dir is None:
        forward = model.__call__
    else:
        dir_for_boot = cache_dir
        # The compile runs on the inference thread: CUDA graph trees are per thread.
        future = worker.submit(lambda: boot_compiled(model, model_args, device, dir_for_boot, knobs))
        try:
            boot = _boot_result(future, stop, scratch)
        except Exception as exc:
            return _compile_failed(exc)
        forward = boot.forward
        # A loaded poisoned artifact mimics a bad compile: same inputs, unstable outputs (test knob).
        nondeterministic = nondeterministic or boot.loaded_poisoned

    hook = random_noise_hook() if nondeterministic else None
    max_seq_len = model_args.max_seq_len
    shapes = _shape_kernels(args, model_args, device, torch.__version__)

    def decode(prompt: list[int], max_tokens: int) -> tuple[list[int], list[int]]:
        if shapes is not None:
            shapes.ensure(len(prompt))
        return generate(forward, prompt, max_tokens, max_seq_len, device, hook)

    if stop.event.is_set():
        markers.emit(markers.SHUTTING_DOWN)
        return EXIT_OK
    app = App(served_model_name=args.served_model_name, max_seq_len=max_seq_len, worker=worker, decode=decode)
    return _serve(args, app, stop)


def _shape_kernels(args: argparse.Namespace, model_args: Any, device: str, torch_version: str) -> ShapeKernels | None:
    """The lazily compiled shape-bucket kernels of ``--shape-buckets`` (None without buckets or a cache)."""
    if not args.shape_buckets or args.no_compile:
        return None
    from .artifact import artifact_key, device_kind

    return ShapeKernels(parse_buckets(args.shape_buckets), artifact_key(model_args, device_kind(device), torch_version))


def _never_ready(stop: _Stop) -> int:
    """The never-ready test knob: neither compile nor listen, only wait for the stop signal."""
    markers.emit(markers.MARKER_PREFIX + "never ready (test knob): not compiling, not listening")
    while not stop.event.wait(0.5):
        pass
    markers.emit(markers.SHUTTING_DOWN)
    return EXIT_OK


def _boot_result(future: Future[BootResult], stop: _Stop, scratch: Path | None) -> BootResult:
    """Wait for the compile (or the artifact load); its own failure is raised.

    The compile cannot be interrupted: a stop signal meanwhile exits at once.
    """
    while True:
        try:
            return future.result(timeout=0.25)
        except TimeoutError:
            if stop.event.is_set():
                _shutting_down_now(scratch)


def _compile_failed(exc: Exception) -> int:
    traceback.print_exception(exc, file=sys.stderr)  # the whole story for diagnostics
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return _fatal(f"compile failed: {type(exc).__name__}: {first_line}")


def _serve(args: argparse.Namespace, app: App, stop: _Stop) -> int:
    """Listen, announce readiness, serve until the stop signal, then drain the requests already accepted."""
    from .server import ReferenceHTTPServer

    try:
        server = ReferenceHTTPServer(args.host, args.port, app)
    except OSError as exc:
        return _fatal(f"cannot listen on {args.host}:{args.port}: {exc}")
    stop.server = server
    markers.emit(markers.ready(server.port))
    if not stop.event.is_set():  # a signal before stop.server was set would otherwise be missed
        server.serve_forever(poll_interval=0.2)
    markers.emit(markers.SHUTTING_DOWN)
    server.server_close()
    # The listener is closed; let requests already accepted finish their answer (bounded).
    if not app.drain(DRAIN_TIMEOUT_S):
        markers.emit(f"{markers.MARKER_PREFIX}requests still in flight after {DRAIN_TIMEOUT_S:.0f} s; exiting")
    # The inference thread is NOT stopped: on CUDA it owns the CUDA-graph trees in its thread-local state,
    # and letting that thread exit (tearing them down) while the process ends crashed one run with SIGSEGV
    # on an H100. It is idle here (drained) and ends with the process (os._exit in __main__).
    return EXIT_OK


if __name__ == "__main__":
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter finalization: one CUDA run (H100, torch 2.11) hung for minutes after "shutting down"
    # somewhere in it (torch's atexit handlers, CUDA-graph teardown), which would turn a graceful stop into
    # a stop timeout. Nothing of ours needs finalizing: artifacts are fsynced, the scratch dir is removed.
    os._exit(exit_code)
