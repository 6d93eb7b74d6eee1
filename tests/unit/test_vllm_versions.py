"""Per-version vLLM rules: every stored entry agrees with the excerpts of its release's source.

The excerpts under tests/fixtures/vllm/source/<version>/ were read from each release's wheel by
``scripts/vllm_rules.py fetch`` (SOURCE.json names the wheel and each member's sha256). A vLLM
release that renames a marker, moves the cache or changes the hashed env changes its excerpts, and
then these tests fail until the entry follows (``scripts/vllm_rules.py update``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from bless.cli.error_hints import command_line_hint
from bless.core.factors import resolve
from bless.core.profile import load_profile
from bless.engines.vllm import CACHE_MOUNT_PATH, VllmAdapter
from bless.engines.vllm import versions as vllm_versions
from bless.engines.vllm.evidence import _AOT_LOAD_PATH, _USING_CACHE_DIR
from bless.errors import ExitCode, UnknownEngineVersionError
from bless.probes import read_model_dir

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
SOURCE = TESTS / "fixtures" / "vllm" / "source"
VERSIONS = vllm_versions.known_versions()
AOT = "ab" * 32


def _rules_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_rules", REPO / "scripts" / "vllm_rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["vllm_rules"] = module
    spec.loader.exec_module(module)
    return module


RULES = _rules_script()


def stored(version: str) -> dict[str, Any]:
    return dict(vllm_versions.all_rules()[version].raw)


# --- the data is the source's ----------------------------------------------------------------------------


def test_every_release_from_0_20_has_an_entry_and_excerpts() -> None:
    fixtures = sorted((p.name for p in SOURCE.iterdir() if p.is_dir()), key=lambda v: tuple(map(int, v.split("."))))
    assert list(VERSIONS) == fixtures
    assert VERSIONS[0] == "0.20.0" and len(VERSIONS) >= 19  # 0.20.0 ... 0.33.0 when this was written
    for version in VERSIONS:
        source = json.loads((SOURCE / version / "SOURCE.json").read_text())
        assert source["version"] == version and source["wheel"].startswith(f"vllm-{version}-")
        assert re.fullmatch(r"[0-9a-f]{64}", source["wheel_sha256"])
        assert "vllm/envs.py" in source["members"]
        # Every Python file was scanned for env assignments, not just the excerpted ones.
        assert source["scanned"]["python_files"] > 1000 and re.fullmatch(r"[0-9a-f]{64}", source["scanned"]["sha256"])


@pytest.mark.parametrize("version", VERSIONS)
def test_stored_entry_agrees_with_its_release_source(version: str) -> None:
    derived = RULES.derive(version, SOURCE)
    assert RULES.diff_entries(RULES.stored_fields(stored(version)), derived) == []


def test_a_renamed_marker_fails_the_derivation(tmp_path: Path) -> None:
    """The guard: if vLLM changes a marker and bless does not follow, deriving that release fails loudly."""
    shutil.copytree(SOURCE / "0.26.0", tmp_path / "0.26.0")
    decorators = tmp_path / "0.26.0" / "vllm" / "compilation" / "decorators.py.txt"
    decorators.write_text(decorators.read_text().replace("Directly load AOT compilation", "Loaded AOT compilation"))
    with pytest.raises(ValueError, match="Directly load AOT compilation from path"):
        RULES.derive("0.26.0", tmp_path)


def test_a_moved_cache_layout_fails_the_derivation(tmp_path: Path) -> None:
    shutil.copytree(SOURCE / "0.33.0", tmp_path / "0.33.0")
    decorators = tmp_path / "0.33.0" / "vllm" / "compilation" / "decorators.py.txt"
    decorators.write_text(decorators.read_text().replace('"torch_aot_compile"', '"aot_cache"'))
    with pytest.raises(ValueError, match="aot cache layout changed"):
        RULES.derive("0.33.0", tmp_path)


def test_0_20_hashed_env_equals_what_a_real_run_recorded() -> None:
    """The names derived from 0.20.0's envs.py are exactly those of a real cold run's cache_key_factors.json."""
    recorded = set((TESTS / "fixtures" / "vllm" / "vllm_0.20_hashed_env_names.txt").read_text().split())
    assert vllm_versions.all_rules()["0.20.0"].hashed_env == recorded


def test_what_changed_across_releases_is_in_the_data() -> None:
    """Facts read from the releases that change how bless must treat them (each was seen in the diff)."""
    rules = vllm_versions.all_rules()
    # HOME left vLLM's key in 0.27: VLLM_CONFIG_ROOT / VLLM_XLA_CACHE_PATH moved to the ignore list.
    assert {"VLLM_CONFIG_ROOT", "VLLM_XLA_CACHE_PATH"} <= rules["0.26.0"].hashed_env
    assert not {"VLLM_CONFIG_ROOT", "VLLM_XLA_CACHE_PATH"} & rules["0.27.0"].hashed_env
    # 0.32 prefixes its compile messages with %s: the markers still match, the formats changed.
    assert rules["0.31.0"].marker_formats["Directly load AOT compilation from path"] == (
        "Directly load AOT compilation from path %s",
    )
    assert rules["0.32.0"].marker_formats["Directly load AOT compilation from path"] == (
        "%sDirectly load AOT compilation from path %s",
    )
    assert [rules[v].torch for v in ("0.26.0", "0.27.0", "0.33.0")] == ["2.11.0", "2.13.0", "2.14.0"]
    assert all(rules[v].force_load_env == "VLLM_FORCE_AOT_LOAD" for v in VERSIONS)
    assert all(not rules[v].raw["aot"]["force_load_hashed_by_vllm"] for v in VERSIONS)


# --- compile-state locations and the env vars vLLM sets itself --------------------------------------------------

ALWAYS = {"TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH", "TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME"}
#: The env assignments whose value vLLM builds outside its cache dir (derived: inside_cache false).
#: FlyDSL's ROCm model runners replace an unset or non-writable FLYDSL_RUNTIME_CACHE_DIR with
#: ~/.flydsl/cache: pointed at a writable dir in the blessed tree it is left alone, but a read-only
#: one would send those kernels to HOME. Any other entry here is a new fact to handle.
MOVED_OUTSIDE = {
    ("0.32.0", "FLYDSL_RUNTIME_CACHE_DIR", "vllm/models/deepseek_v41/amd/mono/runner.py"),
    ("0.33.0", "FLYDSL_RUNTIME_CACHE_DIR", "vllm/models/deepseek_v4/amd/mono/runner.py"),
    ("0.33.0", "FLYDSL_RUNTIME_CACHE_DIR", "vllm/models/deepseek_v41/amd/mono/runner.py"),
    ("0.33.0", "FLYDSL_RUNTIME_CACHE_DIR", "vllm/models/minimax_m3/amd/specialized_decode/mono/runner.py"),
}


def _locations(version: str) -> dict[str, str]:
    return {location.env: location.subdir for location in vllm_versions.all_rules()[version].compile_locations}


def test_compile_locations_are_those_each_release_uses() -> None:
    for version in VERSIONS:
        locations = _locations(version)
        assert set(locations) >= ALWAYS, version
        assert all(subdir.startswith("jit/") for subdir in locations.values())
        assert len(set(locations.values())) == len(locations), "two env vars share a dir"
        for item in stored(version)["compile_locations"]:
            excerpt = SOURCE / version / (item["evidence"]["file"] + ".txt")
            assert item["evidence"]["needle"] in excerpt.read_text(), (version, item["env"])
    # The vendored SM100 FMHA kernels (and their JIT cache dirs) arrived in 0.24, FlyDSL's runners in 0.32.
    assert not {"MINFER_FMHA_CACHE_DIR", "MM_SPARSE_ATTN_AOT_CACHE"} & set(_locations("0.23.0"))
    assert _locations("0.24.0")["MINFER_FMHA_CACHE_DIR"] == "jit/minfer_fmha"
    assert "FLYDSL_RUNTIME_CACHE_DIR" not in _locations("0.31.0")
    assert _locations("0.33.0")["FLYDSL_RUNTIME_CACHE_DIR"] == "jit/flydsl"
    assert _locations("0.26.0")["FLASHINFER_WORKSPACE_BASE"] == "jit/flashinfer"


def test_a_release_without_the_writer_has_no_location(tmp_path: Path) -> None:
    shutil.copytree(SOURCE / "0.24.0", tmp_path / "0.24.0")
    jit = tmp_path / "0.24.0" / "vllm" / "third_party" / "fmha_sm100" / "jit.py.txt"
    assert 'os.environ.get("MINFER_FMHA_CACHE_DIR")' in jit.read_text()
    jit.write_text(jit.read_text().replace('os.environ.get("MINFER_FMHA_CACHE_DIR")', "None"))
    envs = [item["env"] for item in RULES.derive("0.24.0", tmp_path)["compile_locations"]]
    assert "MINFER_FMHA_CACHE_DIR" not in envs and "MM_SPARSE_ATTN_AOT_CACHE" in envs


def test_a_release_without_an_always_present_writer_fails_the_derivation(tmp_path: Path) -> None:
    shutil.copytree(SOURCE / "0.26.0", tmp_path / "0.26.0")
    triton = tmp_path / "0.26.0" / "vllm" / "triton_utils" / "__init__.py.txt"
    triton.write_text(triton.read_text().replace("import triton", "import nothing"))
    with pytest.raises(ValueError, match="no evidence of TRITON_CACHE_DIR"):
        RULES.derive("0.26.0", tmp_path)


def test_vllm_never_moves_a_declared_location_outside_the_cache_except_the_named_ones() -> None:
    outside: set[tuple[str, str, str]] = set()
    for version in VERSIONS:
        declared = set(_locations(version))
        for env, items in stored(version)["env_set_by_vllm"].items():
            assert env in declared, (version, env)
            for item in items:
                if not item["inside_cache"]:
                    outside.add((version, env, item["file"]))
                else:
                    assert set(item["built_from"]) <= {"VLLM_CACHE_ROOT", "compile_cache_dir", "caller"}
    new = sorted(outside - MOVED_OUTSIDE)
    assert outside == MOVED_OUTSIDE, f"vLLM moves a location outside the blessed tree: {new}"
    flydsl = stored("0.33.0")["env_set_by_vllm"]["FLYDSL_RUNTIME_CACHE_DIR"]
    assert {tuple(item["built_from"]) for item in flydsl} == {("HOME",)}


def test_vllm_forces_inductor_and_triton_into_its_compile_cache() -> None:
    """Every release points TORCHINDUCTOR_CACHE_DIR into its cache; from 0.31 a caller's TRITON_CACHE_DIR is kept."""
    for version in VERSIONS:
        rules = vllm_versions.all_rules()[version]
        inductor = {item["file"]: item for item in stored(version)["env_set_by_vllm"]["TORCHINDUCTOR_CACHE_DIR"]}
        assert inductor["vllm/compilation/decorators.py"]["built_from"] == ["VLLM_CACHE_ROOT"]
        assert inductor["vllm/compilation/compiler_interface.py"]["built_from"] == ["compile_cache_dir"]
        assert any(
            line.startswith("vllm/compilation/decorators.py:") and 'os.environ["TORCHINDUCTOR_CACHE_DIR"]' in line
            for line in rules.env_set_by_vllm["TORCHINDUCTOR_CACHE_DIR"]
        )
        triton = next(
            item
            for item in stored(version)["env_set_by_vllm"]["TRITON_CACHE_DIR"]
            if item["file"] == "vllm/compilation/compiler_interface.py"
        )
        honours_caller = RULES._version_key(version) >= (0, 31, 0)
        expected = ["caller", "compile_cache_dir"] if honours_caller else ["compile_cache_dir"]
        assert triton["built_from"] == expected, version


