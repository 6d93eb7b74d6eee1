"""Pure verification of a cache tree against an expected listing.

A blessed cache is a tree of plain files and directories. This module records such a tree
(:func:`hash_tree`) and checks a tree on disk against a recorded listing (:func:`verify_tree`).
It is library code: nothing here prints or exits; results are returned as values and the only
exception raised on purpose is :class:`TreeError` (from :func:`hash_tree`).

Safety rules that shape the code:

* Symbolic links are never followed, neither for files nor for directories. Every path below the
  root is opened component by component relative to a directory file descriptor with
  ``O_NOFOLLOW``, so a file or directory swapped for a symlink after the scan is caught at open
  time instead of being read through. (A plain ``os.open(root / rel, O_NOFOLLOW)`` would only
  protect the last component.) The root itself must not be a symlink either; its *ancestors* are
  resolved by the OS as usual, so callers that use pointer symlinks must resolve them first.
* Files are opened with ``O_NONBLOCK`` so that a FIFO swapped in after the scan cannot block the
  open forever, then ``fstat``-ed to confirm they are still regular files of the expected size.
* Sizes are compared (``lstat``) before any hashing; a file of the wrong size is never read.
* Hashing runs in a thread pool: ``hashlib`` releases the GIL while hashing large buffers and
  ``readinto``/``readv`` release it while reading, so threads give real parallelism.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bless.core.relpath import check_relative_path
from bless.core.untrusted_text import shown

__all__ = [
    "ROOT_PATH",
    "FileEntry",
    "Notice",
    "Problem",
    "ProblemKind",
    "TreeError",
    "TreeListing",
    "VerifyResult",
    "default_workers",
    "hash_tree",
    "verify_tree",
]

ProblemKind = Literal[
    "missing",
    "extra",
    "size",
    "sha256",
    "symlink",
    "bad_path",
    "not_regular",
    "unreadable",
    "missing_dir",
    "extra_dir",
    "root_missing",
    "writable_by_others",
    "special_mode",
    "changed_during_verify",
]
NoticeKind = Literal["writable"]

#: The path used in problems and notices that concern the root directory itself.
ROOT_PATH = "."

# 1 MiB: large enough that per-call overhead (syscall, GIL hand-off, hashlib call) is negligible
# next to hashing, small enough to stay cache-friendly. Measured on the 2-core dev box: 64 KiB to
# 4 MiB all hash within a few percent of each other; 1 MiB is the middle of that plateau.
_BUF_SIZE = 1 << 20

_OPEN_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO read-only would otherwise block until a writer appears.
# O_NOCTTY: never let a swapped-in terminal device become our controlling terminal.
_OPEN_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

_HEX_DIGITS = frozenset("0123456789abcdef")

ProgressFn = Callable[[int], None]


# --------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class FileEntry:
    """One regular file of a cache tree.

    ``path`` is POSIX, relative to the cache root and normalized. It is deliberately *not*
    validated here: a listing read from an untrusted manifest must still be representable so that
    :func:`verify_tree` can report a bad path as a ``bad_path`` problem. ``size`` and ``sha256``
    are validated (a non-negative int and 64 lowercase hex digits) because no tree can match a
    malformed value and a clear error beats a confusing mismatch.
    """

    path: str
    size: int
    sha256: str

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"{self.path!r}: size must be a non-negative integer, got {self.size!r}")
        if not isinstance(self.sha256, str) or len(self.sha256) != 64 or not _HEX_DIGITS.issuperset(self.sha256):
            raise ValueError(f"{self.path!r}: sha256 must be 64 lowercase hex digits, got {self.sha256!r}")


@dataclass(frozen=True)
class TreeListing:
    """The recorded content of a tree: every file (sorted by path) and every directory (sorted).

    ``dirs`` lists every directory below the root (not the root itself), including empty ones, so
    that an added or removed empty directory is detected.
    """

    files: tuple[FileEntry, ...]
    dirs: tuple[str, ...]
    total_size: int


@dataclass(frozen=True)
class Problem:
    """One reason a tree does not match its listing.

    ``path`` is the name as it is on disk or in the listing (data: escape it with
    :func:`bless.core.untrusted_text.shown` to show it); ``detail`` is a human sentence whose names are escaped.
    """

    kind: ProblemKind
    path: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        """Return a JSON-ready dict."""
        return {"kind": self.kind, "path": self.path, "detail": self.detail}


@dataclass(frozen=True)
class Notice:
    """Something worth saying that is not a failure (e.g. a blessed file is writable)."""

    kind: NoticeKind
    path: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        """Return a JSON-ready dict."""
        return {"kind": self.kind, "path": self.path, "detail": self.detail}


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of :func:`verify_tree`.

    ``ok`` is true exactly when there are no problems (notices do not count).
    ``files_checked`` counts listed files found on disk as regular files and compared (by size,
    and by content when the size matched). ``bytes_hashed`` counts bytes fed to SHA-256.
    """

    ok: bool
    problems: tuple[Problem, ...]
    notices: tuple[Notice, ...]
    files_checked: int
    bytes_hashed: int
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (problems and notices as lists of dicts)."""
        return {
            "ok": self.ok,
            "problems": [p.to_dict() for p in self.problems],
            "notices": [n.to_dict() for n in self.notices],
            "files_checked": self.files_checked,
            "bytes_hashed": self.bytes_hashed,
            "elapsed_s": self.elapsed_s,
        }


class TreeError(ValueError):
    """A tree cannot be recorded faithfully (symlinks, special files, unreadable entries, ...).

    ``problems`` holds every reason found, in the same form :func:`verify_tree` uses.
    """

    def __init__(self, message: str, problems: Sequence[Problem] = ()) -> None:
        super().__init__(message)
        self.problems: tuple[Problem, ...] = tuple(problems)


def _parents(path: str) -> Iterable[str]:
    """Yield every proper ancestor directory of a relative path ('a/b/c' -> 'a/b', 'a')."""
    idx = path.rfind("/")
    while idx > 0:
        path = path[:idx]
        yield path
        idx = path.rfind("/")


def _quoted(name: str) -> str:
    """A name from disk inside a problem's detail: quoted, non-printables escaped (details are shown to humans)."""
    return f"'{shown(name)}'"


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


