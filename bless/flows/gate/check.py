"""``bless gate``: for CI, every profile must hash to a valid, unique blessed manifest.

For each profile the factors are resolved without network lookups (``offline``): the image must
be a pinned ``sha256:`` ID, unless a Docker Engine is reachable to read a tag's ID (if resolving
needs Docker and it is unreachable, that profile fails and says so); the hardware factor comes
from the profile's declaration when it is complete, on any machine (a CPU-only CI runner
included), else from probing this machine (the row says which; a CUDA profile with an incomplete
declaration fails on a machine without GPUs, naming the fields to declare). A profile passes when
exactly one valid manifest in the manifests directory carries its config hash; otherwise the row
names the factors that drifted against the nearest blessing. With ``verify`` the blessed files
are verified too: a profile whose cache files the store root does not hold fails (nothing was verified),
unless ``allow_unverified`` lets it pass on its manifest alone (the row notes it).

Library code: nothing here prints. :mod:`.formats` turns a :class:`GateReport` into what CI tools read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bless.core.factors import ResolvedConfig
from bless.core.json_form import JsonForm, as_json, rounded
from bless.core.profile import Profile, load_profile
from bless.errors import (
    BlessError,
    ExitCode,
    GateFailedError,
    ManifestDuplicateError,
    ManifestInvalidError,
    ResolutionError,
    VerifyFailedError,
)
from bless.flows.resolve import ProfileResolution, drift_error, image_needs_runtime, resolve_for_command
from bless.probes import HardwareSource
from bless.runtime.base import Runtime
from bless.store import ManifestIndex, ManifestRecord, Store

Status = Literal["blessed", "failed"]
RuntimeFactory = Callable[[str], Runtime]


@dataclass(frozen=True)
class GateRow(JsonForm):
    """The verdict for one profile. ``reason`` is one human sentence (or a few lines for drift)."""

    json_keys = (
        "profile",
        "name",
        "status",
        "reason",
        "config_hash",
        "hardware",
        "manifest",
        "error",
        "exit_code",
        "drift",
        "notes",
        "verified",
        "seconds",
    )

    profile: str
    status: Status
    reason: str
    config_hash: str | None = None
    name: str | None = None
    hardware: str | None = None
    manifest: str | None = None
    error: str | None = None
    exit_code: int | None = None
    drift: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    verified: bool | None = None
    seconds: float = field(default=0.0, metadata=as_json(to_json=rounded(4)))

    @property
    def ok(self) -> bool:
        return self.status == "blessed"


@dataclass(frozen=True)
class GateReport(JsonForm):
    """Every row, and where the manifests came from."""

    json_keys = (
        "passed",
        "manifests_dir",
        "root",
        "verify",
        "profiles",
        "failed",
        "invalid_manifests",
        "seconds",
        "rows",
    )

    rows: tuple[GateRow, ...]
    manifests_dir: Path
    root: Path
    verify: bool
    invalid_manifests: tuple[str, ...] = ()
    seconds: float = field(default=0.0, metadata=as_json(to_json=rounded(4)))

    @property
    def ok(self) -> bool:
        """True only when there is at least one profile and every one is blessed."""
        return bool(self.rows) and all(row.ok for row in self.rows)

    @property
    def failed(self) -> tuple[GateRow, ...]:
        return tuple(row for row in self.rows if not row.ok)

    def json_extra(self) -> dict[str, Any]:
        """The verdict and the counts of profiles and failed ones."""
        return {"passed": self.ok, "profiles": len(self.rows), "failed": len(self.failed)}


@dataclass
class Runtimes:
    """Runtimes by kind, made on first need and pinged once; an unreachable one is remembered with its error."""

    factory: RuntimeFactory
    ready: dict[str, Runtime] = field(default_factory=dict)
    failed: dict[str, BlessError] = field(default_factory=dict)

    def get(self, kind: str) -> Runtime:
        if kind in self.failed:
            raise self.failed[kind]
        if kind not in self.ready:
            runtime = self.factory(kind)
            try:
                runtime.ping()
            except BlessError as exc:
                self.failed[kind] = exc
                raise
            self.ready[kind] = runtime
        return self.ready[kind]


def _resolve(profile: Profile, runtimes: Runtimes, notes: list[str]) -> ProfileResolution:
    """Resolve offline, the hardware judged: the declared factor when complete, else this machine's (noted in the row).

    A CUDA profile with an incomplete declaration on a machine without GPUs fails the row, naming
    the fields to declare (:func:`bless.probes.judged_hardware`).
    """
    resolution = resolve_for_command(
        profile, image_resolver=_image_resolver(profile, runtimes), hardware="judge", offline=True
    )
    if resolution.hardware_source == "probed":
        undeclared = ", ".join(f"hardware.{key}" for key in resolution.undeclared_hardware)
        notes.append(
            f"hardware probed on this machine: {undeclared} not declared, so the hash holds this machine's "
            "hardware, not the serving host's (declare them to gate this profile on any machine)"
        )
    return resolution


def _image_resolver(profile: Profile, runtimes: Runtimes) -> Callable[[str], str] | None:
    """The Docker runtime's image resolver when the image is a tag (None for a pinned ID or the local runtime)."""
    if not image_needs_runtime(profile):
        return None
    try:
        return runtimes.get("docker").resolve_image
    except BlessError as exc:
        raise ResolutionError(
            f"image {profile.image or ''!r} is a tag; resolving it to its ID needs a Docker Engine, which is "
            f"unreachable ({exc.message.splitlines()[0]})",
            hint="pin runtime.image to its sha256 ID (docker image inspect --format '{{.Id}}' IMAGE) so the "
            "gate runs offline, or run the gate where Docker is available",
        ) from None


