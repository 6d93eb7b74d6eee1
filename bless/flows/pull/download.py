"""The download engine of a pull: every blob of a blessing into a tree, each distinct blob once, in parallel.

Given what to fetch (the artifact's files), where (a staging tree) and what the store already holds
(the live blessing's files by digest, linked instead of downloaded); it decides nothing about the
store (:mod:`.decision` does).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bless.core.manifest import Manifest
from bless.errors import NoSpaceError
from bless.oci.artifact import BlobRef
from bless.oci.client import CHUNK, RegistryClient
from bless.system.bounded_read import open_regular
from bless.system.durable import create_new_file
from bless.system.os_refusals import NO_SPACE_ERRNOS

__all__ = ["DOWNLOAD_WORKERS", "bytes_to_write", "check_free_space", "download", "local_copies"]

DOWNLOAD_WORKERS = 4


def download(
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
            with os.fdopen(create_new_file(first, 0o644), "wb") as sink:
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


def local_copies(live: Manifest | None, blessed_dir: Path | None) -> dict[str, Path]:
    """Digest -> file of the live blessing of the config (in ``blessed_dir``): a rebless's unchanged files need
    no download. Empty without a live blessing."""
    if live is None or blessed_dir is None:
        return {}
    return {f"sha256:{entry.sha256}": blessed_dir / entry.path for entry in live.cache.files}


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
        with open_regular(target) as reader:
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
        with open_regular(source) as reader, os.fdopen(create_new_file(target, 0o644), "wb") as sink:
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


def bytes_to_write(files: tuple[BlobRef, ...], local_copies: Mapping[str, Path]) -> int:
    """What a pull writes: every file, less one per digest the live version holds (linked, not written)."""
    linked: set[str] = set()
    total = 0
    for blob in files:
        if blob.digest in local_copies and blob.digest not in linked:
            linked.add(blob.digest)
            continue
        total += blob.size
    return total


def check_free_space(directory: Path, needed: int, entries: int) -> None:
    """Refuse before downloading when the file system cannot hold ``needed`` bytes (and ``entries`` inodes)."""
    info = os.statvfs(directory)
    free = info.f_bavail * info.f_frsize
    if needed + SPACE_MARGIN > free:
        raise NoSpaceError(
            f"the blessing needs {needed} bytes in {directory} and its file system has {free} free",
            hint="free space there (gc removes what no blessing needs) or pull into another store root; "
            "nothing was downloaded",
            remedy="pull_free_space",
            details={"needed": needed, "free": free},
        )
    # Some file systems (btrfs) report no inode counts at all: only a known count is checked.
    if info.f_files > 0 and entries > info.f_favail:
        raise NoSpaceError(
            f"the blessing needs {entries} files and directories in {directory}; its file system has "
            f"{info.f_favail} inodes free",
            hint="free inodes there or pull into another store root; nothing was downloaded",
            remedy="pull_free_inodes",
        )