def test_an_assignment_to_home_is_derived_as_outside(tmp_path: Path) -> None:
    """The derivation reads what a value is built from: a release that sent Triton's cache to HOME would show it."""
    shutil.copytree(SOURCE / "0.33.0", tmp_path / "0.33.0")
    moved = tmp_path / "0.33.0" / "vllm" / "moved.py.txt"
    moved.write_text(
        '# [lines 10-11]\n    home = os.path.expanduser("~/.triton")\n'
        '    os.environ["TRITON_CACHE_DIR"] = os.path.join(home, "cache")\n'
    )
    items = RULES.derive("0.33.0", tmp_path)["env_set_by_vllm"]["TRITON_CACHE_DIR"]
    item = next(item for item in items if item["file"] == "vllm/moved.py")
    assert item["built_from"] == ["HOME"] and item["inside_cache"] is False and item["line_no"] == 11


def test_compile_cache_parameters_count_only_while_vllm_passes_its_cache_dir(tmp_path: Path) -> None:
    """``base_cache_dir`` is vLLM's compile cache dir only while backends.py hands that dir to the compiler."""
    shutil.copytree(SOURCE / "0.33.0", tmp_path / "0.33.0")
    backends = tmp_path / "0.33.0" / "vllm" / "compilation" / "backends.py.txt"
    backends.write_text(backends.read_text().replace("local_cache_dir, disable_cache, self.prefix", "elsewhere"))
    entry = RULES.derive("0.33.0", tmp_path)
    assert entry["layout"]["compile_cache_param"] is False
    inductor = entry["env_set_by_vllm"]["TORCHINDUCTOR_CACHE_DIR"]
    moved = [item for item in inductor if item["file"] == "vllm/compilation/compiler_interface.py"]
    assert moved and moved[0]["built_from"] == ["unknown: base_cache_dir"] and moved[0]["inside_cache"] is False


