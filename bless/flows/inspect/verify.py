"""``bless verify``: a blessed cache against its manifest, and under ``--trust`` its signature."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bless.core.json_form import JsonForm, as_json
from bless.core.verify import Problem, TreeCheck
from bless.errors import VerifyFailedError
from bless.flows.lookup import lookup_live
from bless.flows.trust_policy import trust_verdict
from bless.store import Store
from bless.trust import TrustVerdict, trust_report

__all__ = ["ProgressFactory", "VerifyOutcome", "verify_blessing"]

#: Given the bytes about to be hashed, a context whose value is a ``progress(nbytes)`` callback (or None:
#: no progress shown). The caller draws it; the hashing threads call it.
ProgressFactory = Callable[[int], AbstractContextManager[Callable[[int], None] | None]]


@dataclass(frozen=True)
class VerifyOutcome(JsonForm):
    """A verified blessing: the tree check, and the trust verdict (None: unsigned, no ``--trust``).

    Its JSON form is ``bless verify --json``'s: the verdict first, the trust section as :func:`trust_report`."""

    json_keys = ("ok", "config_hash", "blessed_dir", "result", "trust")

    config_hash: str
    blessed_dir: Path
    result: TreeCheck
    trust: TrustVerdict | None = field(metadata=as_json(to_json=trust_report))

    def json_extra(self) -> dict[str, Any]:
        """The verdict: whether the tree matches its manifest."""
        return {"ok": self.ok}

    @property
    def ok(self) -> bool:
        """Whether every blessed file matches its manifest, and nothing else is there."""
        return self.result.ok

    @property
    def problems(self) -> tuple[Problem, ...]:
        """Every difference between the tree and its manifest (empty when :attr:`ok`)."""
        return self.result.problems

    @property
    def failure(self) -> VerifyFailedError | None:
        """The refusal (21) naming every problem, reported after them; None when the tree matches."""
        if self.result.ok:
            return None
        return VerifyFailedError.from_result(self.result, self.blessed_dir, config_hash=self.config_hash)


def verify_blessing(
    store: Store,
    text: str,
    *,
    trust_dir: Path | None = None,
    progress: ProgressFactory | None = None,
    workers: int | None = None,
) -> VerifyOutcome:
    """Verify the blessing ``text`` names (a config hash or a unique prefix): every file's size and sha256,
    nothing extra; under ``trust_dir`` its manifest must first be a validly signed, current TUF target.
    ``workers``: hashing threads (None: the default).

    Raises:
        NoManifestError, InputInvalidError, ManifestInvalidError, ManifestDuplicateError: the lookup.
        TrustError subclasses (60-66): the trust check.
        VerifyFailedError: the permissions check (a tree that does not match is a result, not a raise).
    """
    live = lookup_live(store, text)
    manifest = live.manifest
    verdict = trust_verdict(store, manifest, trust_dir, data=live.document)
    blessed_dir = store.blessed_dir(manifest)
    if progress is None:
        result = store.verify_blessing(manifest, workers=workers)
    else:
        with progress(manifest.cache.total_size) as advance:
            result = store.verify_blessing(manifest, progress=advance, workers=workers)
    return VerifyOutcome(manifest.config_hash, blessed_dir, result, verdict)