def default_workers() -> int:
    """The default hashing thread count: one per usable CPU, at least 2, at most 32.

    SHA-256 of page-cached data is CPU-bound, so one thread per CPU is the sweet spot. Measured
    with ``scripts/bench_verify.py`` (many-file set, warm cache) on a 16-vCPU Xeon: 1/2/4/8/16
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


# --------------------------------------------------------------------------------------------
# Low-level, descriptor-relative I/O


class _OpenFailure(Exception):
    """Why a path below the root could not be opened, already mapped to a problem kind."""

    def __init__(self, kind: ProblemKind, detail: str) -> None:
        super().__init__(detail)
        self.kind: ProblemKind = kind
        self.detail = detail


def _classify_open_error(exc: OSError, dir_fd: int, name: str, rel: str) -> _OpenFailure:
    """Turn an ``os.open`` error on ``name`` (relative to ``dir_fd``) into a problem kind.

    With ``O_NOFOLLOW`` Linux reports a symlink as ELOOP (plain open) or ENOTDIR (with
    ``O_DIRECTORY``); an lstat disambiguates ENOTDIR between "symlink" and "a file".
    """
    code = exc.errno
    if code in (errno.ELOOP, errno.ENOTDIR):
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            st = None
        if code == errno.ELOOP or (st is not None and stat.S_ISLNK(st.st_mode)):
            return _OpenFailure("symlink", f"{_quoted(rel)} became a symbolic link during verification")
        return _OpenFailure("missing", f"{_quoted(rel)} is no longer a directory")
    if code == errno.ENOENT:
        return _OpenFailure("missing", f"{_quoted(rel)} vanished during verification")
    if code == errno.ENXIO:
        return _OpenFailure("not_regular", f"{_quoted(rel)} is not a regular file (socket or device)")
    return _OpenFailure("unreadable", f"cannot open {_quoted(rel)}: {exc.strerror or exc}")


def _open_below(root_fd: int, rel: str, final_flags: int) -> int:
    """Open ``rel`` below ``root_fd`` one component at a time, never following a symlink.

    Raises:
        _OpenFailure: mapped from the OS error.
    """
    parts = rel.split("/")
    fd = root_fd
    done = ""
    try:
        for part in parts[:-1]:
            done = _join(done, part)
            try:
                next_fd = os.open(part, _OPEN_DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise _classify_open_error(exc, fd, part, done) from None
            if fd != root_fd:
                os.close(fd)
            fd = next_fd
        try:
            return os.open(parts[-1], final_flags, dir_fd=fd)
        except OSError as exc:
            raise _classify_open_error(exc, fd, parts[-1], rel) from None
    finally:
        if fd != root_fd:
            os.close(fd)


def _open_root(root: Path) -> int:
    """Open the root directory without following a symlink in its last component.

    Raises:
        _OpenFailure: kind ``root_missing``, ``symlink`` or ``unreadable``.
    """
    try:
        return os.open(root, _OPEN_DIR_FLAGS)
    except FileNotFoundError:
        raise _OpenFailure("root_missing", f"cache root {str(root)!r} does not exist") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                st = os.lstat(root)
            except OSError:
                st = None
            if exc.errno == errno.ELOOP or (st is not None and stat.S_ISLNK(st.st_mode)):
                raise _OpenFailure(
                    "symlink", f"cache root {str(root)!r} is a symbolic link (resolve it first)"
                ) from None
            raise _OpenFailure("root_missing", f"cache root {str(root)!r} is not a directory") from None
        raise _OpenFailure("unreadable", f"cannot open cache root {str(root)!r}: {exc.strerror or exc}") from None


def _describe_special(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return f"a special file (mode {stat.filemode(mode)})"


@dataclass
class _Scan:
    """What a walk of the tree found, keyed by relative POSIX path."""

    root_mode: int = 0
    files: dict[str, os.stat_result] = field(default_factory=dict)
    dirs: dict[str, os.stat_result] = field(default_factory=dict)
    symlinks: dict[str, str] = field(default_factory=dict)  # path -> link target (for humans)
    specials: dict[str, str] = field(default_factory=dict)  # path -> description
    unreadable: dict[str, str] = field(default_factory=dict)  # path -> reason
    # Directories we could not descend into; listed paths below them are reported as such.
    blocked: dict[str, str] = field(default_factory=dict)  # path -> why (short phrase)


def _scan(root_fd: int) -> _Scan:
    """Walk the tree below ``root_fd`` without following symlinks, classifying every entry.

    Directories are reopened from the root one component at a time (``_open_below``) rather than
    keeping a descriptor per pending directory: a wide tree would otherwise exhaust descriptors,
    and the extra opens cost nothing next to hashing.
    """
    scan = _Scan(root_mode=os.fstat(root_fd).st_mode)
    pending: list[str] = [""]
    while pending:
        rel = pending.pop()
        if rel:
            try:
                dir_fd = _open_below(root_fd, rel, _OPEN_DIR_FLAGS)
            except _OpenFailure as failure:
                # The directory changed between being listed and being opened.
                scan.dirs.pop(rel, None)
                if failure.kind == "symlink":
                    scan.symlinks[rel] = "?"
                    scan.blocked[rel] = "is a symbolic link"
                elif failure.kind == "missing":
                    scan.blocked[rel] = "vanished during verification"
                else:
                    scan.unreadable[rel] = failure.detail
                    scan.blocked[rel] = "could not be opened"
                continue
        else:
            dir_fd = root_fd
        try:
            try:
                with os.scandir(dir_fd) as entries:
                    listed = list(entries)
            except OSError as exc:
                where = rel or ROOT_PATH
                scan.unreadable[where] = f"cannot list directory {_quoted(where)}: {exc.strerror or exc}"
                scan.blocked[where] = "could not be listed"
                continue
            for entry in listed:
                child = _join(rel, entry.name)
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # vanished between listing and stat: it is simply not there
                except OSError as exc:
                    scan.unreadable[child] = f"cannot stat {_quoted(child)}: {exc.strerror or exc}"
                    continue
                mode = st.st_mode
                if stat.S_ISREG(mode):
                    scan.files[child] = st
                elif stat.S_ISDIR(mode):
                    scan.dirs[child] = st
                    pending.append(child)
                elif stat.S_ISLNK(mode):
                    try:
                        target = os.readlink(entry.name, dir_fd=dir_fd)
                    except OSError:
                        target = "?"
                    scan.symlinks[child] = target
                    scan.blocked[child] = "is a symbolic link"
                else:
                    scan.specials[child] = _describe_special(mode)
        finally:
            if dir_fd != root_fd:
                os.close(dir_fd)
    return scan


_thread_state = threading.local()


def _read_buffer() -> memoryview:
    """A per-thread reusable read buffer (allocating 1 MiB per file would memset it each time)."""
    buf: memoryview | None = getattr(_thread_state, "buf", None)
    if buf is None:
        buf = memoryview(bytearray(_BUF_SIZE))
        _thread_state.buf = buf
    return buf


@dataclass(frozen=True)
class _HashOutcome:
    path: str
    digest: str | None  # None when a problem prevented a full hash
    size: int
    bytes_hashed: int
    problem: Problem | None


def _hash_file(root_fd: int, rel: str, expected_size: int, progress: ProgressFn | None) -> _HashOutcome:
    """Hash one file below ``root_fd``, confirming it is still a regular file of ``expected_size``.

    Reading stops as soon as more than ``expected_size`` bytes arrive, so a file that grows while
    being read (or is swapped for something endless) cannot keep us busy.
    """
    try:
        fd = _open_below(root_fd, rel, _OPEN_FILE_FLAGS)
    except _OpenFailure as failure:
        return _HashOutcome(rel, None, -1, 0, Problem(failure.kind, rel, failure.detail))
    hashed = 0

    def failed(kind: ProblemKind, detail: str, size: int = -1) -> _HashOutcome:
        return _HashOutcome(rel, None, size, hashed, Problem(kind, rel, detail))

    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return failed("not_regular", f"became {_describe_special(st.st_mode)} during verification")
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
        return _HashOutcome(rel, digest.hexdigest(), hashed, hashed, None)
    except OSError as exc:
        return failed("unreadable", f"read error: {exc.strerror or exc}")
    finally:
        os.close(fd)


def _hash_many(
    root_fd: int,
    jobs: Sequence[tuple[str, int]],
    workers: int | None,
    progress: ProgressFn | None,
) -> list[_HashOutcome]:
    """Hash ``(path, expected_size)`` jobs, in parallel when it can help."""
    if workers is None:
        workers = default_workers()
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    # Largest first (LPT scheduling): a big file started last would leave the other cores idle.
    ordered = sorted(jobs, key=lambda job: (-job[1], job[0]))
    workers = min(workers, len(ordered))
    if workers <= 1:
        return [_hash_file(root_fd, path, size, progress) for path, size in ordered]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bless-hash") as pool:
        futures: list[Future[_HashOutcome]] = [
            pool.submit(_hash_file, root_fd, path, size, progress) for path, size in ordered
        ]
        try:
            return [future.result() for future in futures]
        except BaseException:
            # e.g. the progress callback raised or Ctrl-C: do not keep hashing in the background.
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _sort_problems(problems: Iterable[Problem]) -> tuple[Problem, ...]:
    return tuple(sorted(problems, key=lambda p: (p.path, p.kind, p.detail)))


def _blocked_ancestor(path: str, blocked: dict[str, str]) -> str | None:
    for parent in _parents(path):
        if parent in blocked:
            return f"parent {_quoted(parent)} {blocked[parent]}"
    if ROOT_PATH in blocked:
        return f"the cache root {blocked[ROOT_PATH]}"
    return None


# --------------------------------------------------------------------------------------------
# Public operations


def hash_tree(
    root: Path,
    *,
    workers: int | None = None,
    progress: ProgressFn | None = None,
) -> TreeListing:
    """Record every file (size + sha256) and directory of the tree at ``root``.

    A staged cache must be plain files and directories: symlinks (anywhere, including ``root``
    itself), FIFOs, sockets, devices, unreadable entries and names that
    :func:`check_relative_path` rejects make the tree unrecordable.

    Args:
        root: the cache root directory.
        workers: hashing threads (default :func:`default_workers`).
        progress: called as ``progress(nbytes)`` after each chunk is hashed. It is called from
            worker threads, possibly concurrently: the callee must be thread-safe.

    Raises:
        TreeError: listing every reason the tree cannot be recorded.
    """
    try:
        root_fd = _open_root(Path(root))
    except _OpenFailure as failure:
        raise TreeError(failure.detail, [Problem(failure.kind, ROOT_PATH, failure.detail)]) from None
    try:
        scan = _scan(root_fd)
        outcomes: list[_HashOutcome] = []
        problems: list[Problem] = []
        problems += [
            Problem("symlink", p, f"symbolic link to {_quoted(t)} (a staged cache must hold plain files)")
            for p, t in scan.symlinks.items()
        ]
        problems += [Problem("not_regular", p, f"is {d}") for p, d in scan.specials.items()]
        problems += [Problem("unreadable", p, d) for p, d in scan.unreadable.items()]
        for rel in (*scan.files, *scan.dirs):
            try:
                check_relative_path(rel)
            except ValueError as exc:
                problems.append(Problem("bad_path", rel, f"name cannot be recorded: {exc}"))
        if not problems:
            outcomes = _hash_many(root_fd, [(p, st.st_size) for p, st in scan.files.items()], workers, progress)
            problems += [o.problem for o in outcomes if o.problem is not None]
    finally:
        os.close(root_fd)
    if problems:
        ordered = _sort_problems(problems)
        named = "; ".join(f"{shown(p.path)}: {p.detail}" for p in ordered[:5])
        more = f" (and {len(ordered) - 5} more)" if len(ordered) > 5 else ""
        raise TreeError(f"cannot record tree {_quoted(str(root))}: {named}{more}", ordered)
    entries = tuple(
        sorted(
            (FileEntry(o.path, o.size, o.digest) for o in outcomes if o.digest is not None),
            key=lambda e: e.path,
        )
    )
    return TreeListing(
        files=entries,
        dirs=tuple(sorted(scan.dirs)),
        total_size=sum(e.size for e in entries),
    )


def verify_tree(
    root: Path,
    files: Sequence[FileEntry],
    dirs: Sequence[str] = (),
    *,
    workers: int | None = None,
    progress: ProgressFn | None = None,
    expect_read_only: bool = True,
) -> VerifyResult:
    """Check the tree at ``root`` against an expected listing and report every difference.

    The expected directories are ``dirs`` plus every ancestor of a listed file; anything else on
    disk is ``extra``/``extra_dir``. Only explicitly listed ``dirs`` are reported as
    ``missing_dir`` (a missing implied directory already shows as its files being ``missing``).
    Symlinks are never followed and are always a problem; listed paths that fail
    :func:`check_relative_path` (or are listed twice) are ``bad_path`` and never opened. Sizes
    are compared before hashing, and a file whose size is wrong is not hashed.

    The steps: check the listing itself (:func:`_read_listing`), open the root, walk and classify
    what is on disk (:func:`_compare_entries`), hash what has the right size
    (:func:`_compare_digests`), report what is listed but absent (:func:`_report_absent`), and check
    write bits (:func:`_writable_findings`).

    Args:
        root: the cache root directory (its last component must not be a symlink).
        files: the expected files.
        dirs: the expected directories (relative POSIX; empty directories matter).
        workers: hashing threads (default :func:`default_workers`).
        progress: called as ``progress(nbytes)`` after each chunk is hashed. It is called from
            worker threads, possibly concurrently: the callee must be thread-safe.
        expect_read_only: check write bits on every expected file or directory (and the root):
            writable by group or others is a ``writable_by_others`` problem, the owner's write bit a
            ``writable`` notice (notices never fail verification).

    Returns:
        A :class:`VerifyResult`; problems sorted by (path, kind), notices by path.
    """
    started = time.perf_counter()
    findings = _Findings()
    expected = _read_listing(files, dirs, findings)
    try:
        root_fd = _open_root(Path(root))
    except _OpenFailure as failure:
        findings.report(failure.kind, ROOT_PATH, failure.detail)
        return findings.result(files_checked=0, bytes_hashed=0, started=started)
    try:
        scan = _scan(root_fd)
        jobs = _compare_entries(scan, expected, findings)
        outcomes = _hash_many(root_fd, jobs, workers, progress) if jobs else []
    finally:
        os.close(root_fd)
    bytes_hashed = _compare_digests(outcomes, expected, findings)
    _report_absent(scan, expected, findings)
    if expect_read_only:
        _writable_findings(scan, expected, findings)
    files_checked = sum(1 for path in expected.files if path in scan.files)
    return findings.result(files_checked=files_checked, bytes_hashed=bytes_hashed, started=started)


@dataclass
class _Findings:
    """Problems and notices collected by :func:`verify_tree`'s steps."""

    problems: list[Problem] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    reported: set[str] = field(default_factory=set)  # paths with a problem already: no "missing" on top

    def report(self, kind: ProblemKind, path: str, detail: str) -> None:
        self.problems.append(Problem(kind, path, detail))
        self.reported.add(path)

    def result(self, *, files_checked: int, bytes_hashed: int, started: float) -> VerifyResult:
        return VerifyResult(
            ok=not self.problems,
            problems=_sort_problems(self.problems),
            notices=tuple(sorted(self.notices, key=lambda n: n.path)),
            files_checked=files_checked,
            bytes_hashed=bytes_hashed,
            elapsed_s=time.perf_counter() - started,
        )


