"""Where engine processes run: Docker containers or local subprocesses."""

from __future__ import annotations

import os

from bless.errors import InputInvalidError
from bless.runtime.base import Runtime

#: Local runtime only: "namespace" requires mounts in a private mount namespace (root), "copy"
#: forces copying the cache (nothing enforced; the post-run hash check protects the blessing),
#: unset picks the namespace when possible.
LOCAL_MOUNTS_ENV = "BLESS_LOCAL_MOUNTS"


def get_runtime(kind: str) -> Runtime:
    """A runtime of the profile's kind. The Docker SDK is imported only when it is used."""
    if kind == "docker":
        from bless.runtime.docker import DockerRuntime

        return DockerRuntime()
    from bless.runtime.local import LocalRuntime

    mode = os.environ.get(LOCAL_MOUNTS_ENV, "")
    if mode not in ("", "namespace", "copy"):
        raise InputInvalidError(f"{LOCAL_MOUNTS_ENV}={mode!r}: expected 'namespace' or 'copy'")
    return LocalRuntime(use_mount_namespace={"": None, "namespace": True, "copy": False}[mode])