# --- models that compile without AOT ------------------------------------------------------------------------------

TRANSFORMERS_OPT_OUT = {
    "file": "vllm/model_executor/models/transformers/base.py",
    "line": "use_aot_compile=False,",
    "applies_to": "model_impl=transformers",
}


def test_aot_opt_outs_are_those_each_release_has() -> None:
    """0.33 is the first release whose Transformers backend compiles without AOT; it alone keeps the registry."""
    for version in VERSIONS:
        aot = stored(version)["aot"]
        if version == "0.33.0":
            assert aot["disabled_for"] == [TRANSFORMERS_OPT_OUT]
        else:
            assert aot["disabled_for"] == [] and "architectures" not in aot, version
    rules = vllm_versions.all_rules()["0.33.0"]
    assert rules.aot_disabled_for == (vllm_versions.AotOptOut(**TRANSFORMERS_OPT_OUT),)
    assert {"LlamaForCausalLM", "Qwen2ForCausalLM", "Terratorch"} <= rules.native_architectures
    assert {"GPTNeoXForCausalLM", "TransformersForCausalLM"} <= rules.transformers_architectures
    assert not rules.native_architectures & rules.transformers_architectures
    assert not vllm_versions.all_rules()["0.32.0"].native_architectures


def test_a_backend_that_keeps_aot_has_no_opt_out(tmp_path: Path) -> None:
    shutil.copytree(SOURCE / "0.33.0", tmp_path / "0.33.0")
    base = tmp_path / "0.33.0" / "vllm" / "model_executor" / "models" / "transformers" / "base.py.txt"
    base.write_text(base.read_text().replace("use_aot_compile=False", "use_aot_compile=True"))
    aot = RULES.derive("0.33.0", tmp_path)["aot"]
    assert aot["disabled_for"] == [] and "architectures" not in aot


