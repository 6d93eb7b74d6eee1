"""``bless pull``: a blessing from an OCI registry into the local store, verified, atomically.

Steps (:data:`PULL_STEPS`, each preceded by a fault point ``pull:<step>`` of the crash tests' seam,
``fault``: see :mod:`bless.store.faults`; production callers pass nothing):

``resolve``   the OCI manifest by digest (its bytes must hash to it) or by tag (the digest is printed),
              the blessing manifest (config blob, checked against its digest while it streams, canonical,
              listing exactly the artifact's files);
``trust``     with ``trust_dir``: the signatures artifact (``sha256-<hex>.bless-trust``) through TUF
              (:func:`bless.trust.check_blessing`): unsigned, untrusted key, below threshold, expired,
              rolled back or manifest differing from the signed target are refused before any file moves;
``stage``     a present blessing of this very version ends the pull here (a no-op); one older than the
              live blessing of the config is refused (exit 16) unless ``allow_downgrade``; else the config's
              writer lock is taken for the rest of the pull, waiting for it (another pull of the same
              blessing: this one then finds it present, a no-op), and a staging dir ``staging/pull-*``
              (with its owner record) is created, after removing those of dead pulls;
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
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

from bless.core.manifest import Manifest
from bless.errors import (
    AlreadyBlessedError,
    ArtifactNotFoundError,
    DowngradeError,
    LockHeldError,
    NoSpaceError,
)
from bless.flows.trust_policy import trust_verdict
from bless.oci.artifact import (
    BlessingArtifact,
    BlobRef,
    parse_trust_artifact,
    trust_tag,
)
from bless.oci.client import CHUNK, Reference, RegistryClient, Transport
from bless.oci.limits import DEFAULT_LIMITS, TransferLimits
from bless.store import FaultHook, Store, staging_owner
from bless.system.os_refusals import NO_SPACE_ERRNOS, full_disk
from bless.system.trees import remove_tree
from bless.trust import TrustVerdict

__all__ = ["PULL_STEPS", "PullResult", "pull_blessing"]

PULL_STEPS: tuple[str, ...] = ("resolve", "trust", "stage", "download", "publish", "done")
STAGING_PREFIX = "pull-"
DOWNLOAD_WORKERS = 4


@dataclass(frozen=True)
class PullResult:
    """A pull: what was resolved, whether it was installed (False: it was already present)."""

    reference: str
    digest: str
    pinned: str
    config_hash: str
    dir_id: str
    installed: bool
    blobs_downloaded: int
    bytes_downloaded: int
    blessed_dir: Path
    trust: TrustVerdict | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "digest": self.digest,
            "pinned": self.pinned,
            "config_hash": self.config_hash,
            "dir_id": self.dir_id,
            "installed": self.installed,
            "blobs_downloaded": self.blobs_downloaded,
            "bytes_downloaded": self.bytes_downloaded,
            "blessed_dir": str(self.blessed_dir),
        }


def _signatures(client: RegistryClient, artifact: BlessingArtifact) -> dict[str, bytes] | None:
    """The TUF metadata pushed with the blessing, or None when it has none."""
    try:
        data, _digest = client.get_manifest(trust_tag(artifact.digest))
    except ArtifactNotFoundError:
        return None
    trust = parse_trust_artifact(data, artifact.digest)
    return {blob.title: client.read_blob(blob.digest, blob.size) for blob in trust.blobs}


def _refuse_downgrade(store: Store, manifest: Manifest, *, allowed: bool) -> None:
    """Refuse to replace a newer live blessing of the config with ``manifest`` unless ``allowed``.

    Signed metadata protects a host against rolled-back *metadata* under ``--trust``; this protects the
    store itself, with or without it: a tag moved back to an older blessing must not silently win.
    """
    live = store.find(manifest.config_hash)
    if allowed or live is None or live.cache.dir_id == manifest.cache.dir_id or manifest.created >= live.created:
        return
    raise DowngradeError(
        f"{manifest.config_hash[:16]}...: the pulled blessing ({manifest.cache.dir_id}, created {manifest.created}) "
        f"is older than the live one ({live.cache.dir_id}, created {live.created}); nothing was downloaded",
        hint="check the reference (a tag moved back?); to install the older blessing on purpose, pull it with "
        "bless pull --allow-downgrade",
        details={"live": live.cache.dir_id, "pulled": manifest.cache.dir_id},
    )


def _already_present(store: Store, manifest: Manifest) -> bool:
    live = store.find(manifest.config_hash)
    return (
        live is not None
        and live.cache.dir_id == manifest.cache.dir_id
        and live.cache.tree_sha256 == manifest.cache.tree_sha256
    )


def _remove_dead_pulls(store: Store) -> None:
    """Staging dirs of pulls whose process is gone (killed mid-pull): their debris, ours to remove."""
    staging = store.paths.staging
    if not staging.is_dir():
        return
    for entry in staging.iterdir():
        if not entry.name.startswith(STAGING_PREFIX) or not entry.is_dir():
            continue
        if staging_owner(entry).dead:
            remove_tree(entry)


def _download(
    origin: RegistryClient,
    tree: Path,
    files: tuple[BlobRef, ...],
    progress: Callable[[int], None] | None,
    workers: int,
    local_copies: Mapping[str, Path],
) -> tuple[int, int]:
    """Every file of the tree, each distinct blob once; returns (blobs, bytes) downloaded.

    A blob whose bytes the store already holds (``local_copies``: digest -> a file of the live
    blessing of this config) is hard-linked from there (copied where the file system refuses a
    link), hashed, and downloaded only when it does not hash right. After the first failure no
    further blob is started, and that first failure is what is raised (the others are usually its
    consequences, e.g. a registry that died mid-transfer).
    """
    by_digest: dict[str, list[BlobRef]] = {}
    for blob in files:
        by_digest.setdefault(blob.digest, []).append(blob)
    for blob in files:
        (tree / blob.title).parent.mkdir(parents=True, exist_ok=True)
    local = threading.local()
    lock = threading.Lock()

    def client() -> RegistryClient:
        if not hasattr(local, "client"):
            local.client = RegistryClient(
                origin.reference,
                plain_http=origin.plain_http,
                limits=origin.limits,
                deadline=origin.deadline,
                transport=origin.transport,
            )
        return local.client  # type: ignore[no-any-return]

    def report(size: int) -> None:
        if progress is not None:
            with lock:
                progress(size)

    failures: list[BaseException] = []
    downloaded: list[BlobRef] = []

    def fetch(group: list[BlobRef]) -> None:
        with lock:
            if failures:
                return
        try:
            fetch_group(group)
        except BaseException as exc:
            with lock:
                failures.append(exc)

    def fetch_group(group: list[BlobRef]) -> None:
        first = tree / group[0].title
        source = local_copies.get(group[0].digest)
        if source is None or not _reuse_verified(source, first, group[0]):
            with _new_file(first) as sink:
                client().download_blob(group[0].digest, group[0].size, sink, report)
            with lock:
                downloaded.append(group[0])
        for twin in group[1:]:
            shutil.copyfile(first, tree / twin.title, follow_symlinks=False)

    groups = list(by_digest.values())
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for future in [pool.submit(fetch, group) for group in groups]:
            future.result()
    if failures:
        raise failures[0]
    return len(downloaded), sum(blob.size for blob in downloaded)


def _new_file(path: Path) -> IO[bytes]:
    """A new file of ours (never over an existing name or through a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    return os.fdopen(fd, "wb")


def _open_regular(path: Path) -> IO[bytes]:
    """A regular file for reading, never through a link and never blocking (a FIFO is refused, not waited on)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        handle.close()
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return handle


def _reuse_verified(source: Path, target: Path, blob: BlobRef) -> bool:
    """Put a local file that should hold ``blob`` at ``target``; False (and nothing left) when it does not.

    A hard link where the file system allows one (the store on one file system: a rebless's unchanged
    files then cost no space and no copying; both versions are read-only, and publish leaves a linked
    file's mode alone when it gives a tree back), else a copy. Either way the result is hashed.
    """
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in NO_SPACE_ERRNOS:
            raise
        return _copy_verified(source, target, blob)  # EXDEV (another mount), EPERM (protected links), EMLINK
    try:
        with _open_regular(target) as reader:
            hasher = hashlib.sha256()
            size = 0
            while chunk := reader.read(CHUNK):
                hasher.update(chunk)
                size += len(chunk)
    except OSError:
        size = -1
    if size == blob.size and f"sha256:{hasher.hexdigest()}" == blob.digest:
        return True
    target.unlink(missing_ok=True)
    return False


def _copy_verified(source: Path, target: Path, blob: BlobRef) -> bool:
    """Copy a local file that should hold ``blob``, hashing it; False (and nothing left) when it does not."""
    hasher = hashlib.sha256()
    size = 0
    try:
        with _open_regular(source) as reader, _new_file(target) as sink:
            while chunk := reader.read(CHUNK):
                hasher.update(chunk)
                size += len(chunk)
                sink.write(chunk)
    except OSError as exc:
        target.unlink(missing_ok=True)
        if exc.errno in NO_SPACE_ERRNOS:
            raise
        return False
    if size != blob.size or f"sha256:{hasher.hexdigest()}" != blob.digest:
        target.unlink(missing_ok=True)
        return False
    return True


#: Room left beyond a pull's own bytes (directories, the manifest, the file system's own bookkeeping).
SPACE_MARGIN = 1 << 20


def _bytes_to_write(files: tuple[BlobRef, ...], local_copies: Mapping[str, Path]) -> int:
    """What a pull writes: every file, less one per digest the live version holds (linked, not written)."""
    linked: set[str] = set()
    total = 0
    for blob in files:
        if blob.digest in local_copies and blob.digest not in linked:
            linked.add(blob.digest)
            continue
        total += blob.size
    return total


def _check_free_space(directory: Path, needed: int, entries: int) -> None:
    """Refuse before downloading when the file system cannot hold ``needed`` bytes (and ``entries`` inodes)."""
    info = os.statvfs(directory)
    free = info.f_bavail * info.f_frsize
    if needed + SPACE_MARGIN > free:
        raise NoSpaceError(
            f"the blessing needs {needed} bytes in {directory} and its file system has {free} free",
            hint="free space there (bless gc removes what no blessing needs) or pull into another store root "
            "(--root); nothing was downloaded",
            details={"needed": needed, "free": free},
        )
    # Some file systems (btrfs) report no inode counts at all: only a known count is checked.
    if info.f_files > 0 and entries > info.f_favail:
        raise NoSpaceError(
            f"the blessing needs {entries} files and directories in {directory}; its file system has "
            f"{info.f_favail} inodes free",
            hint="free inodes there or pull into another store root (--root); nothing was downloaded",
        )


def _local_copies(store: Store, config_hash: str) -> dict[str, Path]:
    """Digest -> file of the live blessing of this config: a rebless's unchanged files need no download."""
    live = store.find(config_hash)
    if live is None:
        return {}
    blessed_dir = store.blessed_dir(live)
    return {f"sha256:{entry.sha256}": blessed_dir / entry.path for entry in live.cache.files}


def pull_blessing(
    store: Store,
    reference: Reference,
    *,
    trust_dir: Path | None = None,
    plain_http: bool | None = None,
    progress: Callable[[int], None] | None = None,
    fault: FaultHook | None = None,
    workers: int = DOWNLOAD_WORKERS,
    limits: TransferLimits = DEFAULT_LIMITS,
    wait: bool = True,
    allow_downgrade: bool = False,
    transport: Transport | None = None,
) -> PullResult:
    """Pull, verify and install a blessing (see the module docstring); a present one is a no-op.

    ``wait``: queue behind another writer of this config (a pull of the same blessing, a ``bless run``)
    for its lock; False refuses at once (LockHeldError, 11). ``allow_downgrade``: replace a live
    blessing of the config created later than the pulled one (else DowngradeError, 16). ``transport``:
    what carries the registry client's requests (None: the network; the unit tests' in-memory registry
    otherwise).
    """
    started = time.monotonic()

    def step(name: str) -> None:
        if fault is not None:
            fault(f"pull:{name}")

    step("resolve")
    client = RegistryClient(reference, plain_http=plain_http, limits=limits, transport=transport)
    artifact, manifest, manifest_bytes = client.resolve_blessing(reference)
    # From here on every exchange also ends by the pull's deadline: one grace for the whole artifact.
    budget_s = limits.budget(len(artifact.manifest_bytes) + artifact.total_size)
    client.deadline = started + budget_s

    step("trust")
    # Without --trust the signatures are not even fetched.
    verdict = (
        None
        if trust_dir is None
        else trust_verdict(store, manifest, trust_dir, data=manifest_bytes, candidate=_signatures(client, artifact))
    )
    result = partial(_pull_result, store, reference, artifact, manifest, verdict)

    step("stage")
    if _already_present(store, manifest):
        return result(installed=False)
    _refuse_downgrade(store, manifest, allowed=allow_downgrade)
    with _writer_lock(store, manifest.config_hash, wait=wait):
        # Queued behind another pull of this very blessing: it is here now, and nothing is downloaded.
        if _already_present(store, manifest):
            return result(installed=False)
        _refuse_downgrade(store, manifest, allowed=allow_downgrade)  # a newer one may have landed meanwhile
        # The wait for the lock is not transfer time: the pull's deadline starts again.
        client.deadline = time.monotonic() + budget_s
        installed, blobs, size = _install(store, client, artifact, manifest, step, fault, progress, workers)
        return result(installed=installed, blobs=blobs, size=size)


def _install(
    store: Store,
    client: RegistryClient,
    artifact: BlessingArtifact,
    manifest: Manifest,
    step: Callable[[str], None],
    fault: FaultHook | None,
    progress: Callable[[int], None] | None,
    workers: int,
) -> tuple[bool, int, int]:
    """Download into a fresh staging dir and publish from it: (installed, blobs, bytes downloaded).

    Under the config's writer lock. The staging dir is removed whatever happens; a dead pull's is
    removed first. Not installed: a writer that took no lock published this blessing meanwhile.
    """
    _remove_dead_pulls(store)
    staging = store.new_staging_dir(f"{STAGING_PREFIX}{artifact.digest[7:19]}-{secrets.token_hex(4)}")
    try:
        tree = _make_tree(staging, manifest)
        step("download")
        blobs, size = _download_tree(store, client, artifact, manifest, staging, tree, progress, workers)
        step("publish")
        try:
            store.publish(tree, manifest, fault=fault)
        except AlreadyBlessedError:
            return False, blobs, size
        step("done")
        return True, blobs, size
    finally:
        with contextlib.suppress(OSError):
            remove_tree(staging)


def _pull_result(
    store: Store,
    reference: Reference,
    artifact: BlessingArtifact,
    manifest: Manifest,
    verdict: TrustVerdict | None,
    *,
    installed: bool,
    blobs: int = 0,
    size: int = 0,
) -> PullResult:
    return PullResult(
        reference=str(reference),
        digest=artifact.digest,
        pinned=str(reference.with_digest(artifact.digest)),
        config_hash=manifest.config_hash,
        dir_id=manifest.cache.dir_id,
        installed=installed,
        blobs_downloaded=blobs,
        bytes_downloaded=size,
        blessed_dir=store.blessed_dir(manifest),
        trust=verdict,
    )


def _make_tree(staging: Path, manifest: Manifest) -> Path:
    """The staging dir's ``tree/`` with the manifest's directories, where the files are written."""
    tree = staging / "tree"
    with full_disk(f"creating the pulled tree in {staging}"):
        tree.mkdir()
        for directory in manifest.cache.dirs:
            (tree / directory).mkdir(parents=True, exist_ok=True)
    return tree


def _download_tree(
    store: Store,
    client: RegistryClient,
    artifact: BlessingArtifact,
    manifest: Manifest,
    staging: Path,
    tree: Path,
    progress: Callable[[int], None] | None,
    workers: int,
) -> tuple[int, int]:
    """Every file into ``tree``, linked from the live blessing where it holds it: (blobs, bytes) downloaded.

    Refused at once when the file system cannot hold what is to be written (15).
    """
    local = _local_copies(store, manifest.config_hash)
    entries = len(artifact.files) + len(manifest.cache.dirs)
    _check_free_space(staging, _bytes_to_write(artifact.files, local), entries)
    with full_disk(f"writing the pulled files into {staging}"):
        return _download(client, tree, artifact.files, progress, workers, local)


@contextlib.contextmanager
def _writer_lock(store: Store, config_hash: str, *, wait: bool) -> Iterator[None]:
    """The config's writer lock for the whole download and publish, waiting for it unless told not to.

    Two pulls of one blessing: the second waits here instead of downloading everything and then
    finding the lock held; once it has the lock it finds the blessing present (a no-op).
    """
    try:
        with store.lock(config_hash, wait=wait):
            yield
    except LockHeldError as exc:
        raise LockHeldError(
            exc.message,
            hint="another bless pull or bless run writes this config now; rerun bless pull without --no-wait to "
            "queue behind it (it then finds the blessing present, or installs its own)",
            details=exc.details,
        ) from None
