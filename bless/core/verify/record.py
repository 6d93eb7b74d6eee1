"""Recording a tree: every file (size and sha256) and directory of a staged cache, or why it cannot be recorded."""

from __future__ import annotations

import os
from pathlib import Path

from bless.core.relpath import check_relative_path
from bless.core.untrusted_text import shown
from bless.core.verify.hashing import HashOutcome, ProgressFn, hash_many
from bless.core.verify.results import ROOT_PATH, FileEntry, Problem, TreeError, TreeListing, sort_problems
from bless.core.verify.walk import OpenFailure, open_root, quoted, scan_tree

__all__ = ["hash_tree"]


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
        root_fd = open_root(Path(root))
    except OpenFailure as failure:
        raise TreeError(failure.detail, [Problem(failure.kind, ROOT_PATH, failure.detail)]) from None
    try:
        scan = scan_tree(root_fd)
        outcomes: list[HashOutcome] = []
        problems: list[Problem] = []
        problems += [
            Problem("symlink", p, f"symbolic link to {quoted(t)} (a staged cache must hold plain files)")
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
            outcomes = hash_many(root_fd, [(p, st.st_size) for p, st in scan.files.items()], workers, progress)
            problems += [o.problem for o in outcomes if o.problem is not None]
    finally:
        os.close(root_fd)
    if problems:
        ordered = sort_problems(problems)
        named = "; ".join(f"{shown(p.path)}: {p.detail}" for p in ordered[:5])
        more = f" (and {len(ordered) - 5} more)" if len(ordered) > 5 else ""
        raise TreeError(f"cannot record tree {quoted(str(root))}: {named}{more}", ordered)
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
