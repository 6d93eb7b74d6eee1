"""The on-disk store: blessed trees, live manifests, archive, rejected evidence, locks.

Layout under a root (``$BLESS_ROOT``, default ``~/.cache/bless``)::

    <root>/manifests/<config_hash>.json          live manifests (or a separate manifests_dir, e.g. a git
                                                 checkout); found by their ``config_hash`` FIELD, never
                                                 by their file name
    <root>/blessed/<config_hash>/<dir_id>/       immutable blessed trees (files 0444, dirs 0555); the
                                                 path is derived from the manifest, never stored
    <root>/staging/<run_id>/                     work dirs of running blesses (``.owner`` = pid + host);
                                                 a run writes its candidate trees in subdirectories
    <root>/archive/<config_hash>/<created>-<tree_sha256[:12]>.json
                                                 manifests replaced by ``--rebless``
    <root>/rejected/<config_hash>/<run_id>-c<candidate>/
                                                 ``tree/`` + ``summary.md`` + ``evidence.json`` (+ what
                                                 the caller adds): a rejected candidate kept as evidence
    <root>/locks/<config_hash>.lock              per-hash lock (flock, released by the kernel when the
                                                 holder dies) + ``<config_hash>.holder`` (pid, host,
                                                 started) so a refusal can name the holder

Nothing in the store holds an absolute path: manifests have none and every path is derived from the
root, so copying the whole root elsewhere (``cp -a``) keeps every blessing valid.

Atomic publish (:meth:`Store.publish`): the blessed tree lands in a new versioned directory, is
fsynced and made read-only; only then is the manifest written to a dot-named temp file, fsynced and
renamed over the live name, and the directory fsynced. That rename is THE commit point: a reader
sees the old blessing or the new one, never a half. ``kill -9`` at any step leaves exactly one of
them valid; :meth:`Store.recover` (run at the start of every writer operation) removes the debris:
dot temp files (``.<name>.bless-tmp-<pid>-<token>``) and ``.partial-*`` copies. Blessed versions no
live manifest references (superseded ones) stay until :meth:`Store.gc`.

Test hook: when the environment variable ``BLESS_FAULT_AT`` equals a publish step name (see
:data:`PUBLISH_STEPS`), ``publish()`` sends SIGKILL to its own process just before that step. The
crash tests use it to prove the claim above; never set it outside tests.

Concurrency: writers of one config hash serialize on its lock; :meth:`Store.publish` and
:meth:`Store.reject` take it themselves (re-entrantly, so an orchestrator that already holds it for
the whole run is fine). Readers (:meth:`Store.find`, verify, serve-full) take no lock.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from bless.errors import (
    AlreadyBlessedError,
    BlessError,
    InputInvalidError,
    LockHeldError,
    ManifestDuplicateError,
    ManifestInvalidError,
    NoManifestError,
    VerifyFailedError,
)
from bless.factors import CONFIG_HASH, is_config_hash, parse_config_hash_prefix
from bless.manifest import Manifest, load_manifest, utc_now
from bless.verify import TreeError, TreeListing, hash_tree, verify_tree

__all__ = [
    "FAULT_ENV",
    "PUBLISH_STEPS",
    "GcAction",
    "GcReport",
    "ManifestRecord",
    "PublishResult",
    "Store",
    "atomic_write_bytes",
    "default_root",
    "process_alive",
    "process_identity",
]

#: Environment variable of the crash-test hook (see the module docstring).
FAULT_ENV = "BLESS_FAULT_AT"

#: The steps of :meth:`Store.publish`, in order; each is preceded by a fault point of that name.
PUBLISH_STEPS: tuple[str, ...] = (
    "validate",
    "move-tree",
    "fsync-tree",
    "make-read-only",
    "archive-old",
    "write-manifest-tmp",
    "rename-manifest",
    "done",
)

TMP_MARK = ".bless-tmp-"
PARTIAL_PREFIX = ".partial-"
NEW_STAGING_PREFIX = ".new-"
OWNER_FILE = ".owner"
# A leftover we cannot attribute to a process (no owner record) is only removed once it is this old,
# so that we never race its creator.
STALE_S = 3600.0

_DIR_ID = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{12}$")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CREATED = re.compile(r"^([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})")
# Temp files whose name carries the config hash they belong to (manifests dir, locks dir).
_HASHED_TMP = re.compile(r"^\.(?P<hash>" + CONFIG_HASH.pattern + r")(?:\.holder|\.json)?" + re.escape(TMP_MARK))

_FILE_MODE = 0o444
_DIR_MODE = 0o555

# Locks this process holds, per thread: lock() is re-entrant, so publish() and reject() can take the
# lock themselves while an orchestrator already holds it for the whole run. A second FileLock on the
# same file from the same thread would otherwise contend with itself.
_HELD: dict[tuple[str, int], int] = {}
_HELD_GUARD = threading.Lock()


# --------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class ManifestRecord:
    """One ``*.json`` file of the manifests directory: its manifest, or why it is invalid."""

    path: Path
    manifest: Manifest | None
    error: ManifestInvalidError | None


@dataclass(frozen=True)
class PublishResult:
    """What :meth:`Store.publish` did. ``archived_manifest`` is the replaced manifest's copy, if any."""

    config_hash: str
    manifest_path: Path
    blessed_dir: Path
    archived_manifest: Path | None


@dataclass(frozen=True)
class GcAction:
    """One removal (done, or planned when dry-running) and the bytes it frees."""

    path: Path
    reason: str
    bytes: int


@dataclass(frozen=True)
class GcReport:
    """The result of :meth:`Store.gc`. ``notes`` says what was skipped and why (e.g. a held lock)."""

    actions: tuple[GcAction, ...]
    dry_run: bool
    notes: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        """Bytes freed (or that would be freed) by all actions."""
        return sum(action.bytes for action in self.actions)


# --------------------------------------------------------------------------------------------
# Durability helpers


