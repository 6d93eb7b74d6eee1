"""Tests for the vLLM adapter, on trimmed logs and listings recorded with real vLLM 0.20 (tests/fixtures/vllm)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from bless.core.factors import REDACTED, ResolvedConfig, resolve
from bless.core.profile import HardwareSpec, ModelSpec, Profile, load_profile, profile_from_dict
from bless.core.verify import FileEntry, TreeListing
from bless.engines import get_adapter
from bless.engines.base import ENGINE_HOME
from bless.engines.vllm import (
    CACHE_MOUNT_PATH,
    COMPILE_MARKERS,
    FATAL_MARKERS,
    HF_HOME_MOUNT_PATH,
    LOAD_MARKERS,
    MODEL_MOUNT_PATH,
    ModelMount,
    VllmAdapter,
)
from bless.engines.vllm import env as vllm_env
from bless.engines.vllm import versions as vllm_versions
from bless.errors import BootstrapFailedError, ExitCode, InputInvalidError, ResolutionError
from bless.evidence_types import UpperEntry, UpperKind
from bless.probes import read_model_dir
from bless.replay.reuse import classify_reuse
from tests.support.resolving import fake_environment, fake_model_dir, resolved_offline

TESTS = Path(__file__).resolve().parent.parent
FIXTURES = TESTS / "fixtures" / "vllm"
PROFILES = TESTS.parent / "profiles"
PINNED_IMAGE = "sha256:" + "ab" * 32
HEX40 = "0123456789abcdef0123456789abcdef01234567"
GPU = {"accelerator": "cuda", "gpu_count": 1, "gpu_name": "NVIDIA H200", "compute_capability": "9.0"}
# vLLM's own keys in the recorded cold1 run (HOME=/tmp/h1).
COLD1_BACKBONE = "9ee7376e79"
COLD1_AOT = "9beb3f44bc3128d47dd5d9c7c50ec0c00cf54358ca35e670df4c25a86702c34c"
COLD2_BACKBONE = "df3259ed13"  # the same config with another HOME

# --- helpers ---------------------------------------------------------------------------------------


def adapter() -> VllmAdapter:
    return VllmAdapter()


def log(name: str) -> str:
    return (FIXTURES / "logs" / f"{name}.log").read_text(encoding="utf-8")


def base_doc(**sections: Any) -> dict[str, Any]:
    """A Docker vLLM profile document that resolves offline (pinned image ID and revision)."""
    doc: dict[str, Any] = {
        "profile_version": 1,
        "name": "vllm-test",
        "engine": {"name": "vllm"},
        "runtime": {"kind": "docker", "image": PINNED_IMAGE},
        "model": {"source": "huggingface", "id": "org/model", "revision": HEX40, "hf_home": "/srv/hf"},
        "serve": {
            "served_model_name": "m",
            "seed": 0,
            "max_model_len": 512,
            "max_num_seqs": 4,
            "gpu_memory_utilization": 0.3,
            "compilation_config": {"mode": "VLLM_COMPILE", "cudagraph_mode": "FULL_AND_PIECEWISE"},
        },
        "env": {},
        "hardware": {"accelerator": "cuda", "gpu_count": 1},
    }
    doc.update(sections)
    return doc


def with_serve(**serve: Any) -> dict[str, Any]:
    doc = base_doc()
    doc["serve"] = {**doc["serve"], **serve}
    return doc


def with_env(**env: str) -> dict[str, Any]:
    return base_doc(env=env)


def resolved(doc: dict[str, Any], *, gpu: dict[str, Any] | None = None) -> ResolvedConfig:
    def hardware(spec: HardwareSpec) -> dict[str, Any]:
        return dict(gpu or GPU)

    return resolve(
        profile_from_dict(doc),
        adapter(),
        image_resolver=None,
        hardware_probe=hardware,
        environment_probe=fake_environment,
        model_dir_probe=fake_model_dir,
    )


def config_hash(doc: dict[str, Any], **kwargs: Any) -> str:
    return resolved(doc, **kwargs).config_hash


def profile(doc: dict[str, Any]) -> Profile:
    return profile_from_dict(doc)


def listing_from_fixture() -> TreeListing:
    files = []
    for line in (FIXTURES / "cold1_cache.listing.tsv").read_text().splitlines():
        if line.startswith("#"):
            continue
        size, sha, path = line.split("\t")
        files.append(FileEntry(path=path, size=int(size), sha256=sha))
    return listing_of(files)


def listing_of(files: list[FileEntry]) -> TreeListing:
    dirs = sorted({"/".join(f.path.split("/")[:i]) for f in files for i in range(1, f.path.count("/") + 1)})
    files = sorted(files, key=lambda f: f.path)
    return TreeListing(files=tuple(files), dirs=tuple(dirs), total_size=sum(f.size for f in files))


def upper_entries(name: str, kind: UpperKind) -> list[UpperEntry]:
    entries = []
    for line in (FIXTURES / name).read_text().splitlines():
        if not line.strip():
            continue
        size, path = line.split("\t") if "\t" in line else ("0", line)
        entries.append(UpperEntry(path=path, kind=kind, size=int(size)))
    return entries


# --- identity ---------------------------------------------------------------------------------------


def test_adapter_identity() -> None:
    a = get_adapter("vllm")
    assert isinstance(a, VllmAdapter)
    assert (a.name, a.adapter_version) == ("vllm", "4")
    assert a.cache_mount_path == CACHE_MOUNT_PATH == "/var/cache/bless-engine"
    assert a.home == ENGINE_HOME
    assert a.readonly_bind_ok is False  # vLLM 0.20 rewrites inductor_cache entries while loading
    assert a.environment_packages == ("vllm", "torch", "triton", "transformers")


def test_marker_lists_are_the_recorded_strings() -> None:
    assert LOAD_MARKERS == (
        "Directly load AOT compilation from path",
        "Directly load the compiled graph(s) for compile range",
    )
    assert COMPILE_MARKERS == (
        "saved AOT compiled function to",
        "Compiling model again due to a load failure",
        "Compiling a graph for compile range",
        "Cache the graph of compile range",
        "unable to save AOT compiled function",
    )
    assert FATAL_MARKERS == ("EngineCore failed to start", "Engine core initialization failed")


# --- argv and env snapshots --------------------------------------------------------------------------


def test_launch_snapshot_tiny_llama_local() -> None:
    p = load_profile(PROFILES / "vllm-tiny-llama-local.toml")
    launch = adapter().launch(resolved_offline(p, adapter()), port=8123)
    assert launch.command == (
        "python3", "-m", "vllm.entrypoints.cli.main", "serve", "/tmp/tiny-llama",
        "--host", "127.0.0.1",
        "--port", "8123",
        "--served-model-name", "tiny",
        "--seed", "0",
        "--dtype", "bfloat16",
        "--max-model-len", "512",
        "--max-num-seqs", "4",
        "--gpu-memory-utilization", "0.3",
        "--compilation-config", '{"cudagraph_mode":"FULL_AND_PIECEWISE","mode":3}',
    )  # fmt: skip
    assert dict(launch.env) == {
        "VLLM_CACHE_ROOT": "/var/cache/bless-engine",
        "HOME": ENGINE_HOME,
        "PYTHONUNBUFFERED": "1",
        "TRITON_CACHE_AUTOTUNING": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    assert launch.port == 8123
    assert adapter().model_mounts(p) == ()  # the local runtime reads the host path directly
    assert adapter().unsafe_settings(resolved_offline(p, adapter())) == []


def test_launch_snapshot_docker_example() -> None:
    p = load_profile(PROFILES / "vllm-example.toml")
    launch = adapter().launch(resolved_offline(p, adapter()), port=8000)
    assert launch.command == (
        "python3", "-m", "vllm.entrypoints.cli.main", "serve", "Qwen/Qwen2.5-0.5B-Instruct",
        "--revision", "0" * 40,
        "--host", "0.0.0.0",
        "--port", "8000",
        "--served-model-name", "qwen2.5-0.5b",
        "--seed", "0",
        "--dtype", "bfloat16",
        "--max-model-len", "4096",
        "--max-num-seqs", "32",
        "--tensor-parallel-size", "1",
        "--gpu-memory-utilization", "0.85",
        "--compilation-config",
        '{"cudagraph_capture_sizes":[1,2,4,8,16,32],"cudagraph_mode":"FULL_AND_PIECEWISE","mode":3}',
    )  # fmt: skip
    assert dict(launch.env) == {
        "HF_HOME": HF_HOME_MOUNT_PATH,
        "VLLM_CACHE_ROOT": "/var/cache/bless-engine",
        "HOME": ENGINE_HOME,
        "PYTHONUNBUFFERED": "1",
        "TRITON_CACHE_AUTOTUNING": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    assert adapter().model_mounts(p) == (
        ModelMount("/srv/hf-cache", HF_HOME_MOUNT_PATH, "the Hugging Face cache (HF_HOME)"),
    )
    assert p.shm_size == "16g"
    assert adapter().unsafe_settings(resolved_offline(p, adapter())) == []


def test_example_profile_gates_offline() -> None:
    """The example declares GPU name and capability, so CI can hash it without a GPU (pin the image to skip Docker)."""
    from bless.core.factors import declared_hardware_factor

    p = load_profile(PROFILES / "vllm-example.toml")
    factor = declared_hardware_factor(p.hardware)
    assert factor == {
        "accelerator": "cuda",
        "gpu_count": 1,
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "compute_capability": "9.0",
    }


def test_debug_launch_is_eager_without_cache() -> None:
    launch = adapter().launch(resolved(with_serve(enforce_eager=False)), port=9000, debug=True)
    assert "--enforce-eager" in launch.command
    assert "--no-enforce-eager" not in launch.command
    assert launch.env["VLLM_DISABLE_COMPILE_CACHE"] == "1"


def test_local_model_under_docker_uses_the_fixed_mount(tmp_path: Path) -> None:
    doc = base_doc(model={"source": "local", "id": "tiny", "path": str(tmp_path)})
    a = adapter()
    launch = a.launch(resolved(doc), port=8000)
    assert launch.command[4] == MODEL_MOUNT_PATH
    assert a.model_mounts(profile(doc)) == (ModelMount(str(tmp_path), MODEL_MOUNT_PATH, "the local model directory"),)


def test_profile_env_cannot_move_cache_or_home() -> None:
    launch = adapter().launch(resolved(with_env(VLLM_CACHE_ROOT="/elsewhere", HOME="/home/x")), port=8000)
    assert launch.env["VLLM_CACHE_ROOT"] == CACHE_MOUNT_PATH
    assert launch.env["HOME"] == ENGINE_HOME


def test_profile_env_is_passed() -> None:
    launch = adapter().launch(resolved(with_env(VLLM_ENABLE_INDUCTOR_MAX_AUTOTUNE="1")), port=8000)
    assert launch.env["VLLM_ENABLE_INDUCTOR_MAX_AUTOTUNE"] == "1"


def test_bool_args_render_both_ways() -> None:
    launch = adapter().launch(resolved(with_serve(enable_prefix_caching=False, trust_remote_code=True)), port=1)
    assert "--no-enable-prefix-caching" in launch.command
    assert "--trust-remote-code" in launch.command


def test_extra_args_go_last_verbatim() -> None:
    launch = adapter().launch(resolved(with_serve(extra_args=["--max-logprobs", "5"])), port=1)
    assert launch.command[-2:] == ("--max-logprobs", "5")


def test_hf_model_starts_from_the_resolved_commit() -> None:
    """vLLM starts offline: a branch name is refused offline, and a looked-up branch starts at the hashed commit."""
    doc = base_doc(model={"source": "huggingface", "id": "org/model", "revision": "main", "hf_home": "/srv/hf"})
    with pytest.raises(ResolutionError, match="40-hex"):
        resolved(doc)
    looked_up = resolve(
        profile_from_dict(doc),
        adapter(),
        image_resolver=None,
        hardware_probe=lambda _spec: dict(GPU),
        revision_lookup=lambda _id, _revision, *, where: HEX40,
    )
    command = adapter().launch(looked_up, port=1).command
    assert command[command.index("--revision") + 1] == HEX40 == looked_up.factors["model"]["revision"]


def test_hf_model_needs_an_hf_cache() -> None:
    doc = base_doc(model={"source": "huggingface", "id": "org/model", "revision": HEX40})
    with pytest.raises(InputInvalidError, match=r"model\.hf_home"):
        adapter().launch(resolved(doc), port=1)
    doc["env"] = {"HF_HOME": "/opt/weights"}  # an image that holds the weights itself
    assert adapter().launch(resolved(doc), port=1).env["HF_HOME"] == "/opt/weights"


def test_builtin_model_is_refused() -> None:
    doc = base_doc(model={"source": "builtin", "id": "reference-tiny"})
    with pytest.raises(InputInvalidError, match=r"model\.source"):
        adapter().launch(resolved(doc), port=1)


# --- serve validation ---------------------------------------------------------------------------------


def test_unknown_serve_key_names_it_and_lists_known() -> None:
    with pytest.raises(InputInvalidError) as info:
        adapter().normalize_serve({"max_modle_len": 512}, where="p.toml")
    assert "serve.max_modle_len" in info.value.message
    assert info.value.hint is not None and "max_model_len" in info.value.hint and "extra_args" in info.value.hint
    assert info.value.exit_code == ExitCode.INPUT_INVALID


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_model_len", "512"),
        ("max_model_len", 0),
        ("seed", True),
        ("gpu_memory_utilization", 1.5),
        ("gpu_memory_utilization", 0),
        ("dtype", "fp7"),
        ("enforce_eager", "yes"),
        ("served_model_name", ""),
        ("compilation_config", "mode=3"),
        ("extra_args", "--foo"),
        ("extra_args", [1]),
    ],
)
def test_bad_serve_values_are_refused(key: str, value: Any) -> None:
    with pytest.raises(InputInvalidError, match=f"serve.{key}"):
        adapter().normalize_serve({key: value}, where="p")


def test_omitted_args_are_not_invented() -> None:
    assert adapter().normalize_serve({}, where="p") == {}
    assert adapter().normalize_serve({"seed": 1}, where="p") == {"seed": 1}


def test_compilation_config_canonical_form() -> None:
    out = adapter().normalize_serve(
        {
            "compilation_config": {
                "cudagraph_mode": "full_and_piecewise",
                "mode": "vllm_compile",
                "cudagraph_capture_sizes": [8, 1, 4, 2],
                "compile_sizes": ["cudagraph_capture_sizes", 16, 4],
                "compile_ranges_split_points": [256, 64],
                "pass_config": {"fuse_norm_quant": True},
            }
        },
        where="p",
    )
    config = out["compilation_config"]
    assert list(config) == sorted(config)
    assert config["mode"] == 3
    assert config["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert config["cudagraph_capture_sizes"] == [1, 2, 4, 8]
    assert config["compile_sizes"] == [4, 16, "cudagraph_capture_sizes"]
    assert config["compile_ranges_split_points"] == [256, 64]  # order kept: not known to be a set
    assert config["pass_config"] == {"fuse_norm_quant": True}
    # idempotent: the canonical form normalizes to itself
    assert adapter().normalize_serve(out, where="p") == out


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"cache_dir": "/x"}, "cache_dir"),
        ({"level": 3}, "level"),
        ({"mode": 7}, "mode"),
        ({"mode": "FAST"}, "mode"),
        ({"cudagraph_mode": "SOMETIMES"}, "cudagraph_mode"),
        ({"cudagraph_capture_sizes": [1, 1, 2]}, "twice"),
        ({"cudagraph_capture_sizes": [0]}, "cudagraph_capture_sizes"),
        ({"compile_sizes": ["all"]}, "compile_sizes"),
        ({"splitting_ops": "vllm::x"}, "splitting_ops"),
        ({"use_inductor_graph_partition": 1}, "use_inductor_graph_partition"),
        ({"compile_cache_save_format": "zip"}, "compile_cache_save_format"),
    ],
)
def test_bad_compilation_config_is_refused(config: dict[str, Any], match: str) -> None:
    with pytest.raises(InputInvalidError, match=match):
        adapter().normalize_serve({"compilation_config": config}, where="p")


@pytest.mark.parametrize(
    "token",
    ["--port=1", "--host", "--model", "--revision", "--compilation-config", "-cc.mode=3", "--max-model-len",
     "--enforce-eager", "--no-enforce-eager", "--api-key=secret", "--hf-token"],
)  # fmt: skip
def test_extra_args_cannot_bypass_modeled_or_managed_flags(token: str) -> None:
    with pytest.raises(InputInvalidError, match="not allowed"):
        adapter().normalize_serve({"extra_args": [token, "1"]}, where="p")


# --- factor policy: include --------------------------------------------------------------------------

SERVE_CHANGES: list[tuple[str, Any]] = [
    ("served_model_name", "other"),
    ("seed", 1),
    ("dtype", "float16"),
    ("max_model_len", 1024),
    ("max_num_seqs", 8),
    ("max_num_batched_tokens", 4096),
    ("tensor_parallel_size", 2),
    ("pipeline_parallel_size", 2),
    ("gpu_memory_utilization", 0.5),
    ("kv_cache_dtype", "fp8"),
    ("quantization", "fp8"),
    ("block_size", 32),
    ("enable_prefix_caching", False),
    ("enable_chunked_prefill", False),
    ("trust_remote_code", True),
    ("extra_args", ["--max-logprobs", "5"]),
]


@pytest.mark.parametrize(("key", "value"), SERVE_CHANGES)
def test_every_serve_argument_is_a_factor(key: str, value: Any) -> None:
    assert config_hash(with_serve(**{key: value})) != config_hash(base_doc())


@pytest.mark.parametrize(
    "change",
    [{"cudagraph_mode": "PIECEWISE"}, {"cudagraph_capture_sizes": [1, 2, 4]}, {"compile_sizes": [8]},
     {"inductor_compile_config": {"max_autotune": True}}],
)  # fmt: skip
def test_compilation_config_is_a_factor(change: dict[str, Any]) -> None:
    doc = base_doc()
    doc["serve"]["compilation_config"] = {**doc["serve"]["compilation_config"], **change}
    assert config_hash(doc) != config_hash(base_doc())


def test_capture_size_order_does_not_change_the_hash() -> None:
    a, b = base_doc(), base_doc()
    a["serve"]["compilation_config"]["cudagraph_capture_sizes"] = [1, 2, 4, 8, 16]
    b["serve"]["compilation_config"]["cudagraph_capture_sizes"] = [16, 4, 1, 8, 2]
    assert config_hash(a) == config_hash(b)


def test_mode_name_and_number_hash_alike() -> None:
    a, b = base_doc(), base_doc()
    b["serve"]["compilation_config"]["mode"] = 3
    assert config_hash(a) == config_hash(b)


def test_extra_args_order_is_a_factor() -> None:
    a = with_serve(extra_args=["--max-logprobs", "5", "--disable-log-stats"])
    b = with_serve(extra_args=["--disable-log-stats", "--max-logprobs", "5"])
    assert config_hash(a) != config_hash(b)  # verbatim: the adapter does not know their semantics


@pytest.mark.parametrize(
    "name",
    ["VLLM_ENABLE_INDUCTOR_MAX_AUTOTUNE", "VLLM_USE_AOT_COMPILE", "TORCH_CUDA_ARCH_LIST",
     "TORCHINDUCTOR_MAX_AUTOTUNE", "TRITON_CACHE_DIR", "NCCL_ALGO", "VLLM_NIXL_SIDE_CHANNEL_PORT"],
)  # fmt: skip
def test_env_vars_the_profile_sets_are_factors(name: str) -> None:
    r = resolved(with_env(**{name: "1"}))
    assert r.factors["env"] == {name: "1"}
    assert r.config_hash != config_hash(base_doc())


@pytest.mark.parametrize("name", ["TRITON_DEFAULT_FP_FUSION", "TRITON_FORCE_DISABLE_FP_FUSION"])
def test_tritons_fp_fusion_switches_are_factors_whatever_the_ignore_patterns(name: str) -> None:
    """Triton reads them into every kernel's compile options (its cache key, and FMA contraction, so numerics)."""
    assert (
        len({config_hash(with_env(**{name: "0"})), config_hash(with_env(**{name: "1"})), config_hash(base_doc())}) == 3
    )
    assert name in vllm_env.TRITON_COMPILE_ENV
    # pinned: a pattern that would ignore Triton's names (its cache dir, its logging) never drops these two
    wider = dataclasses.replace(vllm_env.ENV_POLICY, ignored=(*vllm_env.ENV_POLICY.ignored, "TRITON_*"))
    assert not wider.is_ignored(name) and wider.is_ignored("TRITON_PRINT_AUTOTUNING")