@dataclass(frozen=True)
class _Expected:
    """What a valid listing says the tree holds.

    ``files``: valid listed files, each listed once. ``claimed_files``: every valid listed file
    path, duplicates included (a duplicated path is not ``extra`` on disk, only unchecked).
    ``explicit_dirs``: valid listed directories. ``dirs``: those plus every ancestor of a listed path.
    """

    files: dict[str, FileEntry]
    claimed_files: frozenset[str]
    explicit_dirs: frozenset[str]
    dirs: frozenset[str]


def _read_listing(files: Sequence[FileEntry], dirs: Sequence[str], findings: _Findings) -> _Expected:
    """Step 1, the listing itself: bad, duplicated or contradictory paths are ``bad_path``, never opened."""
    claimed_files: set[str] = set()
    expected: dict[str, FileEntry] = {}
    duplicated: set[str] = set()
    for entry in files:
        try:
            check_relative_path(entry.path)
        except ValueError as exc:
            findings.report("bad_path", entry.path, f"listed file path rejected: {exc}")
            continue
        if entry.path in claimed_files:
            duplicated.add(entry.path)
        claimed_files.add(entry.path)
        expected[entry.path] = entry
    for path in sorted(duplicated):
        del expected[path]  # ambiguous: which entry is right? fail closed, do not check it
        findings.report("bad_path", path, "file listed more than once")

    explicit_dirs: set[str] = set()
    for d in dirs:
        try:
            check_relative_path(d)
        except ValueError as exc:
            findings.report("bad_path", d, f"listed directory path rejected: {exc}")
            continue
        if d in explicit_dirs:
            findings.report("bad_path", d, "directory listed more than once")
        elif d in claimed_files:
            findings.report("bad_path", d, "listed both as a file and as a directory")
        explicit_dirs.add(d)
    expected_dirs = set(explicit_dirs)
    for path in (*claimed_files, *explicit_dirs):
        expected_dirs.update(_parents(path))
    return _Expected(expected, frozenset(claimed_files), frozenset(explicit_dirs), frozenset(expected_dirs))


