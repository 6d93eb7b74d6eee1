"""``bless pull`` step by step (the package docstring says each): resolve, trust, decide, download, publish."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from bless.core.json_form import OMIT, JsonForm
from bless.core.manifest import Manifest
from bless.errors import AlreadyBlessedError, ArtifactNotFoundError, BlessError, LockHeldError
from bless.flows.pull.decision import PullDecision, decide_pull
from bless.flows.pull.download import DOWNLOAD_WORKERS, bytes_to_write, check_free_space, download, local_copies
from bless.flows.trust_policy import trust_verdict
from bless.oci.artifact import (
    BlessingArtifact,
    blessing_artifact,
    parse_trust_artifact,
    trust_tag,
)
from bless.oci.client import Reference, RegistryClient, Transport, parse_reference
from bless.oci.limits import DEFAULT_LIMITS, TransferLimits
from bless.store import FaultHook, Store, staging_owner
from bless.system.os_refusals import full_disk
from bless.system.trees import remove_tree
from bless.trust import TrustVerdict

__all__ = ["PULL_STEPS", "PullResult", "pull_blessing"]

PULL_STEPS: tuple[str, ...] = ("resolve", "trust", "stage", "download", "publish", "done")
STAGING_PREFIX = "pull-"


@dataclass(frozen=True)
class PullResult(JsonForm):
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
    trust: TrustVerdict | None = field(metadata=OMIT)  # the command line renders the verdict (trust_report)


def _signatures(client: RegistryClient, artifact: BlessingArtifact) -> dict[str, bytes] | None:
    """The TUF metadata pushed with the blessing, or None when it has none."""
    try:
        data, _digest = client.get_manifest(trust_tag(artifact.digest))
    except ArtifactNotFoundError:
        return None
    trust = parse_trust_artifact(data, artifact.digest)
    return {blob.title: client.read_blob(blob.digest, blob.size) for blob in trust.blobs}


def _present_by_digest(store: Store, digest: str) -> tuple[Manifest, bytes] | None:
    """The live blessing whose OCI artifact has ``digest``, with its manifest's bytes; None when none has.

    The artifact is built from the manifest alone, reproducibly (:func:`blessing_artifact`), so its digest
    names the manifest's canonical bytes and every file's sha256: equal digests, the same blessing.
    """
    for record in store.records():
        if record.manifest is None or blessing_artifact(record.manifest).digest != digest:
            continue
        live = store.live(record.manifest.config_hash)
        if live is not None and blessing_artifact(live.manifest).digest == digest:
            return live.manifest, live.document
    return None


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


def pull_blessing(
    store: Store,
    reference: Reference | str,
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
    ``reference`` may be given as written on a command line (parsed here).
    """
    if isinstance(reference, str):
        reference = parse_reference(reference)
    started = time.monotonic()

    def step(name: str) -> None:
        if fault is not None:
            fault(f"pull:{name}")

    step("resolve")
    if reference.digest is not None:
        # Pinned by digest: a blessing live here whose (reproducible) artifact has that digest is that very
        # blessing, so the registry is not asked at all ("a no-op when present", even while it is down).
        present = _present_by_digest(store, reference.digest)
        if present is not None:
            step("trust")
            manifest, data = present
            verdict = trust_verdict(store, manifest, trust_dir, data=data)  # the trusted metadata stored here
            return _pull_result(store, reference, blessing_artifact(manifest), manifest, verdict, installed=False)
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
    with contextlib.ExitStack() as held:
        decision = _decide_holding_the_lock(store, manifest, held, wait=wait, allow_downgrade=allow_downgrade)
        if decision.action == "present":
            return result(installed=False)
        # The wait for the lock is not transfer time: the pull's deadline starts again.
        client.deadline = time.monotonic() + budget_s
        installed, blobs, size = _install(store, client, artifact, manifest, decision, step, fault, progress, workers)
        return result(installed=installed, blobs=blobs, size=size)


def _decide_holding_the_lock(
    store: Store, manifest: Manifest, held: contextlib.ExitStack, *, wait: bool, allow_downgrade: bool
) -> PullDecision:
    """The pull's decision over one lookup of the live manifest, made holding the config's writer lock (in ``held``).

    The lock is tried first, without waiting, so that the one lookup sees what no other writer can change
    before the publish. When it cannot be taken (another pull or ``bless run`` holds it, or this user
    cannot write the store), the live manifest decides without it: present is a no-op and a downgrade a
    refusal, neither needing the lock; otherwise the pull waits for the lock (unless told not to) and
    decides again over what the writer it waited for left: the one case with a second lookup.
    """
    try:
        held.enter_context(_writer_lock(store, manifest.config_hash, wait=False))
    except BlessError as not_taken:
        decision = decide_pull(store.find(manifest.config_hash), manifest, allow_downgrade=allow_downgrade)
        if decision.action == "present":
            return decision
        if not (wait and isinstance(not_taken, LockHeldError)):
            raise
        held.enter_context(_writer_lock(store, manifest.config_hash, wait=True))
    return decide_pull(store.find(manifest.config_hash), manifest, allow_downgrade=allow_downgrade)


def _install(
    store: Store,
    client: RegistryClient,
    artifact: BlessingArtifact,
    manifest: Manifest,
    decision: PullDecision,
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
        blobs, size = _download_tree(store, client, artifact, manifest, decision, staging, tree, progress, workers)
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
    decision: PullDecision,
    staging: Path,
    tree: Path,
    progress: Callable[[int], None] | None,
    workers: int,
) -> tuple[int, int]:
    """Every file into ``tree``, linked from the live blessing where it holds it: (blobs, bytes) downloaded.

    Refused at once when the file system cannot hold what is to be written (15).
    """
    live = decision.live
    local = local_copies(live, None if live is None else store.blessed_dir(live))
    entries = len(artifact.files) + len(manifest.cache.dirs)
    check_free_space(staging, bytes_to_write(artifact.files, local), entries)
    with full_disk(f"writing the pulled files into {staging}"):
        return download(client, tree, artifact.files, progress, workers, local)


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
            hint="another pull or blessing run writes this config now; pull again waiting for the lock (wait) to "
            "queue behind it (it then finds the blessing present, or installs its own)",
            details=exc.details,
            remedy="pull_wait_for_lock",
        ) from None
