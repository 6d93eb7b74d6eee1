"""The one error hierarchy of bless.

Every refusal is a :class:`BlessError` subclass that carries a stable exit code and
a ``diagnostics()`` text saying why and what to do. The CLI catches ``BlessError``
once, prints the diagnostics to stderr and exits with ``exit_code``. Each class that
declares an exit code also says what it means (``meaning``); ``EXIT_CODES`` is derived
from those classes and is the single source for ``bless exit-codes`` and
docs/reference/exit-codes.md's table (and its test).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import IntEnum
from pathlib import Path
from typing import Any, ClassVar, Protocol

from bless.untrusted_text import shown


class ExitCode(IntEnum):
    """Stable process exit codes; one per failure class. Never renumber."""

    OK = 0
    INTERNAL = 1
    USAGE = 2
    INPUT_INVALID = 3
    ALREADY_BLESSED = 10
    LOCK_HELD = 11
    CONTAINER_CONFLICT = 12
    WEAKER_BLESSING = 13
    TRUST_EXISTS = 14
    NO_SPACE = 15
    DOWNGRADE = 16
    STORE_UNAVAILABLE = 17
    NO_MANIFEST = 20
    VERIFY_FAILED = 21
    MANIFEST_INVALID = 22
    MANIFEST_DUPLICATE = 23
    GATE_FAILED = 24
    UNSAFE_ENV = 30
    RESOLUTION_FAILED = 31
    HARDWARE_MISMATCH = 32
    UNKNOWN_ENGINE_VERSION = 33
    ENVIRONMENT_MISMATCH = 34
    BOOTSTRAP_FAILED = 40
    TRIALS_FAILED = 41
    CANARY_FAILED = 42
    CACHE_CHANGED = 43
    ENGINE_FAILED = 44
    CACHE_NOT_USED = 45
    NOT_SERVING = 46
    COVERAGE_INCOMPLETE = 47
    UNPROVEN_COMPILE = 48
    RUNTIME_UNAVAILABLE = 50
    IMAGE_MISSING = 51
    INSUFFICIENT_GPU = 52
    GPU_SELECTION_INVALID = 53
    UNSIGNED = 60
    SIGNATURE_UNTRUSTED = 61
    BELOW_THRESHOLD = 62
    METADATA_EXPIRED = 63
    ROLLBACK = 64
    TARGET_MISMATCH = 65
    TRUST_INVALID = 66
    REGISTRY_UNAVAILABLE = 70
    ARTIFACT_NOT_FOUND = 71
    DIGEST_MISMATCH = 72
    ARTIFACT_INVALID = 73
    TRANSFER_INCOMPLETE = 74
    INTERRUPTED = 130


class BlessError(Exception):
    """Base of every expected failure. Subclasses set ``exit_code`` and ``title``."""

    exit_code: ClassVar[ExitCode] = ExitCode.INTERNAL
    title: ClassVar[str] = "internal error"
    meaning: ClassVar[str] = "unexpected internal error (a bug: rerun with --verbose and report it)"

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        details: Mapping[str, Any] | None = None,
        remedy: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        #: What to do, in words that suit any caller (a Python caller is never told to pass a flag).
        self.hint = hint
        self.details: dict[str, Any] = dict(details or {})
        #: A stable key naming the remedy the hint describes (``"rebless"``): the command line words it as
        #: the option to pass (cli/error_hints.py); None when the hint needs no other wording.
        self.remedy = remedy

    def diagnostics(self) -> str:
        """The text a human reads: what happened and what to do about it."""
        text = f"{self.title}: {self.message}"
        if self.hint:
            text += f"\nWhat to do: {self.hint}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for ``--json`` output."""
        # By hand (not JsonForm): an exception; its class gives the error's name, title and exit code.
        return {
            "error": type(self).__name__,
            "title": self.title,
            "exit_code": int(self.exit_code),
            "message": self.message,
            "hint": self.hint,
            "details": self.details,
        }


# --- families: whom a caller can blame -------------------------------------------------------------------
# Grouped by who is at fault, as python-tuf's tuf/api/exceptions.py groups its errors: a caller catches a
# family (``except bless.TrustError``) instead of listing codes. A family declares no exit code of its own;
# every class below it keeps its code.