def _compare_entries(scan: _Scan, expected: _Expected, findings: _Findings) -> list[tuple[str, int]]:
    """Step 2, what is on disk against the listing, by kind and size; returns the files left to hash.

    A regular file where the listing implies a directory blocks what is listed below it
    (``scan.blocked``), so that those are reported as not checked rather than missing.
    """
    for path, target in scan.symlinks.items():
        findings.report("symlink", path, f"symbolic link to {_quoted(target)} (symlinks are never followed)")
    for path, what in scan.specials.items():
        findings.report("not_regular", path, f"is {what}, not a regular file")
    for path, why in scan.unreadable.items():
        findings.report("unreadable", path, why)
    for path in scan.dirs:
        if path in expected.claimed_files:
            findings.report("not_regular", path, "expected a regular file, found a directory")
        elif path not in expected.dirs:
            findings.report("extra_dir", path, "directory not in the listing")
    jobs: list[tuple[str, int]] = []
    for path, st in scan.files.items():
        if path in expected.dirs:
            # Only explicit dirs get missing_dir; an implied one shows as its files missing.
            if path in expected.explicit_dirs:
                findings.report("missing_dir", path, "expected a directory, found a regular file")
            else:
                findings.report("extra", path, "regular file where the listing implies a directory")
                scan.blocked[path] = "is a regular file, not a directory"
            continue
        if path not in expected.claimed_files:
            findings.report("extra", path, f"file not in the listing ({st.st_size} bytes)")
            continue
        listed = expected.files.get(path)
        if listed is None:
            continue  # listed twice: already a bad_path
        if st.st_size != listed.size:
            findings.report("size", path, f"expected {listed.size} bytes, found {st.st_size}")
        else:
            jobs.append((path, listed.size))
    return jobs


