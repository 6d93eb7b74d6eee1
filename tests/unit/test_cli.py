"""The bless CLI end to end through typer's CliRunner, on a real store with real published blessings.

Profiles pin their image by ID (no Docker), run on CPU, and use the reference engine's builtin model,
so ``hash`` and ``diff --profile`` resolve on any machine.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import bless.runtime as runtimes
from bless.cli import main as cli_main
from bless.cli import render as cli_render
from bless.cli import serve as cli_serve
from bless.cli.main import app
from bless.core.factors import config_hash, declared_hardware_factor
from bless.core.manifest import Manifest
from bless.core.profile import load_profile
from bless.errors import EXIT_CODES, ExitCode
from bless.flows.resolve import resolve_profile
from bless.store import Store
from tests.support.cli import cli_runner
from tests.support.fakes import FakeRuntime
from tests.unit.store_helpers import make_factors, make_manifest, write_tree

IMAGE_ID = "sha256:" + "ab" * 32


def profile_text(*, layers: int = 2, image: str = IMAGE_ID, accelerator: str = "cpu", extra: str = "") -> str:
    return f"""
profile_version = 1
name = "cli-test"

[engine]
name = "reference"

[runtime]
kind = "docker"
image = "{image}"

[model]
source = "builtin"
id = "reference-tiny"

[serve]
layers = {layers}

[env]
BLESS_LOG_LEVEL = "debug"
SOME_FLAG = "1"

[hardware]
accelerator = "{accelerator}"
{extra}
"""


def write_profile(directory: Path, name: str = "profile.toml", **kwargs: Any) -> Path:
    path = directory / name
    path.write_text(profile_text(**kwargs), encoding="utf-8")
    return path


def bless_profile(store: Store, profile: Path, work: Path, variant: str = "a") -> Manifest:
    """Publish a real blessing whose factors are what ``profile`` resolves to here."""
    resolved = resolve_profile(load_profile(profile), image_resolver=None)
    tree = write_tree(work / f"tree-{variant}-{resolved.config_hash[:8]}", variant)
    manifest = make_manifest(tree, resolved.factors)
    store.publish(tree, manifest)
    return manifest


@pytest.fixture
def runner() -> CliRunner:
    return cli_runner()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


@pytest.fixture
def store(root: Path) -> Store:
    return Store(root)


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    return write_profile(tmp_path)


@pytest.fixture
def blessed(store: Store, profile: Path, tmp_path: Path) -> Manifest:
    return bless_profile(store, profile, tmp_path)


Invoke = Callable[..., Result]


@pytest.fixture
def bless(runner: CliRunner, root: Path) -> Invoke:
    def invoke(*args: str, **kwargs: Any) -> Result:
        return runner.invoke(app, ["--root", str(root), *args], **kwargs)

    return invoke


def parse(result: Result) -> dict[str, Any]:
    """stdout must be exactly one JSON document."""
    document = json.loads(result.stdout)
    assert isinstance(document, dict)
    return document


def blessed_file(store: Store, manifest: Manifest, path: str) -> Path:
    return store.blessed_dir(manifest) / path


# --------------------------------------------------------------------------------------------- hash


def test_hash_human(bless: Invoke, profile: Path) -> None:
    expected = resolve_profile(load_profile(profile), image_resolver=None).config_hash
    result = bless("hash", "--profile", str(profile))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""  # humans read stderr; stdout is only for --json
    assert expected in result.stderr
    assert "layers" in result.stderr
    assert "image_id" in result.stderr
    # BLESS_LOG_LEVEL matches the reference adapter's ignore list: recorded, not hashed.
    assert "not hashed" in result.stderr
    assert "BLESS_LOG_LEVEL" in result.stderr


def test_hash_json(bless: Invoke, profile: Path) -> None:
    result = bless("hash", "--profile", str(profile), "--json")
    assert result.exit_code == 0, result.stderr
    document = parse(result)
    assert document["ok"] is True
    assert re.fullmatch(r"[0-9a-f]{64}", document["config_hash"])
    assert document["config_hash"] == config_hash(document["factors"])
    assert document["factors"]["serve"]["layers"] == 2
    assert document["factors"]["runtime"] == {"kind": "docker", "image_id": IMAGE_ID}
    assert document["factors"]["env"] == {"SOME_FLAG": "1"}
    assert document["ignored_env"] == {"BLESS_LOG_LEVEL": "debug"}
    assert document["profile"] == str(profile)


def test_hash_pinned_image_needs_no_runtime(bless: Invoke, profile: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_runtime(kind: str) -> Any:
        raise AssertionError(f"a runtime ({kind}) was constructed for a pinned image ID")

    monkeypatch.setattr(runtimes, "get_runtime", no_runtime)
    result = bless("hash", "--profile", str(profile), "--json")
    assert result.exit_code == 0, result.stderr


def test_hash_image_tag_is_resolved_through_the_runtime(
    bless: Invoke, tmp_path: Path, profile: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kinds: list[str] = []
    runtime = FakeRuntime(images={"bless-reference:cpu": IMAGE_ID})  # any other reference is missing

    def fake_get_runtime(kind: str) -> FakeRuntime:
        kinds.append(kind)
        return runtime

    monkeypatch.setattr(runtimes, "get_runtime", fake_get_runtime)
    tagged = write_profile(tmp_path, "tagged.toml", image="bless-reference:cpu")
    result = bless("hash", "--profile", str(tagged), "--json")
    assert result.exit_code == 0, result.stderr
    assert kinds == ["docker"] and runtime.calls == ["resolve_image"]
    # Same image ID, same factors: the tag and the pinned ID hash alike.
    pinned = parse(bless("hash", "--profile", str(profile), "--json"))
    assert parse(result)["config_hash"] == pinned["config_hash"]


def test_hash_declared_hardware(bless: Invoke, tmp_path: Path) -> None:
    declared = write_profile(tmp_path, "declared.toml", extra='cpu_isa = "x86-64-v1"')
    result = bless("hash", "--profile", str(declared), "--declared-hardware", "--offline", "--json")
    assert result.exit_code == 0, result.stderr
    assert parse(result)["factors"]["hardware"] == {"accelerator": "cpu", "isa": "x86-64-v1"}


def test_hash_invalid_profile_names_the_field(bless: Invoke, tmp_path: Path) -> None:
    bad = write_profile(tmp_path, "bad.toml", accelerator="tpu")
    result = bless("hash", "--profile", str(bad))
    assert result.exit_code == 3  # INPUT_INVALID (a stable number: scripts rely on it)
    assert "hardware" in result.stderr and "accelerator" in result.stderr
    assert "invalid input" in result.stderr
    assert "What to do:" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_hash_invalid_serve_arg_json(bless: Invoke, tmp_path: Path) -> None:
    bad = write_profile(tmp_path, "bad.toml", layers=99)
    result = bless("hash", "--profile", str(bad), "--json")
    assert result.exit_code == 3
    document = parse(result)
    assert document["ok"] is False
    assert document["error"]["exit_code"] == 3
    assert document["error"]["error"] == "InputInvalidError"
    assert "serve.layers" in document["error"]["message"]
    assert "serve.layers" in result.stderr


def test_hash_missing_profile_file(bless: Invoke, tmp_path: Path) -> None:
    result = bless("hash", "--profile", str(tmp_path / "nope.toml"))
    assert result.exit_code == 3
    assert "no such profile file" in result.stderr


# --------------------------------------------------------------------------------------------- diff


def test_diff_profile_against_blessing(bless: Invoke, tmp_path: Path, blessed: Manifest) -> None:
    changed = write_profile(tmp_path, "changed.toml", layers=3)
    result = bless("diff", "--profile", str(changed), blessed.config_hash[:12])
    assert result.exit_code == 0, result.stderr
    assert re.search(r"serve\.layers\s*│\s*2\s*│\s*3", result.stderr), result.stderr
    assert "blessed" in result.stderr and "current" in result.stderr

    document = parse(bless("diff", "--profile", str(changed), blessed.config_hash, "--json"))
    assert document["a"]["config_hash"] == blessed.config_hash
    assert document["b"]["kind"] == "profile"
    assert document["identical"] is False
    assert document["changes"] == [
        {"field": "serve.layers", "before": 2, "after": 3, "before_absent": False, "after_absent": False}
    ]


def test_diff_identical(bless: Invoke, profile: Path, blessed: Manifest) -> None:
    result = bless("diff", "--profile", str(profile), blessed.config_hash)
    assert result.exit_code == 0, result.stderr
    assert "identical" in result.stderr
    document = parse(bless("diff", "--profile", str(profile), blessed.config_hash, "--json"))
    assert document["changes"] == [] and document["identical"] is True
    assert document["b"]["config_hash"] == blessed.config_hash


def test_diff_two_hashes(bless: Invoke, store: Store, tmp_path: Path, blessed: Manifest) -> None:
    other = bless_profile(store, write_profile(tmp_path, "three.toml", layers=3), tmp_path, "b")
    result = bless("diff", blessed.config_hash[:8], other.config_hash[:10])
    assert result.exit_code == 0, result.stderr
    assert re.search(r"serve\.layers\s*│\s*2\s*│\s*3", result.stderr), result.stderr
    document = parse(bless("diff", blessed.config_hash, other.config_hash, "--json"))
    assert document["a"]["kind"] == document["b"]["kind"] == "manifest"
    assert [change["field"] for change in document["changes"]] == ["serve.layers"]


def test_diff_usage_errors(bless: Invoke, profile: Path, blessed: Manifest) -> None:
    both = bless("diff", "--profile", str(profile), blessed.config_hash, blessed.config_hash)
    assert both.exit_code == ExitCode.USAGE
    alone = bless("diff", blessed.config_hash)
    assert alone.exit_code == ExitCode.USAGE
    short = bless("diff", "--profile", str(profile), "abc")
    assert short.exit_code == ExitCode.INPUT_INVALID
    assert "8 to 64 hex" in short.stderr


def vllm_profile_text(serve: str) -> str:
    """A vLLM profile that resolves offline with --declared-hardware (pinned image and revision)."""
    return f"""