class _NotBlessed(Exception):
    """A step of :func:`gate_profile` failing the profile: the row's reason, the error it stands for, row fields."""

    def __init__(self, reason: str, error: BlessError, **row: Any) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error
        self.row = row


def gate_profile(
    path: Path,
    *,
    store: Store,
    index: ManifestIndex,
    runtimes: Runtimes,
    verify: bool,
    allow_unverified: bool = False,
) -> GateRow:
    """Judge one profile file against the manifests of ``index`` (already read and validated)."""
    started = time.perf_counter()
    label = str(path)
    notes: list[str] = []
    hardware: HardwareSource | None = None
    name: str | None = None
    config_hash: str | None = None

    def failed(reason: str, error: BlessError | None = None, **extra: Any) -> GateRow:
        return GateRow(
            profile=label,
            status="failed",
            reason=reason,
            config_hash=config_hash,
            name=name,
            hardware=hardware,
            error=type(error).__name__ if error else None,
            exit_code=int(error.exit_code) if error else None,
            notes=tuple(notes),
            seconds=time.perf_counter() - started,
            **extra,
        )

    try:
        profile = load_profile(path)
        name = profile.name
        resolution = _resolve(profile, runtimes, notes)
    except BlessError as exc:
        # The row names the profile already: "<path>: not valid TOML" would print the path twice.
        return failed(exc.message.removeprefix(f"{label}: "), exc)
    resolved, hardware, config_hash = resolution.resolved, resolution.hardware_source, resolution.config_hash
    try:
        record = _blessed_record(store, index, resolved)
        verified = _verify_blessed(store, record, notes, allow_unverified=allow_unverified) if verify else None
    except _NotBlessed as refusal:
        return failed(refusal.reason, refusal.error, **refusal.row)
    return GateRow(
        profile=label,
        status="blessed",
        reason="blessed" + (" and verified" if verified else ""),
        config_hash=config_hash,
        name=name,
        hardware=hardware,
        manifest=str(record.path),
        notes=tuple(notes),
        verified=verified,
        seconds=time.perf_counter() - started,
    )


def _blessed_record(store: Store, index: ManifestIndex, resolved: ResolvedConfig) -> ManifestRecord:
    """The one valid manifest of the config hash; none (drift named), two, or an unreadable one fail the profile."""
    config_hash = resolved.config_hash
    invalid = index.invalid + tuple(r for r in index.unknown if r.error is None)
    if invalid:
        # Fail closed, as every lookup does: an unreadable manifest might be the one for this hash.
        files = ", ".join(str(record.path) for record in invalid)
        error = ManifestInvalidError(f"invalid manifest file(s) in {store.manifests_dir}: {files}")
        first = invalid[0].error
        detail = f" ({first.message.splitlines()[0]})" if first is not None else ""
        raise _NotBlessed(f"invalid manifest file(s), so no lookup can be trusted: {files}{detail}", error)
    try:
        record = index.find(config_hash)
    except ManifestDuplicateError as exc:
        claimants = [str(p) for p in exc.details.get("paths", ())]
        raise _NotBlessed(
            f"{len(claimants)} manifests claim {config_hash[:16]} (store corruption): {', '.join(claimants)}", exc
        ) from None
    if record is None:
        # The row names the profile already: the reason must not repeat its path.
        drifted = drift_error(resolved, index.manifests(), store.manifests_dir, subject="this profile")
        nearest = drifted.details["nearest"]
        raise _NotBlessed(drifted.message, drifted, drift=tuple(nearest["changes"]) if nearest else ())
    return record


