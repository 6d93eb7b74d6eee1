"""The one error hierarchy of bless.

Every refusal is a :class:`BlessError` subclass that carries a stable exit code and
a ``diagnostics()`` text saying why and what to do. The CLI catches ``BlessError``
once, prints the diagnostics to stderr and exits with ``exit_code``. The table in
``EXIT_CODES`` is the single source for the README's exit-code table and its test.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import Any, ClassVar


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
    NO_MANIFEST = 20
    VERIFY_FAILED = 21
    MANIFEST_INVALID = 22
    MANIFEST_DUPLICATE = 23
    GATE_FAILED = 24
    UNSAFE_ENV = 30
    RESOLUTION_FAILED = 31
    HARDWARE_MISMATCH = 32
    BOOTSTRAP_FAILED = 40
    TRIALS_FAILED = 41
    CANARY_FAILED = 42
    CACHE_CHANGED = 43
    ENGINE_FAILED = 44
    CACHE_NOT_USED = 45
    RUNTIME_UNAVAILABLE = 50
    IMAGE_MISSING = 51
    INSUFFICIENT_GPU = 52
    INTERRUPTED = 130


class BlessError(Exception):
    """Base of every expected failure. Subclasses set ``exit_code`` and ``title``."""

    exit_code: ClassVar[ExitCode] = ExitCode.INTERNAL
    title: ClassVar[str] = "internal error"

    def __init__(self, message: str, *, hint: str | None = None, details: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details: dict[str, Any] = dict(details or {})

    def diagnostics(self) -> str:
        """The text a human reads: what happened and what to do about it."""
        text = f"{self.title}: {self.message}"
        if self.hint:
            text += f"\nWhat to do: {self.hint}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for ``--json`` output."""
        return {
            "error": type(self).__name__,
            "title": self.title,
            "exit_code": int(self.exit_code),
            "message": self.message,
            "hint": self.hint,
            "details": self.details,
        }


class UsageError(BlessError):
    exit_code = ExitCode.USAGE
    title = "usage error"


class InputInvalidError(BlessError):
    """A profile or other input file is unreadable or does not match its schema."""

    exit_code = ExitCode.INPUT_INVALID
    title = "invalid input"


class AlreadyBlessedError(BlessError):
    exit_code = ExitCode.ALREADY_BLESSED
    title = "already blessed"


class LockHeldError(BlessError):
    exit_code = ExitCode.LOCK_HELD
    title = "lock held"


class ContainerConflictError(BlessError):
    exit_code = ExitCode.CONTAINER_CONFLICT
    title = "container conflict"


class WeakerBlessingError(BlessError):
    """``--rebless`` would replace a blessing with one whose failure-rate bound is weaker."""

    exit_code = ExitCode.WEAKER_BLESSING
    title = "weaker blessing"


class NoManifestError(BlessError):
    """No blessed manifest matches a config hash; ``details['nearest']`` holds the factor diff."""

    exit_code = ExitCode.NO_MANIFEST
    title = "no blessed manifest"


class VerifyFailedError(BlessError):
    exit_code = ExitCode.VERIFY_FAILED
    title = "verification failed"


class ManifestInvalidError(BlessError):
    exit_code = ExitCode.MANIFEST_INVALID
    title = "invalid manifest"


class ManifestDuplicateError(BlessError):
    exit_code = ExitCode.MANIFEST_DUPLICATE
    title = "duplicate manifest (store corruption)"


class GateFailedError(BlessError):
    exit_code = ExitCode.GATE_FAILED
    title = "gate failed"


class UnsafeEnvError(BlessError):
    exit_code = ExitCode.UNSAFE_ENV
    title = "unsafe environment"


class ResolutionError(BlessError):
    """A factor (image ID, model revision, hardware facts) could not be resolved."""

    exit_code = ExitCode.RESOLUTION_FAILED
    title = "cannot resolve factors"


class HardwareMismatchError(BlessError):
    exit_code = ExitCode.HARDWARE_MISMATCH
    title = "hardware mismatch"


class BootstrapFailedError(BlessError):
    exit_code = ExitCode.BOOTSTRAP_FAILED
    title = "bootstrap failed"


class TrialsFailedError(BlessError):
    exit_code = ExitCode.TRIALS_FAILED
    title = "trials failed"


class CanaryFailedError(BlessError):
    exit_code = ExitCode.CANARY_FAILED
    title = "canary failed"


