"""A blessing as an OCI artifact: the layout, built and checked without any I/O.

Layout (``artifactType: application/vnd.bless.cache.v1``), one OCI image manifest:

* ``config``: the blessing's manifest, its canonical bytes (:meth:`Manifest.to_json_bytes`, exactly
  what the store writes and what ``bless sign`` signs), media type ``application/vnd.bless.manifest.v1+json``;
* ``layers``: **one blob per file** of the blessed tree, in the manifest's (sorted) path order, media type
  ``application/vnd.bless.file.v1``, the path in the ``org.opencontainers.image.title`` annotation. A
  file's blob digest is its sha256, which the manifest already records: checking a blob while it streams
  is checking the file. Reblesses that keep a file share its blob, so a push or pull moves only what
  changed; there is no archive to extract (no tar entries: no ``..``, absolute, link or device members to
  defend against; paths come from the validated manifest and must match the layer titles exactly);
* ``annotations``: the config hash and dir id (for people browsing the registry).

Reproducible: the manifest JSON is serialized with sorted keys and no whitespace, and holds nothing but
content digests, sizes, paths and media types (no time, host, uid or mode), so the same blessing pushed
from any host has the same OCI manifest digest.

Signatures travel as a second artifact (``application/vnd.bless.trust.v1``) holding the TUF metadata
files as layers, with the blessing manifest as its ``subject``, under the tag
``sha256-<hex>.bless-trust`` (the tag scheme registries without the referrers API use, e.g. Docker
Distribution); re-signing replaces it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bless.core.factors import is_config_hash
from bless.core.manifest import Manifest, manifest_from_dict, strict_json
from bless.core.relpath import check_relative_path
from bless.errors import ArtifactInvalidError, DigestMismatchError

__all__ = [
    "ARTIFACT_TYPE",
    "FILE_MEDIA_TYPE",
    "MANIFEST_MEDIA_TYPE",
    "OCI_MANIFEST_MEDIA_TYPE",
    "TRUST_ARTIFACT_TYPE",
    "BlessingArtifact",
    "BlobRef",
    "TrustArtifact",
    "blessing_artifact",
    "check_distributable",
    "digest_of",
    "parse_blessing_artifact",
    "parse_blessing_config",
    "parse_trust_artifact",
    "trust_artifact",
    "trust_tag",
]

OCI_MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
ARTIFACT_TYPE = "application/vnd.bless.cache.v1"
MANIFEST_MEDIA_TYPE = "application/vnd.bless.manifest.v1+json"
FILE_MEDIA_TYPE = "application/vnd.bless.file.v1"
TRUST_ARTIFACT_TYPE = "application/vnd.bless.trust.v1"
TUF_MEDIA_TYPE = "application/vnd.bless.tuf-metadata.v1+json"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_CONFIG = b"{}"
TITLE = "org.opencontainers.image.title"
CONFIG_HASH_ANNOTATION = "org.bless.config-hash"
DIR_ID_ANNOTATION = "org.bless.dir-id"
#: The largest OCI manifest read or pushed: what the OCI distribution spec has every registry accept
#: (Distribution refuses more). A 2,000-file blessing's is about 400 KB; 4 MiB holds ~18,000 files.
MAX_OCI_MANIFEST_BYTES = 4 << 20
#: The largest blessing manifest (config blob) read into memory: a manifest lists the files the OCI
#: manifest does, in about as many bytes, so this leaves room for trials and golden outputs.
MAX_CONFIG_BYTES = 16 << 20
#: The most TUF metadata (all files of a signatures artifact together) read into memory.
MAX_TRUST_BYTES = 64 << 20

_TUF_NAME = re.compile(r"^(?:[1-9][0-9]{0,9}\.root|root|timestamp|snapshot|targets)\.json$")


@dataclass(frozen=True)
class BlobRef:
    """One blob of an artifact: digest, size, and the path it becomes (files) or its file name (TUF)."""

    digest: str
    size: int
    title: str


@dataclass(frozen=True)
class BlessingArtifact:
    """A parsed (or built) blessing artifact: its manifest bytes and digest, config and file blobs."""

    manifest_bytes: bytes
    digest: str
    config: BlobRef
    files: tuple[BlobRef, ...]
    config_hash: str

    @property
    def total_size(self) -> int:
        return self.config.size + sum(blob.size for blob in self.files)


@dataclass(frozen=True)
class TrustArtifact:
    manifest_bytes: bytes
    digest: str
    blobs: tuple[BlobRef, ...]


def is_sha256_digest(value: object) -> bool:
    """``sha256:`` and 64 lowercase hex (the hex rule is the config hash's: one sha256 format)."""
    return isinstance(value, str) and value.startswith("sha256:") and is_config_hash(value.removeprefix("sha256:"))


def digest_of(data: bytes) -> str:
    """``sha256:<hex>`` of bytes."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def trust_tag(blessing_digest: str) -> str:
    """The tag of a blessing's signatures: ``sha256-<hex>.bless-trust``."""
    return blessing_digest.replace(":", "-") + ".bless-trust"


def _serialize(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _descriptor(media_type: str, digest: str, size: int, title: str | None = None) -> dict[str, Any]:
    descriptor: dict[str, Any] = {"mediaType": media_type, "digest": digest, "size": size}
    if title is not None:
        descriptor["annotations"] = {TITLE: title}
    return descriptor


def blessing_artifact(manifest: Manifest) -> BlessingArtifact:
    """The reproducible OCI manifest of a blessing (see the module docstring)."""
    config_bytes = manifest.to_json_bytes()
    config = BlobRef(digest_of(config_bytes), len(config_bytes), "")
    files = tuple(BlobRef(f"sha256:{entry.sha256}", entry.size, entry.path) for entry in manifest.cache.files)
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": _descriptor(MANIFEST_MEDIA_TYPE, config.digest, config.size),
        "layers": [_descriptor(FILE_MEDIA_TYPE, blob.digest, blob.size, blob.title) for blob in files],
        "annotations": {CONFIG_HASH_ANNOTATION: manifest.config_hash, DIR_ID_ANNOTATION: manifest.cache.dir_id},
    }
    data = _serialize(document)
    return BlessingArtifact(data, digest_of(data), config, files, manifest.config_hash)


def trust_artifact(blessing: BlessingArtifact, metadata: Mapping[str, bytes]) -> TrustArtifact:
    """The artifact carrying a blessing's TUF metadata files, with the blessing as its subject."""
    blobs = tuple(BlobRef(digest_of(data), len(data), name) for name, data in sorted(metadata.items()))
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST_MEDIA_TYPE,
        "artifactType": TRUST_ARTIFACT_TYPE,
        "config": _descriptor(EMPTY_MEDIA_TYPE, digest_of(EMPTY_CONFIG), len(EMPTY_CONFIG)),
        "layers": [_descriptor(TUF_MEDIA_TYPE, blob.digest, blob.size, blob.title) for blob in blobs],
        "subject": _descriptor(OCI_MANIFEST_MEDIA_TYPE, blessing.digest, len(blessing.manifest_bytes)),
    }
    data = _serialize(document)
    return TrustArtifact(data, digest_of(data), blobs)