def default_root() -> Path:
    """The store root: ``$BLESS_ROOT`` when set and non-empty, else ``~/.cache/bless``."""
    env = os.environ.get("BLESS_ROOT", "").strip()
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "bless"


def _fsync_dir(path: Path) -> None:
    """fsync a directory, making the creations, renames and removals of its entries durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_tmp(directory: Path, stem: str, data: bytes, mode: int) -> Path:
    """Write ``data`` to a new dot-named temp file in ``directory``, fsync it, return its path.

    The name ``.<stem>.bless-tmp-<pid>-<token>`` is a dotfile (manifest listings skip dotfiles) and
    carries the stem so :meth:`Store.recover` can tell which config hash a leftover belongs to.
    """
    tmp = directory / f".{stem}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.fchmod(fd, mode)  # exact mode, whatever the umask
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return tmp


def atomic_write_bytes(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    A reader sees the old content or the new, never a mix; after return the new content survives a
    power loss (temp file fsynced, renamed over ``path``, directory fsynced). A crash leaves at most
    a dot temp file beside ``path``.

    Raises:
        OSError: when the directory is missing or not writable, the disk is full, etc.
    """
    path = Path(path)
    tmp = _write_tmp(path.parent, path.name, data, mode)
    try:
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


@contextmanager
def _os_errors(what: str) -> Iterator[None]:
    """Turn an unexpected OSError (read-only or full disk, permissions) into a BlessError."""
    try:
        yield
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise BlessError(
            f"{what} failed: {exc.strerror or exc}{where}",
            hint="check that the store root exists, is writable and has free space",
        ) from exc


def _fault_point(step: str) -> None:
    """Crash-test hook: SIGKILL this process when ``$BLESS_FAULT_AT`` names ``step``."""
    if os.environ.get(FAULT_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def _walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Yield every entry below ``root`` (not ``root``) with its lstat, children before parents.

    Never follows symlinks. Children come first so a caller may chmod a directory read-only only
    after everything inside it is done.
    """
    pending: list[tuple[Path, bool]] = [(root, False)]
    while pending:
        path, expanded = pending.pop()
        if expanded:
            if path != root:
                yield path, os.lstat(path)
            continue
        pending.append((path, True))
        with os.scandir(path) as entries:
            for entry in entries:
                child = Path(entry.path)
                if entry.is_dir(follow_symlinks=False):
                    pending.append((child, False))
                else:
                    yield child, entry.stat(follow_symlinks=False)


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory of a tree, and the tree's root."""
    for path, st in _walk(root):
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            _fsync_path(path)
    _fsync_path(root)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _set_tree_modes(root: Path, file_mode: int, dir_mode: int, *, durable: bool) -> None:
    """chmod every regular file to ``file_mode`` and every directory (root last) to ``dir_mode``.

    Works on descriptors (fchmod + fsync) so the new modes are durable before the manifest commit
    when ``durable`` is set. Symlinks and special files are left alone (verification reports them).
    """
    for path, st in [*_walk(root), (root, os.lstat(root))]:
        if stat.S_ISREG(st.st_mode):
            mode = file_mode
        elif stat.S_ISDIR(st.st_mode):
            mode = dir_mode
        else:
            continue
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)


def _make_owner_writable(root: Path) -> None:
    """Give the owner rwx on every directory of a tree (root included).

    Blessed trees are 0555: a non-root process can neither remove entries from them nor move them
    to another parent (that rewrites their ``..``) until the directories are writable again.
    """
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        return
    pending = [root]
    while pending:
        directory = pending.pop()
        mode = stat.S_IMODE(os.lstat(directory).st_mode)
        if mode & 0o700 != 0o700:
            directory.chmod(mode | 0o700)
        with os.scandir(directory) as entries:
            pending.extend(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False))


def _remove_tree(path: Path) -> None:
    """Remove a file, a symlink or a whole tree (read-only directories included)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        path.unlink()
        return
    _make_owner_writable(path)
    shutil.rmtree(path)


def _tree_bytes(path: Path) -> int:
    """Bytes of the regular files below ``path`` (or of ``path`` itself); unreadable parts count 0."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size if stat.S_ISREG(st.st_mode) else 0
    total = 0
    with contextlib.suppress(OSError):
        for _, entry_st in _walk(path):
            if stat.S_ISREG(entry_st.st_mode):
                total += entry_st.st_size
    return total


def _holds(path: Path, data: bytes) -> bool:
    """Does the file at ``path`` hold exactly ``data``?"""
    try:
        return path.read_bytes() == data
    except OSError:
        return False


def _age_s(path: Path) -> float:
    try:
        return time.time() - os.lstat(path).st_mtime
    except OSError:
        return 0.0


def _listdir(path: Path) -> list[os.DirEntry[str]]:
    """Sorted entries of a directory; a missing directory is empty."""
    try:
        with os.scandir(path) as entries:
            return sorted(entries, key=lambda e: e.name)
    except FileNotFoundError:
        return []


# --------------------------------------------------------------------------------------------
# Process identity (lock holders, staging owners)