def test_a_model_class_that_opts_out_is_named_and_makes_every_model_unsure(tmp_path: Path) -> None:
    shutil.copytree(SOURCE / "0.32.0", tmp_path / "0.32.0")
    model = tmp_path / "0.32.0" / "vllm" / "model_executor" / "models" / "foo.py.txt"
    model.parent.mkdir(parents=True, exist_ok=True)
    model.write_text(
        "# [lines 40-41]\n@support_torch_compile(use_aot_compile=False)\nclass FooForCausalLM(nn.Module):\n"
    )
    disabled = RULES.derive("0.32.0", tmp_path)["aot"]["disabled_for"]
    expected = {"file": "vllm/model_executor/models/foo.py", "line": "@support_torch_compile(use_aot_compile=False)"}
    assert disabled == [{**expected, "applies_to": "FooForCausalLM"}]
    rules = dataclasses.replace(
        vllm_versions.all_rules()["0.32.0"], aot_disabled_for=(vllm_versions.AotOptOut(**disabled[0]),)
    )
    unsure = rules.model_aot("vllm", ["LlamaForCausalLM"])
    assert unsure.uses_aot is None and unsure.reason and "FooForCausalLM" in unsure.reason
    assert vllm_versions.all_rules()["0.32.0"].model_aot("transformers", None).uses_aot is True


# --- the rules read real log lines --------------------------------------------------------------------------