# --------------------------------------------------------------------------------------------
# Parsing what a registry returned (never trusted: every field checked)


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        document = strict_json(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and a duplicate key are ValueErrors too
        raise ArtifactInvalidError(f"{what} is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ArtifactInvalidError(f"{what} is not a JSON object")
    return document


def _blob(descriptor: Any, media_type: str, what: str, *, titled: bool) -> BlobRef:
    if not isinstance(descriptor, dict):
        raise ArtifactInvalidError(f"{what}: not a descriptor")
    if descriptor.get("mediaType") != media_type:
        raise ArtifactInvalidError(f"{what}: media type {descriptor.get('mediaType')!r}, expected {media_type}")
    digest, size = descriptor.get("digest"), descriptor.get("size")
    if not isinstance(digest, str) or not is_sha256_digest(digest):
        raise ArtifactInvalidError(f"{what}: digest {digest!r} is not sha256:<64 hex>")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ArtifactInvalidError(f"{what}: size {size!r} is not a non-negative integer")
    title = ""
    if titled:
        annotations = descriptor.get("annotations")
        title_value = annotations.get(TITLE) if isinstance(annotations, dict) else None
        if not isinstance(title_value, str):
            raise ArtifactInvalidError(f"{what}: no {TITLE} annotation")
        title = title_value
    return BlobRef(digest, size, title)


def _check_manifest_bytes(data: bytes, expected_digest: str | None, what: str) -> str:
    if len(data) > MAX_OCI_MANIFEST_BYTES:
        raise ArtifactInvalidError(f"{what}: {len(data)} bytes, more than {MAX_OCI_MANIFEST_BYTES}")
    digest = digest_of(data)
    if expected_digest is not None and digest != expected_digest:
        raise DigestMismatchError(
            f"{what} hashes to {digest}, not the {expected_digest} asked for",
            hint="the registry returned other bytes than the digest names: it is corrupt or tampered with",
        )
    return digest


def parse_blessing_artifact(data: bytes, expected_digest: str | None = None) -> BlessingArtifact:
    """Check an OCI manifest is a well-formed bless artifact (digest, media types, paths, sizes).

    Raises:
        DigestMismatchError: the bytes do not hash to ``expected_digest``.
        ArtifactInvalidError: anything else is off.
    """
    digest = _check_manifest_bytes(data, expected_digest, "the OCI manifest")
    document = _json_object(data, "the OCI manifest")
    if document.get("schemaVersion") != 2 or document.get("mediaType") != OCI_MANIFEST_MEDIA_TYPE:
        raise ArtifactInvalidError("not an OCI image manifest (schemaVersion 2)")
    if document.get("artifactType") != ARTIFACT_TYPE:
        raise ArtifactInvalidError(
            f"artifact type {document.get('artifactType')!r} is not {ARTIFACT_TYPE}",
            hint="the reference names something other than a pushed blessing",
            remedy="not_a_pushed_blessing",
        )
    config = _blob(document.get("config"), MANIFEST_MEDIA_TYPE, "config", titled=False)
    if config.size > MAX_CONFIG_BYTES:
        raise ArtifactInvalidError(f"config: {config.size} bytes, more than {MAX_CONFIG_BYTES}")
    layers = document.get("layers")
    if not isinstance(layers, list):
        raise ArtifactInvalidError("layers is not a list")
    files: list[BlobRef] = []
    for index, descriptor in enumerate(layers):
        blob = _blob(descriptor, FILE_MEDIA_TYPE, f"layer {index}", titled=True)
        try:
            check_relative_path(blob.title)
        except ValueError as exc:
            raise ArtifactInvalidError(
                f"layer {index}: unsafe path {blob.title!r}: {exc}",
                hint="the artifact was crafted to write outside the cache; nothing was installed",
            ) from None
        files.append(blob)
    annotations = document.get("annotations")
    config_hash = annotations.get(CONFIG_HASH_ANNOTATION) if isinstance(annotations, dict) else None
    if not isinstance(config_hash, str):
        raise ArtifactInvalidError(f"no {CONFIG_HASH_ANNOTATION} annotation")
    return BlessingArtifact(data, digest, config, tuple(files), config_hash)


def parse_blessing_config(artifact: BlessingArtifact, config_bytes: bytes) -> Manifest:
    """The blessing manifest carried as config, checked against the artifact that carries it.

    The manifest must be schema-valid, canonical (its bytes are what the store writes and what is
    signed), name the artifact's config hash, and list exactly the artifact's files (path, size,
    sha256) in order: a manifest swapped for another blessing's is refused here.
    """
    if len(config_bytes) > MAX_CONFIG_BYTES:
        raise ArtifactInvalidError("the blessing manifest is too large")
    document = _json_object(config_bytes, "the blessing manifest")
    manifest = manifest_from_dict(document, where="the pulled blessing manifest")
    if manifest.to_json_bytes() != config_bytes:
        raise ArtifactInvalidError(
            "the blessing manifest is not in canonical form (it was not written by bless push)",
            hint="push the blessing again",
            remedy="push_again",
        )
    if manifest.config_hash != artifact.config_hash:
        raise ArtifactInvalidError(
            f"the artifact is annotated {artifact.config_hash[:16]}... but carries the manifest of "
            f"{manifest.config_hash[:16]}...",
            hint="the artifact's manifest was swapped for another blessing's; nothing was installed",
        )
    expected = tuple(BlobRef(f"sha256:{e.sha256}", e.size, e.path) for e in manifest.cache.files)
    if expected != artifact.files:
        raise ArtifactInvalidError(
            "the artifact's file blobs are not the files its blessing manifest lists",
            hint="the artifact's manifest was swapped or its layers edited; nothing was installed",
        )
    return manifest


def parse_trust_artifact(data: bytes, blessing_digest: str) -> TrustArtifact:
    """Check the signatures artifact: its media types, its subject, and its TUF file names."""
    digest = _check_manifest_bytes(data, None, "the signatures manifest")
    document = _json_object(data, "the signatures manifest")
    if document.get("artifactType") != TRUST_ARTIFACT_TYPE:
        raise ArtifactInvalidError(f"the signatures tag holds a {document.get('artifactType')!r} artifact")
    subject = document.get("subject")
    if not isinstance(subject, dict) or subject.get("digest") != blessing_digest:
        raise ArtifactInvalidError("the signatures artifact names another blessing as its subject")
    layers = document.get("layers")
    if not isinstance(layers, list):
        raise ArtifactInvalidError("the signatures artifact's layers is not a list")
    blobs = tuple(_blob(d, TUF_MEDIA_TYPE, f"signature layer {i}", titled=True) for i, d in enumerate(layers))
    for blob in blobs:
        if not _TUF_NAME.fullmatch(blob.title) or blob.size > MAX_CONFIG_BYTES:
            raise ArtifactInvalidError(f"signature layer {blob.title!r} is not a TUF metadata file")
    if len({blob.title for blob in blobs}) != len(blobs):
        raise ArtifactInvalidError("the signatures artifact names one TUF metadata file twice")
    total = sum(blob.size for blob in blobs)
    if total > MAX_TRUST_BYTES:
        raise ArtifactInvalidError(f"the signatures artifact's metadata is {total} bytes, more than {MAX_TRUST_BYTES}")
    return TrustArtifact(data, digest, blobs)


def check_distributable(artifact: BlessingArtifact) -> None:
    """Refuse to push what no bless pull would read (:data:`MAX_OCI_MANIFEST_BYTES`, :data:`MAX_CONFIG_BYTES`)."""
    if len(artifact.manifest_bytes) > MAX_OCI_MANIFEST_BYTES or artifact.config.size > MAX_CONFIG_BYTES:
        raise ArtifactInvalidError(
            f"this blessing's OCI manifest is {len(artifact.manifest_bytes)} bytes and its manifest "
            f"{artifact.config.size}: over the {MAX_OCI_MANIFEST_BYTES} and {MAX_CONFIG_BYTES} bytes a pull reads "
            f"({len(artifact.files)} files)",
            hint="registries need not accept OCI manifests over 4 MiB; copy a blessing this large with the store "
            "itself (rsync of blessed/ and manifests/)",
        )


def unique_blobs(blobs: Sequence[BlobRef]) -> list[BlobRef]:
    """Each digest once (two identical files share one blob), in first-seen order."""
    seen: set[str] = set()
    unique: list[BlobRef] = []
    for blob in blobs:
        if blob.digest not in seen:
            seen.add(blob.digest)
            unique.append(blob)
    return unique
