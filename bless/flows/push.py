"""``bless push``: a blessing (and optionally its signatures) to an OCI registry.

The blessed tree is verified first (never push bytes that differ from their manifest); then every
blob the registry lacks is uploaded (the manifest as config, one blob per file: see
:mod:`bless.oci.artifact`), then the OCI manifest under the tag. With ``metadata_dir`` the TUF metadata
that signs the blessing is pushed as its signatures artifact (tag ``sha256-<hex>.bless-trust``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bless.core.json_form import JsonForm
from bless.core.manifest import Manifest
from bless.errors import TrustInvalidError, UnsignedError, VerifyFailedError
from bless.flows.lookup import lookup_manifest
from bless.oci.artifact import (
    EMPTY_CONFIG,
    OCI_MANIFEST_MEDIA_TYPE,
    BlobRef,
    blessing_artifact,
    check_distributable,
    digest_of,
    trust_artifact,
    trust_tag,
    unique_blobs,
)
from bless.oci.client import Reference, RegistryClient, Transport, parse_reference
from bless.store import Store
from bless.trust import metadata_from_dir, target_path

__all__ = ["PushResult", "push_blessing", "push_named_blessing"]


@dataclass(frozen=True)
class PushResult(JsonForm):
    """What a push did: the artifact's digest, and how much of it the registry did not have yet."""

    reference: str
    digest: str
    pinned: str
    config_hash: str
    blobs_total: int
    blobs_uploaded: int
    bytes_total: int
    bytes_uploaded: int
    signatures: str | None


def _signing_metadata(metadata_dir: Path, manifest: Manifest) -> dict[str, bytes]:
    """The TUF files to attach; refused unless their targets list this very blessing."""
    files = metadata_from_dir(metadata_dir)
    if "targets.json" not in files or "root.json" not in files:
        raise TrustInvalidError(
            f"{metadata_dir} holds no targets.json/root.json",
            hint="the metadata directory is the signing repository's metadata/ (DIR/metadata)",
            remedy="push_metadata_dir",
        )
    name = target_path(manifest.config_hash, manifest.cache.dir_id)
    try:
        listed = name in json.loads(files["targets.json"])["signed"]["targets"]
    except (ValueError, KeyError, TypeError):
        raise TrustInvalidError(f"{metadata_dir / 'targets.json'} is not TUF targets metadata") from None
    if not listed:
        raise UnsignedError(
            f"the metadata in {metadata_dir} does not sign {manifest.config_hash[:16]}... ({manifest.cache.dir_id})",
            hint=f"sign {manifest.config_hash[:16]} first with the signing repository whose metadata this is",
            details={"config_hash": manifest.config_hash},
            remedy="sign_first",
        )
    return files


#: Blobs uploaded at once by default (as many as a pull downloads).
UPLOAD_WORKERS = 4


def _upload_missing(
    first: RegistryClient,
    reference: Reference,
    sources: list[tuple[BlobRef, Path | bytes]],
    plain_http: bool | None,
    transport: Transport | None,
    progress: Callable[[int], None] | None,
    workers: int,
) -> list[BlobRef]:
    """Upload each blob the registry lacks, ``workers`` at a time; the blobs sent. After the first failure no
    further blob is started, and that first failure is raised (the others are usually its consequences)."""
    local = threading.local()
    lock = threading.Lock()
    sent: list[BlobRef] = []
    failures: list[BaseException] = []

    def client() -> RegistryClient:
        if threading.current_thread() is threading.main_thread():
            return first
        if not hasattr(local, "client"):
            local.client = RegistryClient(reference, plain_http=plain_http, transport=transport)
        return local.client  # type: ignore[no-any-return]

    def push_one(blob: BlobRef, source: Path | bytes) -> None:
        with lock:
            if failures:
                return
        try:
            if not client().blob_exists(blob.digest):
                client().upload_blob(blob.digest, blob.size, source)
                with lock:
                    sent.append(blob)
            if progress is not None:
                with lock:
                    progress(blob.size)
        except BaseException as exc:
            with lock:
                failures.append(exc)

    if workers <= 1:
        for blob, source in sources:
            push_one(blob, source)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for future in [pool.submit(push_one, blob, source) for blob, source in sources]:
                future.result()
    if failures:
        raise failures[0]
    return sent