def _render(fmt: str, value: str = "/var/cache/bless-engine/x") -> str:
    """What vLLM prints for ``fmt`` (a rank prefix for a leading %s, numbers for numeric placeholders)."""
    parts = re.split(r"(%(?:\.\d+)?[sdf])", fmt)
    out = []
    for index, part in enumerate(parts):
        if part == "%s":
            out.append("(EngineCore pid=1) " if index == 1 and parts[0] == "" else value)
        elif part.startswith("%"):
            out.append("1.25")
        else:
            out.append(part)
    return "INFO 11-23 04:00:00 [x.py:1] " + "".join(out)


@pytest.mark.parametrize("version", VERSIONS)
def test_markers_and_timings_match_lines_rendered_from_the_formats(version: str) -> None:
    rules = vllm_versions.all_rules()[version]
    for marker, formats in rules.marker_formats.items():
        for fmt in formats:
            line = _render(fmt)
            assert marker in line
    adapter = VllmAdapter(version, torch_version=rules.torch)
    for name, spec in rules.raw["timings"].items():
        for fmt in spec["formats"]:
            signals = adapter.read_log(_render(fmt))
            assert signals.timings.get(name) == 1.25, (name, fmt)
    for fmt in rules.raw["cache_dir_line"]["formats"]:
        path = CACHE_MOUNT_PATH + "/torch_compile_cache/0123456789/rank_0_0/backbone"
        match = _USING_CACHE_DIR.search(_render(fmt, path))
        assert match and match["path"] == path
    aot_path = f"{CACHE_MOUNT_PATH}/torch_compile_cache/torch_aot_compile/{AOT}/rank_0_0/model"
    for fmt in rules.marker_formats["Directly load AOT compilation from path"]:
        match = _AOT_LOAD_PATH.search(_render(fmt, aot_path))
        assert match and match["path"] == aot_path


@pytest.mark.parametrize("version", VERSIONS)
def test_policy_hashes_every_name_the_release_hashes(version: str) -> None:
    policy = VllmAdapter().env_policy
    hashed = vllm_versions.all_rules()[version].hashed_env
    not_hashed = sorted(name for name in hashed if policy.is_ignored(name))
    # The one secret vLLM hashes (0.20-0.28): bless never writes a secret, so it cannot be a factor.
    assert set(not_hashed) <= {"VLLM_API_KEY"}


def test_format_pattern() -> None:
    pattern = vllm_versions.format_pattern(
        "%sCompiling a graph for compile range %s takes %.2f s", capture_last_number=True
    )
    match = pattern.search("(EngineCore) Compiling a graph for compile range (1, 2048) takes 6.70 s")
    assert match and match["s"] == "6.70"
    assert not pattern.search("Compiling a graph for compile range (1, 2048) took 6.70 s")


# --- versions: known, unknown, allowed --------------------------------------------------------------------


def test_release_matching() -> None:
    assert vllm_versions.release_of("0.26.0+cu130") == "0.26.0"
    assert vllm_versions.rules_for("0.26.0+cu130") is not None
    assert vllm_versions.rules_for("0.26.1.dev3+gabc") is None
    nearest = vllm_versions.nearest_older("0.26.1.dev3+gabc")
    assert nearest is not None and nearest.version == "0.26.0"
    assert vllm_versions.nearest_older("0.19.1") is None
    newest = vllm_versions.nearest_older(None)
    assert newest is not None and newest.version == VERSIONS[-1]


def test_a_known_version_is_accepted_and_says_where_its_rules_come_from() -> None:
    adapter = VllmAdapter("0.26.0", torch_version="2.11.0+cu130")
    adapter.require_known_version(allow_unknown=False)
    assert adapter.rules_known and "rules of vLLM 0.26.0 from source" in adapter.version_note


def test_an_unknown_version_is_refused_with_what_is_known_and_how_to_add_it() -> None:
    adapter = VllmAdapter("0.26.1")
    with pytest.raises(UnknownEngineVersionError) as caught:
        adapter.require_known_version(allow_unknown=False)
    error = caught.value
    assert error.exit_code == ExitCode.UNKNOWN_ENGINE_VERSION and ExitCode.UNKNOWN_ENGINE_VERSION.value == 33
    assert "0.26.1" in error.message and f"{VERSIONS[0]} ... {VERSIONS[-1]}" in error.message
    assert error.hint and "scripts/vllm_rules.py fetch" in error.hint and "--allow" not in error.hint
    worded = command_line_hint(error) or ""
    assert "scripts/vllm_rules.py fetch" in worded and "--allow-unknown-engine-version" in worded
    assert error.details["nearest"] == "0.26.0"


