"""Images that tests and the build script make are removed again: nothing of ours is left behind."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from typing import Any

import pytest

from tests.conftest import _rootfs_tar, _static_busybox
from tests.integration.helpers import REPO, imported_image

pytestmark = pytest.mark.integration


def test_an_image_a_test_imports_is_removed_and_one_that_was_there_is_kept(docker_client: Any) -> None:
    docker = pytest.importorskip("docker")
    rootfs = _rootfs_tar(_static_busybox())
    name = f"bless-test-import-{uuid.uuid4().hex[:8]}:1"
    with imported_image(docker_client, name, rootfs) as made:
        assert docker_client.images.get(made).tags == [name]
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(name)

    docker_client.api.import_image_from_data(rootfs, repository=name.split(":")[0], tag="1")
    try:
        with imported_image(docker_client, name, rootfs):
            pass
        assert docker_client.images.get(name).tags == [name], "not ours: left alone"
    finally:
        docker_client.images.remove(name)


def test_the_build_script_removes_leftover_build_stages(docker_client: Any, reference_image: str) -> None:
    """The legacy builder keeps an offline build's venv stage as an untagged image; the script drops it.

    The leftover is made here (an untagged image labelled like a descendant of our base), so the
    test does not depend on which builder made the reference image.
    """
    docker = pytest.importorskip("docker")
    marker = f"leftover-{uuid.uuid4().hex[:8]}"
    # Imported without a name: an untagged (dangling) <none> image, as the legacy builder leaves a stage.
    before = {image.id for image in docker_client.images.list(filters={"dangling": True})}
    docker_client.api.import_image_from_data(
        _rootfs_tar(_static_busybox()), changes=[f"LABEL org.bless.base-suite={marker}"]
    )
    (stage,) = docker_client.images.list(filters={"dangling": True, "label": f"org.bless.base-suite={marker}"})
    try:
        assert stage.id not in before
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "images" / "build-reference-image.sh")],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip().splitlines()[-1] == reference_image, "up to date: not rebuilt"
        with pytest.raises(docker.errors.ImageNotFound):
            docker_client.images.get(stage.id)
        assert f"removed the leftover build stage {stage.id[7:19]}" in proc.stderr
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_client.images.remove(stage.id)
