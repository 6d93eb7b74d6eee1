"""The narrow parts of a store that its writer operations are given.

:mod:`~bless.store.publish`, :mod:`~bless.store.reject` and :mod:`~bless.store.gc` work on a
:class:`StoreParts` (paths, locks, leases, manifests), never on the :class:`~bless.store.Store`
facade: the facade builds the parts and calls the operations, and nothing calls back into it, so
the package's dependencies run one way (facade -> operations -> parts).
"""

from __future__ import annotations

from dataclasses import dataclass

from bless.store.catalog import ManifestCatalog
from bless.store.layout import StorePaths
from bless.store.lease import LeaseBook
from bless.store.locks import HashLocks

__all__ = ["StoreParts"]


@dataclass(frozen=True)
class StoreParts:
    """One store's directories, per-hash writer locks, serving leases and manifests."""

    paths: StorePaths
    locks: HashLocks
    leases: LeaseBook
    catalog: ManifestCatalog
