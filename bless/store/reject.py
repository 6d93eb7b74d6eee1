"""Keeping a candidate that was not published as evidence, in one of two places:
``rejected/<hash>/<run_id>-c<N>/`` (the trials judged it) or ``interrupted/<hash>/<run_id>-c<N>/`` (a
signal stopped the run first: no verdict, so nothing reading ``rejected/`` counts it as a rejection).

Both are written the same way: the directory is assembled under a ``.partial-`` name and renamed into
place, so it appears complete or not at all; a ``.partial-`` dir left by a crash holds the moved tree
(evidence), and :meth:`Store.recover` completes it instead of deleting it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bless.errors import InputInvalidError
from bless.store.faults import FaultHook
from bless.store.gc import recover
from bless.store.layout import PARTIAL_PREFIX, check_hash, check_run_id
from bless.store.publish import rename_staged
from bless.system.durable import atomic_write_bytes, ensure_dir, fsync_dir
from bless.system.os_refusals import os_refusal

if TYPE_CHECKING:
    from bless.store.parts import StoreParts

__all__ = ["reject"]


def reject(
    parts: StoreParts,
    staged_dir: Path,
    *,
    config_hash: str,
    run_id: str,
    candidate: int,
    summary_md: str,
    evidence: Mapping[str, Any],
    fault: FaultHook,
    interrupted: bool = False,
) -> Path:
    """See :meth:`bless.store.Store.reject`."""
    if interrupted:
        base, what = parts.paths.interrupted, "the evidence of an interrupted run"
    else:
        base, what = parts.paths.rejected, "rejected evidence"
    return _keep_evidence(
        parts,
        base,
        what,
        staged_dir,
        config_hash=config_hash,
        run_id=run_id,
        candidate=candidate,
        summary_md=summary_md,
        evidence=evidence,
        fault=fault,
    )


def _keep_evidence(
    parts: StoreParts,
    base: Path,
    what: str,
    staged_dir: Path,
    *,
    config_hash: str,
    run_id: str,
    candidate: int,
    summary_md: str,
    evidence: Mapping[str, Any],
    fault: FaultHook,
) -> Path:
    """Assemble ``base/<hash>/<run_id>-c<candidate>/`` under a ``.partial-`` name and rename it into place."""
    check_hash(config_hash)
    check_run_id(run_id)
    if isinstance(candidate, bool) or not isinstance(candidate, int) or candidate < 0:
        raise InputInvalidError(f"candidate must be a non-negative integer, got {candidate!r}")
    try:
        evidence_bytes = (
            json.dumps(evidence, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"
        ).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InputInvalidError(f"{what} is not JSON-serializable: {exc}") from None
    staged_dir = Path(staged_dir).absolute()
    parts.paths.ensure_layout()
    with parts.locks.lock(config_hash):
        recover(parts, fault=fault)
        fault("reject-start")
        parent = base / config_hash
        name = f"{run_id}-c{candidate}"
        final = parent / name
        if os.path.lexists(final):
            raise InputInvalidError(f"{what} {final} already exists; it is never overwritten")
        partial = parent / f"{PARTIAL_PREFIX}{name}-{secrets.token_hex(4)}"
        try:
            ensure_dir(parent)
            ensure_dir(partial)
            fault("reject-move-tree")
            if os.path.lexists(staged_dir):
                _move_evidence(parts, staged_dir, partial / "tree")
            fault("reject-write-summary")
            atomic_write_bytes(partial / "summary.md", summary_md.encode("utf-8"))
            fault("reject-write-evidence")
            atomic_write_bytes(partial / "evidence.json", evidence_bytes)
            fault("reject-rename")
            partial.rename(final)
            fsync_dir(parent)
            fsync_dir(base)
            fault("reject-done")
        except OSError as exc:
            # The partial dir may hold the moved tree: it is evidence, recover() completes it.
            raise os_refusal(
                exc,
                f"keeping {what} in {final}",
                hint="nothing was published; a dry run of gc shows what is left",
                remedy="gc_dry_run",
            ) from exc
    return final


def _move_evidence(parts: StoreParts, source: Path, destination: Path) -> None:
    if rename_staged(parts.paths, source, destination):
        return
    if stat.S_ISDIR(os.lstat(source).st_mode):
        shutil.copytree(source, destination, symlinks=True)
    else:
        shutil.copy2(source, destination, follow_symlinks=False)
