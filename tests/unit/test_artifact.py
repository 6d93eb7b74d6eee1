"""The OCI layout of a blessing, built and parsed without a registry."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bless.errors import ArtifactInvalidError, DigestMismatchError, ManifestInvalidError
from bless.oci.artifact import (
    ARTIFACT_TYPE,
    MAX_OCI_MANIFEST_BYTES,
    MAX_TRUST_BYTES,
    blessing_artifact,
    check_distributable,
    digest_of,
    parse_blessing_artifact,
    parse_blessing_config,
    parse_trust_artifact,
    trust_artifact,
    trust_tag,
)
from tests.unit.store_helpers import make_factors, make_manifest, write_tree


def test_layout_is_reproducible_and_content_only(tmp_path: Path) -> None:
    manifest = make_manifest(write_tree(tmp_path / "t"), created="2025-01-01T00:00:00Z")
    artifact = blessing_artifact(manifest)
    assert artifact == blessing_artifact(manifest)
    document = json.loads(artifact.manifest_bytes)
    assert document["artifactType"] == ARTIFACT_TYPE
    assert [layer["annotations"]["org.opencontainers.image.title"] for layer in document["layers"]] == [
        f.path for f in manifest.cache.files
    ]
    assert [layer["digest"] for layer in document["layers"]] == [f"sha256:{f.sha256}" for f in manifest.cache.files]
    assert str(tmp_path) not in artifact.manifest_bytes.decode()
    parsed = parse_blessing_artifact(artifact.manifest_bytes, artifact.digest)
    assert parsed == artifact
    assert parse_blessing_config(parsed, manifest.to_json_bytes()) == manifest
    assert trust_tag(artifact.digest) == artifact.digest.replace(":", "-") + ".bless-trust"
    signatures = trust_artifact(artifact, {"root.json": b"{}", "targets.json": b"[]"})
    assert json.loads(signatures.manifest_bytes)["subject"]["digest"] == artifact.digest


def test_parse_refuses_what_is_not_a_well_formed_blessing(tmp_path: Path) -> None:
    manifest = make_manifest(write_tree(tmp_path / "t"))
    artifact = blessing_artifact(manifest)
    with pytest.raises(DigestMismatchError):
        parse_blessing_artifact(artifact.manifest_bytes, digest_of(b"other"))
    base = json.loads(artifact.manifest_bytes)
    mutations: dict[str, Callable[[dict[str, Any]], object]] = {
        "artifact type": lambda d: d.update(artifactType="application/vnd.oci.image.config.v1+json"),
        "layer media type": lambda d: d["layers"][0].update(mediaType="application/vnd.oci.image.layer.v1.tar"),
        "no title": lambda d: d["layers"][0].pop("annotations"),
        "dotdot": lambda d: d["layers"][0]["annotations"].update({"org.opencontainers.image.title": "../x"}),
        "absolute": lambda d: d["layers"][0]["annotations"].update({"org.opencontainers.image.title": "/x"}),
        "bad digest": lambda d: d["layers"][0].update(digest="md5:abc"),
        "negative size": lambda d: d["layers"][0].update(size=-1),
        "layers not list": lambda d: d.update(layers={}),
    }
    for name, mutate in mutations.items():
        document = json.loads(json.dumps(base))
        mutate(document)
        with pytest.raises(ArtifactInvalidError):
            parse_blessing_artifact(json.dumps(document).encode())
        assert name
    with pytest.raises(ArtifactInvalidError):
        parse_blessing_artifact(b"[]")
    with pytest.raises(ArtifactInvalidError):
        parse_blessing_artifact(b"\xff")


def test_config_must_be_the_canonical_manifest_of_these_files(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "t")
    manifest = make_manifest(tree)
    artifact = blessing_artifact(manifest)
    pretty = json.dumps(manifest.to_dict()).encode()  # same content, other bytes: not what was signed
    with pytest.raises(ArtifactInvalidError):
        parse_blessing_config(artifact, pretty)
    other = make_manifest(tree, make_factors(seed=3))
    with pytest.raises(ArtifactInvalidError):
        parse_blessing_config(artifact, other.to_json_bytes())
    with pytest.raises(ManifestInvalidError):
        parse_blessing_config(artifact, b'{"schema_version": 1}')


def test_push_and_pull_share_one_size_limit(tmp_path: Path) -> None:
    """What a pull would refuse to read (an OCI manifest over 4 MiB, the spec's floor) is refused at push too."""
    manifest = make_manifest(write_tree(tmp_path / "t"))
    artifact = blessing_artifact(manifest)
    check_distributable(artifact)
    padding = b" " * (MAX_OCI_MANIFEST_BYTES + 1 - len(artifact.manifest_bytes))
    oversized = dataclasses.replace(artifact, manifest_bytes=artifact.manifest_bytes + padding)
    with pytest.raises(ArtifactInvalidError, match="a pull reads"):
        check_distributable(oversized)
    with pytest.raises(ArtifactInvalidError, match="more than"):
        parse_blessing_artifact(oversized.manifest_bytes)


def test_signatures_artifact_bounds_its_metadata(tmp_path: Path) -> None:
    """Each TUF layer is read into memory: their sum is capped, and a name listed twice is refused."""
    artifact = blessing_artifact(make_manifest(write_tree(tmp_path / "t")))
    signatures = trust_artifact(artifact, {f"{n}.root.json": b"{}" for n in range(1, 6)})
    document = json.loads(signatures.manifest_bytes)
    for layer in document["layers"]:
        layer["size"] = MAX_TRUST_BYTES // 4
    with pytest.raises(ArtifactInvalidError, match="more than"):
        parse_trust_artifact(json.dumps(document).encode(), artifact.digest)
    document = json.loads(signatures.manifest_bytes)
    document["layers"][1]["annotations"] = document["layers"][0]["annotations"]
    with pytest.raises(ArtifactInvalidError, match="twice"):
        parse_trust_artifact(json.dumps(document).encode(), artifact.digest)


def test_an_oci_manifest_with_a_duplicate_key_is_invalid(tmp_path: Path) -> None:
    """The registry and bless could each read another value: the manifest's one JSON rule holds here too."""
    artifact = blessing_artifact(make_manifest(write_tree(tmp_path / "t")))
    doubled = b'{"artifactType": "x", ' + artifact.manifest_bytes[1:]
    with pytest.raises(ArtifactInvalidError, match="duplicate key"):
        parse_blessing_artifact(doubled)
