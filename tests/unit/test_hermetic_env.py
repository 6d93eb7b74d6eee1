"""A profile's ``[env]`` that moves where compiled state is written is refused (30) before any engine starts.

``TORCHINDUCTOR_CACHE_DIR = "/dev/shm/x"`` was accepted and hashed: the bootstrap and the trials wrote their
``.so`` kernels there, outside the blessed tree and outside every place the trials and the seal watch, and the
blessing was published. bless sets every compile location (into the blessed tree), HOME and the temp dir
(fresh, private and watched at each start) itself; a profile that sets one of them, or any name of the family
(Triton's and Inductor's dirs, XDG, CUDA's PTX cache, vLLM's roots, Inductor's remote caches, every compile
location an engine declares), is refused by ``bless run`` and ``serve-full`` alike, whatever the value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bless.engines.base import RELOCATING_ENV, relocating_settings
from bless.engines.reference import ReferenceAdapter
from bless.engines.vllm.adapter import VllmAdapter
from bless.errors import BlessError, ExitCode, UnsafeEnvError
from bless.store import Store
from tests.support.fakes import FakeRuntime
from tests.unit import test_serve
from tests.unit.run_harness import Harness, make_profile, make_resolved
from tests.unit.test_vllm_adapter import resolved as vllm_resolved
from tests.unit.test_vllm_adapter import with_env

#: The attack of the sweep, and one of each kind of name in the family.
RELOCATING = [
    ("TORCHINDUCTOR_CACHE_DIR", "/dev/shm/x"),
    ("TRITON_CACHE_DIR", "/dev/shm/triton"),
    ("TRITON_HOME", "/tmp/elsewhere"),
    ("TORCHINDUCTOR_FX_GRAPH_CACHE_DIR", "/tmp/fx"),  # any TORCHINDUCTOR_*DIR
    ("TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", "1"),  # compiled artifacts from a server outside the blessing
    ("XDG_CACHE_HOME", "/dev/shm/xdg"),
    ("HOME", "/root"),
    ("TMPDIR", "/dev/shm"),
    ("CUDA_CACHE_PATH", "/dev/shm/nv"),
    ("TORCH_EXTENSIONS_DIR", "/tmp/ext"),
    ("PYTHONPYCACHEPREFIX", "/dev/shm/pyc"),
    ("VLLM_CONFIG_ROOT", "/tmp/vllm-config"),
]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    def factory(profile: object) -> Harness:
        runtime = FakeRuntime()
        store = Store(tmp_path / f"root-{len(list(tmp_path.iterdir()))}")
        return Harness(store, runtime, make_resolved(profile, runtime), [])  # type: ignore[arg-type]

    yield factory


@pytest.mark.parametrize(("name", "value"), RELOCATING, ids=[name for name, _ in RELOCATING])
def test_bless_run_refuses_env_that_moves_a_compile_location_before_any_engine(
    make: Callable[..., Harness], name: str, value: str
) -> None:
    harness = make(make_profile(**{name: value}))
    with pytest.raises(UnsafeEnvError) as caught:
        harness.run(trials=1, allow_test_knobs=True)  # the test seam lets test knobs through, nothing else
    assert caught.value.exit_code == ExitCode.UNSAFE_ENV and int(caught.value.exit_code) == 30
    assert f"{name}={value}" in caught.value.message and "moves where compiled state is written" in caught.value.message
    assert f"remove {name} from the profile's [env]" in (caught.value.hint or "")
    assert harness.runtime.containers == [] and "ping" not in harness.runtime.calls, "refused before the runtime"
    assert not (harness.store.root / "locks").exists() and harness.store.find(harness.config_hash) is None


def test_serve_full_refuses_it_too_before_any_engine(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    runtime = test_serve.serving_runtime()
    profile = test_serve.make_profile(env={"TORCHINDUCTOR_CACHE_DIR": "/dev/shm/x"})
    with pytest.raises(BlessError) as caught:
        test_serve.do_plan(profile, store, runtime, allow_test_knobs=True)
    assert int(caught.value.exit_code) == ExitCode.UNSAFE_ENV
    assert "TORCHINDUCTOR_CACHE_DIR=/dev/shm/x" in caught.value.message
    assert runtime.containers == []


def test_every_compile_location_an_engine_declares_is_in_the_family() -> None:
    """Whatever a release of vLLM declares (DeepGEMM, FlashInfer, TileLang, ...) is refused by name."""
    for adapter in (VllmAdapter(), ReferenceAdapter()):
        declared = adapter.compile_locations()
        assert declared
        env = {location.env: "/dev/shm/elsewhere" for location in declared}
        assert {setting.name for setting in relocating_settings(env, declared)} == set(env)


def test_the_vllm_adapter_refuses_the_family_once_each() -> None:
    """``VLLM_CACHE_ROOT`` keeps its own reason (listed once); the rest are refused as relocations."""
    config = vllm_resolved(with_env(VLLM_CACHE_ROOT="/x", DG_JIT_CACHE_DIR="/dev/shm/dg", HOME="/root"))
    settings = VllmAdapter().for_factors(config.factors).unsafe_settings(config)
    assert sorted(s.name for s in settings) == ["DG_JIT_CACHE_DIR", "HOME", "VLLM_CACHE_ROOT"]
    assert [s.relocates for s in settings if s.name == "VLLM_CACHE_ROOT"] == [False]


def test_names_outside_the_family_stay_allowed() -> None:
    """Tuning knobs, weights and logging are not compile locations: a profile may set them."""
    allowed = {
        "TORCHINDUCTOR_MAX_AUTOTUNE": "1",
        "HF_HOME": "/srv/hf",
        "VLLM_LOGGING_LEVEL": "INFO",
        "TRITON_CACHE_AUTOTUNING": "1",
    }
    assert relocating_settings(allowed, ReferenceAdapter().compile_locations()) == []
    assert {"HOME", "TMPDIR", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH"} <= RELOCATING_ENV