def _verify_blessed(
    store: Store, record: ManifestRecord, notes: list[str], *, allow_unverified: bool = False
) -> bool | None:
    """Verify the blessed files. When the store root does not hold them nothing can be verified: the profile
    fails (21), unless ``allow_unverified`` (None, noted)."""
    manifest = record.manifest
    assert manifest is not None
    blessed_dir = store.blessed_dir(manifest)
    if not blessed_dir.is_dir():
        if allow_unverified:
            notes.append(f"cache files not in {store.root}: not verified (allowed)")
            return None
        missing = VerifyFailedError(
            f"cache files not in {store.root}: nothing verified ({blessed_dir} is absent)",
            hint="point the store root at the store that holds the blessed caches, or allow unverified profiles "
            "to gate on their manifests alone",
            details={"blessed_dir": str(blessed_dir)},
            remedy="gate_allow_unverified",
        )
        raise _NotBlessed(missing.message, missing, manifest=str(record.path), verified=False)
    try:
        result = store.verify_blessing(manifest)
    except VerifyFailedError as exc:
        raise _NotBlessed(exc.message, exc, manifest=str(record.path), verified=False) from None
    if not result.ok:
        mismatch = VerifyFailedError.from_result(result, blessed_dir, config_hash=manifest.config_hash)
        raise _NotBlessed(mismatch.message, mismatch, manifest=str(record.path), verified=False)
    return result.ok


def run_gate(
    profiles: Sequence[Path],
    *,
    store: Store,
    verify: bool = False,
    runtime_factory: RuntimeFactory | None = None,
    allow_unverified: bool = False,
) -> GateReport:
    """Gate every profile; the manifests directory is read once for all of them.

    ``verify``: also verify each blessed tree; one the store root does not hold fails its profile unless
    ``allow_unverified``.
    """
    started = time.perf_counter()
    if runtime_factory is None:
        from bless.runtime import get_runtime

        runtime_factory = get_runtime
    index = store.index()
    runtimes = Runtimes(runtime_factory)
    rows = tuple(
        gate_profile(
            path, store=store, index=index, runtimes=runtimes, verify=verify, allow_unverified=allow_unverified
        )
        for path in profiles
    )
    return GateReport(
        rows=rows,
        manifests_dir=store.manifests_dir,
        root=store.root,
        verify=verify,
        invalid_manifests=tuple(str(record.path) for record in index.records if record.manifest is None),
        seconds=time.perf_counter() - started,
    )


#: What to do, per cause of a failed row: a hint must name the cause the rows show, not a guess.
_HINTS: dict[int | None, str] = {
    ExitCode.NO_MANIFEST: "bless each drifted profile (bless run --profile P) and commit its manifest, "
    "or revert the drifted factors the row names",
    ExitCode.RESOLUTION_FAILED: "a profile could not be resolved offline (the row says which factor): pin "
    "runtime.image to its sha256 ID and model.revision to a 40-hex commit, or run the gate where the "
    "Docker Engine is reachable",
    ExitCode.VERIFY_FAILED: "a blessed cache that no longer matches its manifest: do not serve it; find what "
    "changed the read-only files, then re-bless (bless run --profile P --rebless); one not in the store root: run "
    "the gate where the caches are (--root), or pass --allow-unverified to gate on the manifests alone",
    ExitCode.MANIFEST_INVALID: "repair the manifests directory: restore the invalid file from version "
    "control or the store's archive, or move it out (until then no lookup can be trusted)",
    ExitCode.MANIFEST_DUPLICATE: "keep the right manifest of each duplicated hash and move the other(s) out "
    "of the manifests directory",
    ExitCode.INPUT_INVALID: "fix the profile file the row names",
}
_OTHER_HINT = "read each failed row's reason above"


_DEFAULTED_HINT = (
    "no profiles were named, so every profiles/*.toml was gated, examples for other machines included: "
    "name the profiles this checkout blesses (bless gate profiles/a.toml profiles/b.toml ...), "
    "see docs/guides/ci-gate.md"
)


def gate_failure(report: GateReport, *, defaulted: bool = False) -> GateFailedError:
    """The refusal for a failed gate, its hint naming what to do for each cause the failed rows show.

    ``defaulted``: no profile was named, so every ``profiles/*.toml`` was gated (examples for other
    machines included); the hint then says how to name the ones to gate.
    """
    failed = report.failed
    causes = dict.fromkeys(row.exit_code for row in failed)
    hints = dict.fromkeys(_HINTS.get(cause, _OTHER_HINT) for cause in causes)
    if not failed:
        hints = dict.fromkeys(["pass at least one profile file"])
    elif defaulted:
        hints = {_DEFAULTED_HINT: None, **hints}
    return GateFailedError(
        f"{len(failed)} of {len(report.rows)} profile(s) not blessed: "
        + "; ".join(f"{row.profile}: {row.reason.splitlines()[0]}" for row in failed[:5]),
        hint="; ".join(hints),
        details={"failed": [row.profile for row in failed], "causes": [code for code in causes if code is not None]},
    )


def default_profiles(directory: Path) -> list[Path]:
    """``profiles/*.toml`` under ``directory`` (relative paths, so CI annotations point at the files)."""
    base = directory / "profiles"
    return sorted(base.glob("*.toml")) if base.is_dir() else []


__all__ = [
    "GateReport",
    "GateRow",
    "default_profiles",
    "gate_failure",
    "gate_profile",
    "run_gate",
]
