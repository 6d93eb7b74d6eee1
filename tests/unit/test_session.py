"""engine_spec: where the engine listens and where we reach it, per runtime (the serve-full port rule)."""

from __future__ import annotations

from pathlib import Path

from bless.engines.reference import ReferenceAdapter
from bless.flows.session import DEFAULT_ENGINE_PORT, engine_spec
from bless.profile import ModelSpec, Profile
from bless.runtime.docker import DockerRuntime
from bless.runtime.local import LocalRuntime
from tests.resolving import resolved_offline


def profile(kind: str) -> Profile:
    return Profile(
        name="p",
        engine="reference",
        runtime_kind=kind,  # type: ignore[arg-type]
        image="sha256:" + "ab" * 32 if kind == "docker" else None,
        python="python3" if kind == "local" else None,
        model=ModelSpec(source="builtin", id="reference-tiny"),
    )


def spec_for(kind: str, host_port: int | None):
    runtime = DockerRuntime() if kind == "docker" else LocalRuntime(use_mount_namespace=False)
    return engine_spec(
        resolved_offline(profile(kind), ReferenceAdapter()),
        ReferenceAdapter(),
        runtime,
        name="bless-serve-p",
        labels={"org.bless.owner": "bless"},
        cache_mount=None,
        image=None,
        host_port=host_port,
        log_path=Path("/tmp/unused.log"),
    )


def test_local_engine_listens_on_the_serving_port_itself() -> None:
    spec = spec_for("local", 18123)
    assert spec.port == 18123
    assert spec.host_port is None  # nothing to publish: the engine is on the host
    assert "--port" in spec.command and spec.command[spec.command.index("--port") + 1] == "18123"


def test_docker_maps_the_serving_port_to_the_fixed_container_port() -> None:
    spec = spec_for("docker", 18123)
    assert spec.port == DEFAULT_ENGINE_PORT
    assert spec.host_port == 18123
    assert spec.command[spec.command.index("--port") + 1] == str(DEFAULT_ENGINE_PORT)


def test_without_a_serving_port_the_local_engine_gets_a_free_one() -> None:
    spec = spec_for("local", None)
    assert spec.port is not None and spec.port > 0
    assert spec.host_port is None
