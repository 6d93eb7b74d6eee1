"""``bless pull``: a blessing from an OCI registry into the local store, verified, atomically.

Steps (:data:`PULL_STEPS`, each preceded by a fault point ``pull:<step>`` of the crash tests' seam,
``fault``: see :mod:`bless.store.faults`; production callers pass nothing):

``resolve``   the OCI manifest by digest (its bytes must hash to it) or by tag (the digest is printed),
              the blessing manifest (config blob, checked against its digest while it streams, canonical,
              listing exactly the artifact's files);
``trust``     with ``trust_dir``: the signatures artifact (``sha256-<hex>.bless-trust``) through TUF
              (:func:`bless.trust.check_blessing`): unsigned, untrusted key, below threshold, expired,
              rolled back or manifest differing from the signed target are refused before any file moves;
``stage``     the config's writer lock is taken for the rest of the pull and the live manifest looked up
              once (:mod:`.decision`): a present blessing of this very version ends the pull here (a
              no-op); one older than the live blessing of the config is refused (exit 16) unless
              ``allow_downgrade``. A lock held by another writer: present and older are still told from
              the live manifest, else the pull waits for it (another pull of the same blessing: this one
              then finds it present, a no-op). Then a staging dir ``staging/pull-*`` (with its owner
              record) is created, after removing those of dead pulls;
``download``  refused at once (exit 15) when the store's file system has less free space than the files
              need (less those linked from the live version); then every blob the manifest names,
              checked against its digest and size while it streams, each within its own deadline and
              all of them within the pull's (:class:`TransferLimits`: a grace plus the bytes at a
              minimum rate; past it the pull is refused, exit 74); files the live blessing of this
              config already holds (a rebless's unchanged files) are hard-linked from it (copied
              across file systems) and hashed (downloaded after all if they do not match); a disk
              that fills up meanwhile is refused (exit 15);
``publish``   :meth:`bless.store.Store.publish`: the same atomic publish as ``bless run`` (re-hash, move,
              read-only, manifest last as the commit point; ``fault`` is passed on to its own points). A
              kill at any step leaves the old or the new blessing, never a half; the next pull removes the
              dead pull's staging dir.

The package: :mod:`.flow` (the steps), :mod:`.decision` (what to do, given the live manifest: no I/O),
:mod:`.download` (the download engine: blobs into a tree, linked from the live blessing where it holds them).
"""

from bless.flows.pull.flow import PULL_STEPS, PullResult, pull_blessing

__all__ = ["PULL_STEPS", "PullResult", "pull_blessing"]
