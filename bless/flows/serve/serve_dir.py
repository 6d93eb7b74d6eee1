"""The serve dir of one start: ``<root>/serve/<name>-<time>-<token>/`` with the overlay's upper layer.

It holds what the engine wrote (``upper/``), its log and, after a canary failure, the canary's
outcome: evidence kept on failure or with ``--keep-upper``, discarded otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bless.errors import BlessError
from bless.evidence_types import UpperEntry
from bless.runtime.base import Runtime

ENGINE_LOG = "engine.log"
#: The engine's private HOME and temp dir (home/, tmp/), fresh at the start, discarded with the serve dir.
PRIVATE_DIR = "private"
CANARY_FILE = "canary.json"
_MAX_UPPER_REPORTED = 200


def new_serve_dir(serve_root: Path, profile_name: str, now: datetime | None = None) -> Path:
    """A fresh serve dir path under ``serve_root`` (the store's ``serve/``) for one start (not created)."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    # The token keeps two starts within one second apart (the second is refused by name anyway).
    return serve_root / f"{profile_name}-{stamp}-{secrets.token_hex(3)}"


def save_evidence(serve_dir: Path, log: str, extra: Mapping[str, Any] | None = None) -> None:
    """Keep the engine log (and the canary outcome) next to the upper layer. Best effort."""
    with contextlib.suppress(OSError):
        serve_dir.mkdir(parents=True, exist_ok=True)
        (serve_dir / ENGINE_LOG).write_text(log, encoding="utf-8", errors="replace")
        if extra is not None:
            (serve_dir / CANARY_FILE).write_text(json.dumps(extra, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def upper_summary(entries: Sequence[UpperEntry]) -> list[dict[str, Any]]:
    """The first entries of an upper layer, JSON-ready."""
    return [{"path": e.path, "kind": e.kind, "size": e.size} for e in entries[:_MAX_UPPER_REPORTED]]


def discard_serve_dir(serve_dir: Path, *, runtime: Runtime, image: str | None) -> str | None:
    """Remove a serve dir (upper layer, work dir, log); returns why it could not be, or None."""
    if not os.path.lexists(serve_dir):
        return None
    try:
        shutil.rmtree(serve_dir)
        return None
    except OSError:
        pass
    # Files the engine wrote as root in its container; a helper container of ours makes them ours.
    try:
        runtime.normalize_ownership(serve_dir, image=image)
        shutil.rmtree(serve_dir)
        return None
    except (OSError, BlessError) as exc:
        return f"could not remove {serve_dir}: {exc}"