class CacheChangedError(BlessError):
    """The blessed files changed between verification and use."""

    exit_code = ExitCode.CACHE_CHANGED
    title = "blessed cache changed after verification"


class EngineFailedError(BlessError):
    """The engine did not start or become ready (outside of a bless run)."""

    exit_code = ExitCode.ENGINE_FAILED
    title = "engine failed"


class CacheNotUsedError(BlessError):
    """The served engine did not load the blessed cache (it compiled, or keyed its cache differently)."""

    exit_code = ExitCode.CACHE_NOT_USED
    title = "blessed cache not used"


class RuntimeUnavailableError(BlessError):
    exit_code = ExitCode.RUNTIME_UNAVAILABLE
    title = "runtime unavailable"


class ImageMissingError(BlessError):
    exit_code = ExitCode.IMAGE_MISSING
    title = "image missing"


class InsufficientGpuError(BlessError):
    exit_code = ExitCode.INSUFFICIENT_GPU
    title = "not enough GPU"


class InterruptedByUserError(BlessError):
    """The user or the system asked us to stop (SIGINT / SIGTERM)."""

    exit_code = ExitCode.INTERRUPTED
    title = "interrupted"


EXIT_CODES: tuple[tuple[ExitCode, str], ...] = (
    (ExitCode.OK, "success"),
    (ExitCode.INTERNAL, "unexpected internal error (a bug: rerun with --verbose and report it)"),
    (ExitCode.USAGE, "bad command-line usage"),
    (ExitCode.INPUT_INVALID, "a profile or input file is unreadable or invalid"),
    (ExitCode.ALREADY_BLESSED, "a blessing already exists for this config hash (use --rebless)"),
    (ExitCode.LOCK_HELD, "another bless holds the lock for this config hash"),
    (
        ExitCode.CONTAINER_CONFLICT,
        "a container of ours is already running, or a foreign container holds our name",
    ),
    (
        ExitCode.WEAKER_BLESSING,
        "--rebless would replace a blessing with a weaker failure-rate bound (use --allow-weaker)",
    ),
    (ExitCode.NO_MANIFEST, "no blessed manifest matches the config hash (config drift)"),
    (ExitCode.VERIFY_FAILED, "blessed cache files differ from the manifest"),
    (ExitCode.MANIFEST_INVALID, "a manifest is unreadable, schema-invalid or of an unknown version"),
    (ExitCode.MANIFEST_DUPLICATE, "two manifests claim one config hash (store corruption)"),
    (ExitCode.GATE_FAILED, "bless gate: one or more profiles are not blessed"),
    (ExitCode.UNSAFE_ENV, "unsafe debug or cache-disabling settings in the profile"),
    (ExitCode.RESOLUTION_FAILED, "a factor (image ID, model revision, hardware) could not be resolved"),
    (ExitCode.HARDWARE_MISMATCH, "this machine does not match the profile's declared hardware"),
    (ExitCode.BOOTSTRAP_FAILED, "phase 1 (bootstrap compile) failed"),
    (ExitCode.TRIALS_FAILED, "phase 2 (replay-coherence / reuse trials) rejected every candidate"),
    (ExitCode.CANARY_FAILED, "serve-full: the canary did not reproduce the golden output"),
    (ExitCode.CACHE_CHANGED, "serve-full: blessed files changed between verification and use"),
    (ExitCode.ENGINE_FAILED, "serve-full: the engine exited or never became ready"),
    (
        ExitCode.CACHE_NOT_USED,
        "serve-full: the engine did not load the blessed cache (it compiled or keyed it anew)",
    ),
    (ExitCode.RUNTIME_UNAVAILABLE, "the container runtime (Docker) or local runtime is unavailable"),
    (ExitCode.IMAGE_MISSING, "the engine image is not present"),
    (ExitCode.INSUFFICIENT_GPU, "not enough GPUs or GPU memory for the profile"),
    (ExitCode.INTERRUPTED, "interrupted by SIGINT/SIGTERM (containers stopped, evidence kept)"),
)


class EngineHttpError(BlessError):
    """A request to the engine failed or its reply was malformed; ``refused`` marks a closed port."""

    title = "engine request failed"

    def __init__(self, message: str, *, refused: bool = False):
        super().__init__(message)
        self.refused = refused


class NotReadyError(BlessError):
    """The engine exited, timed out or kept failing before it became ready."""

    title = "engine not ready"
