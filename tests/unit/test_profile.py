"""Tests for bless.core.profile: shipped profiles load; bad input is an InputInvalidError naming file + field."""

from __future__ import annotations

import copy
import math
import re
import tomllib
from datetime import date, datetime, time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bless.core.profile import (
    DEFAULT_PROMPTS,
    MAX_PROFILE_BYTES,
    HardwareSpec,
    ModelSpec,
    Profile,
    TrialSettings,
    load_profile,
    profile_from_dict,
)
from bless.core.schemas import validator
from bless.engines.reference import ReferenceAdapter
from bless.errors import ExitCode, InputInvalidError
from tests.support.resolving import resolved_offline

ROOT = Path(__file__).resolve().parent.parent.parent
SHIPPED = sorted((ROOT / "profiles").glob("*.toml"))
FIXTURE = ROOT / "tests" / "fixtures" / "profiles" / "pinned-cpu.toml"


def base() -> dict[str, Any]:
    return tomllib.loads(FIXTURE.read_text(encoding="utf-8"))


def write(tmp_path: Path, text: str | bytes, name: str = "bad.toml") -> Path:
    path = tmp_path / name
    if isinstance(text, str):
        path.write_text(text, encoding="utf-8")
    else:
        path.write_bytes(text)
    return path


def dump_toml(document: dict[str, Any]) -> str:
    """A tiny TOML writer for the shapes profiles use (top-level scalars + one level of tables)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(type(v))

    lines = [f"{k} = {value(v)}" for k, v in document.items() if not isinstance(v, dict)]
    for k, v in document.items():
        if isinstance(v, dict):
            lines.append(f"\n[{k}]")
            lines += [f"{kk} = {value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


def invalid(path: Path) -> InputInvalidError:
    with pytest.raises(InputInvalidError) as info:
        load_profile(path)
    error = info.value
    assert error.exit_code == ExitCode.INPUT_INVALID and ExitCode.INPUT_INVALID.value == 3
    assert str(path) in error.message, "the message must name the file"
    assert error.diagnostics().startswith("invalid input: ")
    return error


# --- the shipped profiles ----------------------------------------------------------------------------


def test_there_are_shipped_profiles():
    names = {p.name for p in SHIPPED}
    assert "reference-cpu.toml" in names  # the embedded default


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_profile_loads_and_its_serve_args_are_valid(path):
    profile = load_profile(path)
    assert profile.name == path.stem
    assert profile.path == path
    assert profile.label == str(path)
    assert profile.engine in ("reference", "vllm")
    if profile.engine == "reference":
        serve = ReferenceAdapter().normalize_serve(profile.serve, where=profile.label)
        assert serve["device"] in ("cpu", "cuda")
        assert profile.hardware.accelerator == serve["device"]
        assert ReferenceAdapter().unsafe_settings(resolved_offline(profile, ReferenceAdapter())) == []
    if profile.runtime_kind == "docker":
        assert profile.image
    assert profile.trials.count >= 1
    assert profile.trials.repeats >= 2


@pytest.mark.parametrize(
    ("name", "ranks", "shape"),
    [
        ("vllm-0.26-llama-3.1-8b-dummy-tp2-local", 2, "llama-3.1-8b"),
        ("vllm-0.26-llama-3.1-70b-dummy-tp4-local", 4, "llama-3.1-70b"),
    ],
)
def test_tensor_parallel_profiles_declare_one_gpu_per_rank(name: str, ranks: int, shape: str) -> None:
    """The TP profiles of issue 26: one GPU per rank, the product declared (gate on CPU), dummy weights."""
    profile = load_profile(ROOT / "profiles" / f"{name}.toml")
    assert profile.serve["tensor_parallel_size"] == ranks == profile.hardware.gpu_count
    assert profile.hardware.gpu_name and profile.hardware.compute_capability
    assert profile.serve["extra_args"] == ["--load-format", "dummy"]
    assert profile.model.path == f"/tmp/models/{shape}"


def test_the_70b_shape_is_llama_3_1_70b() -> None:
    """scripts/gpu/make_vllm_model.py writes the published Llama-3.1-70B config (issue 26)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_vllm_model", ROOT / "scripts" / "gpu" / "make_vllm_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shape = module.SHAPES["llama-3.1-70b"]
    assert {key: shape[key] for key in ("num_hidden_layers", "hidden_size", "num_attention_heads")} == {
        "num_hidden_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
    }
    assert (shape["num_key_value_heads"], shape["intermediate_size"], shape["vocab_size"]) == (8, 28672, 128256)
    assert shape["num_attention_heads"] % 4 == 0 and shape["num_key_value_heads"] % 4 == 0  # splits over TP=4


