"""Tests for bless.core.factors: canonical JSON, the config hash, factor diffs, resolution and hardware facts."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bless import probes as probes_mod
from bless.core.factors import (
    REDACTED,
    FactorChange,
    GpuInfo,
    canonical_json,
    canonicalize,
    change_to_dict,
    config_hash,
    declared_hardware_factor,
    diff_factors,
    parse_config_hash,
    resolve,
)
from bless.core.profile import HardwareSpec, ModelSpec, Profile, load_profile, profile_from_dict
from bless.engines.reference import ReferenceAdapter
from bless.engines.vllm import VllmAdapter
from bless.errors import ExitCode, HardwareMismatchError, InputInvalidError, ResolutionError
from bless.probes import cpu_isa_level, hardware_factor, read_model_dir, resolve_model

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "profiles"
PINNED_IMAGE = "sha256:" + "0123456789abcdef" * 4
HW = {"accelerator": "cpu", "isa": "x86-64-v3"}
HEX40 = "0123456789abcdef0123456789abcdef01234567"

# --- strategies ------------------------------------------------------------------------------------

# Leaves whose canonical form is themselves (no floats: float handling is tested on its own).
exact_leaves = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.text(max_size=12)
keys = st.text(max_size=8)


def nested(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=5),
        max_leaves=12,
    )


factor_dicts = st.dictionaries(keys, nested(exact_leaves), min_size=1, max_size=6)
any_factor_dicts = st.dictionaries(
    keys, nested(exact_leaves | st.floats(allow_nan=False, allow_infinity=False)), min_size=1, max_size=6
)


def reshuffled(value: Any, rng: random.Random) -> Any:
    """The same value with every dict rebuilt in a random key insertion order (lists keep their order)."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: reshuffled(item, rng) for key, item in items}
    if isinstance(value, list):
        return [reshuffled(item, rng) for item in value]
    return value