def test_cache_path_and_home_are_factors() -> None:
    r = resolved(base_doc())
    assert r.factors["cache"] == {"mount_path": "/var/cache/bless-engine", "home": ENGINE_HOME}
    assert r.factors["engine"] == {"name": "vllm", "adapter_version": "4", **VllmAdapter().compile_location_factor()}


@pytest.mark.parametrize(
    "gpu",
    [{**GPU, "gpu_name": "NVIDIA H100 80GB HBM3"}, {**GPU, "compute_capability": "10.0"}, {**GPU, "gpu_count": 2}],
)
def test_gpu_name_capability_and_count_are_factors(gpu: dict[str, Any]) -> None:
    assert config_hash(base_doc(), gpu=gpu) != config_hash(base_doc())


def test_image_id_is_a_factor() -> None:
    doc = base_doc(runtime={"kind": "docker", "image": "sha256:" + "cd" * 32})
    assert config_hash(doc) != config_hash(base_doc())


def test_model_revision_is_a_factor() -> None:
    doc = base_doc()
    doc["model"] = {**doc["model"], "revision": "f" * 40}
    assert config_hash(doc) != config_hash(base_doc())


def test_environment_versions_are_factors_for_the_local_runtime() -> None:
    doc = base_doc(runtime={"kind": "local", "python": "python3"})
    seen: list[tuple[str, ...]] = []

    def probe(version: str) -> Any:
        def environment(python: str, packages: tuple[str, ...]) -> dict[str, Any]:
            seen.append(packages)
            return {"python_version": "3.12.3", "packages": {"vllm": version, "torch": "2.11.0"}}

        return environment

    def hash_with(version: str) -> str:
        return resolve(
            profile(doc), adapter(), image_resolver=None, hardware_probe=lambda s: dict(GPU),
            environment_probe=probe(version),
        ).config_hash  # fmt: skip

    assert hash_with("0.20.0") != hash_with("0.20.1")
    assert seen[0] == ("vllm", "torch", "triton", "transformers")


