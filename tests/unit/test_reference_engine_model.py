"""Reference engine: model determinism, request validation, artifact files, knobs, markers.

Pure and fast: eager forwards of the tiny model only, no torch.compile, no HTTP server.
Skipped where torch is not installed, and a collection error instead under BLESS_REQUIRE_TORCH=1
(scripts/test.sh, whose setup installs torch's CPU build), so the test command cannot skip them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

try:
    import torch
except ImportError as exc:
    _MISSING = f"torch not installed ({exc}); scripts/setup.sh installs its CPU build into .venv"
    if os.environ.get("BLESS_REQUIRE_TORCH") == "1":
        pytest.fail(_MISSING, pytrace=False)
    pytest.skip(_MISSING, allow_module_level=True)

from bless.engines.reference_engine import ENGINE_VERSION, markers
from bless.engines.reference_engine.__main__ import is_inside, setup_inductor_dir
from bless.engines.reference_engine.artifact import (
    ArtifactPaths,
    FoundArtifact,
    artifact_key,
    build_meta,
    load_hit,
    read_artifact,
    write_artifact,
)
from bless.engines.reference_engine.knobs import KnobError, parse_knobs
from bless.engines.reference_engine.model import (
    ModelArgs,
    TinyTransformer,
    build_model,
    generate,
    padded_input,
    random_noise_hook,
    truncate_prompt,
)
from bless.engines.reference_engine.server import (
    GREEDY_ONLY,
    CompletionRequest,
    RequestError,
    completion_response,
    models_response,
    parse_completion_request,
)

ARGS = ModelArgs()


@pytest.fixture(scope="module")
def model() -> TinyTransformer:
    return build_model(ARGS, "cpu")


def _decode(model: TinyTransformer, text: str, max_tokens: int = 8) -> list[int]:
    return generate(model, list(text.encode()), max_tokens, ARGS.max_seq_len, "cpu")[1]


# --- model -------------------------------------------------------------------------------------------


def test_same_seed_same_weights_other_seed_differs() -> None:
    a = build_model(ARGS, "cpu").state_dict()
    b = build_model(ARGS, "cpu").state_dict()
    c = build_model(ModelArgs(seed=1), "cpu").state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_greedy_decode_is_deterministic_and_prompt_sensitive(model: TinyTransformer) -> None:
    first = _decode(model, "Hello, world")
    assert first == _decode(model, "Hello, world")
    assert first == _decode(build_model(ARGS, "cpu"), "Hello, world")  # a fresh process would agree too
    outputs = {tuple(_decode(model, p)) for p in ("Hello, world", "The quick brown fox", "zzzz", "a")}
    assert len(outputs) == 4
    assert all(0 <= t <= 255 for t in first) and len(first) == 8


def test_noise_hook_makes_repeats_differ(model: TinyTransformer) -> None:
    hook = random_noise_hook()
    runs = {tuple(generate(model, list(b"Hello"), 12, ARGS.max_seq_len, "cpu", hook)[1]) for _ in range(3)}
    assert len(runs) > 1


def test_truncation_keeps_the_tail_and_fits_the_window() -> None:
    prompt = list(range(100))
    kept = truncate_prompt(prompt, 16, 64)
    assert kept == prompt[-48:]
    assert truncate_prompt([1, 2], 16, 64) == [1, 2]
    with pytest.raises(ValueError):
        truncate_prompt([1], 64, 64)


def test_long_prompt_reports_used_tokens(model: TinyTransformer) -> None:
    used, out = generate(model, [120] * 200, 5, ARGS.max_seq_len, "cpu")
    assert len(used) == ARGS.max_seq_len - 5 and len(out) == 5


def test_padded_input_has_the_fixed_shape() -> None:
    ids = padded_input([7, 8, 9], 64, "cpu")
    assert ids.shape == (1, 64) and ids.dtype == torch.int64
    assert ids[0, :3].tolist() == [7, 8, 9] and int(ids[0, 3:].abs().sum()) == 0


@pytest.mark.parametrize(
    "bad",
    [
        ModelArgs(d_model=65),
        ModelArgs(layers=0),
        ModelArgs(max_seq_len=1),
        ModelArgs(heads=0),
        ModelArgs(seed=-1),
    ],
)
def test_model_args_validation(bad: ModelArgs) -> None:
    with pytest.raises(ValueError):
        bad.validate()


# --- request validation ----------------------------------------------------------------------------


def _parse(body: object) -> CompletionRequest:
    return parse_completion_request(json.dumps(body).encode(), "reference-tiny", 64)


def test_valid_requests() -> None:
    req = parse_completion_request(b'{"prompt": "hi"}', "reference-tiny", 64)
    assert req.prompt == [104, 105] and req.max_tokens == 16
    req2 = _parse({"prompt": [0, 255], "max_tokens": 63, "temperature": 0.0, "model": "reference-tiny"})
    assert req2.prompt == [0, 255] and req2.max_tokens == 63
    assert _parse({"prompt": "é", "temperature": None, "max_tokens": None}).prompt == [0xC3, 0xA9]


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"prompt": "hi", "temperature": 0.7}, 400, GREEDY_ONLY),
        ({"prompt": "hi", "temperature": "0"}, 400, "'temperature' must be a number"),
        ({"prompt": ""}, 400, "must not be empty"),
        ({"prompt": []}, 400, "must not be empty"),
        ({"prompt": [1, 256]}, 400, "out of range"),
        ({"prompt": [-1]}, 400, "out of range"),
        ({"prompt": [1, True]}, 400, "integer token id"),
        ({"prompt": [1.5]}, 400, "integer token id"),
        ({"prompt": ["a", "b"]}, 400, "batched"),
        ({"prompt": 5}, 400, "'prompt' must be a string"),
        ({}, 400, "'prompt' is required"),
        ({"prompt": "hi", "max_tokens": 0}, 400, "1..63"),
        ({"prompt": "hi", "max_tokens": 64}, 400, "1..63"),
        ({"prompt": "hi", "max_tokens": "5"}, 400, "must be an integer"),
        ({"prompt": "hi", "max_tokens": True}, 400, "must be an integer"),
        ({"prompt": "hi", "model": 3}, 400, "'model' must be a string"),
        ({"prompt": "hi", "model": "other"}, 404, "does not exist"),
        ({"prompt": "hi", "stream": True}, 400, "streaming"),
        ({"prompt": "hi", "n": 2}, 400, "'n' must be 1"),
        ([1, 2], 400, "JSON object"),
    ],
)
def test_invalid_requests(body: object, status: int, fragment: str) -> None:
    with pytest.raises(RequestError) as info:
        _parse(body)
    assert info.value.status == status
    assert fragment in info.value.message
    error = info.value.body()["error"]
    assert set(error) == {"message", "type"}


def test_greedy_error_is_exact() -> None:
    with pytest.raises(RequestError) as info:
        _parse({"prompt": "hi", "temperature": 1})
    assert info.value.body() == {
        "error": {
            "message": "only greedy decoding (temperature 0) is supported",
            "type": "invalid_request_error",
        }
    }


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe", b"", b"NaN"])
def test_unparseable_bodies(raw: bytes) -> None:
    with pytest.raises(RequestError) as info:
        parse_completion_request(raw, "reference-tiny", 64)
    assert info.value.status == 400


def test_response_shapes() -> None:
    resp = completion_response("reference-tiny", [104, 105], [72, 0xC3], created=1)
    assert resp["id"].startswith("cmpl-") and resp["object"] == "text_completion" and resp["created"] == 1
    choice = resp["choices"][0]
    assert choice == {"index": 0, "text": "H\ufffd", "token_ids": [72, 0xC3], "finish_reason": "length"}
    assert resp["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    assert models_response("m") == {
        "object": "list",
        "data": [{"id": "m", "object": "model", "owned_by": "bless"}],
    }


# --- artifact ------------------------------------------------------------------------------------------


def test_artifact_key_is_stable_and_covers_every_factor() -> None:
    key = artifact_key(ARGS, "cpu", "2.13.0+cpu")
    assert key == artifact_key(ModelArgs(), "cpu", "2.13.0+cpu", ENGINE_VERSION)
    assert len(key) == 16 and int(key, 16) >= 0
    others = {
        artifact_key(ModelArgs(seed=1), "cpu", "2.13.0+cpu"),
        artifact_key(ModelArgs(max_seq_len=32), "cpu", "2.13.0+cpu"),
        artifact_key(ARGS, "cuda", "2.13.0+cpu"),
        artifact_key(ARGS, "cpu", "2.11.0"),
        artifact_key(ARGS, "cpu", "2.13.0+cpu", "2"),
    }
    assert key not in others and len(others) == 5


def test_artifact_roundtrip_and_damage(tmp_path: Path) -> None:
    key = artifact_key(ARGS, "cpu", "t")
    paths = ArtifactPaths.under(tmp_path, key)
    assert read_artifact(paths, key) == "no compiled artifact"
    write_artifact(paths, b"bytes", build_meta(key, ARGS, "cpu", "t", b"bytes", poisoned=True))
    found = read_artifact(paths, key)
    assert isinstance(found, FoundArtifact) and found.data == b"bytes" and found.poisoned
    assert sorted(p.name for p in paths.directory.iterdir()) == ["megacache.bin", "meta.json"]  # no temp left

    assert "not" in str(read_artifact(paths, "0" * 16))  # meta for another key
    paths.megacache.write_bytes(b"bytez")
    assert "corrupt" in str(read_artifact(paths, key))
    paths.meta.unlink()
    assert "incomplete" in str(read_artifact(paths, key))

    blocked = tmp_path / "blocked"
    blocked.write_text("a file in the way")
    assert "unreadable" in str(read_artifact(ArtifactPaths.under(blocked, key), key))
    with pytest.raises(OSError):
        write_artifact(ArtifactPaths.under(blocked, key), b"x", {})


def test_load_hit_needs_a_hit_and_no_miss() -> None:
    assert load_hit({"inductor": {"fxgraph_cache_hit": 1}, "aot_autograd": {"autograd_cache_hit": 1}})
    assert not load_hit({"inductor": {"fxgraph_cache_miss": 1}, "aot_autograd": {}})
    assert not load_hit({"inductor": {"fxgraph_cache_hit": 1, "fxgraph_cache_miss": 1}})
    assert not load_hit({"inductor": {"fxgraph_cache_hit": 1}, "aot_autograd": {"autograd_cache_miss": 1}})
    assert not load_hit({})


# --- knobs, inductor dir, markers ----------------------------------------------------------------------


def test_knobs() -> None:
    assert parse_knobs({}) == parse_knobs({"BLESS_CANDIDATE": "not-an-int"})  # ignored without a poison list
    knobs = parse_knobs(
        {
            "BLESS_REFERENCE_NONDETERMINISTIC": "1",
            "BLESS_REFERENCE_IGNORE_CACHE": "true",
            "BLESS_REFERENCE_POISON_CANDIDATES": "1, 3",
            "BLESS_CANDIDATE": "3",
            "BLESS_REFERENCE_NEVER_READY": "0",
        }
    )
    assert knobs.nondeterministic and knobs.ignore_cache and not knobs.never_ready
    assert knobs.poison_candidates == {1, 3} and knobs.poison_on_save
    assert not parse_knobs({"BLESS_REFERENCE_POISON_CANDIDATES": "1", "BLESS_CANDIDATE": "2"}).poison_on_save
    for env in (
        {"BLESS_REFERENCE_CRASH_AT_BOOT": "maybe"},
        {"BLESS_REFERENCE_POISON_CANDIDATES": "x"},
        {"BLESS_REFERENCE_POISON_CANDIDATES": "1", "BLESS_CANDIDATE": "one"},
    ):
        with pytest.raises(KnobError):
            parse_knobs(env)


def test_inductor_dir_must_be_outside_the_cache_dir(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}
    with pytest.raises(ValueError, match="outside --cache-dir"):
        setup_inductor_dir(cache, env)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "elsewhere")}
    assert setup_inductor_dir(cache, env) == (tmp_path / "elsewhere", False)
    env = {}
    path, created = setup_inductor_dir(cache, env)
    try:
        assert created and path.is_dir() and env["TORCHINDUCTOR_CACHE_DIR"] == str(path)
        assert path.name.startswith("bless-inductor-") and not is_inside(path, cache)
    finally:
        path.rmdir()
    assert is_inside(cache / "a" / ".." / "b", cache) and not is_inside(tmp_path / "cache2", cache)


def test_marker_strings_are_exact() -> None:
    assert markers.using_cache_dir("/c") == "bless-reference: Using cache directory: /c"
    assert markers.loaded("/f") == "bless-reference: Directly load compiled artifact from path /f"
    assert markers.compiling("why") == "bless-reference: Compiling model (reason: why)"
    assert markers.saved("/f") == "bless-reference: saved compiled artifact to /f"
    assert markers.unable_to_save("/f", "e") == "bless-reference: unable to save compiled artifact to /f: e"
    assert markers.counters("{}") == "bless-reference: compile counters {}"
    assert markers.compile_time(1.234) == "bless-reference: torch.compile took 1.23 s in total"
    assert markers.ready(8000) == "bless-reference: ready on port 8000"
    assert markers.fatal("m") == "bless-reference: FATAL m"
    assert markers.SHUTTING_DOWN == "bless-reference: shutting down"
    assert markers.EAGER == "bless-reference: compile disabled (eager mode); cache not used"


def test_a_local_start_runs_the_engine_from_its_directory_without_importing_bless(tmp_path: Path) -> None:
    """What bless starts on a GPU host (the adapter's local command): the engine boots and answers as
    ``bless_reference`` with no module of bless imported, so the profile's interpreter needs only torch."""
    import json
    import subprocess
    import sys
    import urllib.request

    from bless.engines.reference import LAUNCHER

    command = [sys.executable, "-X", "importtime", str(LAUNCHER), "--device", "cpu", "--port", "0",
               "--host", "127.0.0.1", "--cache-dir", str(tmp_path / "cache"), "--layers", "1", "--d-model", "64",
               "--heads", "4", "--max-seq-len", "32", "--no-compile"]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    imports = tmp_path / "importtime.log"  # a file: torch's import lines would fill a pipe nobody reads yet
    with imports.open("w") as stderr_file:
        engine = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr_file, text=True, env=env)
    try:
        assert engine.stdout is not None
        port = None
        for line in engine.stdout:
            if line.startswith(markers.READY):
                port = int(line[len(markers.READY) :].split()[0])
                break
        assert port is not None, "the engine exited before it was ready"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as reply:
            assert json.load(reply)["data"], "the engine answered with no model"
    finally:
        engine.terminate()
        engine.communicate(timeout=60)
    lines = imports.read_text().splitlines()
    imported = {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}
    assert "bless_reference.server" in imported
    assert sorted(name for name in imported if name == "bless" or name.startswith("bless.")) == []