def dict_paths(value: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths (key tuples) of every dict inside ``value``, reached through dicts only."""
    found = [prefix] if isinstance(value, dict) else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += dict_paths(item, (*prefix, key))
    return found


def leaf_paths(value: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths of every value reached through dicts that is not itself a non-empty dict."""
    found: list[tuple[str, ...]] = []
    for key, item in value.items():
        if isinstance(item, dict) and item:
            found += leaf_paths(item, (*prefix, key))
        else:
            found.append((*prefix, key))
    return found


def get_at(value: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


# --- canonical JSON and the hash --------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(document=any_factor_dicts, seed=st.integers(0, 2**32 - 1))
def test_key_insertion_order_never_changes_canonical_bytes_or_hash(document, seed):
    shuffled = reshuffled(document, random.Random(seed))
    assert canonical_json(shuffled) == canonical_json(document)
    assert config_hash(shuffled) == config_hash(document)
    # The canonical form is sorted, compact JSON that parses back to the canonicalized value.
    text = canonical_json(document).decode("utf-8")
    assert json.loads(text) == canonicalize(document)
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@settings(max_examples=60, deadline=None)
@given(document=factor_dicts, data=st.data())
def test_changing_one_leaf_always_changes_the_hash(document, data):
    path = data.draw(st.sampled_from(leaf_paths(document)), label="leaf")
    old = get_at(document, path)
    replacements = exact_leaves | st.lists(exact_leaves, max_size=3) | st.dictionaries(keys, exact_leaves, max_size=2)
    new = data.draw(replacements.filter(lambda v: canonicalize(v) != canonicalize(old)), label="new")
    changed = copy.deepcopy(document)
    get_at(changed, path[:-1])[path[-1]] = new
    assert config_hash(changed) != config_hash(document)
    assert diff_factors(document, changed) != []


@settings(max_examples=60, deadline=None)
@given(document=factor_dicts, data=st.data())
def test_adding_a_key_anywhere_changes_the_hash(document, data):
    where = data.draw(st.sampled_from(dict_paths(document)), label="dict")
    target_before = get_at(document, where)
    key = data.draw(keys.filter(lambda k: k not in target_before), label="key")
    value = data.draw(exact_leaves | st.dictionaries(keys, exact_leaves, max_size=2), label="value")
    changed = copy.deepcopy(document)
    get_at(changed, where)[key] = value
    assert config_hash(changed) != config_hash(document)


@settings(max_examples=60, deadline=None)
@given(document=factor_dicts, data=st.data())
def test_removing_a_key_anywhere_changes_the_hash(document, data):
    where = data.draw(st.sampled_from([p for p in dict_paths(document) if get_at(document, p)]), label="dict")
    key = data.draw(st.sampled_from(sorted(get_at(document, where))), label="key")
    changed = copy.deepcopy(document)
    del get_at(changed, where)[key]
    assert config_hash(changed) != config_hash(document)


def test_unicode_is_written_as_utf8_not_escaped():
    document = {"modèle": "日本語", "emoji": "🙂"}
    raw = canonical_json(document)
    assert raw == '{"emoji":"🙂","modèle":"日本語"}'.encode()
    assert config_hash(document) == config_hash({"emoji": "🙂", "modèle": "日本語"})


def test_nesting_level_is_part_of_the_identity():
    # Same leaves at a different depth must not collide.
    assert config_hash({"a": {"b": 1}}) != config_hash({"a.b": 1})
    assert config_hash({"a": [1, 2]}) != config_hash({"a": [2, 1]})  # list order matters
    assert config_hash({"a": (1, 2)}) == config_hash({"a": [1, 2]})  # tuples are lists


@settings(max_examples=200, deadline=None)
@given(value=st.floats(allow_nan=False, allow_infinity=False))
def test_floats_become_ints_or_round_tripping_decimal_strings(value):
    out = canonicalize(value)
    if value.is_integer():
        # Integral floats become ints: 2.0 from one TOML parser and 2 from another hash alike.
        assert type(out) is int
        assert out == value
        assert canonical_json({"x": value}) == f'{{"x":{int(value)}}}'.encode()
    else:
        # Other floats become their shortest decimal string; no float formatting enters the JSON.
        assert isinstance(out, str)
        assert float(out) == value
        assert out == repr(value)
        assert canonical_json({"x": value}) == f'{{"x":"{value!r}"}}'.encode()


def test_float_canonical_forms_documented():
    assert canonicalize(0.9) == "0.9"
    assert canonicalize(0.90) == "0.9"
    assert canonicalize(2.0) == 2
    assert canonicalize(-0.0) == 0
    assert canonical_json({"gpu_memory_utilization": 0.9}) == b'{"gpu_memory_utilization":"0.9"}'
    assert config_hash({"x": 2.0}) == config_hash({"x": 2})
    # By design a float and its decimal string are the same factor (floats are written as strings).
    assert config_hash({"x": 0.5}) == config_hash({"x": "0.5"})
    # ... but a bool is never an int.
    assert config_hash({"x": True}) != config_hash({"x": 1})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_rejected(bad):
    with pytest.raises(ValueError, match="NaN and infinity"):
        canonicalize({"a": [1, {"b": bad}]})
    with pytest.raises(ValueError):
        config_hash({"a": bad})


@pytest.mark.parametrize("bad_key", [1, 1.5, None, ("a",), True])
def test_non_string_keys_are_rejected(bad_key):
    with pytest.raises(ValueError, match="keys must be strings"):
        config_hash({"outer": {bad_key: "v"}})


@pytest.mark.parametrize("bad", [{1, 2}, b"bytes", bytearray(b"x"), object(), Path("/x"), 1j, frozenset()])
def test_unsupported_types_are_rejected(bad):
    with pytest.raises(ValueError, match="unsupported factor value type"):
        config_hash({"a": {"b": [bad]}})


# A fixed factor set, written out literally, and its hash computed once and pasted here.
# If this test fails, canonicalization (or the hash) changed: every existing blessing would stop
# matching its profile. That must be a deliberate, versioned change (bump factors_version), never
# an accident. Do not "fix" this test by pasting a new hash without that decision.
PINNED_FACTORS = {
    "factors_version": 1,
    "engine": {"name": "reference", "adapter_version": "1"},
    "runtime": {"kind": "docker", "image_id": "sha256:" + "ab" * 32},
    "model": {
        "source": "huggingface",
        "id": "org/modèle-tiny",
        "revision": "0123456789abcdef0123456789abcdef01234567",
    },
    "serve": {
        "max_num_seqs": 1,
        "gpu_memory_utilization": 0.9,
        "enforce_eager": False,
        "dtype": "bfloat16",
        "compilation_config": {"level": 3, "cudagraph_capture_sizes": [1, 2, 4]},
        "scale": 2.0,
    },
    "env": {"VLLM_USE_V1": "1"},
    "hardware": {
        "accelerator": "cuda",
        "gpu_count": 1,
        "gpu_name": "NVIDIA H200",
        "compute_capability": "9.0",
    },
    "cache": {"mount_path": "/var/cache/bless-engine", "home": "/root", "note": None},
}
PINNED_CANONICAL = (
    '{"cache":{"home":"/root","mount_path":"/var/cache/bless-engine","note":null},'
    '"engine":{"adapter_version":"1","name":"reference"},"env":{"VLLM_USE_V1":"1"},"factors_version":1,'
    '"hardware":{"accelerator":"cuda","compute_capability":"9.0","gpu_count":1,"gpu_name":"NVIDIA H200"},'
    '"model":{"id":"org/modèle-tiny","revision":"0123456789abcdef0123456789abcdef01234567","source":"huggingface"},'
    '"runtime":{"image_id":"sha256:abababababababababababababababababababababababababababababababab","kind":"docker"},'
    '"serve":{"compilation_config":{"cudagraph_capture_sizes":[1,2,4],"level":3},"dtype":"bfloat16",'
    '"enforce_eager":false,"gpu_memory_utilization":"0.9","max_num_seqs":1,"scale":2}}'
)
PINNED_HASH = "0ab1d6b9390f5301559511c849e579f9484df22fff41eb06c8e0d6dd8ed8cef1"


def test_pinned_factor_set_has_a_known_hash():
    assert canonical_json(PINNED_FACTORS) == PINNED_CANONICAL.encode("utf-8")
    assert hashlib.sha256(PINNED_CANONICAL.encode("utf-8")).hexdigest() == PINNED_HASH
    assert config_hash(PINNED_FACTORS) == PINNED_HASH
    # The same set built in another key order (as another code path would) hashes alike.
    assert config_hash(reshuffled(PINNED_FACTORS, random.Random(7))) == PINNED_HASH


# --- diff_factors -----------------------------------------------------------------------------------


def test_diff_one_leaf_describes_before_and_after():
    before = {"serve": {"max_num_seqs": 1, "dtype": "bf16"}, "env": {}}
    after = {"serve": {"max_num_seqs": 2, "dtype": "bf16"}, "env": {}}
    changes = diff_factors(before, after)
    assert changes == [FactorChange("serve.max_num_seqs", 1, 2)]
    assert changes[0].describe() == "serve.max_num_seqs: 1 -> 2"
    assert [c.describe() for c in diff_factors(after, before)] == ["serve.max_num_seqs: 2 -> 1"]


def test_diff_added_and_removed_keys_show_absent():
    before = {"serve": {"a": 1, "gone": "x"}}
    after = {"serve": {"a": 1, "new": [1, 2]}}
    described = [c.describe() for c in diff_factors(before, after)]
    assert described == ['serve.gone: "x" -> (absent)', "serve.new: (absent) -> [1, 2]"]
    removed, added = diff_factors(before, after)
    assert change_to_dict(removed) == {
        "field": "serve.gone",
        "before": "x",
        "after": None,
        "before_absent": False,
        "after_absent": True,
    }
    assert change_to_dict(added)["before_absent"] is True
    assert change_to_dict(added)["after"] == [1, 2]


def test_diff_sorted_by_field_and_floats_canonicalized():
    before = {"z": 1, "a": {"x": 0.5, "y": 2.0}}
    after = {"z": 2, "a": {"x": 0.25, "y": 2}}
    assert [c.describe() for c in diff_factors(before, after)] == ['a.x: "0.5" -> "0.25"', "z: 1 -> 2"]


def test_diff_paths_are_unambiguous():
    # A dotted key and a nested key must not look alike in a diff (the hashes differ, so must the diff).
    changes = diff_factors({"serve": {"a.b": 1}}, {"serve": {"a": {"b": 1}}})
    assert [c.describe() for c in changes] == ['serve."a.b": 1 -> (absent)', "serve.a.b: (absent) -> 1"]
    assert [c.describe() for c in diff_factors({"": None}, {"": {"": None}})] == [
        '"": null -> (absent)',
        '""."": (absent) -> null',
    ]


tricky_keys = st.sampled_from(["", "a", "b", "a.b", '"a"', '""', "."])
tricky = st.recursive(
    st.none() | st.integers(0, 2), lambda c: st.dictionaries(tricky_keys, c, max_size=3), max_leaves=6
)


@settings(max_examples=150, deadline=None)
@given(before=st.dictionaries(tricky_keys, tricky, max_size=3), after=st.dictionaries(tricky_keys, tricky, max_size=3))
def test_diff_is_empty_exactly_when_hashes_match(before, after):
    assert (diff_factors(before, after) == []) == (config_hash(before) == config_hash(after))


@settings(max_examples=40, deadline=None)
@given(document=any_factor_dicts, seed=st.integers(0, 2**32 - 1))
def test_diff_of_identical_sets_is_empty(document, seed):
    assert diff_factors(document, reshuffled(document, random.Random(seed))) == []


# --- resolve() with the reference adapter ----------------------------------------------------------


def base_document(**overrides: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "profile_version": 1,
        "name": "unit",
        "engine": {"name": "reference"},
        "runtime": {"kind": "docker", "image": PINNED_IMAGE},
        "model": {"source": "builtin", "id": "reference-tiny"},
        "serve": {"device": "cpu", "layers": 2},
        "env": {},
        "hardware": {"accelerator": "cpu"},
    }
    document.update(overrides)
    return document


def resolve_doc(document: dict[str, Any], **kwargs: Any):
    kwargs.setdefault("image_resolver", None)
    kwargs.setdefault("hardware_probe", lambda spec: dict(HW))
    return resolve(profile_from_dict(document), ReferenceAdapter(), **kwargs)


def test_resolve_builds_every_factor_group():
    resolved = resolve_doc(base_document())
    factors = resolved.factors
    assert set(factors) == {
        "factors_version",
        "engine",
        "runtime",
        "model",
        "serve",
        "env",
        "hardware",
        "cache",
    }
    assert factors["factors_version"] == 1
    assert factors["engine"] == {"name": "reference", "adapter_version": "1"}
    assert factors["runtime"] == {"kind": "docker", "image_id": PINNED_IMAGE}
    assert factors["model"] == {"source": "builtin", "id": "reference-tiny"}
    assert factors["hardware"] == HW
    assert factors["cache"] == {"mount_path": "/var/cache/bless-engine", "home": "/var/lib/bless-engine/home"}
    assert resolved.config_hash == config_hash(factors)
    assert parse_config_hash(resolved.config_hash.upper()) == resolved.config_hash


def test_resolve_is_deterministic_and_uses_the_hardware_probe():
    one = resolve_doc(base_document())
    two = resolve_doc(base_document())
    assert one.config_hash == two.config_hash
    other = resolve_doc(base_document(), hardware_probe=lambda spec: {"accelerator": "cpu", "isa": "x86-64-v4"})
    assert other.config_hash != one.config_hash


def test_shipped_fixture_profile_resolves_offline():
    resolved = resolve(
        load_profile(FIXTURES / "pinned-cpu.toml"),
        ReferenceAdapter(),
        image_resolver=None,
        hardware_probe=declared_hardware_factor,
    )
    assert resolved.factors["hardware"] == {"accelerator": "cpu", "isa": "x86-64-v3"}
    assert resolved.factors["env"] == {"TORCHINDUCTOR_MAX_AUTOTUNE": "0"}


def test_cache_affecting_env_var_changes_the_hash():
    plain = resolve_doc(base_document())
    with_env = resolve_doc(base_document(env={"TORCHINDUCTOR_MAX_AUTOTUNE": "1"}))
    other_value = resolve_doc(base_document(env={"TORCHINDUCTOR_MAX_AUTOTUNE": "0"}))
    assert with_env.config_hash != plain.config_hash
    assert with_env.config_hash != other_value.config_hash
    assert with_env.factors["env"] == {"TORCHINDUCTOR_MAX_AUTOTUNE": "1"}
    assert dict(with_env.recorded_env) == {}


@pytest.mark.parametrize("name", ["BLESS_LOG_LEVEL", "TORCH_CPP_LOG_LEVEL", "LOG_LEVEL", "PYTHONUNBUFFERED"])
def test_ignored_env_var_is_recorded_but_not_hashed(name):
    plain = resolve_doc(base_document())
    with_log = resolve_doc(base_document(env={name: "DEBUG"}))
    assert with_log.config_hash == plain.config_hash
    assert name not in with_log.factors["env"]
    assert with_log.recorded_env == {name: "DEBUG"}
    assert with_log.to_dict()["ignored_env"] == {name: "DEBUG"}


@pytest.mark.parametrize("name", ["HF_TOKEN", "MY_SECRET", "DB_PASSWORD", "OPENAI_API_KEY", "AWS_ACCESS_KEY"])
def test_secret_env_var_is_neither_hashed_nor_written(name):
    secret = "s3cr3t-value-that-must-not-leak-9f8e7d"
    plain = resolve_doc(base_document())
    with_secret = resolve_doc(base_document(env={name: secret, "TORCHINDUCTOR_X": "1"}))
    with_other_secret = resolve_doc(base_document(env={name: "another", "TORCHINDUCTOR_X": "1"}))
    assert with_secret.config_hash == with_other_secret.config_hash
    assert with_secret.config_hash != plain.config_hash  # the non-secret var still counts
    dumped = json.dumps(with_secret.to_dict(), ensure_ascii=False)
    assert secret not in dumped
    assert secret not in canonical_json(with_secret.factors).decode()
    assert with_secret.recorded_env == {name: REDACTED}
    assert name in dumped  # the name is recorded, so a reader knows it was set


def test_explicit_serve_default_hashes_like_omitted():
    omitted = resolve_doc(base_document(serve={}))
    explicit = resolve_doc(
        base_document(serve={"device": "cpu", "seed": 0, "layers": 2, "d_model": 64, "heads": 4, "compile": True})
    )
    assert explicit.config_hash == omitted.config_hash
    assert explicit.factors["serve"] == omitted.factors["serve"]
    changed = resolve_doc(base_document(serve={"layers": 3}))
    assert changed.config_hash != omitted.config_hash
    assert [c.describe() for c in diff_factors(omitted.factors, changed.factors)] == ["serve.layers: 2 -> 3"]


def test_tag_image_without_resolver_is_a_resolution_error():
    document = base_document(runtime={"kind": "docker", "image": "bless-reference:0.1.0"})
    with pytest.raises(ResolutionError, match="is a tag") as info:
        resolve_doc(document)
    assert info.value.exit_code == ExitCode.RESOLUTION_FAILED and ExitCode.RESOLUTION_FAILED.value == 31
    assert "bless-reference:0.1.0" in info.value.message


def test_tag_image_with_resolver_hashes_the_resolved_id():
    document = base_document(runtime={"kind": "docker", "image": "bless-reference:0.1.0"})
    seen: list[str] = []

    def resolver(ref: str) -> str:
        seen.append(ref)
        return PINNED_IMAGE

    by_tag = resolve_doc(document, image_resolver=resolver)
    by_id = resolve_doc(base_document())
    assert seen == ["bless-reference:0.1.0"]
    assert by_tag.config_hash == by_id.config_hash


def test_local_runtime_needs_an_environment_probe():
    document = base_document(runtime={"kind": "local", "python": "python3"})
    with pytest.raises(ResolutionError, match="environment probe"):
        resolve_doc(document)
    resolved = resolve_doc(
        document,
        environment_probe=lambda python, pkgs: {"python_version": "3.11.7", "packages": {"torch": "2.13"}},
    )
    assert resolved.factors["runtime"] == {
        "kind": "local",
        "python_version": "3.11.7",
        "packages": {"torch": "2.13"},
    }


def test_invalid_serve_fails_before_anything_is_probed():
    def probe(spec):
        raise AssertionError("probed")

    with pytest.raises(InputInvalidError, match=r"serve\.layers"):
        resolve_doc(base_document(serve={"layers": "two"}), hardware_probe=probe)


# --- resolve_model ---------------------------------------------------------------------------------


def test_resolve_model_builtin():
    assert resolve_model(ModelSpec("builtin", "reference-tiny"), where="p", offline=True) == {
        "source": "builtin",
        "id": "reference-tiny",
    }


def test_resolve_model_pinned_revision_offline():
    spec = ModelSpec("huggingface", "org/tiny", revision=HEX40)
    assert resolve_model(spec, where="p", offline=True) == {
        "source": "huggingface",
        "id": "org/tiny",
        "revision": HEX40,
    }


@pytest.mark.parametrize("revision", ["main", None, "v1.0", HEX40.upper(), HEX40[:39]])
def test_resolve_model_unpinned_revision_offline_is_refused(revision):
    spec = ModelSpec("huggingface", "org/tiny", revision=revision)
    with pytest.raises(ResolutionError, match="not a pinned 40-hex commit") as info:
        resolve_model(spec, where="my.toml", offline=True)
    assert info.value.exit_code == 31
    assert "my.toml" in info.value.message


def test_resolve_model_unpinned_revision_with_hf_hub_offline_env(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ResolutionError):
        resolve_model(ModelSpec("huggingface", "org/tiny", revision="main"), where="p", offline=False)


def test_resolve_model_local_dir_hash_follows_content_not_mtime(tmp_path):
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text('{"layers": 2}')
    (model / "sub" / "weights.bin").write_bytes(b"\x00\x01" * 100)
    spec = ModelSpec("local", "my-model", path=str(model))
    first = resolve_model(spec, where="p", offline=True)
    assert first["source"] == "local"
    assert first["id"] == "my-model"
    assert len(first["content_sha256"]) == 64

    # mtime changes alone keep the hash.
    os.utime(model / "config.json", (1_000_000, 1_000_000))
    os.utime(model / "sub" / "weights.bin", (2_000_000, 2_000_000))
    assert resolve_model(spec, where="p", offline=True) == first

    # Same size, different bytes: a new hash.
    (model / "sub" / "weights.bin").write_bytes(b"\x00\x02" * 100)
    second = resolve_model(spec, where="p", offline=True)
    assert second["content_sha256"] != first["content_sha256"]

    # A renamed file is a different model too.
    (model / "config.json").rename(model / "config2.json")
    assert resolve_model(spec, where="p", offline=True)["content_sha256"] != second["content_sha256"]


def test_resolve_model_local_dir_missing(tmp_path):
    spec = ModelSpec("local", "m", path=str(tmp_path / "nope"))
    with pytest.raises(ResolutionError, match="not a directory"):
        resolve_model(spec, where="p", offline=True)


def test_resolve_model_unreadable_local_dir_is_a_resolution_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model file this user cannot read (faked: the tests run as root) is the host's problem, not exit 1."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"w")
    real_open = Path.open

    def refusing_open(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self.name == "weights.bin":
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refusing_open)
    spec = ModelSpec("local", "m", path=str(model))
    with pytest.raises(ResolutionError, match="Permission denied") as info:
        resolve_model(spec, where="p", offline=True)
    assert "weights.bin" in info.value.message


# --- hardware ----------------------------------------------------------------------------------------

V2 = {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}
V3 = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
V4 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


@pytest.mark.parametrize(
    ("flags", "machine", "level"),
    [
        (set(), "x86_64", "x86-64-v1"),
        ({"sse2", "fpu"}, "x86_64", "x86-64-v1"),
        (V2 - {"popcnt"}, "x86_64", "x86-64-v1"),
        (V2, "x86_64", "x86-64-v2"),
        (V2 | V3 - {"fma"}, "x86_64", "x86-64-v2"),
        (V2 | V3, "x86_64", "x86-64-v3"),
        (V2 | V3 | V4, "AMD64", "x86-64-v4"),
        (V3 | V4, "x86_64", "x86-64-v1"),  # levels are cumulative: v4 flags without v2 are v1
        (V2 | V4, "x86_64", "x86-64-v2"),
        (V2 | V3 | V4 - {"avx512vl"}, "x86_64", "x86-64-v3"),
        (V2 | V3 | V4, "aarch64", "aarch64"),
        (set(), "arm64", "aarch64"),
        (V2, "riscv64", "other"),
    ],
)
def test_cpu_isa_level(flags, machine, level):
    assert cpu_isa_level(set(flags), machine) == level


def test_hardware_factor_cpu(monkeypatch):
    monkeypatch.setattr(probes_mod, "cpu_isa_level", lambda: "x86-64-v3")
    assert hardware_factor(HardwareSpec("cpu")) == {"accelerator": "cpu", "isa": "x86-64-v3"}
    assert hardware_factor(HardwareSpec("cpu", cpu_isa="x86-64-v3")) == {
        "accelerator": "cpu",
        "isa": "x86-64-v3",
    }
    with pytest.raises(HardwareMismatchError, match="x86-64-v4") as info:
        hardware_factor(HardwareSpec("cpu", cpu_isa="x86-64-v4"))
    assert info.value.exit_code == ExitCode.HARDWARE_MISMATCH and ExitCode.HARDWARE_MISMATCH.value == 32


def test_hardware_factor_cpu_on_this_machine():
    isa = hardware_factor(HardwareSpec("cpu"))["isa"]
    assert isa in {"x86-64-v1", "x86-64-v2", "x86-64-v3", "x86-64-v4", "aarch64", "other"}
    wrong = "aarch64" if isa != "aarch64" else "x86-64-v1"
    with pytest.raises(HardwareMismatchError):
        hardware_factor(HardwareSpec("cpu", cpu_isa=wrong))


H200 = GpuInfo("NVIDIA H200", "9.0", 143771, 140000)
A100 = GpuInfo("NVIDIA A100-SXM4-80GB", "8.0", 81920, 80000)


def test_hardware_factor_cuda_ok():
    factor = hardware_factor(HardwareSpec("cuda", gpu_count=2, gpu_name="NVIDIA H200"), gpus=[H200, H200, A100])
    assert factor == {
        "accelerator": "cuda",
        "gpu_count": 2,
        "gpu_name": "NVIDIA H200",
        "compute_capability": "9.0",
    }
    assert hardware_factor(HardwareSpec("cuda", compute_capability="9.0"), gpus=[H200])["gpu_count"] == 1


def test_hardware_factor_cuda_too_few_gpus():
    with pytest.raises(HardwareMismatchError, match="needs 2 CUDA GPU") as info:
        hardware_factor(HardwareSpec("cuda", gpu_count=2), gpus=[H200])
    assert info.value.exit_code == 32
    with pytest.raises(HardwareMismatchError, match="has 0"):
        hardware_factor(HardwareSpec("cuda"), gpus=[])


def test_hardware_factor_cuda_declared_name_or_capability_mismatch():
    with pytest.raises(HardwareMismatchError, match="gpu_name='NVIDIA H200'"):
        hardware_factor(HardwareSpec("cuda", gpu_name="NVIDIA H200"), gpus=[A100])
    with pytest.raises(HardwareMismatchError, match=r"compute_capability='9\.0'"):
        hardware_factor(HardwareSpec("cuda", compute_capability="9.0"), gpus=[A100])


def test_hardware_factor_cuda_mixed_gpus_refused():
    with pytest.raises(HardwareMismatchError, match="differ"):
        hardware_factor(HardwareSpec("cuda", gpu_count=2), gpus=[H200, A100])


def test_declared_hardware_factor():
    assert declared_hardware_factor(HardwareSpec("cpu", cpu_isa="aarch64")) == {
        "accelerator": "cpu",
        "isa": "aarch64",
    }
    assert declared_hardware_factor(HardwareSpec("cuda", gpu_name="NVIDIA H200", compute_capability="9.0")) == {
        "accelerator": "cuda",
        "gpu_count": 1,
        "gpu_name": "NVIDIA H200",
        "compute_capability": "9.0",
    }
    # The declared factor and the probed one agree on matching hardware: CI gating sees the same hash.
    spec = HardwareSpec("cuda", gpu_count=1, gpu_name="NVIDIA H200", compute_capability="9.0")
    assert declared_hardware_factor(spec) == hardware_factor(spec, gpus=[H200])


@pytest.mark.parametrize(
    ("spec", "missing"),
    [
        (HardwareSpec("cpu"), "hardware.cpu_isa"),
        (HardwareSpec("cuda", compute_capability="9.0"), "hardware.gpu_name"),
        (HardwareSpec("cuda", gpu_name="NVIDIA H200"), "hardware.compute_capability"),
        (HardwareSpec("cuda"), "hardware.gpu_name, hardware.compute_capability"),
    ],
)
def test_declared_hardware_factor_missing_declarations(spec, missing):
    with pytest.raises(ResolutionError, match="not declared") as info:
        declared_hardware_factor(spec)
    assert missing in info.value.message
    assert info.value.exit_code == 31


@pytest.mark.parametrize("text", ["", "abc", "g" * 64, "0" * 63, "0" * 65])
def test_parse_config_hash_rejects_non_hashes(text):
    with pytest.raises(InputInvalidError):
        parse_config_hash(text)


def test_profile_dataclass_defaults_resolve():
    # An in-memory Profile (no file) resolves too; messages name it by its name.
    profile = Profile(
        name="mem",
        engine="reference",
        runtime_kind="docker",
        model=ModelSpec("builtin", "reference-tiny"),
        image="tag:1",
    )
    with pytest.raises(ResolutionError) as info:
        resolve(profile, ReferenceAdapter(), image_resolver=None, hardware_probe=lambda s: dict(HW))
    assert info.value.message.startswith("mem:")


def test_local_model_path_is_a_factor_on_the_local_runtime(tmp_path: Path) -> None:
    """Engines hash the model path they see (vLLM's ModelConfig does); on the local runtime that is the host path."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")

    def resolved_for(path: Path) -> Any:
        profile = Profile(
            name="local-model",
            engine="reference",
            runtime_kind="local",
            python="python3",
            model=ModelSpec(source="local", id="tiny", path=str(path)),
        )
        return resolve(
            profile,
            ReferenceAdapter(),
            image_resolver=None,
            hardware_probe=lambda spec: {"accelerator": "cpu", "isa": "x86-64-v3"},
            environment_probe=lambda python, packages: {"python_version": "3.12.3", "packages": {"torch": "2.11.0"}},
            model_dir_probe=read_model_dir,
        )

    a, b = resolved_for(tmp_path / "a"), resolved_for(tmp_path / "b")
    assert a.factors["model"]["content_sha256"] == b.factors["model"]["content_sha256"]
    assert a.factors["model"]["path"] == str((tmp_path / "a").resolve())
    assert a.config_hash != b.config_hash
    assert [change.field for change in diff_factors(a.factors, b.factors)] == ["model.path"]


# --- what vLLM's own key misses, bless's hash keys apart -------------------------------------------------------


def vllm_profile(**serve: Any) -> Profile:
    """A Docker vLLM profile that resolves offline (pinned image ID and revision, declared GPU)."""
    return profile_from_dict(
        {
            "profile_version": 1,
            "name": "vllm-mm",
            "engine": {"name": "vllm"},
            "runtime": {"kind": "docker", "image": PINNED_IMAGE},
            "model": {"source": "huggingface", "id": "org/vl-model", "revision": HEX40, "hf_home": "/srv/hf"},
            "serve": {"max_model_len": 4096, **serve},
            "hardware": {"accelerator": "cuda", "gpu_name": "NVIDIA H200", "compute_capability": "9.0"},
        }
    )


def vllm_resolved(**serve: Any) -> Any:
    return resolve(vllm_profile(**serve), VllmAdapter(), image_resolver=None, hardware_probe=declared_hardware_factor)


NGRAM = {"method": "ngram", "prompt_lookup_max": 4}


@pytest.mark.parametrize(
    ("before", "after", "field"),
    [
        # vllm#50891: vLLM's compile key ignores limit_mm_per_prompt.
        (
            {"limit_mm_per_prompt": {"image": 1}},
            {"limit_mm_per_prompt": {"image": 2}},
            "serve.limit_mm_per_prompt.image",
        ),
        (
            {"limit_mm_per_prompt": {"image": 1}},
            {"limit_mm_per_prompt": {"image": 1, "video": 0}},
            "serve.limit_mm_per_prompt.video",
        ),
        (
            {"limit_mm_per_prompt": {"image": {"count": 1, "width": 512}}},
            {"limit_mm_per_prompt": {"image": {"count": 1, "width": 1024}}},
            "serve.limit_mm_per_prompt.image.width",
        ),
        # vllm#53366: vLLM's compile key ignores speculative_config.num_speculative_tokens.
        (
            {"speculative_config": {**NGRAM, "num_speculative_tokens": 3}},
            {"speculative_config": {**NGRAM, "num_speculative_tokens": 5}},
            "serve.speculative_config.num_speculative_tokens",
        ),
    ],
)
def test_vllm_args_its_own_key_misses_change_the_config_hash(
    before: dict[str, Any], after: dict[str, Any], field: str
) -> None:
    a, b = vllm_resolved(**before), vllm_resolved(**after)
    assert a.config_hash != b.config_hash
    changes = diff_factors(a.factors, b.factors)
    assert [change.field for change in changes] == [field]
    assert change_to_dict(changes[0])["field"] == field


def test_vllm_table_args_are_canonical_and_reach_the_engine() -> None:
    """Key order is not configuration: the same tables hash alike and render the same argv."""
    spec = {"num_speculative_tokens": 3, "method": "ngram", "prompt_lookup_max": 4}
    one = vllm_resolved(limit_mm_per_prompt={"video": 1, "image": 2}, speculative_config=spec)
    other = vllm_resolved(
        limit_mm_per_prompt={"image": 2, "video": 1}, speculative_config=dict(reversed(list(spec.items())))
    )
    assert one.config_hash == other.config_hash
    assert one.factors["serve"]["speculative_config"]["num_speculative_tokens"] == 3
    command = VllmAdapter().launch(one, port=8000).command
    assert command[command.index("--limit-mm-per-prompt") + 1] == '{"image":2,"video":1}'
    assert command[command.index("--speculative-config") + 1] == (
        '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}'
    )


@pytest.mark.parametrize(
    ("extra", "table"),
    [
        (["--speculative-config", '{"num_speculative_tokens": 3}'], "speculative_config"),
        (['-sc={"num_speculative_tokens": 3}'], "speculative_config"),
        (["--speculative-config.num_speculative_tokens", "3"], "speculative_config"),
        (['--limit-mm-per-prompt={"image": 2}'], "limit_mm_per_prompt"),
        (["--limit-mm-per-prompt.image", "2"], "limit_mm_per_prompt"),
    ],
)
def test_vllm_table_args_are_refused_in_extra_args(extra: list[str], table: str) -> None:
    """In extra_args they would hash as one opaque list: a diff could not name the leaf that changed."""
    with pytest.raises(InputInvalidError, match="is not allowed here") as info:
        vllm_resolved(extra_args=extra)
    assert info.value.hint == f"use the serve.{table} table instead"


@pytest.mark.parametrize(
    ("serve", "message"),
    [
        ({"speculative_config": {"num_speculative_tokens": 0}}, "num_speculative_tokens: expected a positive integer"),
        ({"speculative_config": {"num_speculative_tokens": True}}, "num_speculative_tokens: expected a positive"),
        ({"speculative_config": "ngram"}, "speculative_config: expected a table"),
        ({"limit_mm_per_prompt": {"image": -1}}, r"limit_mm_per_prompt\.image: expected a non-negative integer"),
        ({"limit_mm_per_prompt": {"image": {"count": "2"}}}, r"image\.count: expected a non-negative integer"),
    ],
)
def test_vllm_table_args_are_checked(serve: dict[str, Any], message: str) -> None:
    with pytest.raises(InputInvalidError, match=message):
        vllm_resolved(**serve)