def test_policy_hashes_every_env_var_vllm_hashes() -> None:
    """At least as strict as vLLM 0.20's own key: every name in its recorded env factors is hashed (secrets aside)."""
    policy = adapter().env_policy
    names = (FIXTURES / "vllm_0.20_hashed_env_names.txt").read_text().split()
    assert len(names) == 198
    ignored = [n for n in names if policy.is_ignored(n) and not policy.is_secret(n)]
    assert ignored == []
    # The one secret vLLM hashes: bless never writes it, so it cannot be a factor (see the report).
    assert [n for n in names if policy.is_secret(n)] == ["VLLM_API_KEY"]


# --- factor policy: ignore (recorded, not hashed) ------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [("VLLM_PORT", "8001"), ("MY_SERVICE_PORT", "9000"), ("VLLM_HOST_IP", "10.0.0.2"),
     ("VLLM_LOGGING_LEVEL", "DEBUG"), ("TORCH_CPP_LOG_LEVEL", "INFO"), ("CUDA_VISIBLE_DEVICES", "1,0"),
     ("HF_HOME", "/data/hf"), ("HF_HUB_OFFLINE", "1"), ("VLLM_NO_USAGE_STATS", "1")],
)  # fmt: skip
def test_ignored_env_is_recorded_not_hashed(name: str, value: str) -> None:
    r = resolved(with_env(**{name: value}))
    assert r.config_hash == config_hash(base_doc())
    assert r.recorded_env == {name: value}
    assert name not in r.factors["env"]


