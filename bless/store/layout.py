"""Where things are under a store root, and the names allowed there.

Every name that becomes a path component (config hash, dir id, run id) is checked with a FULL
match: a ``$``-anchored regex would accept a trailing newline, which then names another directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from bless.core.factors import is_config_hash
from bless.errors import BlessError, InputInvalidError, ManifestInvalidError, UsageError
from bless.system.durable import ensure_dir
from bless.system.os_refusals import os_errors

__all__ = [
    "NEW_STAGING_PREFIX",
    "OWNER_FILE",
    "PARTIAL_PREFIX",
    "PUBLISHING_PREFIX",
    "SERVE_SEAL_WATCHER",
    "SERVE_SEAL_WATCHER_LOG",
    "SERVE_SEAL_WATCH_DOC",
    "SERVE_UNPROVEN_COMPILES",
    "StorePaths",
    "check_dir_id",
    "check_hash",
    "check_run_id",
    "is_dir_id",
    "require_manifests_dir",
]

_MANIFESTS = "manifests"
PARTIAL_PREFIX = ".partial-"
#: ``blessed/<hash>/.publishing-<dir_id>``: a publish of that tree is under way (until it commits).
PUBLISHING_PREFIX = ".publishing-"
NEW_STAGING_PREFIX = ".new-"
OWNER_FILE = ".owner"
#: ``serve/<serve dir>/unproven-compiles.jsonl``: every compile a sealed serve saw that the blessing does not
#: hold, one JSON object a line (bless.flows.serve.seal), evidence for a rebless.
SERVE_UNPROVEN_COMPILES = "unproven-compiles.jsonl"
#: ``serve/<serve dir>/seal-watch.json``: what the seal watcher of a detached serve watches
#: (bless.flows.serve.detached): the engine's handle, the runtime, the adapter's factors, the policy; written once,
#: before the watcher starts.
SERVE_SEAL_WATCH_DOC = "seal-watch.json"
#: ``serve/<serve dir>/seal-watcher.json``: the process identity (pid and start time) of that watcher, written by the
#: watcher itself; ``serve-full stop`` ends the very process it names (never a recycled pid).
SERVE_SEAL_WATCHER = "seal-watcher.json"
#: ``serve/<serve dir>/seal-watcher.log``: the watcher's own log (what it saw, how it ended).
SERVE_SEAL_WATCHER_LOG = "seal-watcher.log"

_DIR_ID = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9a-f]{12}")
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _profile_name(name: object) -> str:
    """``name`` when it is a profile name usable as one plain file name; else InputInvalidError (shortened)."""
    if not isinstance(name, str) or _RUN_ID.fullmatch(name) is None:
        shown = repr(name) if not isinstance(name, str) or len(name) <= 160 else repr(name[:160]) + "..."
        raise InputInvalidError(
            f"invalid profile name {shown}: use 1-128 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
        )
    return name


def is_dir_id(text: object) -> bool:
    """A blessed dir id: ``YYYYMMDDTHHMMSSZ-<12 hex>``, exactly."""
    return isinstance(text, str) and _DIR_ID.fullmatch(text) is not None


def check_hash(config_hash: str, error: type[BlessError] = InputInvalidError) -> None:
    """Raise ``error`` unless ``config_hash`` is 64 lowercase hex digits.

    The hash becomes a path component: anything else could escape the store.
    """
    if not is_config_hash(config_hash):
        raise error(f"not a config hash (64 lowercase hex digits): {config_hash!r}")


def check_dir_id(dir_id: str) -> None:
    """Raise ManifestInvalidError unless ``dir_id`` names a blessed dir (a path component)."""
    if not is_dir_id(dir_id):
        raise ManifestInvalidError(f"cache.dir_id {dir_id!r} is not a blessed dir id")


def check_run_id(run_id: str) -> None:
    """Raise InputInvalidError unless ``run_id`` is a safe directory name."""
    if not isinstance(run_id, str) or _RUN_ID.fullmatch(run_id) is None:
        raise InputInvalidError(
            f"invalid run id {run_id!r}: use 1-128 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
        )


@dataclass(frozen=True)
class StorePaths:
    """The directories of one store. ``root`` and ``manifests_dir`` are absolute."""

    root: Path
    manifests_dir: Path

    @classmethod
    def of(cls, root: Path, manifests_dir: Path | None = None) -> StorePaths:
        """The store under ``root``, its manifests in ``manifests_dir`` (default ``root/manifests``)."""
        # Absolute once, so that a later chdir cannot move the store under us.
        absolute_root = Path(root).absolute()
        default = absolute_root / _MANIFESTS
        return cls(absolute_root, Path(manifests_dir).absolute() if manifests_dir is not None else default)

    @property
    def default_manifests_dir(self) -> Path:
        """``root/manifests``: where manifests live unless a separate dir is given."""
        return self.root / _MANIFESTS

    @property
    def blessed(self) -> Path:
        """``root/blessed``: immutable blessed trees, ``<config_hash>/<dir_id>/``."""
        return self.root / "blessed"

    @property
    def staging(self) -> Path:
        """``root/staging``: work dirs of running blesses."""
        return self.root / "staging"

    @property
    def archive(self) -> Path:
        """``root/archive``: manifests replaced by a rebless."""
        return self.root / "archive"

    @property
    def rejected(self) -> Path:
        """``root/rejected``: evidence of rejected candidates."""
        return self.root / "rejected"

    @property
    def interrupted(self) -> Path:
        """``root/interrupted``: evidence of ``bless run`` candidates stopped by a signal (no verdict, not rejected)."""
        return self.root / "interrupted"

    @property
    def locks(self) -> Path:
        """``root/locks``: per-hash writer locks and their holder records."""
        return self.root / "locks"

    def serve_start_lock(self, name: str) -> Path:
        """``locks/serve-<name>.lock``: one serve-full start of profile ``name`` at a time (bless.flows.serve).

        ``name`` is checked as :meth:`ready_file` checks it (InputInvalidError): ``serve-full stop NAME`` takes
        this lock before anything else, so a name with ``/`` or ``..`` would create dirs and a lock file
        outside the store.
        """
        return self.locks / f"serve-{_profile_name(name)}.lock"

    @property
    def runs(self) -> Path:
        """``root/runs``: engine logs of accepted runs."""
        return self.root / "runs"

    @property
    def serve(self) -> Path:
        """``root/serve``: scratch and evidence dirs of serve-full starts."""
        return self.root / "serve"

    @staticmethod
    def unproven_compiles(serve_dir: Path) -> Path:
        """``serve/<serve dir>/unproven-compiles.jsonl``: a sealed serve's unproven compiles (evidence)."""
        return serve_dir / SERVE_UNPROVEN_COMPILES

    @staticmethod
    def seal_watch_doc(serve_dir: Path) -> Path:
        """``serve/<serve dir>/seal-watch.json``: what a detached serve's seal watcher watches."""
        return serve_dir / SERVE_SEAL_WATCH_DOC

    @staticmethod
    def seal_watcher(serve_dir: Path) -> Path:
        """``serve/<serve dir>/seal-watcher.json``: the process identity of a detached serve's seal watcher."""
        return serve_dir / SERVE_SEAL_WATCHER

    @staticmethod
    def seal_watcher_log(serve_dir: Path) -> Path:
        """``serve/<serve dir>/seal-watcher.log``: the log of a detached serve's seal watcher."""
        return serve_dir / SERVE_SEAL_WATCHER_LOG

    @property
    def leases(self) -> Path:
        """``root/leases``: serving leases, ``<config_hash>/<dir_id>/<name>.json``."""
        return self.root / "leases"

    @property
    def ready(self) -> Path:
        """``root/ready``: readiness records of serve-full, ``<name>.json`` (bless.flows.serve.ready)."""
        return self.root / "ready"

    def ready_file(self, name: str) -> Path:
        """``ready/<name>.json`` for a profile name (checked: one plain file name, InputInvalidError)."""
        return self.ready / f"{_profile_name(name)}.json"

    def ready_heartbeat(self, name: str) -> Path:
        """``ready/<name>.heartbeat``: a detached serve's seal watcher, named by itself, its mtime renewed each poll.

        Its suffix is no record's (``.json``), so no profile's name can make it another profile's record.
        """
        return self.ready_file(name).with_suffix(".heartbeat")

    @property
    def trust(self) -> Path:
        """``root/trust``: TUF's trusted metadata (the highest versions this host has trusted)."""
        return self.root / "trust"

    @property
    def trust_lock(self) -> Path:
        """``root/trust.lock``: held while TUF's trusted metadata in ``root/trust`` is read and recorded."""
        return self.root / "trust.lock"

    @property
    def state(self) -> Path:
        """``root/state``: the store's own records (manifests dirs published to, index cache)."""
        return self.root / "state"

    def blessed_dir(self, config_hash: str, dir_id: str) -> Path:
        """``blessed/<config_hash>/<dir_id>`` after checking both names (ManifestInvalidError)."""
        check_hash(config_hash, ManifestInvalidError)
        check_dir_id(dir_id)
        return self.blessed / config_hash / dir_id

    def ensure_layout(self) -> None:
        """Create the store directories that are missing (0755, whatever the umask)."""
        for directory in (
            self.manifests_dir,
            self.blessed,
            self.staging,
            self.archive,
            self.rejected,
            self.interrupted,
            self.locks,
            self.state,
        ):
            with os_errors(f"creating {directory}"):
                ensure_dir(directory)

    def under_staging(self, path: Path) -> bool:
        """Is ``path`` inside ``root/staging`` (so ours to consume by a rename)?"""
        try:
            real = path.resolve()
            staging = self.staging.resolve()
        except OSError:
            return False
        return real != staging and real.is_relative_to(staging)


def require_manifests_dir(manifests_dir: Path) -> None:
    """Refuse (:class:`UsageError`, 2) a manifests dir that does not exist, naming it.

    For a dir named on purpose (a gate's, or one given explicitly): a typo there must not read as "nothing is
    blessed". The default ``<root>/manifests`` of a store not yet used is not checked with it.
    """
    if not manifests_dir.is_dir():
        raise UsageError(
            f"the manifests directory {manifests_dir} does not exist",
            hint="open the store with the manifests directory your blessings were published to "
            "(open_store(manifests_dir=...)), e.g. the checkout's directory of committed manifests",
            details={"manifests_dir": str(manifests_dir)},
            remedy="manifests_dir",
        )