def _proc_start(pid: int) -> int | None:
    """The process start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), if known.

    Recorded beside a pid so that a recycled pid is not mistaken for the original process.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
        fields = raw[raw.rindex(")") + 2 :].split()
        return int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _proc_state(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
        return raw[raw.rindex(")") + 2 :].split()[0]
    except (OSError, ValueError, IndexError):
        return None


def _identity() -> dict[str, Any]:
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "started": utc_now(), "proc_start": _proc_start(pid)}


def _owner_alive(info: Mapping[str, Any]) -> bool | None:
    """Is the process an owner record names still running? ``None`` when this host cannot tell."""
    pid = info.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    if info.get("host") != socket.gethostname():
        return None  # another machine sharing the root: we cannot see its processes
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    if _proc_state(pid) == "Z":
        return False  # exited, not yet reaped
    recorded = info.get("proc_start")
    if isinstance(recorded, int) and not isinstance(recorded, bool):
        current = _proc_start(pid)
        if current is not None and current != recorded:
            return False  # the pid was recycled by another process
    return True


def process_identity() -> dict[str, Any]:
    """This process as lock holders and staging owners record it: pid, host, start time."""
    return _identity()


def process_alive(info: Mapping[str, Any]) -> bool | None:
    """Whether the process a :func:`process_identity` record names still runs; None when this host cannot tell."""
    return _owner_alive(info)


def _read_json_object(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


# --------------------------------------------------------------------------------------------
# Argument checks


def _check_hash(config_hash: str, error: type[BlessError] = InputInvalidError) -> None:
    # The hash becomes a path component: anything but 64 lowercase hex could escape the store.
    if not is_config_hash(config_hash):
        raise error(f"not a config hash (64 lowercase hex digits): {config_hash!r}")


def _check_run_id(run_id: str) -> None:
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise InputInvalidError(
            f"invalid run id {run_id!r}: use 1-128 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
        )


def _created_stamp(created: str) -> str:
    """``2024-05-01T12:34:56Z`` -> ``20240501T123456Z`` (archive file names sort by time)."""
    match = _CREATED.match(created)
    if match is None:  # the schema forbids this; keep a sortable name anyway
        return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    y, mo, d, h, mi, s = match.groups()
    return f"{y}{mo}{d}T{h}{mi}{s}Z"


def _listing_difference(expected: Manifest, listing: TreeListing) -> list[str]:
    """Human lines saying how a hashed tree differs from a manifest's listing."""
    want = {f.path: f for f in expected.cache.files}
    got = {f.path: f for f in listing.files}
    lines = [f"missing file {p}" for p in sorted(want.keys() - got.keys())]
    lines += [f"extra file {p}" for p in sorted(got.keys() - want.keys())]
    for path in sorted(want.keys() & got.keys()):
        if want[path] != got[path]:
            w, g = want[path], got[path]
            lines.append(f"changed file {path} (manifest {w.size} B {w.sha256[:12]}, tree {g.size} B {g.sha256[:12]})")
    lines += [f"missing directory {d}" for d in sorted(set(expected.cache.dirs) - set(listing.dirs))]
    lines += [f"extra directory {d}" for d in sorted(set(listing.dirs) - set(expected.cache.dirs))]
    if not lines and listing.total_size != expected.cache.total_size:
        lines.append(f"total size {listing.total_size} != manifest {expected.cache.total_size}")
    return lines


# --------------------------------------------------------------------------------------------
# The store


