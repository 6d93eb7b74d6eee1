"""Tests for bless.core.manifest: a real round trip, and every malformed manifest is a ManifestInvalidError."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bless.core import manifest as manifest_mod
from bless.core.factors import config_hash
from bless.core.manifest import (
    SCHEMA_VERSION,
    Manifest,
    cache_tree_from_listing,
    default_provenance,
    load_manifest,
    manifest_from_dict,
    new_dir_id,
    tree_sha256,
    validate_document,
)
from bless.core.schemas import listing_conforms, schema_errors, validator
from bless.core.verify import FileEntry, TreeListing, hash_tree
from bless.errors import ExitCode, ManifestInvalidError
from bless.system.clock import utc_now
from tests.unit.store_helpers import mutate_json

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "manifests"
KEY = "0123456789abcdef"
MOUNT = "/var/cache/bless-engine"
FACTORS: dict[str, Any] = {
    "factors_version": 1,
    "engine": {"name": "reference", "adapter_version": "1"},
    "runtime": {"kind": "docker", "image_id": "sha256:" + "ab" * 32},
    "model": {"source": "builtin", "id": "reference-tiny"},
    "serve": {
        "device": "cpu",
        "seed": 0,
        "layers": 2,
        "d_model": 64,
        "heads": 4,
        "max_seq_len": 64,
        "compile": True,
        "served_model_name": "reference-tiny",
    },
    "env": {"TORCHINDUCTOR_MAX_AUTOTUNE": "0"},
    "hardware": {"accelerator": "cpu", "isa": "x86-64-v3"},
    "cache": {"mount_path": MOUNT, "home": "/root"},
}


def build_tree(root: Path) -> Path:
    (root / "reference" / KEY).mkdir(parents=True)
    (root / "reference" / KEY / "megacache.bin").write_bytes(bytes(range(256)) * 40)
    (root / "reference" / KEY / "meta.json").write_text('{"torch": "2.13.0"}\n')
    (root / "logs").mkdir()
    (root / "logs" / "README").write_text("bootstrap notes\n")
    (root / "empty").mkdir()
    return root


def build_manifest(tmp_path: Path) -> Manifest:
    listing = hash_tree(build_tree(tmp_path / "cache"))
    return Manifest(
        config_hash=config_hash(FACTORS),
        factors=FACTORS,
        created=utc_now(),
        tool_version="0.1.0",
        profile_name="reference-cpu",
        cache=cache_tree_from_listing(listing, mount_path=MOUNT),
        artifacts={
            "items": [f"reference/{KEY}/megacache.bin", f"reference/{KEY}/meta.json"],
            "engine_keys": {"artifact_keys": [KEY]},
        },
        trials={
            "planned": 1,
            "passed": 1,
            "failure_rate_bound": {"confidence": 0.95, "max_failure_rate": 0.95},
            "results": [{"index": 1, "passed": True, "reasons": [], "reuse": {"load_markers": 1}}],
        },
        golden=[
            {
                "prompt": "The compiled cache is",
                "max_tokens": 4,
                "text": " ok.",
                "token_ids": [32, 111, 107, 46],
            }
        ],
        provenance=default_provenance("docker", run_id="r-1", image_id=FACTORS["runtime"]["image_id"]),
    )


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Manifest:
    # Built once from a real tree; Manifest is frozen, so tests can share it.
    return build_manifest(tmp_path_factory.mktemp("manifest"))


@pytest.fixture
def document(manifest) -> dict[str, Any]:
    """A fresh, mutable copy of the valid document for each test."""
    document: dict[str, Any] = json.loads(manifest.to_json_bytes())
    return document


def write_json(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def refused(path: Path) -> ManifestInvalidError:
    with pytest.raises(ManifestInvalidError) as info:
        load_manifest(path)
    error = info.value
    assert error.exit_code == ExitCode.MANIFEST_INVALID and ExitCode.MANIFEST_INVALID.value == 22
    assert str(path) in error.message, "the message must name the file"
    assert error.diagnostics().startswith("invalid manifest: ")
    return error


# --- the happy path ----------------------------------------------------------------------------------


def test_round_trip_through_a_file(tmp_path, manifest):
    raw = manifest.to_json_bytes()
    assert raw.endswith(b"}\n")
    path = tmp_path / "manifest.json"
    path.write_bytes(raw)
    loaded = load_manifest(path)
    assert loaded == manifest
    assert loaded.to_json_bytes() == raw  # stable serialization
    assert loaded.engine == "reference"
    assert loaded.model_label == "reference-tiny"
    assert loaded.cache.total_size == sum(f.size for f in loaded.cache.files) == 256 * 40 + 20 + 16
    assert [f.path for f in loaded.cache.files] == [
        "logs/README",
        f"reference/{KEY}/megacache.bin",
        f"reference/{KEY}/meta.json",
    ]
    assert loaded.cache.dirs == ("empty", "logs", "reference", f"reference/{KEY}")


def test_document_shape(document, manifest):
    assert document["schema_version"] == SCHEMA_VERSION == 1
    assert document["tool"] == {"name": "bless", "version": "0.1.0"}
    assert document["config_hash"] == config_hash(document["factors"]) == manifest.config_hash
    assert document["cache"]["tree_sha256"] == tree_sha256(manifest.cache.files, manifest.cache.dirs)
    assert document["cache"]["dir_id"].endswith("-" + document["cache"]["tree_sha256"][:12])
    assert document["provenance"]["runtime"] == "docker"
    assert "host" in document["provenance"]


def test_factors_are_written_canonically(tmp_path):
    # Floats in factors are written as their canonical decimal strings; the hash still matches on read.
    factors = copy.deepcopy(FACTORS)
    factors["serve"]["gpu_memory_utilization"] = 0.9
    base = build_manifest(tmp_path)
    manifest = Manifest(**{**base.__dict__, "factors": factors, "config_hash": config_hash(factors)})
    document = json.loads(manifest.to_json_bytes())
    assert document["factors"]["serve"]["gpu_memory_utilization"] == "0.9"
    path = tmp_path / "m.json"
    path.write_bytes(manifest.to_json_bytes())
    assert load_manifest(path).config_hash == config_hash(factors)


def test_model_label_uses_revision_prefix(tmp_path):
    factors = copy.deepcopy(FACTORS)
    factors["model"] = {
        "source": "huggingface",
        "id": "org/m",
        "revision": "0123456789abcdef" * 2 + "01234567",
    }
    base = build_manifest(tmp_path)
    manifest = Manifest(**{**base.__dict__, "factors": factors, "config_hash": config_hash(factors)})
    assert manifest.model_label == "org/m@0123456789ab"


def test_writing_an_invalid_manifest_is_refused(tmp_path):
    base = build_manifest(tmp_path)
    wrong = Manifest(**{**base.__dict__, "config_hash": "0" * 64})
    with pytest.raises(ManifestInvalidError, match="manifest being written: config_hash"):
        wrong.to_json_bytes()
    no_golden = Manifest(**{**base.__dict__, "golden": []})
    with pytest.raises(ManifestInvalidError, match="golden"):
        no_golden.to_json_bytes()


def test_new_dir_id_format():
    files = (FileEntry("a", 1, "0" * 64),)
    tree = TreeListing(files=files, dirs=(), total_size=1)
    now = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert new_dir_id(tree, now) == "20240102T030405Z-" + tree_sha256(files, ())[:12]
    assert cache_tree_from_listing(tree, mount_path=MOUNT, dir_id="x").dir_id == "x"


def test_tree_sha256_depends_on_every_listed_fact():
    files = [FileEntry("a", 1, "0" * 64), FileEntry("b", 2, "1" * 64)]
    reference = tree_sha256(files, ["d"])
    assert tree_sha256([FileEntry("a", 1, "0" * 64), FileEntry("b", 3, "1" * 64)], ["d"]) != reference
    assert tree_sha256([FileEntry("a", 1, "0" * 64), FileEntry("c", 2, "1" * 64)], ["d"]) != reference
    assert tree_sha256([FileEntry("a", 1, "0" * 64), FileEntry("b", 2, "2" * 64)], ["d"]) != reference
    assert tree_sha256(files, []) != reference
    assert tree_sha256(files, ["d"]) == reference


def test_pinned_fixture_manifest_still_loads():
    # A manifest written by bless 0.1.0, kept verbatim. If it stops loading, existing blessings in
    # users' stores would be refused: a format or canonicalization change must be deliberate.
    loaded = load_manifest(FIXTURES / "reference-cpu.v1.json")
    assert loaded.config_hash == "958fa6f190761659c082f903cbfffaf0da8474e371c9a0624ef635069305479e"
    assert loaded.config_hash == config_hash(loaded.factors)
    assert loaded.cache.dir_id == "20240102T030405Z-" + loaded.cache.tree_sha256[:12]
    assert loaded.profile_name == "reference-cpu"


# --- malformed files ---------------------------------------------------------------------------------


def test_truncated_json(tmp_path, manifest):
    raw = manifest.to_json_bytes()
    path = tmp_path / "m.json"
    path.write_bytes(raw[: len(raw) // 2])
    error = refused(path)
    assert "not valid JSON" in error.message
    assert "line" in error.message
    assert error.hint and "truncated" in error.hint


@pytest.mark.parametrize("raw", [b"", b"hello", b"{'single': 'quotes'}", b"{} {}", b"[1, 2,]"])
def test_not_json(tmp_path, raw):
    path = tmp_path / "m.json"
    path.write_bytes(raw)
    assert "not valid JSON" in refused(path).message


def test_not_utf8(tmp_path, manifest):
    path = tmp_path / "m.json"
    path.write_bytes(manifest.to_json_bytes().replace(b"reference-cpu", b"reference-\xe9pu"))
    assert "not UTF-8" in refused(path).message


def test_missing_file_and_directory(tmp_path):
    assert "No such file" in refused(tmp_path / "nope.json").message
    (tmp_path / "dir.json").mkdir()
    error = refused(tmp_path / "dir.json")
    assert "not a regular file" in error.message or "Is a directory" in error.message


def test_huge_file_refused(tmp_path, manifest, monkeypatch):
    path = tmp_path / "m.json"
    path.write_bytes(manifest.to_json_bytes())
    monkeypatch.setattr(manifest_mod, "MAX_MANIFEST_BYTES", 100)
    error = refused(path)
    assert "more than the 100 allowed" in error.message


@pytest.mark.parametrize("value", [[], [{}], "manifest", 1, None, True])
def test_top_level_not_an_object(tmp_path, value):
    error = refused(write_json(tmp_path / "m.json", value))
    assert "top level is" in error.message
    assert "not an object" in error.message


@pytest.mark.parametrize("version", [2, 0, "1", None, True])
def test_unknown_schema_version(tmp_path, document, version):
    document["schema_version"] = version
    error = refused(write_json(tmp_path / "m.json", document))
    assert "schema_version" in error.message
    if version not in (True,):  # True == 1 in Python; the schema's const catches it
        assert f"unknown manifest schema_version {version!r}" in error.message


def test_missing_schema_version_is_unknown(tmp_path, document):
    del document["schema_version"]
    assert "unknown manifest schema_version None" in refused(write_json(tmp_path / "m.json", document)).message


def set_at(document: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    target: Any = document
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value


def delete_at(document: dict[str, Any], dotted: str) -> None:
    *parents, last = dotted.split(".")
    target: Any = document
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    del target[int(last) if isinstance(target, list) else last]


@pytest.mark.parametrize(
    "field",
    [
        "config_hash",
        "factors",
        "created",
        "tool",
        "profile_name",
        "cache",
        "artifacts",
        "trials",
        "golden",
        "provenance",
        "cache.files",
        "cache.tree_sha256",
        "factors.hardware",
        "factors.env",
        "trials.results",
        "golden.0.token_ids",
        "tool.version",
        "provenance.runtime",
    ],
)
def test_missing_required_field(tmp_path, document, field):
    delete_at(document, field)
    error = refused(write_json(tmp_path / "m.json", document))
    assert f"'{field.rsplit('.', 1)[-1]}' is a required property" in error.message


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("config_hash", "ABC", "config_hash"),
        ("config_hash", 12, "config_hash"),
        ("created", "yesterday", "created"),
        ("created", "2024-01-02 03:04:05", "created"),
        ("tool.name", "other", "tool.name"),
        ("profile_name", None, "profile_name"),
        ("factors", [], "factors"),
        ("factors.factors_version", 2, "factors.factors_version"),
        ("cache.files", {}, "cache.files"),
        ("cache.files.0.size", "20", "cache.files.0.size"),
        ("cache.files.0.size", -1, "cache.files.0.size"),
        ("cache.files.0.sha256", "A" * 64, "cache.files.0.sha256"),
        ("cache.files.0.sha256", "0" * 63, "cache.files.0.sha256"),
        ("cache.total_size", "20", "cache.total_size"),
        ("cache.dirs", "empty", "cache.dirs"),
        ("cache.dir_id", "latest", "cache.dir_id"),
        ("cache.mount_path", "relative/path", "cache.mount_path"),
        ("trials.planned", 0, "trials.planned"),
        ("trials.results", [], "trials.results"),
        ("trials.results.0.passed", "yes", "trials.results.0.passed"),
        ("golden", [], "golden"),
        ("golden.0.token_ids", [1, -2], "golden.0.token_ids.1"),
        ("golden.0.token_ids", ["a"], "golden.0.token_ids.0"),
        ("golden.0.max_tokens", 0, "golden.0.max_tokens"),
        ("provenance.runtime", "podman", "provenance.runtime"),
        ("artifacts.items", ["../escape"], "artifacts.items.0"),
        ("extra_field", 1, "'extra_field' was unexpected"),
    ],
)
def test_wrong_types_and_values(tmp_path, document, field, value, words):
    set_at(document, field, value)
    error = refused(write_json(tmp_path / "m.json", document))
    assert words in error.message
    assert error.details.get("errors") or "does not match" in error.message


@pytest.mark.parametrize(
    "bad",
    ["../x", "/etc/passwd", "a//b", "./a", "a\\b", "a/./b", "a/../b", "a/", "", "a\nb", "a\x01b", "a\x7fb"],
)
@pytest.mark.parametrize("where", ["files", "dirs"])
def test_bad_paths(tmp_path, document, bad, where):
    if where == "files":
        document["cache"]["files"][0]["path"] = bad
    else:
        document["cache"]["dirs"][0] = bad
    error = refused(write_json(tmp_path / "m.json", document))
    assert f"cache.{where}" in error.message
    assert repr(bad) in error.message


def test_duplicate_file_paths(tmp_path, document):
    files = document["cache"]["files"]
    files.insert(1, dict(files[0]))
    error = refused(write_json(tmp_path / "m.json", document))
    assert f"duplicate path {files[0]['path']!r}" in error.message


def test_unsorted_file_paths(tmp_path, document):
    files = document["cache"]["files"]
    files[0], files[1] = files[1], files[0]
    error = refused(write_json(tmp_path / "m.json", document))
    assert "not sorted" in error.message


def test_path_both_file_and_dir(tmp_path, document):
    document["cache"]["dirs"].append(document["cache"]["files"][0]["path"])
    assert "both as a file and a directory" in refused(write_json(tmp_path / "m.json", document)).message


def test_duplicate_dirs(tmp_path, document):
    document["cache"]["dirs"].append(document["cache"]["dirs"][0])
    assert "cache.dirs: duplicate" in refused(write_json(tmp_path / "m.json", document)).message


def test_total_size_mismatch(tmp_path, document):
    document["cache"]["total_size"] += 1
    error = refused(write_json(tmp_path / "m.json", document))
    assert "cache.total_size" in error.message
    assert "files add up to" in error.message


@pytest.mark.parametrize("tamper", ["tree_sha256", "file_sha256", "file_size", "dir_removed"])
def test_tree_sha256_mismatch(tmp_path, document, tamper):
    cache = document["cache"]
    if tamper == "tree_sha256":
        cache["tree_sha256"] = "f" * 64
    elif tamper == "file_sha256":
        cache["files"][0]["sha256"] = "0" * 64
    elif tamper == "file_size":  # size and total kept consistent: only the tree digest can tell
        cache["files"][0]["size"] += 1
        cache["total_size"] += 1
    else:
        cache["dirs"].remove("empty")
    assert "cache.tree_sha256 does not match" in refused(write_json(tmp_path / "m.json", document)).message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("serve.layers", 3),
        ("env.TORCHINDUCTOR_MAX_AUTOTUNE", "1"),
        ("hardware.isa", "x86-64-v4"),
        ("model.id", "x"),
    ],
)
def test_tampered_factor_breaks_config_hash(tmp_path, document, field, value):
    set_at(document["factors"], field, value)
    error = refused(write_json(tmp_path / "m.json", document))
    assert "does not match its factors" in error.message
    assert document["config_hash"][:16] in error.message


def test_added_factor_breaks_config_hash(tmp_path, document):
    document["factors"]["env"]["NEW_VAR"] = "1"
    assert "does not match its factors" in refused(write_json(tmp_path / "m.json", document)).message


def test_tampered_config_hash(tmp_path, document):
    document["config_hash"] = config_hash({"something": "else"})
    assert "does not match its factors" in refused(write_json(tmp_path / "m.json", document)).message


def test_integral_float_size_is_refused_not_a_traceback(tmp_path, document):
    # JSON Schema's "integer" admits 20.0; bless's schemas do not (bless.core.schemas), so the schema refuses it.
    document["cache"]["files"][0]["size"] = float(document["cache"]["files"][0]["size"])
    error = refused(write_json(tmp_path / "m.json", document))
    assert "cache.files.0.size: 16.0 is not of type 'integer'" in error.message


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers_are_refused(tmp_path, document, constant):
    text = json.dumps(document).replace('"layers": 2', f'"layers": {constant}')
    assert constant in text
    path = tmp_path / "m.json"
    path.write_text(text)
    error = refused(path)
    assert any(words in error.message for words in ("not valid JSON", "factors cannot be hashed", "not a JSON number"))


def test_lone_surrogate_in_factors_is_refused(tmp_path, document):
    text = json.dumps(document).replace('"reference-tiny"', '"\\ud800"', 1)
    path = tmp_path / "m.json"
    path.write_text(text)
    assert "factors cannot be hashed" in refused(path).message


@pytest.mark.parametrize("depth", [200, 900, 5000])
def test_deeply_nested_factor_is_refused(tmp_path, document, depth):
    text = json.dumps(document).replace('"layers": 2', '"layers": ' + "[" * depth + "]" * depth)
    path = tmp_path / "m.json"
    path.write_text(text)
    error = refused(path)
    if depth == 200:  # legal nesting: only the hash breaks
        assert "does not match its factors" in error.message


def test_validate_document_names_where(document):
    document["cache"]["total_size"] = 0
    with pytest.raises(ManifestInvalidError, match=r"^store/abc\.json: cache\.total_size"):
        validate_document(document, where="store/abc.json")
    with pytest.raises(ManifestInvalidError, match=r"^manifest: "):
        manifest_from_dict([], where="manifest")


# --- hypothesis: only ManifestInvalidError, never a traceback ----------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=15,
)


def only_manifest_invalid(path: Path) -> None:
    try:
        loaded = load_manifest(path)
    except ManifestInvalidError as exc:
        assert str(path) in exc.message
        assert exc.exit_code == 22
    else:
        # Accepted: it must be internally consistent.
        assert loaded.config_hash == config_hash(loaded.factors)


@pytest.fixture(scope="module")
def pristine(manifest) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(manifest.to_json_bytes())
    return document


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_values | st.dictionaries(st.sampled_from(["schema_version", "cache", "factors"]), json_values))
def test_random_json_only_raises_manifest_invalid(tmp_path, value):
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps(value))
    only_manifest_invalid(path)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_random_bytes_only_raise_manifest_invalid(tmp_path, raw):
    path = tmp_path / "fuzz.json"
    path.write_bytes(raw)
    only_manifest_invalid(path)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_manifests_only_raise_manifest_invalid(tmp_path, pristine, data):
    document = copy.deepcopy(pristine)
    mutate_json(document, data, json_values)
    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps(document))
    only_manifest_invalid(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0), junk=st.binary(max_size=8))
def test_damaged_bytes_only_raise_manifest_invalid(tmp_path, pristine, cut, junk):
    raw = json.dumps(pristine).encode()
    position = cut % len(raw)
    path = tmp_path / "fuzz.json"
    path.write_bytes(raw[:position] + junk + raw[position + len(junk) :])
    only_manifest_invalid(path)


@pytest.mark.parametrize(("field", "path"), [("dir_id", ("cache", "dir_id")), ("created", ("created",))])
def test_a_trailing_newline_breaks_a_pattern_field(document, tmp_path, field, path):
    """Python's ``$`` matches before a final newline; the schema's patterns must not (gc and verify agree)."""
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] += "\n"
    error = refused(write_json(tmp_path / "m.json", document))
    assert field in error.message


def test_a_duplicate_key_is_invalid_json(manifest, tmp_path):
    """Which of two values for one key counts depends on the reader: a manifest says one thing."""
    text = manifest.to_json_bytes().decode()
    doubled = text.replace('"profile_name":', '"profile_name": "other", "profile_name":', 1)
    assert doubled != text
    path = tmp_path / "m.json"
    path.write_text(doubled, encoding="utf-8")
    error = refused(path)
    assert "duplicate key 'profile_name'" in error.message


def with_listing(document: dict[str, Any], files: list[tuple[str, int, str]], dirs: list[str]) -> dict[str, Any]:
    """``document`` listing ``files`` and ``dirs``, its total size and tree digest made to match them."""
    entries = [FileEntry(path, size, sha) for path, size, sha in sorted(files)]
    document["cache"]["files"] = [{"path": e.path, "size": e.size, "sha256": e.sha256} for e in entries]
    document["cache"]["dirs"] = dirs
    document["cache"]["total_size"] = sum(e.size for e in entries)
    document["cache"]["tree_sha256"] = tree_sha256(entries, dirs)
    return document


@pytest.mark.parametrize(
    ("files", "dirs"),
    [
        (["x", "x/y"], []),
        (["x", "x/a/b/y"], []),
        (["x"], ["x/y"]),
        (["d/x", "d/x/y"], ["d"]),
    ],
    ids=["file-under-file", "deep", "dir-under-file", "nested"],
)
def test_a_path_below_a_listed_file_is_invalid(
    tmp_path: Path, document: dict[str, Any], files: list[str], dirs: list[str]
) -> None:
    """No tree holds a file ``x`` and ``x/y``: a pull building it crashed (FileExistsError, exit 1)."""
    listed = [(path, 1, "ab" * 32) for path in files]
    error = refused(write_json(tmp_path / "m.json", with_listing(document, listed, dirs)))
    assert "which is listed as a file" in error.message
    # The same rule for a file beside a directory of a similar name: "x" and "x.d/y" are fine.
    alike = with_listing(document, [("x", 1, "ab" * 32), ("x.d/y", 1, "cd" * 32)], ["x-", "x.d"])
    load_manifest(write_json(tmp_path / "ok.json", alike))


# --- a million files: the listing's entries checked in code, by the schema's own rules ---------------------


def big_document(document: dict[str, Any], entries: int) -> dict[str, Any]:
    files = [(f"d{i % 100}/f{i}.bin", 1, "ab" * 32) for i in range(entries)]
    return with_listing(document, files, sorted({f"d{i % 100}" for i in range(entries)}))


def test_the_listing_rules_are_read_from_the_documented_schema() -> None:
    """The schema's descriptions (the reference page's text) are annotations: the fast path still reads its rules."""
    described = validator("manifest.v1").schema
    assert "description" in described["properties"]["cache"]["properties"]["files"]["items"]["properties"]["path"]
    assert "description" in described["$defs"]["relpath"]
    assert listing_conforms([{"path": "d/f.bin", "size": 1, "sha256": "ab" * 32}], ["d"]) is True


def schema_listings(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The (files, dirs) lengths of every document the manifest module hands the schema library, in order.

    The real validation runs; this records how much of the listing it was given, which is what costs:
    jsonschema takes about 10 s for 150,000 entries (a minute for a million), the listing loop a fraction.
    """
    handed: list[tuple[int, int]] = []
    real = schema_errors  # what bless.core.manifest calls

    def recording(name: str, document: Any, *, limit: int = 10) -> list[str]:
        cache = document.get("cache", {}) if isinstance(document, dict) else {}
        handed.append((len(cache.get("files", [])), len(cache.get("dirs", []))))
        return real(name, document, limit=limit)

    monkeypatch.setattr("bless.core.manifest.schema_errors", recording)
    return handed


