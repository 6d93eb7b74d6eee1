"""No adapter lets an engine compile into HOME (issue 26, item 1).

Every start gets a fresh, empty HOME, so whatever a JIT compiler writes there at a start is
rebuilt at the next one, outside the blessing: the shipped GPU reference profile was rejected at
every trial (41) for Triton's launcher in ``HOME/.triton/cache``. Here a fake engine that writes
compiled state the way Triton, the CUDA driver and vLLM do (their env variable if set, else their
default under HOME) is started, as a real process, with the env :func:`bless.flows.engine_start.engine_spec`
builds for each adapter's CUDA profile; HOME must stay empty and every write must land in the cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bless.core.profile import HardwareSpec, ModelSpec, Profile
from bless.engines import ENGINES, get_adapter
from bless.engines.base import ENGINE_HOME, ENGINE_TMP
from bless.flows.engine_start import engine_spec
from bless.runtime.base import Mount
from tests.support.fakes import FakeRuntime
from tests.support.resolving import resolved_offline

Writer = tuple[str, str, str]
#: A JIT compiler's writes: (the env variable that moves its cache, its default under HOME, a file it writes).
JIT_WRITERS: tuple[Writer, ...] = (
    ("TRITON_CACHE_DIR", ".triton/cache", "KEY/cuda_utils.cpython-312-x86_64-linux-gnu.so"),
    ("CUDA_CACHE_PATH", ".nv/ComputeCache", "index"),
)
#: The engine's own compile cache, beside the JIT compilers every CUDA engine runs.
ENGINE_WRITERS: dict[str, tuple[Writer, ...]] = {
    "reference": (),
    "vllm": (("VLLM_CACHE_ROOT", ".cache/vllm", "torch_compile_cache/KEY/rank_1_0/backbone/model"),),
}
FAKE_ENGINE = """
import json, os, sys
for env, default, file in json.loads(sys.argv[1]):
    root = os.environ.get(env, "").strip() or os.path.join(os.path.expanduser("~"), default)
    path = os.path.join(root, file)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(b"compiled")
"""

PROFILES = {
    "reference": Profile(
        name="reference-cuda",
        engine="reference",
        runtime_kind="local",
        python="python3",
        model=ModelSpec(source="builtin", id="reference-tiny"),
        serve={"device": "cuda"},
        hardware=HardwareSpec("cuda", gpu_count=1),
    ),
    "vllm": Profile(
        name="vllm-cuda",
        engine="vllm",
        runtime_kind="local",
        python="python3",
        model=ModelSpec(source="local", id="m", path="/models/m"),
        serve={"served_model_name": "m", "tensor_parallel_size": 2},
        hardware=HardwareSpec("cuda", gpu_count=2),
    ),
}


def test_every_adapter_is_covered() -> None:
    assert set(PROFILES) == set(ENGINES) == set(ENGINE_WRITERS)


def start_fake_engine(profile: Profile, tmp_path: Path) -> tuple[Path, Path]:
    """Run the fake engine with its start's env, container paths mapped into ``tmp_path``; (HOME, cache)."""
    adapter = get_adapter(profile.engine)
    resolved = resolved_offline(profile, adapter)
    cache = tmp_path / "cache"
    spec = engine_spec(
        resolved,
        adapter,
        FakeRuntime(),
        name="bless-trial",
        labels={},
        cache_mount=Mount("overlay", cache, adapter.cache_mount_path),
        image=None,
        private_dir=tmp_path / "private",
        seal=False,
    )
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    places = {adapter.cache_mount_path: cache, ENGINE_HOME: home, ENGINE_TMP: tmp}
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for name, value in spec.env.items():
        for inside, outside in places.items():
            if value == inside or value.startswith(inside + "/"):
                value = str(outside) + value[len(inside) :]
        env[name] = value
    assert env["HOME"] == str(home)
    for directory in (cache, home, tmp):
        directory.mkdir(parents=True, exist_ok=True)
    writers = json.dumps([*JIT_WRITERS, *ENGINE_WRITERS[profile.engine]])
    subprocess.run([sys.executable, "-c", FAKE_ENGINE, writers], env=env, check=True, timeout=60)
    return home, cache


def files_under(directory: Path) -> list[str]:
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file())


@pytest.mark.parametrize("engine", sorted(PROFILES))
def test_a_start_under_the_adapters_env_leaves_no_compiled_state_in_home(engine: str, tmp_path: Path) -> None:
    home, cache = start_fake_engine(PROFILES[engine], tmp_path)
    assert files_under(home) == [], f"{engine}: compiled outside the blessing, under HOME"
    assert any("cuda_utils" in name for name in files_under(cache)), "Triton's launcher must land in the cache"
    assert any(name.endswith("index") for name in files_under(cache)), "CUDA's JIT cache must land in the cache"
    if engine == "vllm":
        assert any("rank_1_0" in name for name in files_under(cache)), "vLLM's rank 1 must compile into the cache"


def test_the_check_can_fail_a_profile_that_declares_no_jit_location(tmp_path: Path) -> None:
    """The reference engine on CPU without shape buckets declares none: the Triton-style writer lands in HOME."""
    cpu = Profile(
        name="reference-cpu",
        engine="reference",
        runtime_kind="local",
        python="python3",
        model=ModelSpec(source="builtin", id="reference-tiny"),
    )
    home, _cache = start_fake_engine(cpu, tmp_path)
    assert any(name.startswith(".triton/cache/") for name in files_under(home))