def push_blessing(
    store: Store,
    manifest: Manifest,
    reference: Reference | str,
    *,
    metadata_dir: Path | None = None,
    plain_http: bool | None = None,
    progress: Callable[[int], None] | None = None,
    transport: Transport | None = None,
    workers: int = UPLOAD_WORKERS,
) -> PushResult:
    """Push ``manifest``'s blessing to ``reference`` (a tag, or its digest when none is given; a reference
    given as written on a command line is parsed here).

    ``transport``: what carries the registry client's requests (None: the network; the unit tests'
    in-memory registry otherwise). ``workers``: blobs uploaded at once, each thread with its own client.
    """
    if isinstance(reference, str):
        reference = parse_reference(reference)
    signing = _signing_metadata(metadata_dir, manifest) if metadata_dir is not None else None
    blessed_dir = store.blessed_dir(manifest)
    check = store.verify_blessing(manifest)
    if not check.ok:
        raise VerifyFailedError.from_result(check, blessed_dir, config_hash=manifest.config_hash)
    artifact = blessing_artifact(manifest)
    check_distributable(artifact)
    client = RegistryClient(reference, plain_http=plain_http, transport=transport)
    sources: list[tuple[BlobRef, Path | bytes]] = [(artifact.config, manifest.to_json_bytes())]
    sources += [(blob, blessed_dir / blob.title) for blob in unique_blobs(artifact.files)]
    sent = _upload_missing(client, reference, sources, plain_http, transport, progress, workers)
    tag = reference.tag or artifact.digest
    client.put_manifest(artifact.manifest_bytes, tag, OCI_MANIFEST_MEDIA_TYPE)
    signatures = None
    if signing is not None:
        trust = trust_artifact(artifact, signing)
        blobs: list[tuple[BlobRef, bytes]] = [
            (BlobRef(digest_of(EMPTY_CONFIG), len(EMPTY_CONFIG), ""), EMPTY_CONFIG),
            *((blob, signing[blob.title]) for blob in trust.blobs),
        ]
        for blob, data in blobs:
            if not client.blob_exists(blob.digest):
                client.upload_blob(blob.digest, blob.size, data)
        signatures = trust_tag(artifact.digest)
        client.put_manifest(trust.manifest_bytes, signatures, OCI_MANIFEST_MEDIA_TYPE)
    return PushResult(
        reference=str(reference),
        pinned=str(reference.with_digest(artifact.digest)),
        digest=artifact.digest,
        config_hash=manifest.config_hash,
        blobs_total=len(sources),
        blobs_uploaded=len(sent),
        bytes_total=sum(blob.size for blob, _ in sources),
        bytes_uploaded=sum(blob.size for blob in sent),
        signatures=signatures,
    )


def push_named_blessing(
    store: Store,
    text: str,
    reference: str,
    *,
    metadata_dir: Path | None = None,
    plain_http: bool | None = None,
    transport: Transport | None = None,
) -> PushResult:
    """``bless push``: the blessing ``text`` names (a config hash or a unique prefix) to ``reference`` as
    written (``REGISTRY/REPOSITORY[:TAG]``), through :func:`push_blessing`.

    Raises: the lookup's errors (:func:`bless.flows.lookup.lookup_live`), InputInvalidError for a
    malformed reference, and :func:`push_blessing`'s.
    """
    manifest = lookup_manifest(store, text)
    return push_blessing(
        store,
        manifest,
        parse_reference(reference),
        metadata_dir=metadata_dir,
        plain_http=plain_http,
        transport=transport,
    )
