"""The on-disk store: blessed trees, live manifests, archive, rejected and interrupted evidence, locks.

Layout under a root (``$BLESS_ROOT``, default ``~/.cache/bless``)::

    <root>/manifests/<config_hash>.json          live manifests (or a separate manifests_dir, e.g. a git
                                                 checkout); found by their ``config_hash`` FIELD, the
                                                 file name is only a hint
    <root>/blessed/<config_hash>/<dir_id>/       immutable blessed trees (files 0444, dirs 0555); the
                                                 path is derived from the manifest, never stored
    <root>/staging/<run_id>/                     work dirs of running blesses (``.owner`` = pid + host);
                                                 a run writes its candidate trees in subdirectories
    <root>/archive/<config_hash>/<created>-<tree_sha256[:12]>.json
                                                 manifests replaced by ``--rebless``
    <root>/rejected/<config_hash>/<run_id>-c<candidate>/
                                                 ``tree/`` + ``summary.md`` + ``evidence.json`` (+ what
                                                 the caller adds): a rejected candidate kept as evidence
    <root>/interrupted/<config_hash>/<run_id>-c<candidate>/
                                                 the same, for a candidate whose run a signal stopped (no
                                                 verdict: not a rejection, so kept apart from them)
    <root>/locks/<config_hash>.lock              per-hash lock (flock, released by the kernel when the
                                                 holder dies) + ``<config_hash>.holder`` (pid, host,
                                                 started) so a refusal can name the holder
    <root>/runs/<run_id>/                        engine logs of accepted runs + ``.blessing.json``
    <root>/serve/<name>-<stamp>-<token>/         serve-full scratch and evidence
    <root>/leases/<config_hash>/<dir_id>/<token>.json
                                                 serving leases (gc keeps what a live server holds)
    <root>/state/manifests-dirs.json             every manifests dir this store has published to (gc
                                                 consults them all)
    <root>/state/claims-<key>.json               which config hash each manifest file claims, keyed by
                                                 the file's identity (a lookup cache; never the truth)

Nothing in the store holds an absolute path except ``state/`` (which names manifests dirs outside
the root): manifests have none and every path is derived from the root, so copying the whole root
elsewhere (``cp -a``) keeps every blessing valid.

Modules, each importing only those before it (``tests/unit/test_core_structure.py``): the crash
tests' seam (:mod:`.faults`); the narrow parts (:mod:`.layout` paths and names, :mod:`.index` the pure lookup
rules, :mod:`.trusted_paths`, :mod:`.locks`, :mod:`.lease` serving leases, :mod:`.scan` reading a
manifests dir, :mod:`.dirs_record` the manifests dirs published to, :mod:`.catalog` the manifests,
:mod:`.parts` the bundle handed to the operations); the writer operations (:mod:`.gc` recover and gc,
:mod:`.publish`, :mod:`.reject`); and the facade (:mod:`.store`, :class:`Store`).

Concurrency: writers of one config hash serialize on its lock; :meth:`Store.publish` and
:meth:`Store.reject` take it themselves (re-entrantly, so an orchestrator that already holds it for
the whole run is fine). Readers (:meth:`Store.find`, verify, serve-full) take no lock.
"""

from bless.store.faults import FaultHook
from bless.store.gc import GcAction, GcReport, StagingOwner, staging_owner
from bless.store.index import LiveManifest, ManifestIndex, ManifestRecord, manifest_summary
from bless.store.layout import PARTIAL_PREFIX
from bless.store.publish import PUBLISH_STEPS, PublishResult
from bless.store.store import Store, builtin_root, default_root

__all__ = [
    "PARTIAL_PREFIX",
    "PUBLISH_STEPS",
    "FaultHook",
    "GcAction",
    "GcReport",
    "LiveManifest",
    "ManifestIndex",
    "ManifestRecord",
    "PublishResult",
    "StagingOwner",
    "Store",
    "builtin_root",
    "default_root",
    "manifest_summary",
    "staging_owner",
]
