"""Pure verification of a cache tree against an expected listing.

A blessed cache is a tree of plain files and directories. This package records such a tree
(:func:`hash_tree`, in :mod:`.record`) and checks a tree on disk against a recorded listing
(:func:`verify_tree`, in :mod:`.check`); both walk the tree without following a link (:mod:`.walk`)
and hash in parallel (:mod:`.hashing`); what they produce is in :mod:`.results`. It is library code:
nothing here prints or exits; results are returned as values and the only exception raised on
purpose is :class:`TreeError` (from :func:`hash_tree`). Import what you need from here: the modules
are how the package is laid out, not what it offers.

Safety rules that shape the code:

* Symbolic links are never followed, neither for files nor for directories (:mod:`.walk`).
* Files are opened with ``O_NONBLOCK`` so that a FIFO swapped in after the scan cannot block the
  open forever, then ``fstat``-ed to confirm they are still regular files of the expected size.
* Sizes are compared (``lstat``) before any hashing; a file of the wrong size is never read.
* Hashing runs in a thread pool: ``hashlib`` releases the GIL while hashing large buffers and
  ``readinto``/``readv`` release it while reading, so threads give real parallelism.
"""

from bless.core.verify.check import verify_tree
from bless.core.verify.hashing import ProgressFn, default_workers
from bless.core.verify.record import hash_tree
from bless.core.verify.results import (
    ROOT_PATH,
    FileEntry,
    Notice,
    Problem,
    ProblemKind,
    TreeCheck,
    TreeError,
    TreeListing,
)

__all__ = [
    "ROOT_PATH",
    "FileEntry",
    "Notice",
    "Problem",
    "ProblemKind",
    "ProgressFn",
    "TreeCheck",
    "TreeError",
    "TreeListing",
    "default_workers",
    "hash_tree",
    "verify_tree",
]
