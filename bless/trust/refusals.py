"""What the verifying client's failures mean as bless refusals, each with its own exit code.

python-tuf's Updater raises its own errors; :func:`updater_refusal` maps each to the bless error an
operator acts on (expired, rolled back, untrusted key, below threshold, too large, unsigned, a full
disk). Metadata mixing two signings is told apart before the Updater sees it
(:func:`refuse_mixed_versions`): python-tuf would report it as a rollback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from tuf.api import exceptions as tuf_errors
from tuf.api.metadata import Metadata, Root, Snapshot, Targets, Timestamp

from bless.errors import (
    BelowThresholdError,
    BlessError,
    MetadataExpiredError,
    RollbackError,
    SignatureUntrustedError,
    TrustInvalidError,
    UnsignedError,
)
from bless.system.os_refusals import full_disk_error
from bless.trust.metadata import ROLE_MAX_BYTES, read_trust_file

__all__ = ["refuse_mixed_versions", "updater_refusal"]

_MIXED_HINT = (
    "its files come from different signings: use timestamp.json, snapshot.json and targets.json of one signing "
    "(the signing repository's metadata/ as signing left it), or pull the signed blessing again"
)


def _diagnose_unsigned(state_dir: Path, candidate: Mapping[str, bytes], cause: Exception) -> BlessError:
    """Tell a signature by an untrusted key apart from too few signatures, for the failing role."""
    try:
        trusted_root: Root | None = Metadata.from_bytes(read_trust_file(state_dir / "root.json")).signed
    except Exception:
        trusted_root = None
    hint_keys = "sign with the keys the trusted root lists, or provision the right root.json"
    if trusted_root is not None:
        for role in (Timestamp.type, Snapshot.type, Targets.type):
            data = candidate.get(f"{role}.json")
            if data is None:
                continue
            try:
                metadata = Metadata.from_bytes(data)
                result = trusted_root.get_verification_result(role, metadata.signed_bytes, metadata.signatures)
            except Exception:  # noqa: S112 -- malformed: the generic message below says so
                continue
            if result.verified:
                continue
            if result.signed:
                return BelowThresholdError(
                    f"{role} metadata has {len(result.signed)} valid signature(s); its threshold is {result.threshold}",
                    hint=f"{result.missing} more key holder(s) of role {role} must sign",
                    details={"role": role, "signed": len(result.signed), "threshold": result.threshold},
                )
            return SignatureUntrustedError(
                f"{role} metadata carries no valid signature by a key the trusted root lists for {role}",
                hint=hint_keys,
                details={"role": role, "threshold": result.threshold},
                remedy="sign_with_root_keys",
            )
    return SignatureUntrustedError(f"signature check failed: {cause}", hint=hint_keys, remedy="sign_with_root_keys")


def _mixed_versions(files: Mapping[str, bytes]) -> str | None:
    """Why the timestamp, snapshot and targets of ``files`` are not one signing's, or None.

    A version mismatch inside the presented metadata is not a rollback (the host may never have trusted
    anything): it is told apart here, before python-tuf reports both as one error.
    """
    try:
        timestamp = Metadata.from_bytes(files["timestamp.json"]).signed
        snapshot = Metadata.from_bytes(files["snapshot.json"]).signed
        targets = Metadata.from_bytes(files["targets.json"]).signed
    except Exception:  # missing or malformed: python-tuf's own checks name it
        return None
    if not (isinstance(timestamp, Timestamp) and isinstance(snapshot, Snapshot) and isinstance(targets, Targets)):
        return None
    if timestamp.snapshot_meta.version != snapshot.version:
        return (
            f"timestamp.json (version {timestamp.version}) names snapshot version {timestamp.snapshot_meta.version}, "
            f"but snapshot.json is version {snapshot.version}"
        )
    listed = snapshot.meta.get("targets.json")
    if listed is not None and listed.version != targets.version:
        return (
            f"snapshot.json (version {snapshot.version}) names targets version {listed.version}, "
            f"but targets.json is version {targets.version}"
        )
    return None


def refuse_mixed_versions(files: Mapping[str, bytes]) -> None:
    """Refuse presented metadata whose timestamp, snapshot and targets are not one signing's (66)."""
    mixed = _mixed_versions(files)
    if mixed is not None:
        raise TrustInvalidError(
            f"the signed metadata mixes versions: {mixed}", hint=_MIXED_HINT, remedy="mixed_signings"
        )


def updater_refusal(
    exc: Exception, *, state_dir: Path, candidate: Mapping[str, bytes], trusted_before: bool
) -> BlessError:
    """The refusal for what python-tuf's Updater raised: one row per error, the most specific first."""
    size_limits = ", ".join(f"{role} {limit}" for role, limit in ROLE_MAX_BYTES.items())
    table: list[tuple[type[Exception], Callable[[], BlessError]]] = [
        (
            tuf_errors.ExpiredMetadataError,
            lambda: MetadataExpiredError(
                f"{exc}",
                hint="re-sign the blessing and distribute the new metadata",
                remedy="resign",
            ),
        ),
        (
            tuf_errors.BadVersionNumberError,
            lambda: (
                RollbackError(
                    f"{exc}: this host already trusted newer metadata",
                    hint="someone serves older signed metadata (a moved tag?); pull the current signed blessing",
                )
                if trusted_before  # nothing trusted here yet: nothing to roll back from
                else TrustInvalidError(
                    f"the signed metadata is inconsistent: {exc}", hint=_MIXED_HINT, remedy="mixed_signings"
                )
            ),
        ),
        (
            tuf_errors.UnsignedMetadataError,
            lambda: _diagnose_unsigned(state_dir, candidate, exc),
        ),
        (
            tuf_errors.DownloadLengthMismatchError,
            lambda: TrustInvalidError(
                f"signed metadata is larger than a verifier reads ({exc}; limits in bytes: {size_limits})",
                hint="bless's signing never writes metadata this large: it was made by other means; re-sign it",
                remedy="resign_oversized",
            ),
        ),
        (
            tuf_errors.DownloadHTTPError,
            lambda: UnsignedError(
                "no signed metadata is available for this blessing",
                hint="sign it and push it, or trust the signing repository's metadata directory",
                remedy="sign_and_push",
            ),
        ),
        (
            OSError,
            lambda: (
                full_disk_error(exc, f"cannot record the trusted metadata in {state_dir}")
                or TrustInvalidError(f"cannot use {state_dir}: {getattr(exc, 'strerror', None) or exc}")
            ),
        ),
    ]
    for error_type, refusal in table:
        if isinstance(exc, error_type):
            return refusal()
    return TrustInvalidError(f"trust metadata rejected: {exc}")  # any other RepositoryError or DownloadError