def test_a_large_legal_manifest_is_validated_by_the_listing_loop_not_entry_by_entry_by_the_schema(
    document: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """150,000 entries took jsonschema about 10 s: the schema now sees one entry of each list, the loop the rest.

    What is counted is what the schema is handed, so 20,000 entries prove it as well as a million would.
    """
    big = big_document(document, 20_000)
    handed = schema_listings(monkeypatch)
    validate_document(big, where="big")
    assert handed == [(1, 1)], "the schema library validated the listing entry by entry"


@pytest.mark.parametrize("listing", ["files", "dirs"])
def test_a_listing_past_its_limit_is_refused_on_the_count_at_once(
    document: dict[str, Any], listing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,000,001 entries took 60 s to refuse (the schema validated every entry before it counted them, issue 25
    item 11); the count is now checked first, whatever the entries hold: no entry reaches a check."""
    cache = document["cache"]
    entry: Any = {"path": "d/f.bin", "size": 1, "sha256": "ab" * 32} if listing == "files" else "d"
    big = {**document, "cache": {**cache, listing: [entry] * 1_000_001}}
    handed = schema_listings(monkeypatch)
    looped: list[object] = []
    monkeypatch.setattr("bless.core.manifest.listing_conforms", lambda *listings: looped.append(listings))
    with pytest.raises(ManifestInvalidError, match=f"cache.{listing}: 1000001 entries, more than the 1000000"):
        validate_document(big, where="big")
    assert handed == [] and looped == [], "an entry was looked at before the count refused the listing"


entry_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet=st.sampled_from(["a", "/", ".", "\\", "\n", "\x85", "\u202e", "f", "0", "é"]), max_size=6),
    st.sampled_from(["ab" * 32, "AB" * 32, "ab" * 32 + "\n", "a" * 4097, "x/y", "/abs", "a//b", "a/"]),
)


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(["path", "size", "sha256", "extra", "drop"]), value=entry_values, where=st.booleans())
def test_the_listing_loop_and_the_schema_agree_on_every_entry(key: str, value: Any, where: bool) -> None:
    """One rule in two forms: for any entry, the code says "conforms" exactly when the schema finds nothing."""
    entry: dict[str, Any] = {"path": "d/f.bin", "size": 1, "sha256": "ab" * 32}
    dirs: list[Any] = ["d"]
    if key == "drop":
        del entry["path"]
    elif key == "extra":
        entry["extra"] = value
    elif where and key == "path":
        dirs = [value]
    else:
        entry[key] = value
    document = {"cache": {"files": [entry], "dirs": dirs}}
    schema_says = not [
        e
        for e in validator("manifest.v1").iter_errors({"cache": document["cache"]})
        if list(e.absolute_path)[:2] in (["cache", "files"], ["cache", "dirs"])
    ]
    assert listing_conforms([entry], dirs) is schema_says, (entry, dirs)
