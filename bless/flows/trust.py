"""``bless trust init`` and ``bless trust rotate``: the TUF roles and keys that sign blessings.

The options arrive as the user wrote them (durations as ``30d``, signers as ``ROLE=URI``); the keys are
reached through a :class:`~bless.trust.keys.KeyAccess`, whose passphrase source is asked only once the
flow knows whether a file key will be written or opened (the CLI prompts then).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bless.trust import DEFAULT_EXPIRES, DEFAULT_ROOT_EXPIRES, RoleKeys, TrustSigning, init_repository, rotate_role
from bless.trust.keys import NO_KEY_OPTIONS, KeyAccess, has_encrypted_keys, parse_signer_option
from bless.trust.metadata import TOP_LEVEL_ROLES
from bless.trust.repository import TrustInitResult, parse_duration

__all__ = ["TrustInit", "init_trust", "rotate_trust"]

#: A role of one key, one signature required (trust init's default for root and targets).
ONE_KEY = RoleKeys()


@dataclass(frozen=True)
class TrustInit:
    """A signing repository created by ``trust init``."""

    result: TrustInitResult

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``bless trust init --json``): the result's own."""
        return self.result.to_dict()


def init_trust(
    keys_dir: Path,
    *,
    root: RoleKeys = ONE_KEY,
    targets: RoleKeys = ONE_KEY,
    access: KeyAccess = NO_KEY_OPTIONS,
    expires: str = f"{DEFAULT_EXPIRES.days}d",
    root_expires: str = f"{DEFAULT_ROOT_EXPIRES.days}d",
) -> TrustInit:
    """Create the four TUF roles, their keys and signed metadata in ``keys_dir`` (see
    :func:`bless.trust.init_repository`): a role with signers in ``access`` uses those keys, every other
    one gets file keys, so a passphrase is asked for (with confirmation) unless every role has a signer.

    Raises:
        UsageError: a bad ``--signer``, duration, or an unencrypted file key not asked for.
        TrustExistsError, TrustInvalidError, NoSpaceError: as :func:`bless.trust.init_repository`.
    """
    file_roles = set(TOP_LEVEL_ROLES) - set(parse_signer_option(access.signers))
    sources = access.sources(passphrase_needed=bool(file_roles), confirm=True)
    result = init_repository(
        keys_dir,
        roles={"root": root, "targets": targets},
        sources=sources,
        expires=parse_duration(expires),
        root_expires=parse_duration(root_expires),
    )
    return TrustInit(result)


def rotate_trust(
    keys_dir: Path,
    role: str,
    *,
    access: KeyAccess = NO_KEY_OPTIONS,
    new_signers: tuple[str, ...] = (),
    expires: str = f"{DEFAULT_EXPIRES.days}d",
    root_expires: str = f"{DEFAULT_ROOT_EXPIRES.days}d",
) -> TrustSigning:
    """Replace ``role``'s keys in a new root version and re-sign (see :func:`bless.trust.rotate_role`).

    The new keys are ``new_signers`` (URIs, checked as ``--signer`` values are) or fresh file keys, for
    which a new passphrase is asked for with confirmation; an existing encrypted key needs one too.

    Raises:
        UsageError: a bad signer URI or duration. Trust errors: as :func:`bless.trust.rotate_role`.
    """
    for uri in new_signers:
        parse_signer_option([f"{role}={uri}"])  # the same checks as --signer's (scheme, role)
    encrypted = has_encrypted_keys(keys_dir)
    sources = access.sources(passphrase_needed=not new_signers or encrypted, confirm=not new_signers and not encrypted)
    return rotate_role(
        keys_dir,
        role,
        sources=sources,
        new_signers=new_signers,
        expires=parse_duration(expires),
        root_expires=parse_duration(root_expires),
    )
