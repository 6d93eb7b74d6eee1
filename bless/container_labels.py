"""Container labels: the one place that names them. We only ever stop or remove what carries OWNER.

Machines are shared (CI runners, team GPU boxes): every container and volume bless creates for a store root
carries that root's identity (:data:`STORE`, a short hash of its resolved path, also in the object's name, and
:data:`STORE_ROOT`), and a leftover counts as ours only when this store made it (:func:`made_by_store`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

OWNER = "org.bless.owner"
OWNER_VALUE = "bless"
RUN_ID = "org.bless.run-id"
PHASE = "org.bless.phase"
CONFIG_HASH = "org.bless.config-hash"
PROFILE = "org.bless.profile"
# JSON {"host", "pid", "proc_start"} of the bless process that created a bless-run container: a leftover is
# only removed once that process is gone (another store root may bless the same config right now).
OWNER_PROCESS = "org.bless.owner-process"
# The store root (absolute) of a serve container: its lease and serve dir live there, so only a stop run
# against that root may stop it (one from another root would strand them).
STORE_ROOT = "org.bless.store-root"
# The store root's tag (:func:`store_tag`): what a leftover is matched by, and what names carry.
STORE = "org.bless.store"

PHASE_BOOTSTRAP = "bootstrap"
PHASE_TRIAL = "trial"
PHASE_SERVE = "serve"
PHASE_HELPER = "helper"


def store_tag(root: Path) -> str:
    """The 8 hex digits that name ``root``'s objects on a shared engine (a hash of its real path).

    Two spellings of one directory (a symlink, a relative ``--root``) give one tag; two roots, two tags.
    """
    return hashlib.sha256(str(Path(root).resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:8]


def store_labels(root: Path) -> dict[str, str]:
    """The labels that say which store root made an object: its tag and its real path."""
    return {STORE: store_tag(root), STORE_ROOT: str(Path(root).resolve())}


def labels_for(
    *, run_id: str, phase: str, config_hash: str, profile: str, store_root: Path | None = None
) -> dict[str, str]:
    """The full label set every container (and overlay volume) we create carries."""
    found = {
        OWNER: OWNER_VALUE,
        RUN_ID: run_id,
        PHASE: phase,
        CONFIG_HASH: config_hash,
        PROFILE: profile,
    }
    if store_root is not None:
        found.update(store_labels(store_root))
    return found


def made_by_store(labels: Mapping[str, str] | None, tag: str) -> bool:
    """True only for an object of ours made for the store root whose :func:`store_tag` is ``tag``."""
    return is_ours(dict(labels or {})) and (labels or {}).get(STORE) == tag


def other_store_root(labels: Mapping[str, str], root: Path) -> str | None:
    """The store root a container records when it is not ``root`` (None: ``root``'s, or unrecorded)."""
    recorded = labels.get(STORE_ROOT)
    if not recorded or recorded == str(root):
        return None
    try:
        # Two spellings of one directory (a symlink, a relative --root) are the same store.
        if Path(recorded).samefile(root):
            return None
    except OSError:
        pass
    return recorded


def is_ours(labels: dict[str, str] | None) -> bool:
    """True only for objects we created (owner label set to our value)."""
    return bool(labels) and (labels or {}).get(OWNER) == OWNER_VALUE
