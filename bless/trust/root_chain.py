"""Which root the verifying client starts from: a store remembers one root chain.

A serving host presents a ``root.json`` (its ``--trust`` anchor); the store's TUF state
(``<root>/trust/``) holds the root it trusted last. The Updater always starts from the store's
root, and the presented one must be on that root's chain; another chain needs ``<root>/trust``
removed on purpose (:func:`forget_hint` says so).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tuf.api import exceptions as tuf_errors
from tuf.api.metadata import Metadata, Root

from bless.errors import RollbackError, TrustInvalidError
from bless.trust.metadata import parse_root, read_trust_file

__all__ = ["bootstrap_root", "forget_hint"]


def forget_hint(state_dir: Path) -> str:
    """How an operator deliberately moves a store to another root chain (and what that costs)."""
    return (
        f"to trust another root on purpose, remove {state_dir} (the host then forgets the versions it trusted: "
        "rollback protection starts again from the new root), or use another store root"
    )


def bootstrap_root(state_dir: Path, anchor: bytes, available: Mapping[str, bytes]) -> bytes:
    """The root the Updater starts from: the store's trusted root, once ``anchor`` is shown to be on its chain.

    A store remembers one root chain. The presented ``anchor`` is accepted only if it is the store's
    trusted root, a root the store passed through, or a successor reachable through ``N.root.json``
    files of ``available``, each version signed by a threshold of the previous version's root keys and
    of its own (checked with python-tuf's ``Root.verify_delegate``, as its Updater does). Starting the
    Updater from the store's root (never from ``anchor``) keeps its rollback state: bootstrapping from
    an unrelated root made the Updater discard the timestamp and snapshot versions it had trusted.

    Raises:
        TrustInvalidError: another root chain, a missing link of the chain, or unreadable trust state (66).
        RollbackError: a root older than the store's that the store never trusted (64).
    """
    presented = parse_root(anchor, "the trusted root.json")
    current_path = state_dir / "root.json"
    if not current_path.exists():
        return anchor  # first use: this store trusts the root it is provisioned with
    current_bytes = read_trust_file(current_path)
    try:
        current = parse_root(current_bytes, f"{current_path}")
    except TrustInvalidError as exc:
        raise TrustInvalidError(
            str(exc), hint=forget_hint(state_dir), details={"state_dir": str(state_dir)}, remedy="forget_trusted_root"
        ) from None
    have, want = current.signed.version, presented.signed.version
    another = _another_chain(state_dir, have, want)
    if want == have:
        if presented.signed != current.signed:
            raise another
    elif want < have:
        _check_trusted_before(state_dir, presented, have, another)
    else:
        _check_successors(current.signed, anchor, want, available, another)
    return current_bytes


def _another_chain(state_dir: Path, have: int, want: int) -> TrustInvalidError:
    """The refusal of a presented root (version ``want``) that is not on the store's chain (at ``have``)."""
    return TrustInvalidError(
        f"this store already trusts another root chain (its root is version {have}: {state_dir / 'root.json'}); "
        f"the presented root.json (version {want}) is not on that chain",
        hint=f"use the root.json this store was first verified with (or a later one of its chain); "
        f"{forget_hint(state_dir)}",
        details={"trusted_root_version": have, "presented_root_version": want, "state_dir": str(state_dir)},
        remedy="another_root_chain",
    )


def _check_trusted_before(state_dir: Path, presented: Metadata[Root], have: int, another: TrustInvalidError) -> None:
    """An older root is accepted only as one the store followed before: it keeps following from where it is."""
    want = presented.signed.version
    kept = state_dir / "root_history" / f"{want}.root.json"
    if not kept.is_file():
        raise RollbackError(
            f"the presented root.json is version {want}; this store already trusts version {have} and never "
            f"trusted a version {want}",
            hint="provision the host with the current root.json of the signing repository (DIR/metadata/root.json)",
            details={"trusted_root_version": have, "presented_root_version": want},
        )
    if parse_root(read_trust_file(kept), f"{kept}").signed != presented.signed:
        raise another


def _check_successors(
    trusted: Root, anchor: bytes, want: int, available: Mapping[str, bytes], another: TrustInvalidError
) -> None:
    """Walk from ``trusted`` to version ``want`` (``anchor``): each ``N.root.json`` signed by N-1's keys and its own."""
    have = trusted.version
    for version in range(have + 1, want + 1):
        name = f"{version}.root.json"
        data = anchor if version == want else available.get(name)
        if data is None:
            raise TrustInvalidError(
                f"cannot follow this store's root version {have} to the presented version {want}: {name} is missing",
                hint="verify trusting the signing repository's metadata directory (it keeps every N.root.json), or "
                "put the missing N.root.json files beside the root.json",
                remedy="root_chain_gap",
                details={"trusted_root_version": have, "presented_root_version": want},
            )
        successor = parse_root(data, name)
        try:
            if successor.signed.version != version:
                raise tuf_errors.BadVersionNumberError(f"{name} holds version {successor.signed.version}")
            trusted.verify_delegate(Root.type, successor.signed_bytes, successor.signatures)
            successor.signed.verify_delegate(Root.type, successor.signed_bytes, successor.signatures)
        except tuf_errors.RepositoryError as exc:
            raise TrustInvalidError(
                f"{another} ({name}: {exc})", hint=another.hint, details=another.details, remedy=another.remedy
            ) from None
        trusted = successor.signed