def test_cuda_visible_devices_ordering_does_not_change_the_hash() -> None:
    assert config_hash(with_env(CUDA_VISIBLE_DEVICES="0,1")) == config_hash(with_env(CUDA_VISIBLE_DEVICES="1,0"))


@pytest.mark.parametrize("name", ["VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE", "VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD"])
def test_vllm_token_knobs_are_not_secrets(name: str) -> None:
    """``*TOKEN*`` would redact them, yet vLLM hashes them: they must be factors."""
    r = resolved(with_env(**{name: "4096"}))
    assert r.factors["env"] == {name: "4096"}
    assert r.config_hash != config_hash(base_doc())


@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY", "WANDB_API_KEY"])
def test_secrets_are_never_hashed_nor_written(name: str) -> None:
    r = resolved(with_env(**{name: "s3cr3t"}))
    assert r.config_hash == config_hash(base_doc())
    assert r.recorded_env == {name: REDACTED}
    assert "s3cr3t" not in json.dumps(r.to_dict())


# --- factor policy: unsafe ------------------------------------------------------------------------------


def unsafe_names(doc: dict[str, Any]) -> list[str]:
    return [u.name for u in adapter().unsafe_settings(resolved(doc))]


@pytest.mark.parametrize(
    ("name", "value"),
    [("VLLM_DISABLE_COMPILE_CACHE", "1"), ("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1"),
     ("TORCH_COMPILE_DEBUG", "1"), ("TORCH_LOGS", "+dynamo"), ("TORCHDYNAMO_VERBOSE", "1"),
     ("VLLM_TRACE_FUNCTION", "1"), ("CUDA_LAUNCH_BLOCKING", "1"), ("TORCH_COMPILE_DISABLE", "1"),
     ("TORCHDYNAMO_DISABLE", "1"), ("VLLM_PATTERN_MATCH_DEBUG", "1"), ("VLLM_DEBUG_DUMP_PATH", "/tmp/d"),
     ("VLLM_CACHE_ROOT", "/elsewhere"), ("VLLM_LOGGING_LEVEL", "ERROR"), ("VLLM_CONFIGURE_LOGGING", "0")],
)  # fmt: skip
def test_unsafe_env(name: str, value: str) -> None:
    found = adapter().unsafe_settings(resolved(with_env(**{name: value})))
    assert [u.name for u in found] == [name]
    assert found[0].value == value and found[0].reason


@pytest.mark.parametrize(
    ("name", "value"),
    [("VLLM_DISABLE_COMPILE_CACHE", "0"), ("TORCHINDUCTOR_FORCE_DISABLE_CACHES", ""), ("VLLM_LOGGING_LEVEL", "DEBUG"),
     ("CUDA_LAUNCH_BLOCKING", "0")],
)  # fmt: skip
def test_off_values_are_not_unsafe(name: str, value: str) -> None:
    assert unsafe_names(with_env(**{name: value})) == []


def test_enforce_eager_is_unsafe() -> None:
    found = adapter().unsafe_settings(resolved(with_serve(enforce_eager=True)))
    assert [(u.name, u.value) for u in found] == [("serve.enforce_eager", "true")]
    assert "nothing to bless" in found[0].reason
    assert unsafe_names(with_serve(enforce_eager=False)) == []