class ConfigError(BlessError):
    """The call itself is wrong: an option, a profile or another input the caller gave (2, 3, 30, 33)."""


class ConflictError(BlessError):
    """What was asked conflicts with what the store, trust repository or host already holds (10-14, 16):
    another writer, an existing blessing or trust repository, a container of that name, a downgrade."""


class BlessingError(BlessError):
    """The blessing the call names: none matches, its manifest is invalid or duplicated, a gate found profiles
    without one (20, 22-24)."""


class VerificationError(BlessError):
    """Blessed files differ from what their manifest records, before or during use (21, 43)."""


class EngineError(BlessError):
    """The engine (or its compile) failed to prove, start, answer or reuse a blessing (40-42, 44-48)."""


class HostError(BlessError):
    """This machine or its services cannot do it: disk, store permissions, factor resolution, hardware, the
    container runtime, the image, GPUs (15, 17, 31, 32, 50-53)."""


class TrustError(BlessError):
    """Signed trust metadata refused the blessing, or the signing repository is unusable (14, 60-66)."""


class RegistryError(BlessError):
    """The OCI registry or what it returned (70-74)."""


class UsageError(ConfigError):
    exit_code = ExitCode.USAGE
    title = "usage error"
    meaning = "bad command-line usage"


class InputInvalidError(ConfigError):
    """A profile or other input file is unreadable or does not match its schema."""

    exit_code = ExitCode.INPUT_INVALID
    title = "invalid input"
    meaning = "a profile or input file is unreadable or invalid"


class AlreadyBlessedError(ConflictError):
    exit_code = ExitCode.ALREADY_BLESSED
    title = "already blessed"
    meaning = "a blessing already exists for this config hash (use --rebless)"


class LockHeldError(ConflictError):
    exit_code = ExitCode.LOCK_HELD
    title = "lock held"
    meaning = "another bless holds the lock for this config hash"


class ContainerConflictError(ConflictError):
    exit_code = ExitCode.CONTAINER_CONFLICT
    title = "container conflict"
    meaning = "a container of ours is already running, or a foreign container holds our name"


class WeakerBlessingError(ConflictError):
    """``--rebless`` would replace a blessing with one whose failure-rate bound is weaker."""

    exit_code = ExitCode.WEAKER_BLESSING
    title = "weaker blessing"
    meaning = "--rebless would replace a blessing with a weaker failure-rate bound (use --allow-weaker)"


class NoSpaceError(HostError):
    """A write found the disk full, the quota used up, or the file system read-only; nothing was committed."""

    exit_code = ExitCode.NO_SPACE
    title = "no space to write"
    meaning = (
        "the disk is full, the quota used up or the file system read-only (run, pull, publish, sign, trust state); "
        "nothing was committed"
    )


class DowngradeError(ConflictError):
    """A pull would replace the live blessing of a config with an older one."""

    exit_code = ExitCode.DOWNGRADE
    title = "downgrade refused"
    meaning = "a pull would replace a newer live blessing of the config with an older one (use --allow-downgrade)"


class StoreUnavailableError(HostError):
    """The store cannot be used here: its root or one of its dirs is not a directory, or a lock, lease or
    other store file cannot be created or opened for a reason other than a full or read-only disk
    (that is :class:`NoSpaceError`). The environment is at fault, not bless and not the manifests."""

    exit_code = ExitCode.STORE_UNAVAILABLE
    title = "store unavailable"
    meaning = (
        "the store cannot be used here: a store path is not a directory, or a lock, lease or store file "
        "cannot be created or opened (permissions, a file where a dir belongs)"
    )


class NoManifestError(BlessingError):
    """No blessed manifest matches a config hash; ``details['nearest']`` holds the factor diff."""

    exit_code = ExitCode.NO_MANIFEST
    title = "no blessed manifest"
    meaning = "no blessed manifest matches the config hash (config drift)"