class Store:
    """The store under ``root``; live manifests in ``manifests_dir`` (default ``root/manifests``).

    Creating a Store touches nothing on disk; writer operations create the layout as needed.
    """

    def __init__(self, root: Path, manifests_dir: Path | None = None) -> None:
        # Absolute once, so that a later chdir cannot move the store under us.
        self._root = Path(root).absolute()
        self._manifests_dir = Path(manifests_dir).absolute() if manifests_dir is not None else self._root / "manifests"

    @property
    def root(self) -> Path:
        """The store root."""
        return self._root

    @property
    def manifests_dir(self) -> Path:
        """Where live manifests are (``root/manifests`` unless given)."""
        return self._manifests_dir

    @property
    def _blessed(self) -> Path:
        return self._root / "blessed"

    @property
    def _staging(self) -> Path:
        return self._root / "staging"

    @property
    def _archive(self) -> Path:
        return self._root / "archive"

    @property
    def _rejected(self) -> Path:
        return self._root / "rejected"

    @property
    def _locks(self) -> Path:
        return self._root / "locks"

    def ensure_layout(self) -> None:
        """Create the store directories that are missing."""
        for directory in (
            self._manifests_dir,
            self._blessed,
            self._staging,
            self._archive,
            self._rejected,
            self._locks,
        ):
            with _os_errors(f"creating {directory}"):
                directory.mkdir(parents=True, exist_ok=True)

    def blessed_dir(self, manifest: Manifest) -> Path:
        """``root/blessed/<config_hash>/<dir_id>``: derived from the manifest, never stored.

        Raises:
            ManifestInvalidError: when the hash or dir_id could name a path outside the store.
        """
        _check_hash(manifest.config_hash, ManifestInvalidError)
        if not _DIR_ID.match(manifest.cache.dir_id):
            raise ManifestInvalidError(f"cache.dir_id {manifest.cache.dir_id!r} is not a blessed dir id")
        return self._blessed / manifest.config_hash / manifest.cache.dir_id

    def new_staging_dir(self, run_id: str) -> Path:
        """Create ``root/staging/<run_id>/`` with an ``.owner`` record (pid, host) and return it.

        The directory appears complete (owner record included) or not at all, so :meth:`gc` can
        always tell whether its run is still alive. Put candidate trees in subdirectories: the
        ``.owner`` file is not part of any cache.

        Raises:
            InputInvalidError: bad run id, or a staging dir of that name exists.
        """
        _check_run_id(run_id)
        self.ensure_layout()
        final = self._staging / run_id
        if os.path.lexists(final):
            raise InputInvalidError(f"staging dir {final} already exists", hint="use a new run id")
        tmp = self._staging / f"{NEW_STAGING_PREFIX}{run_id}-{secrets.token_hex(4)}"
        with _os_errors(f"creating a staging dir in {self._staging}"):
            tmp.mkdir(mode=0o755)
        try:
            owner = {**_identity(), "run_id": run_id}
            atomic_write_bytes(tmp / OWNER_FILE, (json.dumps(owner, sort_keys=True) + "\n").encode("utf-8"))
            # rename(2) onto an existing non-empty dir fails: two runs with one id cannot both win.
            tmp.rename(final)
        except OSError as exc:
            _remove_tree(tmp)
            raise InputInvalidError(f"cannot create staging dir {final}: {exc.strerror or exc}") from None
        with _os_errors(f"syncing {self._staging}"):
            _fsync_dir(self._staging)
        return final

    # ---------------------------------------------------------------------------------- locks

    def _lock_path(self, config_hash: str) -> Path:
        return self._locks / f"{config_hash}.lock"

    def _holder_path(self, config_hash: str) -> Path:
        return self._locks / f"{config_hash}.holder"

    @contextmanager
    def lock(self, config_hash: str, *, wait: bool = False, timeout: float | None = None) -> Iterator[None]:
        """Hold the per-hash lock for the ``with`` body.

        Not waiting, a held lock is a :class:`LockHeldError` at once, naming the holder (pid, host,
        since when). With ``wait=True`` it blocks until the lock is free, at most ``timeout``
        seconds (``None``: forever), then raises the same error. Re-entrant within one thread. The
        lock is an flock: the kernel releases it when the holder dies, so there are no stale locks.
        """
        _check_hash(config_hash)
        path = self._lock_path(config_hash)
        with _os_errors(f"preparing the lock {path}"):
            self._locks.mkdir(parents=True, exist_ok=True)
            key = (str(path.resolve()), threading.get_ident())
        with _HELD_GUARD:
            depth = _HELD.get(key, 0)
            if depth:
                _HELD[key] = depth + 1
        if depth:
            try:
                yield
            finally:
                with _HELD_GUARD:
                    _HELD[key] -= 1
            return

        if not wait:
            limit = 0.0
        elif timeout is None:
            limit = -1.0  # filelock: negative = wait forever
        else:
            limit = max(0.0, float(timeout))
        flock = FileLock(str(path))
        try:
            flock.acquire(timeout=limit)
        except Timeout:  # a TimeoutError, hence an OSError: handled first
            raise self._lock_held_error(config_hash, waited=limit if wait else None) from None
        except OSError as exc:
            raise BlessError(
                f"taking the lock {path} failed: {exc.strerror or exc}",
                hint="check that the store root exists and is writable",
            ) from exc
        holder = self._holder_path(config_hash)
        try:
            with _HELD_GUARD:
                _HELD[key] = 1
            # The holder record is advisory (for the refusal message); failing to write it must not
            # fail the operation.
            with contextlib.suppress(OSError):
                atomic_write_bytes(holder, (json.dumps(_identity(), sort_keys=True) + "\n").encode("utf-8"))
            try:
                yield
            finally:
                record = _read_json_object(holder)
                if record is not None and record.get("pid") == os.getpid():
                    with contextlib.suppress(OSError):
                        holder.unlink()
                with _HELD_GUARD:
                    _HELD.pop(key, None)
        finally:
            flock.release()

    def _lock_held_error(self, config_hash: str, *, waited: float | None) -> LockHeldError:
        holder = _read_json_object(self._holder_path(config_hash))
        if holder is not None and _owner_alive(holder) is not False:
            who = (
                f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
                f"holding it since {holder.get('started', '?')}"
            )
        else:
            # Just taken: the new holder has not recorded itself (what is there names a dead one).
            who = "the holder has not recorded itself yet"
        waited_text = f" (waited {waited:g} s)" if waited is not None and waited >= 0 else ""
        return LockHeldError(
            f"another bless holds the lock for config hash {config_hash[:16]}...: {who}{waited_text}",
            hint=(
                "wait for that run to finish, or rerun with --wait (bless run --wait) to queue behind it; "
                "the lock is released as soon as that process exits"
                if waited is None
                else "that run is still going: wait longer, or stop it; the lock is released as soon as "
                "that process exits"
            ),
            details={
                "config_hash": config_hash,
                "holder": holder,
                "lock": str(self._lock_path(config_hash)),
            },
        )

    @contextmanager
    def _try_lock(self, config_hash: str) -> Iterator[bool]:
        """Like :meth:`lock` without waiting, but yields False instead of raising when held."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self.lock(config_hash))
            except LockHeldError:
                yield False
                return
            yield True

    # ------------------------------------------------------------------------------ manifests

    def records(self) -> list[ManifestRecord]:
        """Every ``*.json`` in the manifests dir (dotfiles skipped), parsed and validated, by name.

        Invalid files are listed too, with their error. A missing manifests dir has no records.

        Raises:
            ManifestInvalidError: when the manifests dir exists but cannot be listed.
        """
        try:
            entries = _listdir(self._manifests_dir)
        except OSError as exc:
            raise ManifestInvalidError(f"{self._manifests_dir}: cannot list manifests: {exc.strerror or exc}") from None
        records: list[ManifestRecord] = []
        for entry in entries:
            if entry.name.startswith(".") or not entry.name.endswith(".json"):
                continue  # temp files of a publish in progress are dotfiles
            path = self._manifests_dir / entry.name
            try:
                # Never open a FIFO or device (opening a FIFO blocks until a writer shows up).
                if not stat.S_ISREG(path.stat().st_mode):
                    raise ManifestInvalidError(f"{path}: not a regular file")
            except OSError as exc:
                error = ManifestInvalidError(f"{path}: cannot read: {exc.strerror or exc}")
                records.append(ManifestRecord(path, None, error))
                continue
            except ManifestInvalidError as exc:
                records.append(ManifestRecord(path, None, exc))
                continue
            try:
                records.append(ManifestRecord(path, load_manifest(path), None))
            except ManifestInvalidError as exc:
                records.append(ManifestRecord(path, None, exc))
        return records

    def _valid_records(self, manifests_dir: Path | None = None) -> list[tuple[Path, Manifest]]:
        """All records, failing closed: an invalid one might be the manifest being looked for."""
        store = self if manifests_dir is None else Store(self._root, manifests_dir)
        valid: list[tuple[Path, Manifest]] = []
        for record in store.records():
            if record.error is not None:
                raise record.error
            assert record.manifest is not None  # a record has one or the other
            valid.append((record.path, record.manifest))
        return valid

    def _live(self, config_hash: str) -> tuple[Path, Manifest] | None:
        matches = [(p, m) for p, m in self._valid_records() if m.config_hash == config_hash]
        if len(matches) > 1:
            paths = [str(p) for p, _ in matches]
            raise ManifestDuplicateError(
                f"{len(matches)} manifests claim config hash {config_hash}: " + ", ".join(paths),
                hint="the store is corrupt: keep the one that is right, move the other(s) out of "
                f"{self._manifests_dir}, then run bless verify",
                details={"config_hash": config_hash, "paths": paths},
            )
        return matches[0] if matches else None

    def find(self, config_hash: str) -> Manifest | None:
        """The live manifest whose ``config_hash`` FIELD is ``config_hash`` (file names do not count).

        Raises:
            ManifestDuplicateError: two manifest files claim this hash (naming both).
            ManifestInvalidError: any manifest file in the dir is invalid (fail closed: it might be
                the one claiming this hash).
            InputInvalidError: ``config_hash`` is not 64 lowercase hex digits.
        """
        _check_hash(config_hash)
        live = self._live(config_hash)
        return live[1] if live else None

    def manifest_path(self, config_hash: str) -> Path | None:
        """Where the live manifest for ``config_hash`` is (any file name), or None. Raises as :meth:`find`."""
        _check_hash(config_hash)
        live = self._live(config_hash)
        return live[0] if live else None

    def find_prefix(self, prefix: str) -> Manifest:
        """The live manifest whose config hash starts with ``prefix`` (at least 8 hex digits).

        Raises:
            InputInvalidError: a malformed prefix, or one that matches several hashes (listed).
            NoManifestError: no live manifest matches.
            ManifestDuplicateError, ManifestInvalidError: as :meth:`find`.
        """
        wanted = parse_config_hash_prefix(prefix)
        by_hash: dict[str, list[tuple[Path, Manifest]]] = {}
        for path, manifest in self._valid_records():
            if manifest.config_hash.startswith(wanted):
                by_hash.setdefault(manifest.config_hash, []).append((path, manifest))
        if not by_hash:
            raise NoManifestError(
                f"no blessed manifest has a config hash starting with {wanted}",
                hint=f"list the blessings in {self._manifests_dir}, or bless this config first",
                details={"prefix": wanted},
            )
        if len(by_hash) > 1:
            candidates = sorted(by_hash)
            raise InputInvalidError(
                f"config hash prefix {wanted} is ambiguous: it matches " + ", ".join(candidates),
                hint="give more characters of the config hash",
                details={"prefix": wanted, "candidates": candidates},
            )
        ((config_hash, matches),) = by_hash.items()
        if len(matches) > 1:
            self._live(config_hash)  # raises the duplicate error, naming every path
        return matches[0][1]

    # -------------------------------------------------------------------------------- publish

    def publish(self, staged_dir: Path, manifest: Manifest) -> PublishResult:
        """Publish ``staged_dir`` as the blessing ``manifest`` describes, atomically.

        Steps (see :data:`PUBLISH_STEPS`; each preceded by a fault point): ``validate`` (serialize
        the manifest, re-hash the staged tree and require it equals the manifest's listing),
        ``move-tree`` (rename into ``blessed/<hash>/<dir_id>`` when the staged dir is under
        ``root/staging``, else copy it to a ``.partial-`` dir there and rename: the source is left
        untouched), ``fsync-tree``, ``make-read-only`` (files 0444, dirs 0555, then the tree is
        verified again: what is committed is what was hashed), ``archive-old`` (copy of the live
        manifest for this hash, if any, into ``archive/``), ``write-manifest-tmp``,
        ``rename-manifest`` (over the live manifest's path, whatever its name, else
        ``<hash>.json``; then fsync the directory: the commit point), ``done``.

        Takes the hash lock (re-entrantly: fine if the caller holds it) and runs :meth:`recover`
        first. A live blessing of the hash is replaced (archived); refusing without ``--rebless`` is
        the caller's decision. On a failure before the commit the tree is put back (or the copy
        removed) and the live blessing is unchanged.

        Raises:
            ManifestInvalidError: the manifest does not validate, another manifest in the dir is
                invalid, or ``<hash>.json`` holds another hash's manifest.
            InputInvalidError: the staged tree cannot be recorded or differs from the manifest.
            AlreadyBlessedError: this very version (same dir_id) is already the live blessing.
            VerifyFailedError: the tree changed while it was being published.
            LockHeldError, ManifestDuplicateError: as :meth:`lock` and :meth:`find`.
        """
        staged_dir = Path(staged_dir).absolute()
        config_hash = manifest.config_hash
        _check_hash(config_hash, ManifestInvalidError)
        self.ensure_layout()
        with _os_errors(f"publishing {config_hash[:16]}..."), self.lock(config_hash):
            self.recover()

            _fault_point("validate")
            document = manifest.to_json_bytes()  # validates against the schema
            target = self.blessed_dir(manifest)
            live = self._live(config_hash)
            manifest_target = live[0] if live else self._manifests_dir / f"{config_hash}.json"
            if live is None and os.path.lexists(manifest_target):
                # records() raised if it were invalid, so it is a valid manifest of another hash.
                raise ManifestInvalidError(
                    f"{manifest_target} is named for {config_hash[:16]}... but holds another hash's manifest",
                    hint="rename that file after the config_hash it contains",
                )
            self._check_staged(staged_dir, manifest)
            if os.path.lexists(target):
                if live is not None and live[1].cache.dir_id == manifest.cache.dir_id:
                    raise AlreadyBlessedError(
                        f"{config_hash[:16]}... is already blessed with this very version ({target.name})",
                        hint="nothing to publish; re-bless to make a new version",
                    )
                # No live manifest references it: debris of an interrupted publish of this same
                # version (or a superseded copy of it). We hold the lock, so nobody else uses it.
                _remove_tree(target)

            renamed: bool | None = None  # None: nothing moved yet
            tmp: Path | None = None
            try:
                _fault_point("move-tree")
                renamed = self._move_tree(staged_dir, target)

                _fault_point("fsync-tree")
                _fsync_tree(target)
                _fsync_dir(target.parent)
                _fsync_dir(self._blessed)
                if renamed:
                    _fsync_dir(staged_dir.parent)

                _fault_point("make-read-only")
                _set_tree_modes(target, _FILE_MODE, _DIR_MODE, durable=True)
                # Hashing again costs time but closes the gap between validate and now (a writer
                # that still had a staged file open): the commit must cover exactly these bytes.
                check = verify_tree(target, manifest.cache.files, manifest.cache.dirs)
                if not check.ok:
                    shown = "; ".join(f"{p.path}: {p.detail}" for p in check.problems[:5])
                    raise VerifyFailedError(
                        f"the staged tree changed while it was being published: {shown}",
                        hint="make sure no process still writes the staged cache, then bless again",
                        details={"problems": [p.to_dict() for p in check.problems]},
                    )

                _fault_point("archive-old")
                archived = self._archive_manifest(*live) if live is not None else None

                _fault_point("write-manifest-tmp")
                tmp = _write_tmp(self._manifests_dir, config_hash, document, 0o644)

                _fault_point("rename-manifest")
                tmp.replace(manifest_target)  # THE commit point
                tmp = None
            except BaseException as exc:
                if tmp is not None:
                    with contextlib.suppress(OSError):
                        tmp.unlink()
                # Give the tree back unless the commit happened after all (an interrupt landing
                # right after os.replace): then the live manifest references it.
                if renamed is not None and not _holds(manifest_target, document):
                    with contextlib.suppress(OSError):
                        self._undo_move(target, staged_dir, renamed)
                if isinstance(exc, OSError):
                    raise BlessError(
                        f"publishing {config_hash[:16]}... failed: {exc.strerror or exc}"
                        + (f" ({exc.filename})" if exc.filename else ""),
                        hint="nothing was published; the previous blessing (if any) is unchanged",
                    ) from exc
                raise
            try:
                _fsync_dir(self._manifests_dir)
            except OSError as exc:
                raise BlessError(
                    f"published {config_hash[:16]}... but could not fsync {self._manifests_dir}: {exc.strerror or exc}",
                    hint="the blessing is visible but may not survive a power loss; run bless verify",
                ) from exc

            _fault_point("done")
            return PublishResult(
                config_hash=config_hash,
                manifest_path=manifest_target,
                blessed_dir=target,
                archived_manifest=archived,
            )

    def _check_staged(self, staged_dir: Path, manifest: Manifest) -> None:
        """Hash the staged tree and require it to be exactly the manifest's listing."""
        try:
            st = os.lstat(staged_dir)
        except OSError as exc:
            raise InputInvalidError(f"staged tree {staged_dir}: {exc.strerror or exc}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise InputInvalidError(f"staged tree {staged_dir} is not a directory (symlinks are not followed)")
        try:
            listing = hash_tree(staged_dir)
        except TreeError as exc:
            raise InputInvalidError(
                f"staged tree cannot be published: {exc}",
                details={"problems": [p.to_dict() for p in exc.problems]},
            ) from None
        differences = _listing_difference(manifest, listing)
        if differences:
            more = f" (and {len(differences) - 5} more)" if len(differences) > 5 else ""
            shown = "; ".join(differences[:5]) + more
            raise InputInvalidError(
                f"staged tree {staged_dir} does not match the manifest: {shown}",
                hint="the manifest must be built from the staged tree as it is; nothing was published",
                details={"differences": differences},
            )

    def _under_staging(self, path: Path) -> bool:
        try:
            real = path.resolve()
            staging = self._staging.resolve()
        except OSError:
            return False
        return real != staging and real.is_relative_to(staging)

    def _move_tree(self, source: Path, target: Path) -> bool:
        """Move a staged tree to ``target``; True when renamed, False when copied (source kept).

        Renamed only from under ``root/staging`` (same file system, and ours to consume); anything
        else is copied into a ``.partial-`` sibling of ``target`` first, so a crash mid-copy leaves
        a name :meth:`recover` knows is debris, then renamed into place.
        """
        target.parent.mkdir(parents=True, exist_ok=True)
        if self._under_staging(source):
            # Moving a directory to another parent rewrites its '..': it must be writable.
            mode = stat.S_IMODE(os.lstat(source).st_mode)
            if mode & 0o700 != 0o700:
                source.chmod(mode | 0o700)
            try:
                source.rename(target)
                return True
            except OSError as exc:
                if exc.errno != errno.EXDEV:  # staging on another mount: copy instead
                    raise
        partial = target.parent / f"{PARTIAL_PREFIX}{target.name}-{secrets.token_hex(4)}"
        try:
            shutil.copytree(source, partial, symlinks=True, copy_function=shutil.copyfile)
            partial.rename(target)
        except BaseException:
            with contextlib.suppress(OSError):
                _remove_tree(partial)
            raise
        return False

    def _undo_move(self, target: Path, staged_dir: Path, renamed: bool) -> None:
        """Before the commit: give the staged tree back (writable again), or drop our copy."""
        if not os.path.lexists(target):
            return
        if renamed and not os.path.lexists(staged_dir):
            _set_tree_modes(target, 0o644, 0o755, durable=False)
            target.rename(staged_dir)
        else:
            _remove_tree(target)

    def _archive_manifest(self, live_path: Path, live: Manifest) -> Path:
        """Copy the live manifest file, byte for byte, to ``archive/<hash>/<created>-<tree12>.json``."""
        directory = self._archive / live.config_hash
        directory.mkdir(parents=True, exist_ok=True)
        raw = live_path.read_bytes()
        stem = f"{_created_stamp(live.created)}-{live.cache.tree_sha256[:12]}"
        path = directory / f"{stem}.json"
        counter = 1
        # Same second and same tree but other bytes (other trials): never overwrite history.
        while path.exists() and path.read_bytes() != raw:
            counter += 1
            path = directory / f"{stem}-{counter}.json"
        atomic_write_bytes(path, raw)
        _fsync_dir(self._archive)
        return path

    # --------------------------------------------------------------------------------- reject

    def reject(
        self,
        staged_dir: Path,
        *,
        config_hash: str,
        run_id: str,
        candidate: int,
        summary_md: str,
        evidence: Mapping[str, Any],
    ) -> Path:
        """Keep a rejected candidate as evidence; publish nothing.

        Moves ``staged_dir`` (copies it when it is not under ``root/staging``) to
        ``rejected/<hash>/<run_id>-c<candidate>/tree`` and writes ``summary.md`` and
        ``evidence.json`` there. The directory is assembled under a ``.partial-`` name and renamed
        into place, so it appears complete. A missing ``staged_dir`` (nothing was staged) gives a
        directory without ``tree/``. Returns the directory; the caller may add files to it.

        Raises:
            InputInvalidError: bad hash / run id / candidate, evidence not JSON-serializable, or
                that evidence directory already exists.
            LockHeldError: another process holds the hash lock.
        """
        _check_hash(config_hash)
        _check_run_id(run_id)
        if isinstance(candidate, bool) or not isinstance(candidate, int) or candidate < 0:
            raise InputInvalidError(f"candidate must be a non-negative integer, got {candidate!r}")
        try:
            evidence_bytes = (
                json.dumps(evidence, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"
            ).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise InputInvalidError(f"rejection evidence is not JSON-serializable: {exc}") from None
        staged_dir = Path(staged_dir).absolute()
        self.ensure_layout()
        with self.lock(config_hash):
            self.recover()
            parent = self._rejected / config_hash
            parent.mkdir(parents=True, exist_ok=True)
            name = f"{run_id}-c{candidate}"
            final = parent / name
            if os.path.lexists(final):
                raise InputInvalidError(f"rejected evidence {final} already exists; it is never overwritten")
            partial = parent / f"{PARTIAL_PREFIX}{name}-{secrets.token_hex(4)}"
            try:
                partial.mkdir()
                if os.path.lexists(staged_dir):
                    self._move_evidence(staged_dir, partial / "tree")
                atomic_write_bytes(partial / "summary.md", summary_md.encode("utf-8"))
                atomic_write_bytes(partial / "evidence.json", evidence_bytes)
                partial.rename(final)
                _fsync_dir(parent)
                _fsync_dir(self._rejected)
            except OSError as exc:
                # The partial dir may hold the moved tree: it is evidence, recover() completes it.
                raise BlessError(
                    f"keeping rejected evidence in {final} failed: {exc.strerror or exc}",
                    hint="nothing was published; run bless gc --dry-run to see what is left",
                ) from exc
        return final

    def _move_evidence(self, source: Path, destination: Path) -> None:
        if self._under_staging(source):
            mode = stat.S_IMODE(os.lstat(source).st_mode)
            if stat.S_ISDIR(os.lstat(source).st_mode) and mode & 0o700 != 0o700:
                source.chmod(mode | 0o700)
            try:
                source.rename(destination)
                return
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
        if stat.S_ISDIR(os.lstat(source).st_mode):
            shutil.copytree(source, destination, symlinks=True)
        else:
            shutil.copy2(source, destination, follow_symlinks=False)

    # -------------------------------------------------------------------------- recover / gc

    def _debris_hashes(self) -> list[str]:
        """Config hashes that may have crash debris somewhere in the store."""
        hashes: set[str] = set()
        for directory in (self._blessed, self._archive, self._rejected):
            hashes.update(e.name for e in _listdir(directory) if is_config_hash(e.name))
        for directory in (self._manifests_dir, self._locks):
            for entry in _listdir(directory):
                match = _HASHED_TMP.match(entry.name)
                if match:
                    hashes.add(match.group("hash"))
        return sorted(hashes)

    def _debris(self, config_hash: str) -> list[tuple[Path, str, bool]]:
        """Crash debris of one hash: (path, reason, finalize) where finalize = complete, do not delete."""
        found: list[tuple[Path, str, bool]] = []
        for entry in _listdir(self._blessed / config_hash):
            if entry.name.startswith(PARTIAL_PREFIX):
                found.append((Path(entry.path), "partial copy of an interrupted publish", False))
        for directory, what in ((self._manifests_dir, "manifest"), (self._locks, "lock holder")):
            for entry in _listdir(directory):
                match = _HASHED_TMP.match(entry.name)
                if match and match.group("hash") == config_hash:
                    found.append((Path(entry.path), f"temp {what} file of an interrupted write", False))
        for entry in _listdir(self._archive / config_hash):
            if entry.name.startswith(".") and TMP_MARK in entry.name:
                found.append((Path(entry.path), "temp archive file of an interrupted publish", False))
        for entry in _listdir(self._rejected / config_hash):
            if entry.name.startswith(PARTIAL_PREFIX):
                # Holds a moved staged tree: evidence. Complete it rather than delete it.
                found.append((Path(entry.path), "completed an interrupted reject (kept as evidence)", True))
            elif entry.is_dir(follow_symlinks=False):
                for inner in _listdir(Path(entry.path)):
                    if inner.name.startswith(".") and TMP_MARK in inner.name:
                        found.append((Path(inner.path), "temp evidence file of an interrupted reject", False))
        return found

    def _staging_debris(self) -> list[tuple[Path, str]]:
        """Half-created staging dirs (``.new-*``) whose creator is gone."""
        found: list[tuple[Path, str]] = []
        for entry in _listdir(self._staging):
            if not entry.name.startswith(NEW_STAGING_PREFIX):
                continue
            path = Path(entry.path)
            owner = _read_json_object(path / OWNER_FILE)
            alive = _owner_alive(owner) if owner is not None else None
            if alive is False or (alive is None and owner is None and _age_s(path) > STALE_S):
                found.append((path, "half-created staging dir of a run that is gone"))
        return found

    def _recover(self, *, dry_run: bool) -> tuple[list[GcAction], list[str]]:
        actions: list[GcAction] = []
        notes: list[str] = []
        for config_hash in self._debris_hashes():
            if not self._debris(config_hash):
                continue  # look before locking: most hashes have no debris
            with self._try_lock(config_hash) as locked:
                if not locked:
                    notes.append(f"{config_hash[:16]}...: lock held by a running bless; debris left alone")
                    continue
                # Listed again under the lock: only now is nobody writing this hash.
                for path, reason, finalize in self._debris(config_hash):
                    size = 0 if finalize else _tree_bytes(path)
                    try:
                        if finalize and not dry_run:
                            self._finalize_rejected(path)
                        elif not dry_run:
                            _remove_tree(path)
                    except OSError as exc:
                        notes.append(f"{path}: could not clean up: {exc.strerror or exc}")
                        continue
                    actions.append(GcAction(path, reason, size))
        for path, reason in self._staging_debris():
            size = _tree_bytes(path)
            try:
                if not dry_run:
                    _remove_tree(path)
            except OSError as exc:
                notes.append(f"{path}: could not remove: {exc.strerror or exc}")
                continue
            actions.append(GcAction(path, reason, size))
        return actions, notes

    def _finalize_rejected(self, partial: Path) -> None:
        # ".partial-<run>-c<N>-<token>" -> "<run>-c<N>" (or a fresh name if that exists).
        base = partial.name[len(PARTIAL_PREFIX) :].rsplit("-", 1)[0] or "unknown"
        final = partial.parent / base
        if os.path.lexists(final):
            final = partial.parent / f"{base}-recovered-{secrets.token_hex(4)}"
        partial.rename(final)
        _fsync_dir(partial.parent)

    def recover(self) -> list[Path]:
        """Clean up after crashed writers; return what was removed (or, for rejects, completed).

        Removes dot temp files of manifests, archive copies, holder records and evidence files,
        ``.partial-`` copies under ``blessed/``, and half-created staging dirs whose creator is
        dead. A ``.partial-`` rejected dir holds evidence: it is renamed to its final name instead.
        Each hash is cleaned under its lock (skipped while another process holds it, which may be
        publishing right now). Never touches a blessed dir a manifest references: only
        ``.partial-`` names are removed there.
        """
        with _os_errors(f"recovering the store {self._root}"):
            actions, _ = self._recover(dry_run=False)
        return [action.path for action in actions]

    def _referenced(self, config_hash: str) -> set[str]:
        """dir_ids of ``config_hash`` that live manifests reference, failing closed on invalid ones.

        The default ``root/manifests`` is consulted too when a separate manifests dir is in use:
        a gc run with the wrong manifests dir must still not delete what the other one references.
        """
        dirs = [self._manifests_dir]
        if self._manifests_dir != self._root / "manifests":
            dirs.append(self._root / "manifests")
        referenced: set[str] = set()
        for directory in dirs:
            for _, manifest in self._valid_records(directory):
                if manifest.config_hash == config_hash:
                    referenced.add(manifest.cache.dir_id)
        return referenced

    def gc(self, *, keep: int = 0, dry_run: bool = False) -> GcReport:
        """Remove what no live blessing needs; with ``dry_run``, only list it.

        Per config hash (under its lock; skipped with a note while held): blessed versions no live
        manifest references beyond the ``keep`` newest (by dir_id, which starts with a UTC
        timestamp), and rejected evidence dirs beyond the ``keep`` newest (by mtime). Also staging
        dirs whose owner process is dead on this host, and the debris :meth:`recover` removes.
        Never touches what a live manifest references. Archived manifests are kept (history).

        Raises:
            ManifestInvalidError: a manifest is invalid: gc cannot know what it references.
            InputInvalidError: negative ``keep``.
        """
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
            raise InputInvalidError(f"keep must be a non-negative integer, got {keep!r}")
        with _os_errors(f"gc of {self._root}"):
            return self._gc(keep, dry_run)

    def _gc(self, keep: int, dry_run: bool) -> GcReport:
        # Fail closed before touching anything: an unreadable manifest may reference any version.
        self._valid_records()
        actions, notes = self._recover(dry_run=dry_run)

        def drop(path: Path, reason: str) -> None:
            size = _tree_bytes(path)
            if not dry_run:
                try:
                    _remove_tree(path)
                except OSError as exc:
                    notes.append(f"{path}: could not remove: {exc.strerror or exc}")
                    return
            actions.append(GcAction(path, reason, size))

        hashes = {e.name for e in _listdir(self._blessed) if is_config_hash(e.name)}
        hashes |= {e.name for e in _listdir(self._rejected) if is_config_hash(e.name)}
        for config_hash in sorted(hashes):
            with self._try_lock(config_hash) as locked:
                if not locked:
                    notes.append(f"{config_hash[:16]}...: lock held by a running bless; skipped")
                    continue
                # Under the lock, so a publish cannot commit between this read and the removals.
                referenced = self._referenced(config_hash)
                versions = [
                    Path(e.path)
                    for e in _listdir(self._blessed / config_hash)
                    if e.is_dir(follow_symlinks=False) and not e.name.startswith(".") and e.name not in referenced
                ]
                versions.sort(key=lambda p: p.name, reverse=True)
                for path in versions[keep:]:
                    drop(path, "blessed version no live manifest references")
                evidence = [
                    Path(e.path)
                    for e in _listdir(self._rejected / config_hash)
                    if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")
                ]
                evidence.sort(key=lambda p: (os.lstat(p).st_mtime, p.name), reverse=True)
                for path in evidence[keep:]:
                    drop(path, "rejected evidence beyond the newest kept")

        for entry in _listdir(self._staging):
            if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                continue
            path = Path(entry.path)
            owner = _read_json_object(path / OWNER_FILE)
            alive = _owner_alive(owner) if owner is not None else None
            if alive is False:
                assert owner is not None
                drop(path, f"staging of a run that is not running (pid {owner.get('pid')} is gone)")
            elif owner is None and _age_s(path) > STALE_S:
                drop(path, "staging dir without an owner record, untouched for over an hour")
            elif alive is None and owner is not None:
                notes.append(f"{path}: owner on host {owner.get('host')!r} cannot be checked here; kept")
        return GcReport(actions=tuple(actions), dry_run=dry_run, notes=tuple(notes))