def test_reference_cpu_profile_values():
    profile = load_profile(ROOT / "profiles" / "reference-cpu.toml")
    assert profile.runtime_kind == "docker"
    assert profile.image == "bless-reference:0.1.0"
    assert profile.model == ModelSpec(source="builtin", id="reference-tiny")
    assert profile.hardware == HardwareSpec(accelerator="cpu")
    assert profile.cache_mount == "overlay"
    assert profile.trials == TrialSettings(
        count=3,
        repeats=3,
        max_tokens=12,
        concurrent=True,
        prompts=("The compiled cache is", "Replay coherence means", "A blessed artifact"),
        ready_timeout_s=300,
        request_timeout_s=60,
        stop_timeout_s=30,
    )
    assert profile.serving_host == "127.0.0.1"
    assert profile.serving_port == 8000
    assert dict(profile.env) == {}


def schema_defaults(schema: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every (field path, default) the profile schema states, tables' own included."""
    found = []
    for name, field in schema.get("properties", {}).items():
        if "default" in field:
            found.append(((*prefix, name), field["default"]))
        found += schema_defaults(field, (*prefix, name))
    return found


PROFILE_SCHEMA = validator("profile.v1").schema
STATED_DEFAULTS = schema_defaults(PROFILE_SCHEMA)
MINIMAL: dict[str, Any] = {
    "profile_version": 1,
    "name": "minimal",
    "engine": {"name": "reference"},
    "runtime": {"kind": "local"},
    "model": {"source": "builtin", "id": "reference-tiny"},
}


def test_minimal_profile_gets_defaults():
    profile = profile_from_dict(MINIMAL)
    assert profile == Profile(
        name="minimal", engine="reference", runtime_kind="local", model=ModelSpec("builtin", "reference-tiny")
    )
    assert profile.trials.prompts == DEFAULT_PROMPTS
    assert profile.label == "minimal"
    assert profile.hardware.accelerator == "cpu"


@pytest.mark.parametrize(("path", "default"), STATED_DEFAULTS, ids=[".".join(path) for path, _ in STATED_DEFAULTS])
def test_each_default_the_schema_states_is_the_one_the_loader_applies(path, default):
    """One fact in two forms (the reference page shows the schema's): writing the default changes nothing."""
    document = copy.deepcopy(MINIMAL)
    table = document
    for name in path[:-1]:
        table = table.setdefault(name, {})
    table[path[-1]] = default
    assert profile_from_dict(document) == profile_from_dict(MINIMAL)


def test_the_schema_states_every_trial_settings_default() -> None:
    fields = PROFILE_SCHEMA["properties"]["trials"]["properties"]
    stated = {name: field.get("default") for name, field in fields.items()}
    settings = {
        name: list(value) if isinstance(value, tuple) else value for name, value in vars(TrialSettings()).items()
    }
    assert stated == settings


# --- malformed files ---------------------------------------------------------------------------------


def test_truncated_toml(tmp_path):
    text = FIXTURE.read_text(encoding="utf-8")
    cut = text.index("[serve]") + len("[ser")
    error = invalid(write(tmp_path, text[:cut]))
    assert "not valid TOML" in error.message


def test_truncated_inside_a_string(tmp_path):
    text = FIXTURE.read_text(encoding="utf-8")
    cut = text.index('"reference-tiny"') + 5
    assert "not valid TOML" in invalid(write(tmp_path, text[:cut])).message


def test_a_string_left_open_at_a_line_end_is_said_in_words(tmp_path):
    # tomllib says "Illegal character '\\n'": shown escaped, the operator read a literal backslash-n.
    error = invalid(write(tmp_path, 'name = "reference-tiny\n'))
    assert "not valid TOML" in error.message
    assert "\\" not in error.message and "\n" not in error.message
    assert "line break" in error.message and "line 1" in error.message


def test_truncated_at_a_table_boundary_names_the_missing_field(tmp_path):
    # Cut right before [model]: valid TOML, but the required table is gone.
    text = FIXTURE.read_text(encoding="utf-8")
    error = invalid(write(tmp_path, text[: text.index("[model]")]))
    assert "'model' is a required property" in error.message


@pytest.mark.parametrize(
    "raw",
    [b'name = "caf\xe9"\n', b"\xff\xfeprofile_version = 1\n", b"x = 1\n\x80\x80"],
    ids=["latin1", "bom16", "junk"],
)
def test_not_utf8(tmp_path, raw):
    assert "not UTF-8" in invalid(write(tmp_path, raw)).message


def test_missing_file_and_directory(tmp_path):
    assert "no such profile file" in invalid(tmp_path / "nope.toml").message
    directory = tmp_path / "dir.toml"
    directory.mkdir()
    assert "is a directory, not a regular file" in invalid(directory).message


def test_huge_file_refused_before_reading(tmp_path):
    text = FIXTURE.read_text(encoding="utf-8")
    padding = "# " + "x" * 100 + "\n"
    big = text + padding * (MAX_PROFILE_BYTES // len(padding) + 1)
    assert len(big.encode()) > MAX_PROFILE_BYTES
    error = invalid(write(tmp_path, big))
    assert f"over the {MAX_PROFILE_BYTES} bytes it may be" in error.message
    # Just under the limit is fine: the limit is on size, not on comments.
    ok = text + padding * ((MAX_PROFILE_BYTES - len(text)) // len(padding))
    assert len(ok.encode()) <= MAX_PROFILE_BYTES
    assert load_profile(write(tmp_path, ok, "ok.toml")).name == "pinned-cpu"


def test_deeply_nested_toml_is_input_invalid(tmp_path):
    # tomllib parses nested arrays recursively; a deep nest must not escape as RecursionError.
    depth = 5000
    error = invalid(write(tmp_path, "x = " + "[" * depth + "]" * depth + "\n"))
    assert "nested too deeply" in error.message or "not valid TOML" in error.message


def mutated(mutation) -> dict[str, Any]:
    document = base()
    mutation(document)
    return document


# (mutation, fields and words the message must contain)
SCHEMA_CASES = {
    "unknown-top-level-key": (lambda d: d.update(colour="blue"), ["(top level)", "'colour' was unexpected"]),
    "unknown-engine": (lambda d: d["engine"].update(name="sglang"), ["engine.name", "'sglang'"]),
    "missing-engine-name": (lambda d: d["engine"].pop("name"), ["engine", "'name' is a required property"]),
    "unknown-runtime-key": (lambda d: d["runtime"].update(gpus="all"), ["runtime", "'gpus' was unexpected"]),
    "runtime-kind-wrong-type": (lambda d: d["runtime"].update(kind=1), ["runtime.kind"]),
    "docker-without-image": (lambda d: d["runtime"].pop("image"), ["runtime.image", "required"]),
    "local-with-image": (lambda d: d["runtime"].update(kind="local"), ["runtime.image", "local runtime"]),
    "empty-image": (lambda d: d["runtime"].update(image=""), ["runtime.image"]),
    "model-path-without-local": (lambda d: d["model"].update(path="/models/x"), ["model.path", "'local'"]),
    "local-model-without-path": (lambda d: d["model"].update(source="local"), ["model.path", "required"]),
    "builtin-with-revision": (lambda d: d["model"].update(revision="main"), ["model.revision", "builtin"]),
    "unknown-model-source": (lambda d: d["model"].update(source="s3"), ["model.source", "'s3'"]),
    "profile-version-2": (lambda d: d.update(profile_version=2), ["profile_version", "1 was expected"]),
    "profile-version-missing": (lambda d: d.pop("profile_version"), ["'profile_version' is a required"]),
    "bad-name": (lambda d: d.update(name="../etc"), ["name", "'../etc'"]),
    "env-int-value": (lambda d: d["env"].update(MAX_JOBS=4), ["env.MAX_JOBS", "not of type 'string'"]),
    "env-bool-value": (lambda d: d["env"].update(FLAG=True), ["env.FLAG", "not of type 'string'"]),
    "env-bad-name-dash": (lambda d: d["env"].update({"BAD-NAME": "1"}), ["env", "'BAD-NAME'"]),
    "env-bad-name-digit": (lambda d: d["env"].update({"1ABC": "1"}), ["env", "'1ABC'"]),
    "env-not-a-table": (lambda d: d.update(env="FOO=1"), ["env", "not of type 'object'"]),
    "trials-count-string": (
        lambda d: d["trials"].update(count="3"),
        ["trials.count", "not of type 'integer'"],
    ),
    "trials-repeats-one": (lambda d: d["trials"].update(repeats=1), ["trials.repeats", "minimum"]),
    "trials-no-prompts": (lambda d: d["trials"].update(prompts=[]), ["trials.prompts"]),
    "trials-empty-prompt": (lambda d: d["trials"].update(prompts=[""]), ["trials.prompts.0"]),
    "trials-unknown-key": (lambda d: d["trials"].update(seeds=3), ["trials", "'seeds' was unexpected"]),
    "hardware-bad-accelerator": (lambda d: d["hardware"].update(accelerator="tpu"), ["hardware.accelerator"]),
    "hardware-gpu-count-zero": (lambda d: d["hardware"].update(gpu_count=0), ["hardware.gpu_count"]),
    "hardware-bad-isa": (lambda d: d["hardware"].update(cpu_isa="x86-64-v9"), ["hardware.cpu_isa"]),
    "hardware-bad-cc": (
        lambda d: d["hardware"].update(compute_capability="sm90"),
        ["hardware.compute_capability"],
    ),
    "cache-bad-mount": (lambda d: d["cache"].update(mount="bind"), ["cache.mount", "'bind'"]),
    "serving-port-zero": (lambda d: d["serving"].update(port=0), ["serving.port"]),
    "serving-port-string": (lambda d: d["serving"].update(port="8000"), ["serving.port"]),
    "serve-not-a-table": (lambda d: d.update(serve="layers=2"), ["serve", "not of type 'object'"]),
}


@pytest.mark.parametrize("case", sorted(SCHEMA_CASES))
def test_malformed_profile_names_file_and_field(tmp_path, case):
    mutation, needles = SCHEMA_CASES[case]
    path = write(tmp_path, dump_toml(mutated(mutation)), f"{case}.toml")
    error = invalid(path)
    for needle in needles:
        assert needle in error.message, f"{needle!r} not in {error.message!r}"
    # The same document given as a dict names the source passed in.
    with pytest.raises(InputInvalidError) as info:
        profile_from_dict(mutated(mutation), source=Path("/somewhere/p.toml"))
    assert info.value.message.startswith("/somewhere/p.toml: ")


def test_schema_errors_carry_details():
    with pytest.raises(InputInvalidError) as info:
        profile_from_dict(mutated(lambda d: d.update(profile_version=2, colour="x")), source=Path("p.toml"))
    assert info.value.details["file"] == "p.toml"
    assert len(info.value.details["errors"]) == 2
    assert info.value.hint and "profile.v1.json" in info.value.hint


def test_dict_without_source_is_named_profile():
    with pytest.raises(InputInvalidError) as info:
        profile_from_dict(mutated(lambda d: d.update(colour="x")))
    assert info.value.message.startswith("profile: ")


@pytest.mark.parametrize(
    ("serve", "field", "words"),
    [
        ({"layers": "two"}, "serve.layers", "expected int"),
        ({"layers": 2.0}, "serve.layers", "expected int"),
        ({"layers": True}, "serve.layers", "expected int"),
        ({"layers": 0}, "serve.layers", "outside 1..16"),
        ({"device": "tpu"}, "serve.device", "not one of"),
        ({"compile": "yes"}, "serve.compile", "expected bool"),
        ({"tensor_parallel_size": 2}, "serve.tensor_parallel_size", "not an argument"),
    ],
)
def test_serve_args_are_validated_by_the_adapter(tmp_path, serve, field, words):
    document = base()
    document["serve"].update(serve)
    path = write(tmp_path, dump_toml(document))
    profile = load_profile(path)  # the schema leaves serve to the adapter ...
    with pytest.raises(InputInvalidError) as info:
        ReferenceAdapter().normalize_serve(profile.serve, where=profile.label)  # ... which names file + field
    assert info.value.message.startswith(f"{path}: {field}")
    assert words in info.value.message
    assert info.value.exit_code == 3


@pytest.mark.parametrize("where", ["trials.ready_timeout_s", "hardware.min_gpu_memory_gib", "serve.scale"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_refused(tmp_path, where, bad):
    # NaN slips through JSON Schema bounds (every comparison is false): a NaN ready timeout would never
    # expire, and NaN/inf cannot be hashed as a factor. TOML spells them nan / inf.
    table, key = where.split(".")
    document = base()
    document[table][key] = bad
    text = dump_toml(document)
    assert f"{key} = {bad!r}" in text
    error = invalid(write(tmp_path, text))
    assert where in error.message
    if math.isnan(bad):  # the schema cannot see NaN; the profile loader must
        assert "nan is not a finite number" in error.message


# --- hypothesis: nothing but InputInvalidError ever escapes ------------------------------------------

toml_scalars = (
    st.text(max_size=10)
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats()
    | st.booleans()
    | st.dates()
    | st.datetimes()
    | st.times()
)
toml_values = st.recursive(
    toml_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)
profile_keys = st.sampled_from(
    [
        "profile_version",
        "name",
        "description",
        "engine",
        "runtime",
        "model",
        "serve",
        "env",
        "hardware",
        "cache",
        "trials",
        "serving",
        "kind",
        "image",
        "source",
        "id",
        "path",
        "revision",
        "count",
        "prompts",
    ]
)


def paths_of(value: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths_of(item, (*prefix, key))
    return found


def check_only_input_invalid(document: Any) -> None:
    try:
        profile = profile_from_dict(document, source=Path("fuzz.toml"))
    except InputInvalidError as exc:
        assert exc.message.startswith("fuzz.toml: ")
        assert exc.exit_code == 3
        return
    # Accepted: it must be a well-formed Profile.
    assert isinstance(profile, Profile)
    assert profile.runtime_kind in ("docker", "local")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_profiles_only_raise_input_invalid(data):
    document = base()
    path = data.draw(st.sampled_from(paths_of(document)), label="path")
    action = data.draw(st.sampled_from(["replace", "add", "delete"]), label="action")
    if not path:
        document = data.draw(st.dictionaries(profile_keys | st.text(max_size=5), toml_values, max_size=6))
    else:
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        if action == "delete":
            del parent[path[-1]]
        elif action == "add" and isinstance(parent[path[-1]], dict):
            parent[path[-1]][data.draw(profile_keys | st.text(max_size=5))] = data.draw(toml_values)
        else:
            parent[path[-1]] = data.draw(toml_values)
    check_only_input_invalid(document)


@settings(max_examples=60, deadline=None)
@given(document=st.dictionaries(profile_keys, toml_values, max_size=8))
def test_garbage_dicts_only_raise_input_invalid(document):
    check_only_input_invalid(copy.deepcopy(document))


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(max_size=300))
def test_garbage_bytes_only_raise_input_invalid(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("fuzz") / "p.toml"
    path.write_bytes(raw)
    try:
        load_profile(path)
    except InputInvalidError as exc:
        assert str(path) in exc.message
    else:  # pragma: no cover - random bytes are never a valid profile
        raise AssertionError("garbage accepted")


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(min_value=0, max_value=2000), junk=st.binary(max_size=20))
def test_damaged_real_profile_only_raises_input_invalid(tmp_path_factory, cut, junk):
    raw = FIXTURE.read_bytes()
    damaged = raw[: cut % len(raw)] + junk
    path = tmp_path_factory.mktemp("damaged") / "p.toml"
    path.write_bytes(damaged)
    try:
        profile = load_profile(path)
    except InputInvalidError as exc:
        assert str(path) in exc.message
    else:
        assert profile.name  # some cuts leave a valid profile (e.g. only optional tables lost)


def test_toml_dates_are_rejected_with_the_field():
    for value in (date(2024, 1, 1), datetime(2024, 1, 1, 12, 0), time(12, 0)):
        with pytest.raises(InputInvalidError, match=r"name"):
            profile_from_dict(mutated(lambda d, v=value: d.update(name=v)))


def test_the_shipped_profiles_point_to_sections_that_exist() -> None:
    """A comment saying where to read more (``docs/....md, "Heading"``) names a page and a heading that exist."""
    pointer = re.compile(r'(docs/[\w./-]+\.md), "([^"]+)"')
    found = 0
    for profile in sorted((ROOT / "profiles").glob("*.toml")):
        text = " ".join(line.lstrip("# ").strip() for line in profile.read_text().splitlines())
        assert 'README, "' not in text, f"{profile.name} points to a README section"
        for page, heading in pointer.findall(text):
            found += 1
            headings = [
                line.lstrip("#").strip() for line in (ROOT / page).read_text().splitlines() if line.startswith("#")
            ]
            assert any(h.startswith(heading) for h in headings), f"{profile.name}: no {heading!r} in {page}"
    assert found >= 3
