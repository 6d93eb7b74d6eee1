"""Checking a tree on disk against a recorded listing: every difference, as problems and notices.

Sizes are compared (``lstat``) before any hashing; a file of the wrong size is never read.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bless.core.relpath import check_relative_path
from bless.core.verify.hashing import HashOutcome, ProgressFn, hash_many
from bless.core.verify.results import (
    ROOT_PATH,
    FileEntry,
    Notice,
    Problem,
    ProblemKind,
    TreeCheck,
    sort_problems,
)
from bless.core.verify.walk import OpenFailure, Scan, open_root, parents, quoted, scan_tree

__all__ = ["verify_tree"]


def verify_tree(
    root: Path,
    files: Sequence[FileEntry],
    dirs: Sequence[str] = (),
    *,
    workers: int | None = None,
    progress: ProgressFn | None = None,
    expect_read_only: bool = True,
) -> TreeCheck:
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
        A :class:`TreeCheck`; problems sorted by (path, kind), notices by path.
    """
    started = time.perf_counter()
    findings = _Findings()
    expected = _read_listing(files, dirs, findings)
    try:
        root_fd = open_root(Path(root))
    except OpenFailure as failure:
        findings.report(failure.kind, ROOT_PATH, failure.detail)
        return findings.result(files_checked=0, bytes_hashed=0, started=started)
    try:
        scan = scan_tree(root_fd)
        jobs = _compare_entries(scan, expected, findings)
        outcomes = hash_many(root_fd, jobs, workers, progress) if jobs else []
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

    def result(self, *, files_checked: int, bytes_hashed: int, started: float) -> TreeCheck:
        return TreeCheck(
            ok=not self.problems,
            problems=sort_problems(self.problems),
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
        expected_dirs.update(parents(path))
    return _Expected(expected, frozenset(claimed_files), frozenset(explicit_dirs), frozenset(expected_dirs))


def _compare_entries(scan: Scan, expected: _Expected, findings: _Findings) -> list[tuple[str, int]]:
    """Step 2, what is on disk against the listing, by kind and size; returns the files left to hash.

    A regular file where the listing implies a directory blocks what is listed below it
    (``scan.blocked``), so that those are reported as not checked rather than missing.
    """
    for path, target in scan.symlinks.items():
        findings.report("symlink", path, f"symbolic link to {quoted(target)} (symlinks are never followed)")
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


def _compare_digests(outcomes: Sequence[HashOutcome], expected: _Expected, findings: _Findings) -> int:
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


def _report_absent(scan: Scan, expected: _Expected, findings: _Findings) -> None:
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


def _writable_findings(scan: Scan, expected: _Expected, findings: _Findings) -> None:
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


def _blocked_ancestor(path: str, blocked: dict[str, str]) -> str | None:
    for parent in parents(path):
        if parent in blocked:
            return f"parent {quoted(parent)} {blocked[parent]}"
    if ROOT_PATH in blocked:
        return f"the cache root {blocked[ROOT_PATH]}"
    return None
