"""Signed blessings with The Update Framework (python-tuf): keys, signing, offline verification.

A blessing's manifest is a TUF target (:mod:`bless.trust.target`). The signing side
(``bless trust init|rotate``, ``bless sign``) is a directory of keys and metadata; a serving host
verifies under ``--trust DIR`` with python-tuf's own client. One module per concern, dependencies
running one way (the repository and the client never import each other)::

    metadata.py    metadata files as both sides read them: names, size limits, bounded reads, strict JSON
    target.py      a blessing as a TUF target: its name, the bytes signed and checked, its custom fields
    keys.py        the private keys of a signing repository: encrypted files (DIR/keys/), signer URIs (HSM, KMS)
    repository.py  the signing side: trust init, sign, rotate
    client.py      the serving side: check_blessing through python-tuf's Updater, fed from memory
    root_chain.py  which root the client starts from (a store remembers one root chain)
    refusals.py    python-tuf's errors as bless refusals, each with its own exit code
"""

from __future__ import annotations

from bless.trust.client import UNSIGNED_NOTE, TrustVerdict, check_blessing, trust_report
from bless.trust.metadata import metadata_from_dir
from bless.trust.repository import (
    DEFAULT_EXPIRES,
    DEFAULT_ROOT_EXPIRES,
    KeySources,
    RoleKeys,
    TrustSigning,
    init_repository,
    parse_duration,
    rotate_role,
    sign_blessing,
)
from bless.trust.target import target_path

__all__ = [
    "DEFAULT_EXPIRES",
    "DEFAULT_ROOT_EXPIRES",
    "UNSIGNED_NOTE",
    "KeySources",
    "RoleKeys",
    "TrustSigning",
    "TrustVerdict",
    "check_blessing",
    "init_repository",
    "metadata_from_dir",
    "parse_duration",
    "rotate_role",
    "sign_blessing",
    "target_path",
    "trust_report",
]