class _Problem(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


class _TreeChecked(Protocol):
    """What :meth:`VerifyFailedError.from_result` needs of a tree check's result (``bless.TreeCheck``,
    described here so that the vocabulary imports nothing above it): its problems, each in its JSON form."""

    @property
    def problems(self) -> Sequence[_Problem]: ...


class VerifyFailedError(VerificationError):
    exit_code = ExitCode.VERIFY_FAILED
    title = "verification failed"
    meaning = "blessed cache files differ from the manifest"

    #: How many problems the message names; ``details["problems"]`` holds them all.
    NAMED_PROBLEMS: ClassVar[int] = 8

    @classmethod
    def from_result(cls, result: _TreeChecked, blessed_dir: Path, *, config_hash: str) -> VerifyFailedError:
        """The one refusal for a blessed tree that does not match its manifest (verify, serve-full, gate, push)."""
        problems = [problem.to_dict() for problem in result.problems]
        count = len(problems)
        named = "; ".join(f"{shown(p['path'])} ({p['kind']}: {p['detail']})" for p in problems[: cls.NAMED_PROBLEMS])
        more = f" and {count - cls.NAMED_PROBLEMS} more" if count > cls.NAMED_PROBLEMS else ""
        return cls(
            f"{count} problem(s) in {shown(str(blessed_dir))}: {named}{more}",
            hint="do not serve or push this cache: re-bless the configuration (rebless) and find out what changed "
            "the read-only blessed files (verifying it lists every problem)",
            remedy="rebless_changed_cache",
            details={
                "config_hash": config_hash,
                "blessed_dir": str(blessed_dir),
                "problems": problems,
            },
        )


class ManifestInvalidError(BlessingError):
    exit_code = ExitCode.MANIFEST_INVALID
    title = "invalid manifest"
    meaning = "a manifest is unreadable, schema-invalid or of an unknown version"


class ManifestDuplicateError(BlessingError):
    exit_code = ExitCode.MANIFEST_DUPLICATE
    title = "duplicate manifest (store corruption)"
    meaning = "two manifests claim one config hash (store corruption)"


class GateFailedError(BlessingError):
    exit_code = ExitCode.GATE_FAILED
    title = "gate failed"
    meaning = "bless gate: one or more profiles are not blessed"


class UnsafeEnvError(ConfigError):
    exit_code = ExitCode.UNSAFE_ENV
    title = "unsafe environment"
    meaning = (
        "unsafe debug or cache-disabling settings in the profile, or env that moves where compiled state is written"
    )


class ResolutionError(HostError):
    """A factor (image ID, model revision, hardware facts) could not be resolved."""

    exit_code = ExitCode.RESOLUTION_FAILED
    title = "cannot resolve factors"
    meaning = "a factor (image ID, model revision, hardware) could not be resolved"


class HardwareMismatchError(HostError):
    exit_code = ExitCode.HARDWARE_MISMATCH
    title = "hardware mismatch"
    meaning = "this machine does not match the profile's declared hardware"


class EnvironmentMismatchError(HostError):
    exit_code = ExitCode.ENVIRONMENT_MISMATCH
    title = "environment mismatch"
    meaning = "the engine's packages, Python or local model differ from the profile's [runtime] / [model] declaration"


class UnknownEngineVersionError(ConfigError):
    """The engine version has no entry in bless's per-version rules (its markers, hashed env, layout are unknown)."""

    exit_code = ExitCode.UNKNOWN_ENGINE_VERSION
    title = "unknown engine version"
    meaning = "bless has no rules for this engine version (see bless engines; --allow-unknown-engine-version)"


class BootstrapFailedError(EngineError):
    exit_code = ExitCode.BOOTSTRAP_FAILED
    title = "bootstrap failed"
    meaning = "phase 1 (bootstrap compile) failed"


class TrialsFailedError(EngineError):
    exit_code = ExitCode.TRIALS_FAILED
    title = "trials failed"
    meaning = "phase 2 (replay-coherence / reuse trials) rejected every candidate"


class CanaryFailedError(EngineError):
    exit_code = ExitCode.CANARY_FAILED
    title = "canary failed"
    meaning = "serve-full: the canary did not reproduce the golden output"


class CacheChangedError(VerificationError):
    """The blessed files changed between verification and use."""

    exit_code = ExitCode.CACHE_CHANGED
    title = "blessed cache changed after verification"
    meaning = "serve-full: blessed files changed between verification and use"


class EngineFailedError(EngineError):
    """The engine did not start or become ready (outside of a bless run)."""

    exit_code = ExitCode.ENGINE_FAILED
    title = "engine failed"
    meaning = "serve-full: the engine exited or never became ready"


class CacheNotUsedError(EngineError):
    """The served engine did not load the blessed cache (it compiled, or keyed its cache differently)."""

    exit_code = ExitCode.CACHE_NOT_USED
    title = "blessed cache not used"
    meaning = "serve-full: the engine did not load the blessed cache (it compiled or keyed it anew)"


class NotServingError(EngineError):
    exit_code = ExitCode.NOT_SERVING
    title = "not serving"
    meaning = (
        "serve-full ready: no canary-checked engine serves this profile here (not started yet, stopping, "
        "or its engine does not answer); the readiness probe's failure"
    )


class CoverageIncompleteError(EngineError):
    """The profile requires full coverage and the engine's coverage model cannot reach a family or class."""

    exit_code = ExitCode.COVERAGE_INCOMPLETE
    title = "coverage incomplete"
    meaning = "bless run: full coverage is required and a kernel family or class, or serves' evidence, is out of reach"


class UnprovenCompileError(EngineError):
    """The served engine compiled something the blessing does not hold (policy ``stop``)."""

    exit_code = ExitCode.UNPROVEN_COMPILE
    title = "unproven compile while serving"
    meaning = "serve-full: the engine compiled a kernel the blessing does not hold and was stopped (policy stop)"


class RuntimeUnavailableError(HostError):
    exit_code = ExitCode.RUNTIME_UNAVAILABLE
    title = "runtime unavailable"
    meaning = "the container runtime (Docker) or local runtime is unavailable"


class ImageMissingError(HostError):
    exit_code = ExitCode.IMAGE_MISSING
    title = "image missing"
    meaning = "the engine image is not present"


class InsufficientGpuError(HostError):
    exit_code = ExitCode.INSUFFICIENT_GPU
    title = "not enough GPU"
    meaning = "not enough GPUs or GPU memory for the profile"


class GpuSelectionError(HostError):
    """``CUDA_VISIBLE_DEVICES`` names a GPU this host does not have, or one GPU twice: ranks would shift."""

    exit_code = ExitCode.GPU_SELECTION_INVALID
    title = "GPU selection invalid"
    meaning = "CUDA_VISIBLE_DEVICES names a GPU this host does not have, or one GPU twice"


class TrustExistsError(ConflictError, TrustError):
    """``bless trust init`` would overwrite existing keys or metadata."""

    exit_code = ExitCode.TRUST_EXISTS
    title = "trust repository exists"
    meaning = "bless trust init: keys or metadata already exist in that directory (never overwritten)"


class UnsignedError(TrustError):
    """Under ``--trust``: the blessing is not a target of the trusted, signed metadata."""

    exit_code = ExitCode.UNSIGNED
    title = "blessing not signed"
    meaning = "--trust: the blessing is not a target of the signed metadata (unsigned or delisted)"


class SignatureUntrustedError(TrustError):
    """Signed metadata carries no valid signature by a key the trusted root lists for its role."""

    exit_code = ExitCode.SIGNATURE_UNTRUSTED
    title = "signature by an untrusted key"
    meaning = "--trust: signed metadata has no valid signature by a key the trusted root lists"


class BelowThresholdError(TrustError):
    """Signed metadata has valid signatures, but fewer than its role's threshold."""

    exit_code = ExitCode.BELOW_THRESHOLD
    title = "signatures below threshold"
    meaning = "--trust: signed metadata has fewer valid signatures than its role's threshold"


class MetadataExpiredError(TrustError):
    exit_code = ExitCode.METADATA_EXPIRED
    title = "signed metadata expired"
    meaning = "--trust: signed metadata has expired (re-sign with bless sign)"


class RollbackError(TrustError):
    """Validly signed metadata older than the newest this host has already trusted."""

    exit_code = ExitCode.ROLLBACK
    title = "rollback refused"
    meaning = "--trust: signed metadata is older than the newest this host has trusted (rollback)"


class TargetMismatchError(TrustError):
    """The manifest's bytes differ from the signed target's length or hashes."""

    exit_code = ExitCode.TARGET_MISMATCH
    title = "manifest differs from the signed target"
    meaning = "--trust: the manifest differs from the signed target's length or hashes"


class TrustInvalidError(TrustError):
    """Trust metadata or keys are missing, malformed or inconsistent, or the signing repository cannot be written."""

    exit_code = ExitCode.TRUST_INVALID
    title = "invalid trust metadata"
    meaning = (
        "trust metadata or keys are missing, malformed, inconsistent or over their size limit (--trust, sign), "
        "or the signing repository cannot be created or written here"
    )


class RegistryUnavailableError(RegistryError):
    exit_code = ExitCode.REGISTRY_UNAVAILABLE
    title = "registry unavailable"
    meaning = "the OCI registry is unreachable or refused the request or credentials"


class ArtifactNotFoundError(RegistryError):
    exit_code = ExitCode.ARTIFACT_NOT_FOUND
    title = "artifact not found"
    meaning = "the registry has no such repository, tag or digest"


class DigestMismatchError(RegistryError):
    """A downloaded blob or manifest does not hash to the digest it was asked for."""

    exit_code = ExitCode.DIGEST_MISMATCH
    title = "digest mismatch"
    meaning = "a downloaded blob or manifest does not match its digest (altered in the registry)"


class ArtifactInvalidError(RegistryError):
    """What the registry returned is not a well-formed bless artifact."""

    exit_code = ExitCode.ARTIFACT_INVALID
    title = "invalid artifact"
    meaning = "the artifact is not a well-formed bless artifact (media types, paths, layout)"


class TransferIncompleteError(RegistryError):
    """A download ended before all its bytes arrived."""

    exit_code = ExitCode.TRANSFER_INCOMPLETE
    title = "transfer incomplete"
    meaning = "a download ended early (the registry went away mid-transfer); nothing installed"


class InterruptedByUserError(BlessError):
    """The user or the system asked us to stop (SIGINT / SIGTERM)."""

    exit_code = ExitCode.INTERRUPTED
    title = "interrupted"
    meaning = "interrupted by SIGINT/SIGTERM (containers stopped, evidence kept)"


class EngineHttpError(EngineError):
    """A request to the engine failed or its reply was malformed; ``refused`` marks a closed port."""

    title = "engine request failed"

    def __init__(self, message: str, *, refused: bool = False):
        super().__init__(message)
        self.refused = refused


class NotReadyError(EngineError):
    """The engine exited, timed out or kept failing before it became ready."""

    title = "engine not ready"


def _declaring_classes() -> list[type[BlessError]]:
    """Every BlessError class that declares an exit code itself (subclasses that inherit one do not)."""
    found: list[type[BlessError]] = []
    seen: set[type[BlessError]] = set()
    pending: list[type[BlessError]] = [BlessError]
    while pending:
        cls = pending.pop()
        if cls in seen:  # a class in two families is reached twice
            continue
        seen.add(cls)
        if "exit_code" in vars(cls):
            found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


#: The families, in the order a caller reads them (docs/reference/python-api.md lists each with its codes).
FAMILIES: tuple[type[BlessError], ...] = (
    ConfigError,
    ConflictError,
    BlessingError,
    VerificationError,
    EngineError,
    HostError,
    TrustError,
    RegistryError,
)


def _exit_codes() -> tuple[tuple[ExitCode, str], ...]:
    """The table, from the classes: each code's meaning is written once, next to the class that exits with it."""
    rows: dict[ExitCode, str] = {ExitCode.OK: "success"}
    for cls in _declaring_classes():
        if cls.exit_code in rows:
            raise AssertionError(f"exit code {int(cls.exit_code)} is declared twice (by {cls.__name__})")
        rows[cls.exit_code] = cls.meaning
    missing = sorted(set(ExitCode) - set(rows))
    if missing:
        raise AssertionError(f"exit codes without a class: {missing}")
    return tuple(sorted(rows.items()))


#: The exit-code table (``bless exit-codes``, the README): derived from the classes above.
EXIT_CODES: tuple[tuple[ExitCode, str], ...] = _exit_codes()
