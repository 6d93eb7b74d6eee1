"""Hashing the files of a tree in parallel: each opened below the root without following a link, then confirmed.

Files are opened with ``O_NONBLOCK`` so that a FIFO swapped in after the scan cannot block the open
forever, then ``fstat``-ed to confirm they are still regular files of the expected size. Hashing runs
in a thread pool: ``hashlib`` releases the GIL while hashing large buffers and ``readinto``/``readv``
release it while reading, so threads give real parallelism.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from bless.core.verify.results import Problem, ProblemKind
from bless.core.verify.walk import OPEN_FILE_FLAGS, OpenFailure, describe_special, open_below

__all__ = ["HashOutcome", "ProgressFn", "default_workers", "hash_file", "hash_many"]

# 1 MiB: large enough that per-call overhead (syscall, GIL hand-off, hashlib call) is negligible
# next to hashing, small enough to stay cache-friendly. Measured on the 2-core dev box: 64 KiB to
# 4 MiB all hash within a few percent of each other; 1 MiB is the middle of that plateau.
_BUF_SIZE = 1 << 20

ProgressFn = Callable[[int], None]


def default_workers() -> int:
    """The default hashing thread count: one per usable CPU, at least 2, at most 32.

    SHA-256 of page-cached data is CPU-bound, so one thread per CPU is the sweet spot. Measured
    with ``scripts/bench/bench_verify.py`` (many-file set, warm cache) on a 16-vCPU Xeon: 1/2/4/8/16
    threads gave 1.1/2.2/4.2/7.9/12.2 GB/s (so a cap of 8 would leave 1.5x on the table), while
    32 threads fell back to 7.0 GB/s: oversubscription hurts (GIL hand-offs between many
    threads), so this is not "2 x CPUs". On the 2-vCPU dev VM, whose two vCPUs together hash no
    faster than one, 1 to 8 threads were all within noise. The floor of 2 keeps a read in flight
    while another file hashes on one-CPU boxes; the cap bounds descriptors and buffer memory (one
    1 MiB buffer per thread) on very large hosts, where memory bandwidth saturates first anyway.
    """
    try:
        cpus = len(os.sched_getaffinity(0))  # honours cgroup cpusets / taskset
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(2, min(32, cpus))


_thread_state = threading.local()


def _read_buffer() -> memoryview:
    """A per-thread reusable read buffer (allocating 1 MiB per file would memset it each time)."""
    buf: memoryview | None = getattr(_thread_state, "buf", None)
    if buf is None:
        buf = memoryview(bytearray(_BUF_SIZE))
        _thread_state.buf = buf
    return buf


@dataclass(frozen=True)
class HashOutcome:
    """One file hashed, or the problem that stopped it."""

    path: str
    digest: str | None  # None when a problem prevented a full hash
    size: int
    bytes_hashed: int
    problem: Problem | None


def hash_file(root_fd: int, rel: str, expected_size: int, progress: ProgressFn | None) -> HashOutcome:
    """Hash one file below ``root_fd``, confirming it is still a regular file of ``expected_size``.

    Reading stops as soon as more than ``expected_size`` bytes arrive, so a file that grows while
    being read (or is swapped for something endless) cannot keep us busy.
    """
    try:
        fd = open_below(root_fd, rel, OPEN_FILE_FLAGS)
    except OpenFailure as failure:
        return HashOutcome(rel, None, -1, 0, Problem(failure.kind, rel, failure.detail))
    hashed = 0

    def failed(kind: ProblemKind, detail: str, size: int = -1) -> HashOutcome:
        return HashOutcome(rel, None, size, hashed, Problem(kind, rel, detail))

    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return failed("not_regular", f"became {describe_special(st.st_mode)} during verification")
        if st.st_size != expected_size:
            return failed("size", f"expected {expected_size} bytes, found {st.st_size}", st.st_size)
        digest = hashlib.sha256()
        buf = _read_buffer()
        while True:
            n = os.readv(fd, [buf])
            if n == 0:
                break
            if hashed + n > expected_size:
                return failed("size", f"expected {expected_size} bytes, but it grew while being read")
            digest.update(buf[:n])
            hashed += n
            if progress is not None:
                progress(n)
        if hashed != expected_size:
            return failed("size", f"expected {expected_size} bytes, read only {hashed} (it shrank while being read)")
        after = os.fstat(fd)
        if (after.st_mtime_ns, after.st_ctime_ns) != (st.st_mtime_ns, st.st_ctime_ns):
            # Rewritten in place while we read it: the digest may mix old and new bytes. ctime moves on
            # every write and cannot be set back, so putting the mtime back does not hide it.
            return failed("changed_during_verify", "written to while it was being hashed; verify again", hashed)
        return HashOutcome(rel, digest.hexdigest(), hashed, hashed, None)
    except OSError as exc:
        return failed("unreadable", f"read error: {exc.strerror or exc}")
    finally:
        os.close(fd)


def hash_many(
    root_fd: int,
    jobs: Sequence[tuple[str, int]],
    workers: int | None,
    progress: ProgressFn | None,
) -> list[HashOutcome]:
    """Hash ``(path, expected_size)`` jobs, in parallel when it can help."""
    if workers is None:
        workers = default_workers()
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    # Largest first (LPT scheduling): a big file started last would leave the other cores idle.
    ordered = sorted(jobs, key=lambda job: (-job[1], job[0]))
    workers = min(workers, len(ordered))
    if workers <= 1:
        return [hash_file(root_fd, path, size, progress) for path, size in ordered]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bless-hash") as pool:
        futures: list[Future[HashOutcome]] = [
            pool.submit(hash_file, root_fd, path, size, progress) for path, size in ordered
        ]
        try:
            return [future.result() for future in futures]
        except BaseException:
            # e.g. the progress callback raised or Ctrl-C: do not keep hashing in the background.
            pool.shutdown(wait=True, cancel_futures=True)
            raise