@pytest.mark.parametrize("mode", [0, "NONE", "none"])
def test_compilation_mode_none_is_unsafe(mode: Any) -> None:
    doc = base_doc()
    doc["serve"]["compilation_config"]["mode"] = mode
    assert unsafe_names(doc) == ["serve.compilation_config.mode"]


def test_compile_modes_that_compile_are_safe() -> None:
    for mode in (3, "VLLM_COMPILE"):
        doc = base_doc()
        doc["serve"]["compilation_config"]["mode"] = mode
        assert unsafe_names(doc) == []


def test_debug_dump_path_is_unsafe() -> None:
    doc = base_doc()
    doc["serve"]["compilation_config"]["debug_dump_path"] = "/tmp/dump"
    assert unsafe_names(doc) == ["serve.compilation_config.debug_dump_path"]


@pytest.mark.parametrize(
    "args",
    [["-O0"], ["-O", "0"], ["-O=0"], ["--optimization-level", "0"], ["--optimization-level=0"], ["-O.mode=0"],
     ["-O.level=0"], ["--max-logprobs", "5", "-O0"]],
)  # fmt: skip
def test_optimization_level_zero_is_unsafe(args: list[str]) -> None:
    found = adapter().unsafe_settings(resolved(with_serve(extra_args=args)))
    assert [u.name for u in found] == ["serve.extra_args"]


@pytest.mark.parametrize("args", [["-O3"], ["-O", "2"], ["--max-logprobs", "0"]])
def test_other_optimization_levels_are_safe(args: list[str]) -> None:
    assert unsafe_names(with_serve(extra_args=args)) == []


# --- reading the recorded logs ---------------------------------------------------------------------------


def test_cold_log_shows_compile_and_save_no_load() -> None:
    signals = adapter().read_log(log("cold1"))
    assert signals.load_markers == ()
    assert len(signals.compile_markers) == 3
    assert any("saved AOT compiled function to" in line for line in signals.compile_markers)
    assert any("Cache the graph of compile range" in line for line in signals.compile_markers)
    assert any("Compiling a graph for compile range" in line for line in signals.compile_markers)
    # vLLM logs a benign DEBUG traceback (no chat template): not fatal
    assert "Traceback" in log("cold1")
    assert signals.fatal_markers == ()
    assert signals.timings["torch_compile_s"] == 8.66
    assert signals.timings["init_engine_s"] == 12.06
    assert signals.timings["graph_compile_s"] == 6.70
    assert signals.timings["dynamo_transform_s"] == 1.64
    assert signals.engine_keys == {
        "cache_dirs": [f"/tmp/vc1/torch_compile_cache/{COLD1_BACKBONE}/rank_0_0/backbone"],
        "backbone_keys": [COLD1_BACKBONE],
        "aot_keys": [COLD1_AOT],
        "ranks": ["rank_0_0"],
        "aot_load_paths": [],
        "compiled_ranks": ["rank_0_0"],  # the save line names the rank that compiled
        "ranks_loaded": [],
    }
    report = classify_reuse(signals, None, None)
    assert not report.passed
    assert any("no load marker" in r for r in report.reasons)


@pytest.mark.parametrize(
    ("name", "torch_compile_s"), [("warm_rw", 0.87), ("warm_overlay", 0.95), ("warm_relocated", 0.73)]
)
def test_warm_logs_show_loads_and_no_compile(name: str, torch_compile_s: float) -> None:
    signals = adapter().read_log(log(name))
    assert len(signals.load_markers) == 2
    assert any("Directly load AOT compilation from path" in line for line in signals.load_markers)
    assert any("Directly load the compiled graph(s) for compile range" in line for line in signals.load_markers)
    assert signals.compile_markers == ()
    assert signals.fatal_markers == ()
    assert signals.timings["torch_compile_s"] == torch_compile_s
    assert "graph_load_s" in signals.timings and "init_engine_s" in signals.timings
    assert len(signals.engine_keys["aot_keys"]) == 1
    report = classify_reuse(signals, None, None)
    assert report.passed, report.reasons


def test_read_only_failure_is_a_failed_start() -> None:
    signals = adapter().read_log(log("warm_ro_nodummy"))
    assert signals.load_markers == ()
    assert len(signals.compile_markers) == 1
    assert "Compiling model again due to a load failure" in signals.compile_markers[0]
    assert "Read-only file system" in signals.compile_markers[0]
    assert any("EngineCore failed to start" in line for line in signals.fatal_markers)
    assert any("Engine core initialization failed" in line for line in signals.fatal_markers)
    assert "torch_compile_s" not in signals.timings  # it never got that far
    report = classify_reuse(signals, None, None)
    assert not report.passed
    assert report.fatal_markers == 2
    assert any(r.startswith("fatal marker(s) in the log") and "EngineCore failed to start" in r for r in report.reasons)


def test_overlay_trial_passes_on_log_and_upper_layer() -> None:
    a = adapter()
    verdict = a.classify_upper(upper_entries("warm_overlay_upper.files.tsv", "rewritten"))
    report = classify_reuse(a.read_log(log("warm_overlay")), verdict, None)
    assert report.passed, report.reasons
    assert report.upper_expected_rewrites == 12


# --- drift: vLLM's own keys ------------------------------------------------------------------------------


def test_same_keys_are_no_drift() -> None:
    a = adapter()
    blessed = {"backbone_keys": [COLD1_BACKBONE], "aot_keys": [COLD1_AOT], "ranks": ["rank_0_0"]}
    logged = dict(a.read_log(log("warm_rw")).engine_keys)
    logged["cache_dirs"] = [CACHE_MOUNT_PATH + f"/torch_compile_cache/{COLD1_BACKBONE}/rank_0_0/backbone"]
    logged["aot_load_paths"] = [CACHE_MOUNT_PATH + f"/torch_compile_cache/torch_aot_compile/{COLD1_AOT}/rank_0_0/model"]
    assert a.drift_reasons(blessed, logged) == []


def test_other_vllm_key_is_drift() -> None:
    a = adapter()
    blessed = {"backbone_keys": [COLD1_BACKBONE], "aot_keys": [COLD1_AOT], "ranks": ["rank_0_0"]}
    reasons = a.drift_reasons(blessed, a.read_log(log("cold2")).engine_keys)
    assert any(COLD2_BACKBONE in r and COLD1_BACKBONE in r and "Using cache directory" in r for r in reasons)
    assert any("AOT" in r for r in reasons)
    assert any("not under /var/cache/bless-engine" in r for r in reasons)  # the recorded runs used /tmp/vc2


