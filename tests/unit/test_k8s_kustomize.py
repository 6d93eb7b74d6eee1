"""The kustomize base (deploy/kubernetes/): kubectl kustomize builds it and its example overlay, and what they
build validates strictly against the Kubernetes schemas of 1.30 to 1.37. That the base is what bless k8s render
makes is the generated-pages test (scripts/gen_docs.py --check)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE = REPO / "deploy" / "kubernetes"
VERSIONS = [f"1.{minor}.0" for minor in range(30, 38)]


def build(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl (with kustomize) is needed: it is installed on the machines bless is built on"
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=True, timeout=60)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.mark.parametrize("directory", ["base", "overlays/example"])
def test_kustomize_builds_and_every_document_validates(directory: str) -> None:
    documents = build(KUSTOMIZE / directory)
    assert sorted(doc["kind"] for doc in documents) == ["ConfigMap", "Deployment"]
    for version in VERSIONS:
        for document in documents:
            kubernetes_validate.validate(document, version, strict=True)


def test_the_profile_configmap_is_generated_and_referenced_by_its_hashed_name() -> None:
    documents = build(KUSTOMIZE / "base")
    (configmap,) = [doc for doc in documents if doc["kind"] == "ConfigMap"]
    (deployment,) = [doc for doc in documents if doc["kind"] == "Deployment"]
    name = configmap["metadata"]["name"]
    assert name.startswith("bless-serve-profile-"), "a changed profile gets a new name, so the pods roll"
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["bless-profile"]["configMap"]["name"] == name
    assert configmap["data"]["profile.toml"] == (KUSTOMIZE / "base" / "profile.toml").read_text()


def test_the_example_overlay_pins_images_and_the_blessing_by_digest() -> None:
    (deployment,) = [doc for doc in build(KUSTOMIZE / "overlays" / "example") if doc["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    images = [c["image"] for c in spec["initContainers"] + spec["containers"]]
    assert all("@sha256:" in image for image in images), images
    artifact = spec["initContainers"][0]["command"][4]
    assert artifact.endswith("@sha256:" + "3" * 64)
    assert deployment["metadata"]["annotations"]["bless.dev/artifact"] == artifact
    assert deployment["spec"]["template"]["metadata"]["annotations"]["bless.dev/artifact"] == artifact
