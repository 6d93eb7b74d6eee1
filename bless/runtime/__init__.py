"""Where engine processes run: Docker containers or local subprocesses."""

from __future__ import annotations

from bless.runtime.base import Runtime


def get_runtime(kind: str) -> Runtime:
    """A runtime of the profile's kind. The Docker SDK is imported only when it is used."""
    if kind == "docker":
        from bless.runtime.docker import DockerRuntime

        return DockerRuntime()
    from bless.runtime.local import LocalRuntime

    return LocalRuntime()