def _tp2_log(*ranks_loaded: str, compiled: str | None = None) -> str:
    """A TP=2 warm start's log as vLLM 0.26 writes it: each rank's worker names its own directories."""
    root = CACHE_MOUNT_PATH + "/torch_compile_cache"
    lines = []
    for rank in ("rank_0_0", "rank_1_0"):
        tag = f"(Worker_TP{rank[5]} pid={100 + int(rank[5])})"
        lines.append(
            f"{tag} INFO Using cache directory: {root}/{COLD1_BACKBONE}/{rank}/backbone for vLLM's torch.compile"
        )
        if rank in ranks_loaded:
            lines.append(
                f"{tag} INFO Directly load AOT compilation from path {root}/torch_aot_compile/{COLD1_AOT}/{rank}/model"
            )
    if compiled:
        lines.append(
            f"(Worker_TP1 pid=101) INFO saved AOT compiled function to {root}/torch_aot_compile/"
            f"{COLD1_AOT}/{compiled}/model"
        )
    return "\n".join(lines)


TP2_BLESSED = {"backbone_keys": [COLD1_BACKBONE], "aot_keys": [COLD1_AOT], "ranks": ["rank_0_0", "rank_1_0"]}


def test_every_rank_of_a_tp_blessing_must_load_its_own_aot_model() -> None:
    a = adapter()
    assert a.drift_reasons(TP2_BLESSED, a.read_log(_tp2_log("rank_0_0", "rank_1_0")).engine_keys) == []
    reasons = a.drift_reasons(TP2_BLESSED, a.read_log(_tp2_log("rank_0_0")).engine_keys)
    assert reasons == [
        "rank rank_1_0: no 'Directly load AOT compilation' line for its rank_1_0/model: this rank's blessed AOT "
        "model was not loaded"
    ]


def test_a_rank_that_saved_a_compile_is_named() -> None:
    a = adapter()
    logged = a.read_log(_tp2_log("rank_0_0", "rank_1_0", compiled="rank_1_0")).engine_keys
    assert "rank rank_1_0: a compile or save marker names this rank's directory" in a.drift_reasons(TP2_BLESSED, logged)


def test_log_without_cache_dir_is_drift() -> None:
    reasons = adapter().drift_reasons({"backbone_keys": [COLD1_BACKBONE]}, adapter().read_log("nothing").engine_keys)
    assert reasons and "cannot confirm" in reasons[0]


# --- the upper layer ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["warm_overlay_upper.files.tsv", "overlay_same_path_upper_files.txt"])
def test_recorded_overlay_writes_are_the_expected_rewrites(name: str) -> None:
    entries = upper_entries(name, "rewritten")
    assert len(entries) == 12
    verdict = adapter().classify_upper(entries)
    assert len(verdict.expected_rewrites) == 12
    assert verdict.new_artifacts == () and verdict.unexpected == ()
    assert not verdict.recompiled
    kinds = [p.split("/inductor_cache/")[1].split("/")[0] for p in verdict.expected_rewrites]
    assert kinds.count("aotautograd") == 3 and kinds.count("fxgraph") == 3
    assert sum(p.endswith(".best_config") for p in verdict.expected_rewrites) == 6


def test_a_new_inductor_file_is_a_new_artifact() -> None:
    entries = upper_entries("warm_overlay_upper.files.tsv", "rewritten")
    new = f"torch_compile_cache/torch_aot_compile/{COLD1_AOT}/inductor_cache/zz/cnew.py"
    verdict = adapter().classify_upper([*entries, UpperEntry(new, "new", 100)])
    assert verdict.new_artifacts == (new,)
    assert len(verdict.expected_rewrites) == 12
    assert verdict.recompiled
    report = classify_reuse(adapter().read_log(log("warm_overlay")), verdict, None)
    assert not report.passed and any("new compiled artifact" in r for r in report.reasons)


def test_expected_paths_written_as_new_are_new_artifacts() -> None:
    """A rewrite is expected only over an EXISTING path: the same name created fresh is a compile."""
    entries = upper_entries("warm_overlay_upper.files.tsv", "new")
    verdict = adapter().classify_upper(entries)
    assert verdict.expected_rewrites == () and len(verdict.new_artifacts) == 12


def test_relocated_cache_new_entries_are_new_artifacts() -> None:
    entries = upper_entries("warm_relocated_new_files.tsv", "new")
    assert len(entries) == 6
    verdict = adapter().classify_upper(entries)
    assert len(verdict.new_artifacts) == 6 and verdict.recompiled


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        (f"torch_compile_cache/torch_aot_compile/{COLD1_AOT}/rank_0_0/model", "rewritten"),
        (
            f"torch_compile_cache/{COLD1_BACKBONE}/rank_0_0/backbone/artifact_compile_range_1_2048_subgraph_0",
            "rewritten",
        ),
        (f"torch_compile_cache/{COLD1_BACKBONE}/rank_0_0/backbone/artifact_compile_range_1_8_subgraph_0", "new"),
        (f"torch_compile_cache/torch_aot_compile/{COLD1_AOT}/inductor_cache/triton/0/ABC/k.cubin", "rewritten"),
        ("torch_compile_cache/0123456789/rank_0_0/backbone/cache_key_factors.json", "new"),
    ],
)
def test_written_compiled_artifacts_are_new_artifacts(path: str, kind: UpperKind) -> None:
    verdict = adapter().classify_upper([UpperEntry(path, kind, 1)])
    assert verdict.new_artifacts == (path,)


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        (f"torch_compile_cache/torch_aot_compile/{COLD1_AOT}/inductor_cache/eh/{'f' * 64}.best_config", "deleted"),
        ("modelinfos/vllm-model_executor-models-llama-LlamaForCausalLM.json", "rewritten"),
        (f"torch_compile_cache/torch_aot_compile/{COLD1_AOT}/inductor_cache/eh/x.kernel_perf", "rewritten"),
        ("dummy_cache/x", "new"),
    ],
)
def test_other_writes_are_unexpected(path: str, kind: UpperKind) -> None:
    verdict = adapter().classify_upper([UpperEntry(path, kind, 1)])
    assert verdict.unexpected == (path,) and verdict.new_artifacts == ()


def test_unknown_vllm_version_uses_the_same_rules_conservatively() -> None:
    entries = upper_entries("warm_overlay_upper.files.tsv", "rewritten")
    known = VllmAdapter("0.20.0")
    unknown = VllmAdapter("0.99.1")
    assert known.rules_known and not unknown.rules_known
    assert not VllmAdapter().rules_known
    assert unknown.classify_upper(entries) == known.classify_upper(entries)
    assert "conservatively" in unknown.rules_note and "0.99.1" in unknown.rules_note
    assert VllmAdapter.for_environment({"kind": "local", "packages": {"vllm": "0.20.2"}}).rules_known
    assert not VllmAdapter.for_environment({"kind": "docker", "image_id": PINNED_IMAGE}).rules_known


# --- artifacts after a bootstrap -------------------------------------------------------------------------


