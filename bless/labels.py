"""Container labels: the one place that names them. We only ever stop or remove what carries OWNER."""

from __future__ import annotations

OWNER = "org.bless.owner"
OWNER_VALUE = "bless"
RUN_ID = "org.bless.run-id"
PHASE = "org.bless.phase"
CONFIG_HASH = "org.bless.config-hash"
PROFILE = "org.bless.profile"
# JSON {"host", "pid", "proc_start"} of the bless process that created a bless-run container: a leftover is
# only removed once that process is gone (another store root may bless the same config right now).
OWNER_PROCESS = "org.bless.owner-process"

PHASE_BOOTSTRAP = "bootstrap"
PHASE_TRIAL = "trial"
PHASE_SERVE = "serve"
PHASE_HELPER = "helper"


def labels_for(*, run_id: str, phase: str, config_hash: str, profile: str) -> dict[str, str]:
    """The full label set every container (and overlay volume) we create carries."""
    return {
        OWNER: OWNER_VALUE,
        RUN_ID: run_id,
        PHASE: phase,
        CONFIG_HASH: config_hash,
        PROFILE: profile,
    }


def is_ours(labels: dict[str, str] | None) -> bool:
    """True only for objects we created (owner label set to our value)."""
    return bool(labels) and (labels or {}).get(OWNER) == OWNER_VALUE
