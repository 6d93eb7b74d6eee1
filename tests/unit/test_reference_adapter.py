"""Tests for the reference adapter: serve args, unsafe settings, argv, log markers, artifacts, upper."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import bless
from bless.core.profile import ModelSpec, Profile, profile_from_dict
from bless.core.verify import FileEntry, TreeListing
from bless.engines import reference as reference_mod
from bless.engines.base import EngineAdapter
from bless.engines.reference import DEBUG_ENV, KNOBS, SERVE_ARGS, ReferenceAdapter
from bless.engines.reference_engine import markers
from bless.errors import BootstrapFailedError, ExitCode, InputInvalidError
from bless.evidence_types import UpperEntry
from tests.support.resolving import resolved_offline

KEY = "0123456789abcdef"
DEFAULTS = {
    "seed": 0,
    "layers": 2,
    "d_model": 64,
    "heads": 4,
    "max_seq_len": 64,
    "device": "cpu",
    "compile": True,
    "served_model_name": "reference-tiny",
}


@pytest.fixture
def adapter() -> ReferenceAdapter:
    return ReferenceAdapter()


def profile(
    runtime: dict[str, Any] | None = None,
    serve: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> Profile:
    return profile_from_dict(
        {
            "profile_version": 1,
            "name": "ref",
            "engine": {"name": "reference"},
            "runtime": runtime or {"kind": "docker", "image": "bless-reference:0.1.0"},
            "model": {"source": "builtin", "id": "reference-tiny"},
            "serve": serve or {},
            "env": env or {},
        },
        source=Path("/profiles/ref.toml"),
    )


def test_adapter_satisfies_the_protocol(adapter):
    checked: EngineAdapter = adapter  # static check under mypy; attribute checks at run time
    for name in ("name", "adapter_version", "cache_mount_path", "home", "readonly_bind_ok", "env_policy"):
        assert getattr(checked, name) is not None
    assert adapter.name == "reference"
    assert adapter.cache_mount_path == "/var/cache/bless-engine"
    assert adapter.readonly_bind_ok is True


# --- normalize_serve -----------------------------------------------------------------------------------


def test_normalize_serve_defaults(adapter):
    assert adapter.normalize_serve({}, where="p") == DEFAULTS
    assert {k: default for k, (_, default, _) in SERVE_ARGS.items()} == DEFAULTS


def test_normalize_serve_keeps_given_values_and_does_not_mutate_input(adapter):
    serve = {"layers": 8, "d_model": 1024, "heads": 16, "device": "cuda", "compile": False}
    out = adapter.normalize_serve(serve, where="p")
    assert out == {**DEFAULTS, **serve}
    assert serve == {"layers": 8, "d_model": 1024, "heads": 16, "device": "cuda", "compile": False}


@pytest.mark.parametrize(
    ("key", "low", "high"),
    [
        ("seed", 0, 2**31 - 1),
        ("layers", 1, 16),
        ("d_model", 8, 2048),
        ("heads", 1, 64),
        ("max_seq_len", 8, 1024),
    ],
)
def test_normalize_serve_bounds(adapter, key, low, high):
    # Bounds are inclusive; every bound keeps d_model a multiple of the default heads (4) and vice versa.
    assert adapter.normalize_serve({key: low}, where="p")[key] == low
    assert adapter.normalize_serve({key: high}, where="p")[key] == high
    for bad in (low - 1, high + 1):
        with pytest.raises(InputInvalidError) as info:
            adapter.normalize_serve({key: bad}, where="f.toml")
        assert info.value.message == f"f.toml: serve.{key}: {bad} is outside {low}..{high}"


@pytest.mark.parametrize(
    ("serve", "needle"),
    [
        ({"layers": "2"}, "serve.layers: expected int, got '2'"),
        ({"layers": 2.0}, "serve.layers: expected int, got 2.0"),
        ({"layers": True}, "serve.layers: expected int, got True"),
        ({"compile": 1}, "serve.compile: expected bool, got 1"),
        ({"device": "tpu"}, "serve.device: 'tpu' is not one of cpu, cuda"),
        ({"device": None}, "serve.device: expected str, got None"),
        ({"served_model_name": ["x"]}, "serve.served_model_name: expected str"),
        ({"d_model": 64, "heads": 6}, "serve.d_model must be a multiple of serve.heads"),
    ],
)
def test_normalize_serve_wrong_types(adapter, serve, needle):
    with pytest.raises(InputInvalidError) as info:
        adapter.normalize_serve(serve, where="f.toml")
    assert info.value.message == f"f.toml: {needle}" or info.value.message.startswith(f"f.toml: {needle}")
    assert info.value.exit_code == ExitCode.INPUT_INVALID


def test_normalize_serve_unknown_keys(adapter):
    with pytest.raises(InputInvalidError) as info:
        adapter.normalize_serve({"zeta": 1, "alpha": 2, "layers": 2}, where="f.toml")
    assert info.value.message == "f.toml: serve.alpha: not an argument of the reference engine"
    assert info.value.hint and "max_seq_len" in info.value.hint


# --- unsafe_settings -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted({**KNOBS, **DEBUG_ENV}))
def test_each_knob_and_debug_var_is_unsafe(adapter, name):
    found = adapter.unsafe_settings(resolved_offline(profile(env={name: "1", "TORCHINDUCTOR_X": "1"}), adapter))
    assert [(s.name, s.value) for s in found] == [(name, "1")]
    assert found[0].reason == {**KNOBS, **DEBUG_ENV}[name]


def test_torch_logs_and_compile_debug_flagged(adapter):
    found = adapter.unsafe_settings(
        resolved_offline(profile(env={"TORCH_LOGS": "+dynamo", "TORCH_COMPILE_DEBUG": "1"}), adapter)
    )
    assert sorted(s.name for s in found) == ["TORCH_COMPILE_DEBUG", "TORCH_LOGS"]
    assert {s.name: s.value for s in found}["TORCH_LOGS"] == "+dynamo"


@pytest.mark.parametrize("value", ["0", ""])
def test_zero_or_empty_is_off(adapter, value):
    env = {"TORCH_COMPILE_DEBUG": value, "BLESS_REFERENCE_NONDETERMINISTIC": value}
    assert adapter.unsafe_settings(resolved_offline(profile(env=env), adapter)) == []


def test_compile_false_is_unsafe_but_compile_true_is_not(adapter):
    found = adapter.unsafe_settings(resolved_offline(profile(serve={"compile": False}), adapter))
    assert [(s.name, s.value) for s in found] == [("serve.compile", "false")]
    assert adapter.unsafe_settings(resolved_offline(profile(serve={"compile": True}), adapter)) == []
    assert adapter.unsafe_settings(resolved_offline(profile(), adapter)) == []


def test_safe_env_is_not_flagged(adapter):
    env = {"TORCHINDUCTOR_MAX_AUTOTUNE": "1", "BLESS_LOG_LEVEL": "DEBUG", "OMP_NUM_THREADS": "4"}
    assert adapter.unsafe_settings(resolved_offline(profile(env=env), adapter)) == []


# --- launch ------------------------------------------------------------------------------------------------


def flag(command: tuple[str, ...], name: str) -> str:
    return command[command.index(name) + 1]


def test_launch_docker(adapter):
    launch = adapter.launch(
        resolved_offline(profile(serve={"layers": 3, "seed": 7}, env={"OMP_NUM_THREADS": "2"}), adapter), port=8123
    )
    command = launch.command
    assert command[:5] == ("python3", "-m", "bless_reference", "--host", "0.0.0.0")
    assert flag(command, "--port") == "8123"
    assert flag(command, "--cache-dir") == "/var/cache/bless-engine" == adapter.cache_mount_path
    assert flag(command, "--device") == "cpu"
    assert flag(command, "--seed") == "7"
    assert flag(command, "--layers") == "3"
    assert flag(command, "--d-model") == "64"
    assert flag(command, "--heads") == "4"
    assert flag(command, "--max-seq-len") == "64"
    assert flag(command, "--served-model-name") == "reference-tiny"
    assert "--no-compile" not in command
    assert all(isinstance(part, str) for part in command)
    assert launch.port == 8123
    assert dict(launch.env) == {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "2"}
    assert "PYTHONPATH" not in launch.env


def test_launch_debug_adds_no_compile(adapter):
    command = adapter.launch(resolved_offline(profile(), adapter), port=8000, debug=True).command
    assert command.count("--no-compile") == 1
    assert command[-1] == "--no-compile"


def test_launch_compile_false_adds_no_compile(adapter):
    assert (
        "--no-compile"
        in adapter.launch(resolved_offline(profile(serve={"compile": False}), adapter), port=8000).command
    )


def test_launch_local(adapter):
    local = profile(runtime={"kind": "local", "python": "/opt/venv/bin/python3"}, serve={"device": "cuda"})
    launch = adapter.launch(resolved_offline(local, adapter), port=9000)
    launcher = Path(bless.__file__).resolve().parent / "engines" / "reference_engine" / "launch.py"
    assert launch.command[:4] == ("/opt/venv/bin/python3", str(launcher), "--host", "127.0.0.1")
    assert flag(launch.command, "--cache-dir") == "/var/cache/bless-engine"
    assert flag(launch.command, "--device") == "cuda"
    assert "PYTHONPATH" not in launch.env  # the host's stays: the launcher needs nothing of it but torch
    assert launch.env["PYTHONUNBUFFERED"] == "1"


def test_launch_local_default_python(adapter):
    in_memory = Profile(
        name="m", engine="reference", runtime_kind="local", model=ModelSpec("builtin", "reference-tiny")
    )
    assert adapter.launch(resolved_offline(in_memory, adapter), port=1).command[0] == "python3"


def test_launch_profile_env_wins_over_defaults(adapter):
    launch = adapter.launch(resolved_offline(profile(env={"PYTHONUNBUFFERED": "0"}), adapter), port=1)
    assert launch.env["PYTHONUNBUFFERED"] == "0"


def test_launch_validates_serve(adapter):
    with pytest.raises(InputInvalidError, match=r"^/profiles/ref\.toml: serve\.layers"):
        adapter.launch(resolved_offline(profile(serve={"layers": 99}), adapter), port=1)


# --- read_log --------------------------------------------------------------------------------------------


def test_read_log_warm_load(adapter):
    log = "\n".join(
        [
            "torch 2.13.0 starting",
            markers.using_cache_dir("/var/cache/bless-engine"),
            markers.ARTIFACT_KEY + KEY,
            markers.loaded(f"/var/cache/bless-engine/reference/{KEY}/megacache.bin"),
            markers.counters('{"fxgraph_cache_hit": 1}'),
            markers.compile_time(1.23),
            markers.ready(8000),
        ]
    )
    signals = adapter.read_log(log)
    assert signals.load_markers == (markers.loaded(f"/var/cache/bless-engine/reference/{KEY}/megacache.bin"),)
    assert signals.compile_markers == ()
    assert signals.fatal_markers == ()
    assert signals.timings == {"torch_compile_s": 1.23}
    assert signals.engine_keys == {"cache_dir": "/var/cache/bless-engine", "artifact_key": KEY}
    # The key the log shows is the one the blessing holds: no drift; another key, or none, is drift.
    assert adapter.drift_reasons({"artifact_keys": [KEY]}, signals.engine_keys) == []
    assert "keyed its artifact" in adapter.drift_reasons({"artifact_keys": ["f" * 16]}, signals.engine_keys)[0]
    assert "no artifact key" in adapter.drift_reasons({"artifact_keys": [KEY]}, {})[0]


def test_read_log_cold_compile(adapter):
    log = "\n".join(
        [
            markers.compiling("no artifact"),
            markers.saved("/c/reference/x/megacache.bin"),
            markers.unable_to_save("/c/y", "EROFS"),
            markers.compile_time(22.5),
        ]
    )
    signals = adapter.read_log(log)
    assert signals.load_markers == ()
    assert len(signals.compile_markers) == 3
    assert signals.compile_markers[0] == "bless-reference: Compiling model (reason: no artifact)"
    assert signals.timings["torch_compile_s"] == 22.5


def test_read_log_fatal(adapter):
    signals = adapter.read_log("noise\n" + markers.fatal("artifact corrupt") + "\n")
    assert signals.fatal_markers == ("bless-reference: FATAL artifact corrupt",)
    assert signals.load_markers == signals.compile_markers == ()


def test_read_log_ignores_markers_not_at_line_start(adapter):
    # An echoed command line or a quoted marker is not the engine speaking.
    log = "echo " + markers.loaded("/x") + "\n" + f"+ grep '{markers.compiling('x')}'" + "\n"
    signals = adapter.read_log(log)
    assert signals.load_markers == ()
    assert signals.compile_markers == ()
    assert signals.fatal_markers == ()
    assert adapter.read_log("").timings == {}


def test_read_log_eager_and_knob_lines_are_not_load_markers(adapter):
    signals = adapter.read_log(markers.EAGER + "\n" + markers.KNOB_ACTIVE + "BLESS_REFERENCE_IGNORE_CACHE\n")
    assert signals.load_markers == signals.compile_markers == signals.fatal_markers == ()


# --- summarize_artifacts ---------------------------------------------------------------------------------


def listing(*paths: str) -> TreeListing:
    files = tuple(FileEntry(p, 10, "0" * 64) for p in sorted(paths))
    return TreeListing(files=files, dirs=(), total_size=10 * len(files))


def test_summarize_artifacts_with_megacache(adapter):
    summary = adapter.summarize_artifacts(
        listing(f"reference/{KEY}/megacache.bin", f"reference/{KEY}/meta.json", "reference/notes.txt", "tmp/x")
    )
    assert summary.artifacts == (f"reference/{KEY}/megacache.bin", f"reference/{KEY}/meta.json")
    assert summary.engine_keys == {"artifact_keys": [KEY]}


def test_summarize_artifacts_names_the_kept_kernel_libraries(adapter):
    kernel = f"reference/{KEY}/kernels/ab/cabcdef.main.so"
    summary = adapter.summarize_artifacts(
        listing(f"reference/{KEY}/megacache.bin", f"reference/{KEY}/meta.json", kernel, f"{kernel}.tmp")
    )
    assert summary.artifacts == (kernel, f"reference/{KEY}/megacache.bin", f"reference/{KEY}/meta.json")
    # A kernel library written during a trial is a new compiled artifact, not a stray file.
    assert adapter.classify_upper([UpperEntry(kernel, "new", 9)]).new_artifacts == (kernel,)


def test_summarize_artifacts_two_keys(adapter):
    other = "fedcba9876543210"
    summary = adapter.summarize_artifacts(listing(f"reference/{other}/megacache.bin", f"reference/{KEY}/megacache.bin"))
    assert summary.engine_keys == {"artifact_keys": [KEY, other]}


@pytest.mark.parametrize(
    "paths",
    [
        (),
        (f"reference/{KEY}/meta.json",),
        ("reference/SHORT/megacache.bin",),
        (f"other/{KEY}/megacache.bin",),
        (f"reference/{KEY}/megacache.bin.tmp",),
    ],
)
def test_summarize_artifacts_without_megacache(adapter, paths):
    with pytest.raises(BootstrapFailedError, match="wrote no compiled artifact") as info:
        adapter.summarize_artifacts(listing(*paths))
    assert info.value.exit_code == ExitCode.BOOTSTRAP_FAILED and ExitCode.BOOTSTRAP_FAILED.value == 40
    assert f"found {len(paths)} file(s)" in info.value.message


# --- classify_upper ----------------------------------------------------------------------------------------


def test_classify_upper(adapter):
    verdict = adapter.classify_upper(
        [
            UpperEntry(f"reference/{KEY}/megacache.bin", "new", 100),
            UpperEntry("stray.txt", "new", 3),
            UpperEntry("inductor/thing.bin", "new", 5),
            UpperEntry(f"reference/{KEY}/meta.json", "rewritten", 5),
        ]
    )
    assert verdict.new_artifacts == (
        f"reference/{KEY}/megacache.bin",
        "inductor/thing.bin",
        f"reference/{KEY}/meta.json",
    )
    assert verdict.unexpected == ("stray.txt",)
    assert verdict.expected_rewrites == ()
    assert verdict.recompiled is True


def test_classify_upper_empty_and_stray_only(adapter):
    empty = adapter.classify_upper([])
    assert (empty.new_artifacts, empty.unexpected, empty.recompiled) == ((), (), False)
    stray = adapter.classify_upper([UpperEntry("tmp/lock", "deleted", 0)])
    assert stray.unexpected == ("tmp/lock",)
    assert stray.recompiled is False


def test_artifact_pattern():
    assert reference_mod.ARTIFACT.match(f"reference/{KEY}/megacache.bin")
    assert reference_mod.ARTIFACT.match(f"reference/{KEY}/meta.json")
    assert not reference_mod.ARTIFACT.match(f"reference/{KEY.upper()}/megacache.bin")
    assert not reference_mod.ARTIFACT.match(f"x/reference/{KEY}/megacache.bin")