def test_cold_tree_has_the_expected_artifacts() -> None:
    summary = adapter().summarize_artifacts(listing_from_fixture())
    assert summary.engine_keys == {
        "backbone_keys": [COLD1_BACKBONE],
        "aot_keys": [COLD1_AOT],
        "ranks": ["rank_0_0"],
    }
    backbone = f"torch_compile_cache/{COLD1_BACKBONE}/rank_0_0/backbone/"
    assert summary.artifacts == (
        backbone + "artifact_compile_range_1_2048_subgraph_0",
        backbone + "artifact_compile_range_1_2048_subgraph_1",
        backbone + "artifact_compile_range_1_2048_subgraph_2",
        backbone + "cache_key_factors.json",
        backbone + "vllm_compile_cache.py",
        f"torch_compile_cache/torch_aot_compile/{COLD1_AOT}/rank_0_0/model",
    )


def test_engine_keys_of_tree_and_warm_log_agree() -> None:
    """What summarize_artifacts records is what read_log of a warm start reports: drift_reasons can compare."""
    a = adapter()
    summary = a.summarize_artifacts(listing_from_fixture())
    logged = a.read_log(log("warm_rw")).engine_keys
    for key in ("backbone_keys", "aot_keys", "ranks"):
        assert logged[key] == summary.engine_keys[key]


@pytest.mark.parametrize(
    ("drop", "named"),
    [
        ("/rank_0_0/model", "rank_<R>_<D>/model"),
        ("/backbone/artifact_", "backbone/artifact_*"),
        ("cache_key_factors.json", f"torch_compile_cache/{COLD1_BACKBONE}/rank_0_0/backbone/cache_key_factors.json"),
    ],
)
def test_missing_artifact_fails_the_bootstrap(drop: str, named: str) -> None:
    full = listing_from_fixture()
    kept = [f for f in full.files if drop not in f.path]
    assert len(kept) < len(full.files)
    with pytest.raises(BootstrapFailedError) as info:
        adapter().summarize_artifacts(listing_of(kept))
    assert named in info.value.message
    assert "Expected torch_compile_cache/torch_aot_compile/<64 hex>/rank_<R>_<D>/model" in info.value.message
    assert "found " in info.value.message
    assert info.value.exit_code == ExitCode.BOOTSTRAP_FAILED


def test_empty_tree_fails_the_bootstrap() -> None:
    with pytest.raises(BootstrapFailedError, match="found 0 file"):
        adapter().summarize_artifacts(listing_of([]))


def test_ranks_must_match() -> None:
    full = listing_from_fixture()
    moved = [FileEntry(f.path.replace("/rank_0_0/model", "/rank_1_0/model"), f.size, f.sha256) for f in full.files]
    with pytest.raises(BootstrapFailedError, match="same ranks"):
        adapter().summarize_artifacts(listing_of(moved))


def test_unpacked_artifacts_count() -> None:
    """compile_cache_save_format = 'unpacked' writes artifact_* as directories."""
    full = listing_from_fixture()
    unpacked = [FileEntry(f.path + "/data", f.size, f.sha256) if "/artifact_" in f.path else f for f in full.files]
    summary = adapter().summarize_artifacts(listing_of(unpacked))
    assert summary.engine_keys["backbone_keys"] == [COLD1_BACKBONE]


# --- cache dir preparation ---------------------------------------------------------------------------------


def test_prepare_cache_dir_creates_dummy_cache(tmp_path: Path) -> None:
    adapter().prepare_cache_dir(tmp_path)
    adapter().prepare_cache_dir(tmp_path)  # idempotent
    assert (tmp_path / "dummy_cache").is_dir()
    assert list(tmp_path.iterdir()) == [tmp_path / "dummy_cache"]


def test_profiles_are_schema_valid_and_distinct() -> None:
    tiny = resolved_local(load_profile(PROFILES / "vllm-tiny-llama-local.toml"))
    assert tiny.factors["serve"]["compilation_config"] == {"cudagraph_mode": "FULL_AND_PIECEWISE", "mode": 3}
    example = load_profile(PROFILES / "vllm-example.toml")
    assert example.engine == "vllm" and example.runtime_kind == "docker"
    assert example.model.revision is not None and len(example.model.revision) == 40


def resolved_local(p: Profile) -> ResolvedConfig:
    """Resolve a local-runtime profile with fakes; the model dir (created on the GPU host) is a builtin stand-in."""
    return resolve(
        dataclasses.replace(p, model=ModelSpec(source="builtin", id="stand-in")),
        adapter(),
        image_resolver=None,
        hardware_probe=lambda spec: dict(GPU),
        environment_probe=lambda python, packages: {"python_version": "3.12.3", "packages": {"vllm": "0.20.0"}},
    )


def test_for_factors_picks_the_rules_of_the_resolved_vllm_version_and_says_so() -> None:
    known = VllmAdapter().for_factors({"runtime": {"kind": "local", "packages": {"vllm": "0.20.0"}}})
    assert known.rules_known and known.notes() == (known.version_note, known.rules_note)
    assert "rules of vLLM 0.20.0 from source" in known.notes()[0]
    assert "expected rewrites of vLLM 0.20" in known.notes()[1]
    unknown = VllmAdapter().for_factors({"runtime": {"kind": "docker", "image_id": "sha256:" + "ab" * 32}})
    assert not unknown.rules_known
    assert "no entry" in unknown.notes()[0] and "--allow-unknown-engine-version" in unknown.notes()[0]
    assert "no recorded rewrite set" in unknown.notes()[1] and "conservatively" in unknown.notes()[1]


# --- AOT only where the model uses it (0.33 turns it off for the Transformers backend) ----------------------

# What a 0.33 bootstrap of a Transformers-backend model leaves: vLLM's key file, Inductor's own caches
# (no artifact_*, no vllm_compile_cache.py, no AOT model: vLLM writes those only with AOT).
NO_AOT_TREE = [
    FileEntry(f"torch_compile_cache/{COLD1_BACKBONE}/rank_0_0/backbone/cache_key_factors.json", 10, "a" * 64),
    FileEntry(f"torch_compile_cache/{COLD1_BACKBONE}/rank_0_0/inductor_cache/fxgraph/ab/fab/entry", 10, "b" * 64),
]


def local_model(tmp_path: Path, architectures: list[str] | None) -> dict[str, Any]:
    """A local model factor (local runtime: the real directory) whose config.json names ``architectures``."""
    if architectures is not None:
        (tmp_path / "config.json").write_text(json.dumps({"architectures": architectures}), encoding="utf-8")
    return {"source": "local", "id": "m", "content_sha256": "0" * 64, "path": str(tmp_path)}


def specialized(vllm: str, serve: dict[str, Any], model: dict[str, Any] | None = None) -> VllmAdapter:
    """The adapter as a run builds it: from resolved factors (local runtime, the release's pinned torch)."""
    torch = vllm_versions.all_rules()[vllm].torch
    factors = {
        "runtime": {"kind": "local", "packages": {"vllm": vllm, "torch": torch}},
        "serve": serve,
        "model": model or {"source": "huggingface", "id": "org/model", "revision": HEX40},
        "env": {},
    }
    return VllmAdapter().for_factors(factors)


