"""The serving side: is this blessing a signed, fresh, current TUF target? (``--trust DIR``)

A serving host verifies with ``--trust DIR`` (a directory holding at least the trusted ``root.json``)
through python-tuf's own client (:class:`tuf.ngclient.Updater`), fed from memory instead of a
network: the metadata comes from a pulled artifact, from ``DIR`` itself, or from what the host trusted
before. The Updater keeps TUF's trusted-metadata directory in the store root (``<root>/trust/``): the
highest versions seen, so metadata that is older (rolled back) or expired is refused even when it is
validly signed, and thresholds and root rotation work as TUF defines them. The Updater starts from
the store's own trusted root (:mod:`bless.trust.root_chain`); what it raises becomes a bless refusal
(:mod:`bless.trust.refusals`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib import parse

from tuf.api import exceptions as tuf_errors
from tuf.api.metadata import Metadata, Root, Snapshot, TargetFile, Targets, Timestamp
from tuf.ngclient import Updater, UpdaterConfig
from tuf.ngclient.fetcher import FetcherInterface

from bless.core.json_form import JsonForm
from bless.core.manifest import Manifest
from bless.errors import TargetMismatchError, TrustInvalidError, UnsignedError
from bless.system.entries import unsafe_to_trust
from bless.system.file_locks import blocking_file_lock
from bless.system.os_refusals import full_disk, os_errors
from bless.trust.metadata import (
    ROLE_MAX_BYTES,
    check_strict_json,
    iso_utc,
    metadata_from_dir,
    parse_metadata,
    parse_root,
)
from bless.trust.refusals import refuse_mixed_versions, updater_refusal
from bless.trust.root_chain import bootstrap_root, forget_hint
from bless.trust.target import target_path

__all__ = ["UNSIGNED_NOTE", "TrustVerdict", "check_blessing", "trust_report"]

#: What a report says of a blessing whose signature was not checked.
UNSIGNED_NOTE = "unsigned: no --trust given, signatures were not checked"
_UPDATER_CONFIG = UpdaterConfig(
    root_max_length=ROLE_MAX_BYTES[Root.type],
    targets_max_length=ROLE_MAX_BYTES[Targets.type],
    snapshot_max_length=ROLE_MAX_BYTES[Snapshot.type],
    timestamp_max_length=ROLE_MAX_BYTES[Timestamp.type],
)
_BASE_URL = "https://metadata.bless.invalid/"


@dataclass(frozen=True)
class TrustVerdict(JsonForm):
    """A blessing verified against trusted metadata: which target, at which versions, until when."""

    json_keys = ("signed", "target", "versions", "expires", "custom")

    target: str
    versions: Mapping[str, int]
    expires: str
    custom: Mapping[str, Any] = field(default_factory=dict)

    def json_extra(self) -> dict[str, Any]:
        """``signed``: a verdict is only ever of a signed blessing (:func:`trust_report` says when unsigned)."""
        return {"signed": True}


def trust_report(verdict: TrustVerdict | None) -> dict[str, Any]:
    """The ``trust`` section of a report: the verdict, or a note that nothing was checked."""
    return verdict.to_dict() if verdict is not None else {"signed": False, "note": UNSIGNED_NOTE}


class _MemoryFetcher(FetcherInterface):
    """Serves metadata files from memory: the Updater's checks, without a network."""

    def __init__(self, files: Mapping[str, bytes]) -> None:
        self._files = dict(files)

    def _fetch(self, url: str) -> Iterator[bytes]:
        name = parse.unquote(url.removeprefix(_BASE_URL))
        data = self._files.get(name)
        if data is None:
            raise tuf_errors.DownloadHTTPError(f"{name} not available", 404)
        return iter((data,))


def check_blessing(
    manifest: Manifest,
    data: bytes,
    *,
    trust_dir: Path,
    state_dir: Path,
    lock_path: Path,
    candidate: Mapping[str, bytes] | None = None,
) -> TrustVerdict:
    """Verify ``manifest`` (file bytes ``data``) is a signed, fresh, current TUF target; record what was trusted.

    ``trust_dir`` holds the trusted ``root.json`` (the anchor). New metadata comes from ``candidate``
    (e.g. a pulled artifact), else from ``trust_dir`` when it holds ``timestamp.json``, else from
    what ``state_dir`` trusted before. ``state_dir`` is TUF's trusted-metadata directory, read and
    recorded under the flock ``lock_path`` (a store's ``StorePaths.trust`` and ``StorePaths.trust_lock``).

    Raises:
        UnsignedError, SignatureUntrustedError, BelowThresholdError, MetadataExpiredError,
        RollbackError, TargetMismatchError, TrustInvalidError: each refusal its own exit code.
        StoreUnavailableError: the lock file cannot be opened; NoSpaceError: a full or read-only disk.
    """
    trust_files, anchor = _read_anchor(Path(trust_dir))
    _create_state_dir(state_dir)
    if candidate is None:
        candidate = trust_files if "timestamp.json" in trust_files else metadata_from_dir(state_dir)
    name = target_path(manifest.config_hash, manifest.cache.dir_id)
    with (
        full_disk(f"recording the trusted metadata in {state_dir}"),
        blocking_file_lock(lock_path, what="lock of the trusted metadata"),
    ):
        # python-tuf's Updater reads the state files itself, whole and through links: vet them first.
        trusted_before = "timestamp.json" in metadata_from_dir(state_dir)
        served, presented_version = _metadata_to_serve(candidate, trust_files, anchor)
        bootstrap = bootstrap_root(state_dir, anchor, served)
        try:
            info = _refreshed_target_info(name, state_dir=state_dir, served=served, bootstrap=bootstrap)
        except (tuf_errors.RepositoryError, tuf_errors.DownloadError, OSError) as exc:
            raise updater_refusal(
                exc, state_dir=state_dir, candidate=candidate, trusted_before=trusted_before
            ) from None
        signed_target = _matching_target(manifest, data, name, info)
        trusted = _trusted_after(state_dir, presented_version)
    return _verdict(name, signed_target, trusted)