def _compare_digests(outcomes: Sequence[_HashOutcome], expected: _Expected, findings: _Findings) -> int:
    """Step 3, each hashed file's sha256 against the listing; returns the bytes hashed."""
    bytes_hashed = 0
    for outcome in outcomes:
        bytes_hashed += outcome.bytes_hashed
        want = expected.files[outcome.path].sha256
        if outcome.problem is not None:
            findings.report(outcome.problem.kind, outcome.problem.path, outcome.problem.detail)
        elif outcome.digest != want:
            findings.report("sha256", outcome.path, f"expected sha256 {want}, found {outcome.digest}")
    return bytes_hashed


def _report_absent(scan: _Scan, expected: _Expected, findings: _Findings) -> None:
    """Step 4, what is listed but not there: ``missing`` / ``missing_dir``, or not checked below a blocked dir."""
    for path in expected.files:
        if path in scan.files or path in findings.reported:
            continue
        blocked = _blocked_ancestor(path, scan.blocked)
        findings.report("missing", path, f"not checked: {blocked}" if blocked else "listed but not found")
    for d in expected.explicit_dirs:
        if d in scan.dirs or d in findings.reported or d in expected.claimed_files:
            continue
        blocked = _blocked_ancestor(d, scan.blocked)
        findings.report("missing_dir", d, f"not checked: {blocked}" if blocked else "listed directory not found")