def test_0_33_transformers_backend_needs_no_aot_artifact_and_no_force_load() -> None:
    a = specialized("0.33.0", {"model_impl": "transformers"})
    assert a.aot_expected is False and a.replay_env() == {}
    summary = a.summarize_artifacts(listing_of(NO_AOT_TREE))
    assert summary.engine_keys == {"backbone_keys": [COLD1_BACKBONE], "aot_keys": [], "ranks": ["rank_0_0"]}
    note = a.notes()[-1]
    assert "Transformers backend" in note and "model_executor/models/transformers/base.py" in note
    assert "VLLM_FORCE_AOT_LOAD is not set" in note
    # The key file is still required: it is what shows vLLM compiled into the tree at all.
    with pytest.raises(BootstrapFailedError, match=r"backbone/cache_key_factors\.json") as info:
        a.summarize_artifacts(listing_of(NO_AOT_TREE[1:]))
    assert "no AOT model required" in info.value.message


@pytest.mark.parametrize(
    ("vllm", "impl"), [("0.26.0", "transformers"), ("0.33.0", "vllm"), ("0.33.0", "auto"), ("0.32.0", "transformers")]
)
def test_a_release_or_an_implementation_that_uses_aot_still_requires_it(vllm: str, impl: str, tmp_path: Path) -> None:
    a = specialized(vllm, {"model_impl": impl}, local_model(tmp_path, ["LlamaForCausalLM"]))
    assert a.aot_expected is True and a.replay_env() == {"VLLM_FORCE_AOT_LOAD": "1"}
    assert len(a.notes()) == 2
    with pytest.raises(BootstrapFailedError, match=r"rank_<R>_<D>/model \(the AOT-compiled model\)"):
        a.summarize_artifacts(listing_of(NO_AOT_TREE))
    assert a.summarize_artifacts(listing_from_fixture()).engine_keys["aot_keys"] == [COLD1_AOT]


@pytest.mark.parametrize(
    ("architectures", "uses_aot"),
    [
        (["LlamaForCausalLM"], True),  # vLLM's own implementation
        (["GPTNeoXForCausalLM"], False),  # the 0.33 registry serves it through the Transformers backend
        (["NoSuchModelForCausalLM"], False),  # unknown to vLLM: auto falls back to the backend
        (["NoSuchModelForCausalLM", "Qwen2ForCausalLM"], True),  # the first one vLLM knows decides
    ],
)
def test_auto_reads_the_local_model_config(architectures: list[str], uses_aot: bool, tmp_path: Path) -> None:
    a = specialized("0.33.0", {}, local_model(tmp_path, architectures))
    assert a.aot_expected is uses_aot
    assert (a.replay_env() == {"VLLM_FORCE_AOT_LOAD": "1"}) is uses_aot


def test_auto_without_a_readable_config_is_not_required_but_said(tmp_path: Path) -> None:
    """Unsure: the AOT model is not required, the note says why, and the force-load switch stays on."""
    for model in (local_model(tmp_path, None), None):  # a local dir without config.json; a Hub model
        a = specialized("0.33.0", {"model_impl": "auto"}, model)
        assert a.aot_expected is None
        assert a.replay_env() == {"VLLM_FORCE_AOT_LOAD": "1"}
        assert a.summarize_artifacts(listing_of(NO_AOT_TREE)).engine_keys["aot_keys"] == []
        # What is there is recorded all the same: a trial must then load it (drift_reasons).
        assert a.summarize_artifacts(listing_from_fixture()).engine_keys["aot_keys"] == [COLD1_AOT]
        note = a.notes()[-1]
        assert "cannot be read here" in note and "every trial must still log a load marker" in note
    # The reuse verdict still needs a load marker: a start that only compiled fails.
    unsure = specialized("0.33.0", {"model_impl": "auto"})
    verdict = classify_reuse(unsure.read_log(log("cold1")), None, None)
    assert not verdict.passed and any("no load marker" in reason for reason in verdict.reasons)


def test_engine_factors_count_aot_only_where_the_model_uses_it(tmp_path: Path) -> None:
    runtime = {"kind": "local", "packages": {"vllm": "0.33.0", "torch": "2.14.0"}}
    locations = VllmAdapter("0.33.0").compile_location_factor()
    off = {"aot": {"aot_compile": False, "mega_artifact": False}, **locations}
    on = {"aot": {"aot_compile": True, "mega_artifact": True}, **locations}
    assert VllmAdapter().engine_factors(runtime, {}, serve={"model_impl": "transformers"}, model={}) == off
    assert VllmAdapter().engine_factors(runtime, {}, serve={"model_impl": "vllm"}, model={}) == on
    native = local_model(tmp_path, ["LlamaForCausalLM"])
    assert VllmAdapter().engine_factors(runtime, {}, serve={}, model=native) == on
    # Unknown (a Hub model under auto): the release's switch stands, so the hash needs no config.json.
    assert VllmAdapter().engine_factors(runtime, {}, serve={}, model={"source": "huggingface"}) == on
    older = {"kind": "local", "packages": {"vllm": "0.26.0", "torch": "2.11.0"}}
    assert VllmAdapter().engine_factors(older, {}, serve={"model_impl": "transformers"}, model={}) == {
        "aot": {"aot_compile": True, "mega_artifact": False},
        **VllmAdapter("0.26.0").compile_location_factor(),
    }


def test_a_transformers_profile_resolves_to_aot_off_and_its_own_hash(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}), encoding="utf-8")

    def resolve_with(impl: str) -> ResolvedConfig:
        doc = with_serve(model_impl=impl)
        doc["runtime"] = {"kind": "local", "python": "python3"}
        doc["model"] = {"source": "local", "id": "m", "path": str(tmp_path)}
        return resolve(
            profile_from_dict(doc),
            adapter(),
            image_resolver=None,
            hardware_probe=lambda spec: dict(GPU),
            environment_probe=lambda python, packages: {"packages": {"vllm": "0.33.0", "torch": "2.14.0"}},
            model_dir_probe=read_model_dir,
        )

    backend, native = resolve_with("transformers"), resolve_with("auto")
    assert backend.factors["engine"]["aot"] == {"aot_compile": False, "mega_artifact": False}
    assert native.factors["engine"]["aot"] == {"aot_compile": True, "mega_artifact": True}
    assert backend.factors["serve"]["model_impl"] == "transformers" and backend.config_hash != native.config_hash
    assert "--model-impl" in (launched := adapter().launch(backend, port=1).command)
    assert launched[launched.index("--model-impl") + 1] == "transformers"
    run = adapter().for_factors(backend.factors)
    assert run.aot_expected is False and run.replay_env() == {}


def test_model_impl_is_modeled_not_passed_through_extra_args() -> None:
    with pytest.raises(InputInvalidError, match="'--model-impl=transformers' is not allowed here") as info:
        resolved(with_serve(extra_args=["--model-impl=transformers"]))
    assert info.value.hint == "use serve.model_impl instead"
    with pytest.raises(InputInvalidError, match="not one of auto, vllm, transformers, terratorch"):
        resolved(with_serve(model_impl="hf"))