def _read_anchor(trust_dir: Path) -> tuple[dict[str, bytes], bytes]:
    """The metadata files of ``trust_dir`` and, among them, the trusted ``root.json`` it must hold."""
    trust_files = metadata_from_dir(trust_dir)
    anchor = trust_files.get("root.json")
    if anchor is None:
        raise TrustInvalidError(
            f"{trust_dir} holds no root.json",
            hint="provision the serving host with the root.json of the signing repository (DIR/metadata/root.json)",
        )
    return trust_files, anchor


def _create_state_dir(state_dir: Path) -> None:
    why = unsafe_to_trust(state_dir)  # like every other store directory: never a link, never writable by others
    if why is not None:
        raise TrustInvalidError(
            f"{why}: the store's trusted metadata would be read and written through it",
            hint="bless never makes it a link or writable by others: remove it (the next trusted verification "
            "records it again from the trusted root.json)",
            remedy="trust_state_dir",
        )
    with os_errors(
        f"creating {state_dir}",
        refusal=TrustInvalidError,
        hint="the store's trusted metadata lives there: check that the store root is a directory this user can write",
    ):
        state_dir.mkdir(parents=True, exist_ok=True)


def _metadata_to_serve(
    candidate: Mapping[str, bytes], trust_files: Mapping[str, bytes], anchor: bytes
) -> tuple[dict[str, bytes], int]:
    """What the in-memory fetcher offers the Updater, vetted first; and the presented root's version.

    The Updater follows root versions through the fetcher: it is offered the chain the anchor was
    checked through (the trust directory's N.root.json), and the anchor itself under its version's name.
    """
    served = dict(candidate)
    for file_name, file_data in trust_files.items():
        if file_name.endswith(".root.json"):
            served.setdefault(file_name, file_data)
    check_strict_json(served, "the signed metadata")
    for file_name, file_data in served.items():  # every root the Updater may walk: each key listed once
        if file_name.endswith("root.json"):
            parse_root(file_data, file_name)
    refuse_mixed_versions(candidate)
    presented_version = parse_root(anchor, "the trusted root.json").signed.version
    served[f"{presented_version}.root.json"] = anchor
    return served, presented_version


def _refreshed_target_info(
    name: str, *, state_dir: Path, served: Mapping[str, bytes], bootstrap: bytes
) -> TargetFile | None:
    """python-tuf's Updater, refreshed from ``served`` on top of ``state_dir``: the signed target ``name``, if any.

    Raises python-tuf's own errors (and OSError from the state directory): the caller makes them refusals.
    """
    updater = Updater(
        str(state_dir),
        _BASE_URL,
        fetcher=_MemoryFetcher(served),
        bootstrap=bootstrap,
        config=_UPDATER_CONFIG,
    )
    updater.refresh()
    return updater.get_targetinfo(name)


def _matching_target(manifest: Manifest, data: bytes, name: str, info: TargetFile | None) -> TargetFile:
    """The signed target ``info``; refused when there is none (unsigned) or the manifest bytes differ from it."""
    if info is None:
        raise UnsignedError(
            f"{manifest.config_hash[:16]}... version {manifest.cache.dir_id} is not a target of the signed metadata",
            hint="sign it with the signing repository's keys; a re-blessed config delists its older versions "
            "unless signed keeping them (keep_previous)",
            remedy="sign_target",
            details={"target": name},
        )
    try:
        info.verify_length_and_hashes(data)
    except tuf_errors.LengthOrHashMismatchError as exc:
        raise TargetMismatchError(
            f"the manifest of {manifest.config_hash[:16]}... differs from its signed target: {exc}",
            hint="the manifest was changed after signing; restore it from the signer or pull it again",
            details={"target": name},
        ) from None
    return info


def _trusted_after(state_dir: Path, presented_version: int) -> dict[str, bytes]:
    """The metadata the store trusts now, which must have reached the presented root's version."""
    trusted = metadata_from_dir(state_dir)
    if (
        "root.json" not in trusted
        or parse_metadata(trusted["root.json"], "root.json").signed.version < presented_version
    ):
        # The chain was checked before; an Updater that did not reach the presented root is a bug, not a pass.
        raise TrustInvalidError(
            f"the store's trusted root did not reach the presented version {presented_version}",
            hint=forget_hint(state_dir),
            details={"state_dir": str(state_dir)},
            remedy="forget_trusted_root",
        )
    return trusted


def _verdict(name: str, info: TargetFile, trusted: Mapping[str, bytes]) -> TrustVerdict:
    """The verified target, each trusted role's version, and the earliest expiry among them."""
    versions: dict[str, int] = {}
    expiries: list[str] = []
    for role in (Root.type, Timestamp.type, Snapshot.type, Targets.type):
        raw = trusted.get(f"{role}.json")
        if raw is None:
            continue
        signed = Metadata.from_bytes(raw).signed
        versions[role] = signed.version
        expiries.append(iso_utc(signed.expires))
    return TrustVerdict(
        target=name,
        versions=versions,
        expires=min(expiries) if expiries else "",
        custom=info.custom if isinstance(info.custom, dict) else {},
    )