def test_an_allowed_unknown_version_uses_the_nearest_older_entry_and_says_so() -> None:
    adapter = VllmAdapter("0.26.1")
    adapter.require_known_version(allow_unknown=True)
    assert adapter.version_rules.version == "0.26.0"
    assert "nearest older" in adapter.notes()[0] and "0.26.0" in adapter.notes()[0]


def test_a_version_older_than_every_entry_is_refused_even_when_allowed() -> None:
    with pytest.raises(UnknownEngineVersionError, match="older than every release"):
        VllmAdapter("0.19.1").require_known_version(allow_unknown=True)


def test_an_unprobed_docker_version_is_refused_unless_allowed() -> None:
    adapter = VllmAdapter.for_environment({"kind": "docker", "image_id": "sha256:" + "ab" * 32})
    with pytest.raises(UnknownEngineVersionError, match="cannot be read before the start"):
        adapter.require_known_version(allow_unknown=False)
    adapter.require_known_version(allow_unknown=True)
    assert adapter.version_rules.version == VERSIONS[-1]


# --- force-AOT-load and the AOT switches ----------------------------------------------------------------------


def test_replays_force_the_aot_load_where_the_release_has_the_switch() -> None:
    assert VllmAdapter("0.26.0", torch_version="2.11.0").replay_env() == {"VLLM_FORCE_AOT_LOAD": "1"}
    # AOT compile is off by default below torch 2.10: there is no AOT artifact to force.
    assert VllmAdapter("0.26.0", torch_version="2.9.1").replay_env() == {}


@pytest.mark.parametrize(
    ("vllm", "torch", "env", "expected"),
    [
        ("0.26.0", "2.11.0+cu130", {}, {"aot_compile": True, "mega_artifact": False}),
        ("0.27.0", "2.13.0", {}, {"aot_compile": True, "mega_artifact": True}),
        ("0.27.0", "2.13.0", {"VLLM_USE_MEGA_AOT_ARTIFACT": "0"}, {"aot_compile": True, "mega_artifact": False}),
        ("0.26.0", "2.11.0", {"VLLM_USE_AOT_COMPILE": "0"}, {"aot_compile": False, "mega_artifact": False}),
        ("0.26.0", "2.11.0", {"VLLM_DISABLE_COMPILE_CACHE": "1"}, {"aot_compile": False, "mega_artifact": False}),
        ("0.26.0", "2.12.0.dev20260101", {}, {"aot_compile": True, "mega_artifact": True}),
    ],
)
def test_effective_aot_switches(vllm: str, torch: str, env: dict[str, str], expected: dict[str, bool]) -> None:
    runtime = {"kind": "local", "packages": {"vllm": vllm, "torch": torch}}
    adapter = VllmAdapter(vllm)
    assert VllmAdapter().engine_factors(runtime, env) == {"aot": expected, **adapter.compile_location_factor()}


def test_aot_switches_are_factors_and_docker_adds_none(tmp_path: Path) -> None:
    profile = load_profile(REPO / "profiles" / "vllm-tiny-llama-local.toml")
    profile = dataclasses.replace(profile, model=dataclasses.replace(profile.model, path=str(tmp_path)))

    def config(torch: str) -> Any:
        return resolve(
            profile,
            VllmAdapter(),
            image_resolver=None,
            hardware_probe=lambda spec: {
                "accelerator": "cuda",
                "gpu_count": 1,
                "gpu_name": "H",
                "compute_capability": "9.0",
            },
            environment_probe=lambda python, packages: {
                "python_version": "3.12.3",
                "packages": {"vllm": "0.26.0", "torch": torch, "triton": "3.6.0", "transformers": "5.17.0"},
            },
            model_dir_probe=read_model_dir,
        )

    with_mega, without = config("2.12.0"), config("2.11.0")
    assert with_mega.factors["engine"]["aot"] == {"aot_compile": True, "mega_artifact": True}
    assert without.factors["engine"]["aot"] == {"aot_compile": True, "mega_artifact": False}
    assert with_mega.config_hash != without.config_hash
    # Under Docker the versions are not probed: no AOT switch, but the (nearest) compile locations, which
    # every start's env is built from.
    docker = VllmAdapter().engine_factors({"kind": "docker", "image_id": "sha256:" + "ab" * 32}, {})
    assert docker == VllmAdapter().compile_location_factor()