def _writable_findings(scan: _Scan, expected: _Expected, findings: _Findings) -> None:
    """Step 5, the modes of the root and every expected entry (blessed caches are plain read-only data).

    Writable by group or others is a problem: another user could rewrite a file or rename entries in
    a directory while the cache is served, after every byte verified. A setuid, setgid or sticky bit
    is a problem too: publish sets every mode exactly (0444/0555), so such a bit was put there since,
    and a setuid file in a tree a server reads is a privilege waiting to be used. The owner's own
    write bit is a notice: the owner can always chmod, so it takes nothing away that was there.
    """
    candidates: list[tuple[str, int]] = [(ROOT_PATH, scan.root_mode)]
    candidates += [(p, st.st_mode) for p, st in scan.dirs.items() if p in expected.dirs]
    candidates += [(p, st.st_mode) for p, st in scan.files.items() if p in expected.files]
    for path, mode in candidates:
        if mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
            findings.report(
                "special_mode",
                path,
                f"mode {stat.filemode(mode)}: a setuid, setgid or sticky bit (blessed caches are plain read-only "
                "data; bless never sets one)",
            )
        elif mode & 0o022:
            findings.report(
                "writable_by_others", path, f"mode {stat.filemode(mode)}: other users could change it (chmod go-w)"
            )
        elif mode & 0o200:
            findings.notices.append(
                Notice(
                    "writable", path, f"mode {stat.filemode(mode)} has a write bit set (blessed caches are read-only)"
                )
            )