profile_version = 1
name = "vllm-cli-test"

[engine]
name = "vllm"

[runtime]
kind = "docker"
image = "{IMAGE_ID}"

[model]
source = "huggingface"
id = "org/vl-model"
revision = "{"0123456789abcdef" * 2 + "01234567"}"
hf_home = "/srv/hf"

[serve]
max_model_len = 4096
{serve}

[hardware]
accelerator = "cuda"
gpu_name = "NVIDIA H200"
compute_capability = "9.0"
"""


def bless_vllm_profile(store: Store, path: Path, work: Path, variant: str) -> Manifest:
    resolved = resolve_profile(load_profile(path), image_resolver=None, hardware_probe=declared_hardware_factor)
    manifest = make_manifest(write_tree(work / f"tree-{variant}", variant), resolved.factors)
    store.publish(work / f"tree-{variant}", manifest)
    return manifest


@pytest.mark.parametrize(
    ("before", "after", "field"),
    [
        # vllm#50891 and vllm#53366: vLLM's own compile key misses both; bless's hash and diff do not.
        (
            "limit_mm_per_prompt = { image = 1 }",
            "limit_mm_per_prompt = { image = 2 }",
            "serve.limit_mm_per_prompt.image",
        ),
        (
            'speculative_config = { method = "ngram", num_speculative_tokens = 3, prompt_lookup_max = 4 }',
            'speculative_config = { method = "ngram", num_speculative_tokens = 5, prompt_lookup_max = 4 }',
            "serve.speculative_config.num_speculative_tokens",
        ),
    ],
)
def test_diff_names_vllm_args_its_own_key_misses(
    bless: Invoke, store: Store, tmp_path: Path, before: str, after: str, field: str
) -> None:
    old = tmp_path / "old.toml"
    old.write_text(vllm_profile_text(before), encoding="utf-8")
    new = tmp_path / "new.toml"
    new.write_text(vllm_profile_text(after), encoding="utf-8")
    blessed = bless_vllm_profile(store, old, tmp_path, "a")
    other = bless_vllm_profile(store, new, tmp_path, "b")
    assert blessed.config_hash != other.config_hash

    document = parse(bless("diff", blessed.config_hash, other.config_hash, "--json"))
    assert [change["field"] for change in document["changes"]] == [field]
    document = parse(
        bless("diff", "--profile", str(new), blessed.config_hash, "--offline", "--declared-hardware", "--json")
    )
    assert document["identical"] is False and [change["field"] for change in document["changes"]] == [field]
    assert document["b"]["config_hash"] == other.config_hash
    shown = bless("diff", "--profile", str(new), blessed.config_hash[:12], "--offline", "--declared-hardware")
    assert shown.exit_code == 0, shown.stderr
    assert field in shown.stderr


def test_diff_unknown_prefix(bless: Invoke, profile: Path, blessed: Manifest) -> None:
    unknown = "0" * 8 if not blessed.config_hash.startswith("0" * 8) else "f" * 8
    result = bless("diff", "--profile", str(profile), unknown)
    assert result.exit_code == ExitCode.NO_MANIFEST


# --------------------------------------------------------------------------------------------- list


def test_list(bless: Invoke, blessed: Manifest) -> None:
    result = bless("list")
    assert result.exit_code == 0, result.stderr
    assert blessed.config_hash[:16] in result.stderr
    assert "reference" in result.stderr
    assert "1/1" in result.stderr
    document = parse(bless("list", "--json"))
    assert document["ok"] is True
    assert [item["config_hash"] for item in document["manifests"]] == [blessed.config_hash]
    assert document["manifests"][0]["total_size"] == blessed.cache.total_size
    assert document["invalid"] == []


def test_list_empty_store(bless: Invoke) -> None:
    result = bless("list")
    assert result.exit_code == 0
    assert "no valid blessings" in result.stderr
    assert parse(bless("list", "--json"))["manifests"] == []


def test_list_with_corrupted_manifest(bless: Invoke, store: Store, blessed: Manifest) -> None:
    bad = store.manifests_dir / "corrupt.json"
    bad.write_text('{"schema_version": 1, "config_hash": ', encoding="utf-8")
    result = bless("list")
    assert result.exit_code == 22  # MANIFEST_INVALID (a stable number: scripts rely on it)
    assert blessed.config_hash[:16] in result.stderr  # the good one is still shown
    assert "corrupt.json" in result.stderr
    assert "not valid JSON" in result.stderr

    json_result = bless("list", "--json")
    assert json_result.exit_code == 22
    document = parse(json_result)
    assert document["ok"] is False
    assert [item["config_hash"] for item in document["manifests"]] == [blessed.config_hash]
    assert [Path(item["path"]).name for item in document["invalid"]] == ["corrupt.json"]
    assert document["error"]["exit_code"] == 22


def test_list_duplicate(bless: Invoke, store: Store, blessed: Manifest) -> None:
    source = store.manifest_path(blessed.config_hash)
    assert source is not None
    shutil.copyfile(source, store.manifests_dir / "copy.json")
    result = bless("list", "--json")
    assert result.exit_code == ExitCode.MANIFEST_DUPLICATE
    assert list(parse(result)["duplicates"]) == [blessed.config_hash]


def test_manifests_dir_option_and_env(
    runner: CliRunner, root: Path, store: Store, blessed: Manifest, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "checkout"
    shutil.copytree(store.manifests_dir, elsewhere)
    by_option = runner.invoke(app, ["--root", str(root), "--manifests-dir", str(elsewhere), "list", "--json"])
    assert parse(by_option)["manifests_dir"] == str(elsewhere)
    by_env = runner.invoke(app, ["list", "--json"], env={"BLESS_ROOT": str(root)})
    assert parse(by_env)["manifests"][0]["config_hash"] == blessed.config_hash
    # A manifests dir named on purpose but missing is a typo, not "nothing blessed" (as bless gate says).
    missing = runner.invoke(
        app, ["--manifests-dir", str(tmp_path / "none"), "list", "--json"], env={"BLESS_ROOT": str(root)}
    )
    assert missing.exit_code == ExitCode.USAGE
    assert str(tmp_path / "none") in parse(missing)["error"]["message"]
    fresh = runner.invoke(app, ["list", "--json"], env={"BLESS_ROOT": str(tmp_path / "fresh")})
    assert fresh.exit_code == 0 and parse(fresh)["manifests"] == []  # the default dir of a new store may be missing


@pytest.mark.parametrize(
    "command",
    [
        ["list"],
        ["show", "HASH"],
        ["verify", "HASH"],
        ["diff", "HASH", "HASH"],
        ["gc", "--dry-run"],
        ["sign", "HASH", "--keys", "/nonexistent-keys"],
        ["push", "HASH", "127.0.0.1:9/never/contacted:v1"],
    ],
)
def test_read_only_commands_refuse_a_missing_manifests_dir_given_explicitly(
    runner: CliRunner, root: Path, blessed: Manifest, tmp_path: Path, command: list[str]
) -> None:
    """By option or by environment: exit 2 naming the directory, with the JSON document, never "nothing blessed"."""
    missing = tmp_path / "typo"
    args = [blessed.config_hash if arg == "HASH" else arg for arg in command]
    for result in (
        runner.invoke(app, ["--root", str(root), "--manifests-dir", str(missing), *args, "--json"]),
        runner.invoke(app, [*args, "--json"], env={"BLESS_ROOT": str(root), "BLESS_MANIFESTS_DIR": str(missing)}),
    ):
        assert result.exit_code == ExitCode.USAGE, result.stderr
        error = parse(result)["error"]
        assert f"the manifests directory {missing} does not exist" in error["message"]
        assert "--manifests-dir" in error["hint"]
        assert f"{missing} does not exist" in result.stderr
    assert not missing.exists()  # refused before anything could create it


# --------------------------------------------------------------------------------------------- show


def test_show_json(bless: Invoke, store: Store, blessed: Manifest) -> None:
    result = bless("show", blessed.config_hash[:16], "--json")
    assert result.exit_code == 0, result.stderr
    document = parse(result)
    assert document["config_hash"] == blessed.config_hash
    assert document["manifest_path"] == str(store.manifest_path(blessed.config_hash))
    assert document["blessed_dir"] == str(store.blessed_dir(blessed))
    expected = blessed.to_dict()
    assert {key: document[key] for key in expected} == expected


def test_show_human(bless: Invoke, store: Store, blessed: Manifest) -> None:
    result = bless("show", blessed.config_hash)
    assert result.exit_code == 0, result.stderr
    for text in (blessed.config_hash, "tiny-test", "golden", "abcd", "pass", "provenance", "1/1 passed"):
        assert text in result.stderr
    assert str(store.blessed_dir(blessed)) in result.stderr


def test_show_says_in_words_what_a_blessing_covers_without_padding(
    bless: Invoke, store: Store, blessed: Manifest
) -> None:
    """Factors, hardware, engine keys and trials in words (not only under --json), and no line padded with
    spaces when stderr is not a terminal (the runner's is not)."""
    result = bless("show", blessed.config_hash)
    assert result.exit_code == 0, result.stderr
    text = result.stderr
    assert "what this blessing covers" in text
    assert "hardware it was proven on:" in text and "engine:" in text
    hardware = blessed.factors["hardware"]
    for key, value in hardware.items():
        if not isinstance(value, dict):
            assert any(key in line and str(value) in line for line in text.splitlines()), key
    engine_name = blessed.factors["engine"]["name"]
    assert any(line.split() == ["name", engine_name] for line in text.splitlines()), "engine keys in words"
    assert f"trials: {blessed.trials['passed']} of {blessed.trials['planned']} passed" in text
    provenance = text.split("provenance\n", 1)[1]
    assert "{" not in provenance and '"' not in provenance, "provenance in words, not JSON"
    padded = [line for line in text.splitlines() if line != line.rstrip() and "─" not in line and "│" not in line]
    assert padded == []
    assert max(len(line) for line in text.splitlines()) < 300


def test_a_hash_that_is_not_hex_is_called_so(bless: Invoke) -> None:
    result = bless("verify", "nothex!!")
    assert result.exit_code == ExitCode.INPUT_INVALID
    assert "is not a hex config hash" in result.stderr
    assert "at least the first 8" not in result.stderr.split("not a hex", 1)[1].split("\n", 1)[0]
    short = bless("verify", "abc")
    assert short.exit_code == ExitCode.INPUT_INVALID and "8 to 64 hex digits" in short.stderr


def test_show_says_how_many_gpus_and_in_which_order_the_blessing_was_proven_on(
    bless: Invoke, store: Store, tmp_path: Path
) -> None:
    """Issue 26: a TP=2 blessing whose trials ran on GPUs 0,1 and 2,3 (``--parallel 2``) says so."""
    gpus = [{"index": index, "uuid": f"GPU-{index}{index}", "name": "NVIDIA H100 80GB HBM3"} for index in range(4)]
    factors = {
        **make_factors(),
        "hardware": {
            "accelerator": "cuda",
            "gpu_count": 2,
            "gpu_name": "NVIDIA H100 80GB HBM3",
            "compute_capability": "9.0",
        },
    }
    tree = write_tree(tmp_path / "tree-tp2")
    manifest = dataclasses.replace(
        make_manifest(tree, factors),
        trials={
            "planned": 3,
            "passed": 3,
            "parallel": 2,
            "devices": gpus,
            "results": [
                {"index": 1, "passed": True, "reasons": [], "slot": 0, "gpus": gpus[:2]},
                {"index": 2, "passed": True, "reasons": [], "slot": 1, "gpus": gpus[2:]},
                {"index": 3, "passed": True, "reasons": [], "slot": 0, "gpus": gpus[:2]},
            ],
        },
    )
    store.publish(tree, manifest)
    result = bless("show", manifest.config_hash)
    assert result.exit_code == 0, result.stderr
    assert "GPUs: 2 NVIDIA H100 80GB HBM3 per engine, proven on 4 in all: 0 (GPU-00), 1 (GPU-11), 2 (GPU-22)" in (
        result.stderr
    )
    assert "GPUs 0,1 (in this order): trial(s) 1, 3" in result.stderr
    assert "GPUs 2,3 (in this order): trial(s) 2" in result.stderr


def test_show_renders_where_each_rank_of_the_bootstrap_and_the_trials_ran(
    bless: Invoke, store: Store, tmp_path: Path
) -> None:
    """A TP=2 blessing whose trials ran on GPUs 0,1 and, swapped, 1,0: the ranks, and --json keeps them."""
    gpus = [{"index": index, "uuid": f"GPU-{index}{index}", "name": "NVIDIA H200"} for index in range(2)]
    in_order = [{"rank": rank, **gpu} for rank, gpu in enumerate(gpus)]
    swapped = [{"rank": rank, **gpu} for rank, gpu in enumerate(reversed(gpus))]
    factors = {
        **make_factors(),
        "hardware": {"accelerator": "cuda", "gpu_count": 2, "gpu_name": "NVIDIA H200", "compute_capability": "9.0"},
    }
    tree = write_tree(tmp_path / "tree-ranks")
    manifest = make_manifest(tree, factors)
    manifest = dataclasses.replace(
        manifest,
        trials={
            "planned": 2,
            "passed": 2,
            "parallel": 1,
            "devices": gpus,
            "results": [
                {"index": 1, "passed": True, "reasons": [], "slot": 0, "gpus": in_order},
                {"index": 2, "passed": True, "reasons": [], "slot": 0, "gpus": swapped},
            ],
        },
        provenance={**manifest.provenance, "bootstrap": {"gpus": in_order}},
    )
    store.publish(tree, manifest)
    result = bless("show", manifest.config_hash)
    assert result.exit_code == 0, result.stderr
    assert "bootstrap: rank 0: GPU 0 (GPU-00), rank 1: GPU 1 (GPU-11)" in result.stderr
    assert "trial(s) 1: rank 0: GPU 0 (GPU-00), rank 1: GPU 1 (GPU-11)" in result.stderr
    assert "trial(s) 2: rank 0: GPU 1 (GPU-11), rank 1: GPU 0 (GPU-00)" in result.stderr
    shown = json.loads(bless("show", manifest.config_hash, "--json").stdout)
    assert [gpu["uuid"] for gpu in shown["trials"]["results"][1]["gpus"] if gpu["rank"] == 0] == ["GPU-11"]


def test_show_golden_outputs_readable_and_escaped(bless: Invoke, store: Store, profile: Path, tmp_path: Path) -> None:
    """Golden outputs of a byte-level engine: escaped text (no raw control bytes reach the terminal) and token ids."""
    resolved = resolve_profile(load_profile(profile), image_resolver=None)
    tree = write_tree(tmp_path / "tree-golden", "g")
    manifest = make_manifest(tree, resolved.factors)
    raw = ".\ufffd$I\x18\x1b[31mFORGED\u202e\\n"
    golden = [{"prompt": "p\x07", "max_tokens": 30, "text": raw, "token_ids": list(range(30))}]
    manifest = dataclasses.replace(manifest, golden=golden)
    store.publish(tree, manifest)
    result = bless("show", manifest.config_hash)
    assert result.exit_code == 0, result.stderr
    assert "\x1b" not in result.stderr and "\x18" not in result.stderr and "\u202e" not in result.stderr
    assert '".\ufffd$I\\x18\\x1b[31mFORGED\\u202e\\\\n"' in result.stderr
    assert "(not UTF-8 text: compared by token ids)" in result.stderr
    assert "p\\x07" in result.stderr
    assert " ".join(str(i) for i in range(24)) + " ... (30 in all)" in result.stderr
    assert parse(bless("show", manifest.config_hash, "--json"))["golden"] == golden, "--json keeps the exact text"


# ------------------------------------------------------------------------------------------- verify


def test_verify_clean(bless: Invoke, store: Store, blessed: Manifest) -> None:
    result = bless("verify", blessed.config_hash)
    assert result.exit_code == 0, result.stderr
    assert "verified" in result.stderr
    assert "warning" not in result.stderr  # published trees are read-only
    document = parse(bless("verify", blessed.config_hash[:8], "--json"))
    assert document["ok"] is True
    assert document["blessed_dir"] == str(store.blessed_dir(blessed))
    assert document["result"]["problems"] == []
    assert document["result"]["files_checked"] == len(blessed.cache.files)


def test_verify_flipped_byte(bless: Invoke, store: Store, blessed: Manifest) -> None:
    target = blessed_file(store, blessed, "nested/deep/kernel.so")
    target.chmod(0o644)
    data = bytearray(target.read_bytes())
    data[10] ^= 0xFF
    target.write_bytes(bytes(data))

    result = bless("verify", blessed.config_hash)
    assert result.exit_code == 21  # VERIFY_FAILED (a stable number: scripts rely on it)
    assert "nested/deep/kernel.so" in result.stderr
    assert "sha256" in result.stderr
    assert "verification failed" in result.stderr
    assert "write bit" in result.stderr  # the chmod is reported as a warning too
    assert result.stdout == ""

    json_result = bless("verify", blessed.config_hash, "--json")
    assert json_result.exit_code == 21
    document = parse(json_result)
    assert document["ok"] is False
    assert document["result"]["problems"] == [
        {
            "kind": "sha256",
            "path": "nested/deep/kernel.so",
            "detail": document["result"]["problems"][0]["detail"],
        }
    ]
    assert document["error"]["exit_code"] == 21
    assert document["error"]["details"]["problems"] == document["result"]["problems"]


def test_verify_lists_every_problem(bless: Invoke, store: Store, blessed: Manifest) -> None:
    directory = store.blessed_dir(blessed)
    (directory / "nested").chmod(0o755)
    (directory / "nested" / "index.json").unlink()
    (directory / "nested" / "intruder.py").write_text("print('hi')\n")
    result = bless("verify", blessed.config_hash)
    assert result.exit_code == 21
    assert "nested/index.json" in result.stderr and "missing" in result.stderr
    assert "nested/intruder.py" in result.stderr and "extra" in result.stderr


def test_verify_unknown_hash(bless: Invoke, blessed: Manifest) -> None:
    unknown = "0" * 64 if blessed.config_hash != "0" * 64 else "1" * 64
    result = bless("verify", unknown)
    assert result.exit_code == 20  # NO_MANIFEST (a stable number: scripts rely on it)
    assert "no blessed manifest" in result.stderr
    assert "bless list" in result.stderr
    document = parse(bless("verify", unknown, "--json"))
    assert document["ok"] is False and document["error"]["exit_code"] == 20


def test_verify_unknown_hash_empty_store(bless: Invoke) -> None:
    assert bless("verify", "a" * 64).exit_code == 20
    assert bless("verify", "a" * 8).exit_code == 20


def test_verify_duplicate_manifest(bless: Invoke, store: Store, blessed: Manifest) -> None:
    source = store.manifest_path(blessed.config_hash)
    assert source is not None
    shutil.copyfile(source, store.manifests_dir / "copy.json")
    result = bless("verify", blessed.config_hash)
    assert result.exit_code == 23  # MANIFEST_DUPLICATE (a stable number: scripts rely on it)
    assert "copy.json" in result.stderr
    assert bless("verify", blessed.config_hash[:8]).exit_code == 23


def test_verify_invalid_manifest_fails_closed(bless: Invoke, store: Store, blessed: Manifest) -> None:
    (store.manifests_dir / "corrupt.json").write_text("[]", encoding="utf-8")
    assert bless("verify", blessed.config_hash).exit_code == ExitCode.MANIFEST_INVALID


def test_verify_progress_bar_path(bless: Invoke, blessed: Manifest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_render, "PROGRESS_THRESHOLD_BYTES", 0)
    seen: list[int] = []
    original = cli_render.hashing_progress

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(args[1])
        return original(*args, **kwargs)

    monkeypatch.setattr(cli_render, "hashing_progress", recording)
    result = bless("verify", blessed.config_hash, "--json")
    assert result.exit_code == 0, result.stderr
    assert seen == [blessed.cache.total_size]
    parse(result)  # the bar went to stderr: stdout is still one document


def test_hashing_progress_is_thread_safe() -> None:
    import threading

    from rich.console import Console

    console = Console(file=open("/dev/null", "w"), force_terminal=False)  # noqa: SIM115
    with cli_render.hashing_progress(console, 1000, enabled=True) as none:
        assert none is None  # below the threshold: no bar
    total = cli_render.PROGRESS_THRESHOLD_BYTES + 8 * 10_000
    with cli_render.hashing_progress(console, total, enabled=True) as advance:
        assert advance is not None
        threads = [threading.Thread(target=lambda: [advance(1) for _ in range(10_000)]) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    console.file.close()


# ----------------------------------------------------------------------------------------------- gc


def test_gc_empty(bless: Invoke) -> None:
    result = bless("gc")
    assert result.exit_code == 0, result.stderr
    assert "nothing to collect" in result.stderr
    document = parse(bless("gc", "--json"))
    assert document["actions"] == [] and document["total_bytes"] == 0


def test_gc_dry_run(bless: Invoke, store: Store, profile: Path, tmp_path: Path, blessed: Manifest) -> None:
    old_dir = store.blessed_dir(blessed)
    newer = bless_profile(store, profile, tmp_path, "b")  # re-bless: the old version is superseded
    assert newer.config_hash == blessed.config_hash and newer.cache.dir_id != blessed.cache.dir_id

    result = bless("gc", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert str(old_dir) in result.stderr
    assert "would reclaim" in result.stderr
    document = parse(bless("gc", "--dry-run", "--json"))
    assert document["dry_run"] is True
    assert [action["path"] for action in document["actions"]] == [str(old_dir)]
    assert document["total_bytes"] == blessed.cache.total_size
    assert old_dir.exists()

    assert bless("gc", "--keep", "1", "--json").exit_code == 0
    assert old_dir.exists()
    done = bless("gc")
    assert done.exit_code == 0 and "reclaimed" in done.stderr
    assert not old_dir.exists()
    assert bless("verify", newer.config_hash).exit_code == 0


def test_gc_negative_keep_is_usage(bless: Invoke) -> None:
    assert bless("gc", "--keep", "-1").exit_code == ExitCode.USAGE


# ---------------------------------------------------------------------------------- error boundary


def test_internal_error_without_traceback(bless: Invoke, blessed: Manifest, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(Store, "verify_blessing", boom)
    result = bless("verify", blessed.config_hash)
    assert result.exit_code == 1  # INTERNAL (a stable number: scripts rely on it)
    assert "internal error: RuntimeError: disk on fire" in result.stderr
    assert "--verbose" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""

    verbose = bless("--verbose", "verify", blessed.config_hash)
    assert verbose.exit_code == 1
    assert "Traceback" in verbose.stderr and "disk on fire" in verbose.stderr

    as_json = bless("verify", blessed.config_hash, "--json")
    assert as_json.exit_code == 1
    document = parse(as_json)
    assert document["ok"] is False
    assert document["error"]["exit_code"] == 1
    assert document["error"]["error"] == "RuntimeError"


def test_keyboard_interrupt_exits_130(bless: Invoke, profile: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_main, "hash_profile", interrupted)
    result = bless("hash", "--profile", str(profile))
    assert result.exit_code == 130  # INTERRUPTED (a stable number: scripts rely on it)
    assert "interrupted" in result.stderr
    assert "Traceback" not in result.stderr


def test_bless_error_verbose_shows_details(bless: Invoke) -> None:
    result = bless("--verbose", "verify", "a" * 64)
    assert result.exit_code == 20
    assert "details:" in result.stderr


def test_bad_usage_is_exit_2(bless: Invoke) -> None:
    assert bless("verify").exit_code == 2
    assert bless("hash").exit_code == 2  # --profile is required
    assert bless("list", "--no-such-option").exit_code == 2
    assert bless("no-such-command").exit_code == 2


# ------------------------------------------------------------------------------------- exit-codes


def test_exit_codes_json(bless: Invoke) -> None:
    result = bless("exit-codes", "--json")
    assert result.exit_code == 0
    rows = parse(result)["exit_codes"]
    assert [(row["code"], row["name"], row["meaning"]) for row in rows] == [
        (int(code), code.name, meaning) for code, meaning in EXIT_CODES
    ]
    human = bless("exit-codes")
    for code, _ in EXIT_CODES:
        assert code.name in human.stderr


def test_exit_codes_markdown(bless: Invoke) -> None:
    result = bless("exit-codes", "--markdown")
    assert result.exit_code == 0
    assert result.stdout == cli_render.exit_codes_markdown()
    for code, meaning in EXIT_CODES:
        assert f"| {int(code)} | `{code.name}` | {meaning} |" in result.stdout
    assert bless("exit-codes", "--markdown", "--json").exit_code == 2


def test_help_mentions_commands(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in ("hash", "diff", "list", "show", "verify", "gc", "exit-codes"):
        assert name in result.stdout


def test_real_process_streams(root: Path, blessed: Manifest) -> None:
    """As a real process: one JSON document on stdout, the diagnostics on stderr, the exit code."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]

    def verify(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "bless.cli.main", "--root", str(root), "verify", *args]
        return subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=120, check=False)

    completed = verify("f" * 64, "--json")
    assert completed.returncode == 20, completed.stderr
    document = json.loads(completed.stdout)
    assert document["ok"] is False and document["error"]["error"] == "NoManifestError"
    assert "no blessed manifest" in completed.stderr
    ok = verify(blessed.config_hash)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == ""


def test_error_details_that_json_cannot_hold_are_still_reported(
    bless: Invoke, profile: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bless.errors import ResolutionError

    def unresolvable(*args: Any, **kwargs: Any) -> Any:
        raise ResolutionError("no image", details={"where": Path("/somewhere")})

    monkeypatch.setattr(cli_main, "hash_profile", unresolvable)
    result = bless("hash", "--profile", str(profile), "--json")
    assert result.exit_code == 31  # RESOLUTION_FAILED
    assert parse(result)["error"]["details"] == {"where": "/somewhere"}


# --- engines -------------------------------------------------------------------------------------------


def fake_interpreter(tmp_path: Path, vllm: str | None, torch: str | None) -> Path:
    """An executable that answers the package probe like a Python with these versions would."""
    script = tmp_path / "python-fake"
    answer = json.dumps({"python_version": "3.12.3", "packages": {"vllm": vllm, "torch": torch}})
    script.write_text(f"#!/bin/sh\ncat <<'JSON'\n{answer}\nJSON\n")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize(
    ("vllm", "torch", "known", "rules", "torch_matches", "said"),
    [
        ("0.26.0", "2.11.0+cu130", True, "0.26.0", True, "known"),
        ("0.26.1", "2.11.0", False, "0.26.0", True, "UNKNOWN: refused without --allow-unknown-engine-version"),
        ("0.19.1", "2.10.0", False, None, None, "older than every supported release"),
        (None, "2.11.0", False, None, None, "no vLLM installed"),
    ],
)
def test_engines_lists_versions_and_the_local_vllm(
    runner: CliRunner,
    tmp_path: Path,
    vllm: str | None,
    torch: str | None,
    known: bool,
    rules: str | None,
    torch_matches: bool | None,
    said: str,
) -> None:
    python = str(fake_interpreter(tmp_path, vllm, torch))
    result = runner.invoke(app, ["engines", "--python", python, "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    vllm_row = next(engine for engine in data["engines"] if engine["name"] == "vllm")
    versions = [row["version"] for row in vllm_row["versions"]]
    assert versions[0] == "0.20.0" and "0.26.0" in versions and "0.33.0" in versions
    assert {row["proven"] for row in vllm_row["versions"]} <= {"gpu", "source"}
    coverage = {row["version"]: row["coverage"] for row in vllm_row["versions"]}
    assert (coverage["0.26.0"], coverage["0.33.0"], coverage["0.20.0"]) == ("gpu", "source", "none")
    local = data["local"]
    assert (local["vllm"], local["known"], local["rules"], local["torch_matches_pin"]) == (
        vllm,
        known,
        rules,
        torch_matches,
    )
    human = runner.invoke(app, ["engines", "--python", python])
    assert human.exit_code == 0 and said in human.stderr and "0.33.0" in human.stderr
    assert "not GPU-proven" in " ".join(human.stderr.split())


def test_engines_refuses_an_interpreter_it_cannot_run(runner: CliRunner, tmp_path: Path) -> None:
    """A wrong --python is an input error (3), not an all-clear: the table still comes, then the refusal."""
    result = runner.invoke(app, ["engines", "--python", str(tmp_path / "missing"), "--json"])
    assert result.exit_code == ExitCode.INPUT_INVALID
    document = json.loads(result.stdout)
    assert document["ok"] is False and document["engines"]
    assert "cannot read package versions" in document["local"]["error"]
    assert document["error"]["exit_code"] == ExitCode.INPUT_INVALID and "--python" in document["error"]["hint"]
    human = runner.invoke(app, ["engines", "--python", str(tmp_path / "missing")])
    assert human.exit_code == ExitCode.INPUT_INVALID and "What to do:" in human.stderr


# --------------------------------------------------------------------------------------------- parse errors


def _entry(
    capsys: pytest.CaptureFixture[str], entry: Callable[[list[str]], object], args: list[str]
) -> tuple[int, str, str]:
    """Run a console-script entry point as the shell would: its exit code, stdout and stderr."""
    with pytest.raises(SystemExit) as exited:
        entry(args)
    captured = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 0), captured.out, captured.err


def _bless_main(args: list[str]) -> object:
    return cli_main.main(argv=args)


@pytest.mark.parametrize(
    ("entry", "args"),
    [
        (_bless_main, ["run", "--json"]),
        (_bless_main, ["run", "--profile", "profiles/reference-cpu.toml", "--trials", "0", "--json"]),
        (_bless_main, ["run", "--profile", "profiles/reference-cpu.toml", "--trials", "two", "--json"]),
        (_bless_main, ["verify", "--json"]),
        (_bless_main, ["list", "--no-such-option", "--json"]),
        (cli_serve.main, ["--json"]),
        (cli_serve.main, ["stop", "--json"]),
    ],
)
def test_parse_errors_under_json_still_write_one_json_document(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    entry: Callable[[list[str]], object],
    args: list[str],
) -> None:
    """Errors click raises before a command body runs: exit 2, click's message on stderr, JSON on stdout."""
    monkeypatch.setenv("BLESS_ROOT", str(tmp_path / "root"))
    code, out, err = _entry(capsys, entry, args)
    assert code == ExitCode.USAGE
    doc = json.loads(out)
    assert doc["ok"] is False and doc["error"]["exit_code"] == ExitCode.USAGE
    assert doc["error"]["error"] == "UsageError" and "--help" in doc["error"]["hint"]
    assert "Error:" in err and "Usage:" in err  # humans get what click always printed
    code, out, err = _entry(capsys, entry, [arg for arg in args if arg != "--json"])
    assert code == ExitCode.USAGE and out == "" and "Error:" in err


def test_entry_points_exit_with_the_command_code(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Non-standalone click must not swallow exit codes: success is 0, a refusal its own code, --help 0."""
    monkeypatch.setenv("BLESS_ROOT", str(tmp_path / "root"))
    assert _entry(capsys, _bless_main, ["--help"])[0] == 0
    code, out, _ = _entry(capsys, _bless_main, ["exit-codes", "--json"])
    assert code == 0 and json.loads(out)["ok"] is True
    code, out, _ = _entry(capsys, _bless_main, ["show", "deadbeefdeadbeef", "--json"])
    assert code == ExitCode.NO_MANIFEST and json.loads(out)["error"]["exit_code"] == ExitCode.NO_MANIFEST


@pytest.mark.parametrize("command", [["hash"], ["run"], ["diff", "deadbeefdeadbeef"]])
def test_a_directory_as_profile_is_an_input_error_like_a_missing_file(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, command: list[str]
) -> None:
    monkeypatch.setenv("BLESS_ROOT", str(tmp_path / "root"))
    bless_profile(Store(tmp_path / "root"), write_profile(tmp_path), tmp_path)  # diff's hash must exist
    hash_ = Store(tmp_path / "root").records()[0].manifest
    assert hash_ is not None
    args = [hash_.config_hash if arg == "deadbeefdeadbeef" else arg for arg in command]
    code, out, err = _entry(capsys, _bless_main, [*args, "--profile", str(tmp_path), "--json"])
    assert code == ExitCode.INPUT_INVALID, err
    assert "is a directory" in json.loads(out)["error"]["message"]
    code, _, _ = _entry(capsys, _bless_main, [*args, "--profile", str(tmp_path / "missing.toml")])
    assert code == ExitCode.INPUT_INVALID


# --------------------------------------------------------------------------------------------- push rendering


@pytest.mark.parametrize(("uploaded", "says_rest"), [(3, False), (1, True)])
def test_push_says_the_registry_had_the_rest_only_when_it_had_some(uploaded: int, says_rest: bool) -> None:
    from rich.console import Console

    from bless.cli.registry import _render_push

    console = Console(record=True, width=200)
    data = {
        "reference": "localhost:5000/caches/reference:v1",
        "digest": "sha256:" + "0" * 64,
        "pinned": "localhost:5000/caches/reference@sha256:" + "0" * 64,
        "blobs_uploaded": uploaded,
        "blobs_total": 3,
        "bytes_uploaded": 10 * uploaded,
        "bytes_total": 30,
        "signatures": None,
    }
    _render_push(console, data)
    text = console.export_text()
    assert f"{uploaded} of 3 blobs uploaded" in text
    assert ("the registry had the rest" in text) is says_rest


# --------------------------------------------------------------------------------------------- --version, completion


@pytest.mark.parametrize(("entry", "program"), [(_bless_main, "bless"), (cli_serve.main, "serve-full")])
def test_version_prints_the_installed_version_and_exits_0(
    capsys: pytest.CaptureFixture[str], entry: Callable[[list[str]], object], program: str
) -> None:
    """Eager: no command (bless) and no --profile (serve-full) needed; the distribution's version, one line."""
    import importlib.metadata

    code, out, _ = _entry(capsys, entry, ["--version"])
    assert code == 0
    assert out == f"{program} {importlib.metadata.version('bless-cache')}\n"


def test_version_falls_back_to_the_package_when_bless_is_not_installed(tmp_path: Path) -> None:
    """A checkout run without installing (PYTHONPATH, as the GPU scripts do) has no distribution metadata.

    The interpreter starts without site (-S); bless and its dependencies are reached through a directory that links
    the package and every entry of this venv's site-packages except bless's own metadata and editable finder.
    """
    import subprocess
    import sys
    import sysconfig

    import bless

    deps = tmp_path / "deps"
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("bless-", "bless_cache", "__editable__", "bless.")):
            (deps / entry.name).symlink_to(entry)
    # bless alone, not the checkout: an editable install leaves bless_cache.egg-info (metadata) at the checkout's top
    (deps / "bless").symlink_to(Path(bless.__file__).resolve().parent)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(deps)}
    check = (
        "import importlib.metadata as m\ntry:\n    m.version('bless-cache')\n"
        "except m.PackageNotFoundError:\n    print('no')"
    )
    # cwd: -c and -m put it first on sys.path, and the checkout's is where bless_cache.egg-info is
    absent = subprocess.run(
        [sys.executable, "-S", "-c", check], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert absent.stdout.strip() == "no", absent.stdout + absent.stderr  # the fallback path is the one taken
    for module, program in (("bless.cli.main", "bless"), ("bless.cli.serve", "serve-full")):
        result = subprocess.run(
            [sys.executable, "-S", "-m", module, "--version"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout == f"{program} {bless.__version__}\n"


@pytest.mark.parametrize(
    ("module", "variable", "words", "expected"),
    [
        ("bless.cli.main", "_BLESS_COMPLETE", "bless ver", "verify"),
        ("bless.cli.main", "_BLESS_COMPLETE", "bless run --tri", "--trials"),
        ("bless.cli.serve", "_SERVE_FULL_COMPLETE", "serve-full --dry", "--dry-run"),
    ],
)
def test_shell_completion_answers_through_the_entry_point(
    module: str, variable: str, words: str, expected: str
) -> None:
    """What the script from --install-completion / --show-completion asks the program at every TAB (bash)."""
    import os
    import subprocess
    import sys

    env = os.environ | {variable: "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)}
    program = "bless" if module.endswith("main") else "serve-full"
    code = f"import sys; sys.argv[0] = {program!r}; import {module} as m; m.main()"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert expected in result.stdout.split(), result.stdout


def test_show_completion_prints_a_script_for_the_named_program() -> None:
    """Run from bash, as a user runs it: ``--show-completion`` takes no shell name, it detects the shell running it.

    The shell is found among the process's ancestors (the nearest shell within ten), so called inside pytest
    the answer was whatever shell had started the test run: ``sh`` (not supported, exit 1) under a runner
    using ``sh -c``. Here bash is the parent, whatever runs the tests.
    """
    import subprocess
    import sys

    code = "import sys; sys.argv[0] = 'bless'; import bless.cli.main as m; m.main()"
    # Not a lone command: bash would exec it, and the parent would be whatever started bash.
    script = '"$0" -c "$1" --show-completion; exit $?'
    result = subprocess.run(
        ["bash", "-c", script, sys.executable, code], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "_BLESS_COMPLETE=complete_bash" in out and "complete -o default -F _bless_completion bless" in out


@pytest.mark.parametrize("vllm", [None, "0.20.0"])
def test_engines_says_torch_is_not_installed_rather_than_none(vllm: str | None) -> None:
    from io import StringIO

    from rich.console import Console

    out = StringIO()
    local = {"python": "/usr/bin/python3", "vllm": vllm, "torch": None, "known": True, "rules": None}
    cli_render.render_engines(
        Console(file=out, width=200), {"engines": [], "local": {**local, "torch_matches_pin": None}}
    )
    assert "torch not installed" in out.getvalue() and "None" not in out.getvalue()


def test_the_readme_names_the_columns_bless_list_shows(bless: Invoke, blessed: Manifest) -> None:
    result = bless("list")
    assert result.exit_code == 0, result.stderr
    header = next(line for line in result.stderr.splitlines() if "hash" in line and "engine" in line)
    shown_columns = [cell.strip() for cell in header.strip("┃│ ").split("┃")]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| `bless list` |"))
    described = row.split("table of blessings:", 1)[1].rstrip("| ")
    documented = [re.sub(r"\s*\(.*?\)", "", column).strip() for column in described.split(", ")]
    assert documented == shown_columns