# --- reuse: the AOT artifact must be loaded from the blessed tree ---------------------------------------------


def _keys(aot_load_paths: list[str]) -> dict[str, Any]:
    return {
        "cache_dirs": [f"{CACHE_MOUNT_PATH}/torch_compile_cache/0123456789/rank_0_0/backbone"],
        "backbone_keys": ["0123456789"],
        "aot_keys": [AOT],
        "ranks": ["rank_0_0"],
        "aot_load_paths": aot_load_paths,
    }


def test_aot_load_inside_the_blessed_tree_is_no_drift() -> None:
    blessed = {"backbone_keys": ["0123456789"], "aot_keys": [AOT], "ranks": ["rank_0_0"]}
    inside = f"{CACHE_MOUNT_PATH}/torch_compile_cache/torch_aot_compile/{AOT}/rank_0_0/model"
    assert VllmAdapter("0.26.0").drift_reasons(blessed, _keys([inside])) == []


def test_aot_load_outside_the_blessed_tree_or_missing_is_drift() -> None:
    blessed = {"backbone_keys": ["0123456789"], "aot_keys": [AOT], "ranks": ["rank_0_0"]}
    outside = f"/root/.cache/vllm/torch_compile_cache/torch_aot_compile/{AOT}/rank_0_0/model"
    reasons = VllmAdapter("0.26.0").drift_reasons(blessed, _keys([outside]))
    assert any("outside the blessed tree" in reason for reason in reasons)
    reasons = VllmAdapter("0.26.0").drift_reasons(blessed, _keys([]))
    assert any("AOT artifact was not loaded" in reason for reason in reasons)


def test_the_version_table_shows_what_is_gpu_proven() -> None:
    text = (REPO / "docs" / "guides" / "vllm.md").read_text()
    table = text[text.index("<!-- vllm-versions:begin -->") : text.index("<!-- vllm-versions:end -->")]
    proven = [v for v in VERSIONS if vllm_versions.all_rules()[v].gpu_proven]
    assert proven, "at least one release is GPU-proven"
    for version in VERSIONS:
        row = next((line for line in table.splitlines() if line.startswith(f"| {version} ")), None)
        if version in proven:
            assert row is not None and "GPU run" in row, version
        elif row is not None:
            assert "GPU run" not in row, version
    assert VERSIONS[0] in table and VERSIONS[-1] in table


# --- real vLLM 0.26 logs (the GPU proof, docs/evidence/vllm-0.26-h100/) -------------------------------------

LOGS = TESTS / "fixtures" / "vllm" / "logs"
AOT_026 = "cd866155bcd9aa9cff0fb164885b5d068527b39d0ffc923bc5b0e6987199dcfa"


def test_real_0_26_cold_log_shows_compile_and_save() -> None:
    signals = VllmAdapter("0.26.0", torch_version="2.11.0").read_log((LOGS / "v0.26.0_cold.log").read_text())
    assert signals.load_markers == () and len(signals.compile_markers) == 3 and signals.fatal_markers == ()
    assert signals.timings["torch_compile_s"] == 15.39 and signals.timings["init_engine_s"] == 30.02
    assert signals.engine_keys["backbone_keys"] == ["b16e54872f"] and signals.engine_keys["aot_keys"] == [AOT_026]


def test_real_0_26_overlay_trial_loads_from_the_blessed_tree() -> None:
    adapter = VllmAdapter("0.26.0", torch_version="2.11.0")
    signals = adapter.read_log((LOGS / "v0.26.0_warm_overlay.log").read_text())
    assert len(signals.load_markers) == 2 and signals.compile_markers == () and signals.fatal_markers == ()
    assert signals.timings["torch_compile_s"] == 0.91 and signals.timings["graph_load_s"] == 0.101
    blessed = {"backbone_keys": ["b16e54872f"], "aot_keys": [AOT_026], "ranks": ["rank_0_0"]}
    assert adapter.drift_reasons(blessed, signals.engine_keys) == []
    assert signals.engine_keys["aot_load_paths"] == [
        f"{CACHE_MOUNT_PATH}/torch_compile_cache/torch_aot_compile/{AOT_026}/rank_0_0/model"
    ]
