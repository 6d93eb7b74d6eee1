"""Hostile command-line values: a refusal with its documented exit code, and nothing written outside the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from bless.cli.serve import stop_app
from bless.errors import ExitCode
from tests.support.cli import cli_runner


def _everything_under(directory: Path) -> set[Path]:
    return set(directory.rglob("*"))


@pytest.mark.parametrize(
    "name",
    ["x/../../escaped/evil", "../escaped", "a/b", "..", "x" * 5000],
    ids=["traversal", "dotdot-first", "slash", "dotdot", "very-long"],
)
def test_serve_stop_refuses_a_hostile_name_before_it_creates_anything(tmp_path: Path, name: str) -> None:
    root = tmp_path / "store" / "root"
    root.mkdir(parents=True)
    before = _everything_under(tmp_path)
    result = cli_runner().invoke(stop_app, [name, "--root", str(root), "--json"])
    assert result.exit_code == ExitCode.INPUT_INVALID, result.output
    assert "invalid profile name" in result.stderr
    assert _everything_under(tmp_path) == before, "a refused name created files or dirs (the start lock)"


VLLM_PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "vllm-0.26-llama-3.1-8b-dummy-local.toml"


@pytest.mark.parametrize(
    ("extra_args", "code"),
    [
        ('["--max_model_len", "8"]', ExitCode.INPUT_INVALID),
        ('["--max_model_len=8"]', ExitCode.INPUT_INVALID),
        ('["--enforce_eager"]', ExitCode.INPUT_INVALID),
        ('["--compilation_config", "{}"]', ExitCode.INPUT_INVALID),
        ('["--compilation_config.mode=0"]', ExitCode.INPUT_INVALID),
        # vLLM pulls more flags from a YAML file named by --config: its contents would be in no factor.
        ('["--config", "/tmp/more-flags.yaml"]', ExitCode.INPUT_INVALID),
        ('["--config=/tmp/more-flags.yaml"]', ExitCode.INPUT_INVALID),
    ],
)
def test_vllm_extra_args_refuse_a_modeled_flag_spelled_with_underscores(
    tmp_path: Path, extra_args: str, code: ExitCode
) -> None:
    """vLLM's parser reads ``--max_model_len`` as ``--max-model-len``: the underscore spelling must not smuggle
    a modeled, managed or compile-disabling flag past the checks the dash spelling meets."""
    from bless.cli.main import app

    text = VLLM_PROFILE.read_text(encoding="utf-8")
    start = text.index("extra_args = [")
    end = text.index("]", start) + 1
    profile = tmp_path / "hostile.toml"
    profile.write_text(text[:start] + f"extra_args = {extra_args}" + text[end:], encoding="utf-8")
    result = cli_runner().invoke(
        app, ["--root", str(tmp_path / "root"), "hash", "--profile", str(profile), "--offline", "--json"]
    )
    assert result.exit_code == code, result.output + result.stderr


@pytest.mark.parametrize("extra_args", [["--optimization_level=0"], ["--optimization_level", "0"]])
def test_vllm_optimization_level_zero_spelled_with_underscores_is_unsafe(extra_args: list[str]) -> None:
    from bless.engines.vllm.serve_args import unsafe_serve_settings

    found = unsafe_serve_settings({"extra_args": extra_args})
    assert [setting.name for setting in found] == ["serve.extra_args"], found


@pytest.mark.parametrize("command", ["verify", "show"])
def test_a_manifest_with_a_duplicate_config_hash_key_makes_its_lookup_manifest_invalid(
    tmp_path: Path, command: str
) -> None:
    """``bless list`` calls such a file invalid (22); a lookup of the hash its name gives must refuse the same way,
    not answer that nothing is blessed (20, config drift)."""
    from bless.cli.main import app
    from bless.store import Store
    from tests.unit.store_helpers import make_manifest, write_tree

    store = Store(tmp_path / "root")
    manifest = make_manifest(write_tree(tmp_path / "tree"))
    store.publish(tmp_path / "tree", manifest)
    path = store.manifests_dir / f"{manifest.config_hash}.json"
    text = path.read_text(encoding="utf-8").rstrip()
    assert text.endswith("}")
    path.write_text(text[:-1] + ', "config_hash": "' + "0" * 64 + '"}\n', encoding="utf-8")
    result = cli_runner().invoke(app, ["--root", str(store.root), command, manifest.config_hash, "--json"])
    assert result.exit_code == ExitCode.MANIFEST_INVALID, result.stdout + result.stderr
    assert "duplicate key" in result.stderr


def test_a_store_path_this_user_cannot_stat_is_not_called_writable(tmp_path: Path) -> None:
    """``cannot stat (...)`` (permission denied for another user; here: a path below a file, which root meets
    too) is a reader's problem: the refusal must not call the path writable nor tell them to chmod go-w."""
    from bless.errors import VerifyFailedError
    from bless.store.trusted_paths import refuse_untrusted_paths

    plain_file = tmp_path / "file"
    plain_file.write_bytes(b"")
    with pytest.raises(VerifyFailedError) as refused:
        refuse_untrusted_paths([plain_file / "blessed"], config_hash="0" * 64, root=tmp_path)
    assert "cannot stat" in str(refused.value)
    assert "unreadable by this user" in str(refused.value)
    assert "writable by other users" not in str(refused.value)
    assert "chmod go-w" not in (refused.value.hint or "")


@pytest.mark.parametrize(
    "argv",
    [
        ["bless.cli.main", "--root", "", "list", "--json"],
        ["bless.cli.main", "--manifests-dir=", "gate", "--json"],
        ["bless.cli.serve", "stop", "demo", "--root", "", "--json"],
    ],
    ids=["root", "manifests-dir", "serve-full-stop"],
)
def test_an_empty_store_path_is_refused_not_read_as_the_current_directory(tmp_path: Path, argv: list[str]) -> None:
    """``--root "$UNSET"``: click would make it '.', and bless would list, gate or lock in the working directory."""
    import json
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "BLESS_ROOT": str(tmp_path / "unused")}
    done = subprocess.run(
        [sys.executable, "-m", *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert json.loads(done.stdout)["error"]["message"].endswith(
        "is empty, which would name the current directory: give a directory, or leave the option out for the default"
    )
    assert list(tmp_path.iterdir()) == [], "something was made in the working directory"


def test_only_an_empty_value_of_a_store_option_counts() -> None:
    from bless.cli.boundary import empty_store_path_option

    assert empty_store_path_option(["--root", "", "list"]) == "--root"
    assert empty_store_path_option(["--manifests-dir=", "gate"]) == "--manifests-dir"
    assert empty_store_path_option(["--root", "/r", "gate", ""]) is None  # an empty positional is another matter
    assert empty_store_path_option(["--root=/r", "--manifests-dir", "m"]) is None
    assert empty_store_path_option(["run", "--", "--root", ""]) is None
    assert empty_store_path_option(["--root"]) is None  # click says the value is missing


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe{}", b"[" * 100_000 + b"]" * 100_000, b'{"config_hash": "a", "config_hash": "b"}', b'{"x": NaN}', b"{"],
    ids=["not-utf8", "nested", "duplicate-key", "nan", "truncated"],
)
def test_every_refusal_of_a_manifest_file_says_what_to_do(tmp_path: Path, content: bytes) -> None:
    from bless.core.manifest import read_manifest
    from bless.errors import ManifestInvalidError

    path = tmp_path / ("a" * 64 + ".json")
    path.write_bytes(content)
    with pytest.raises(ManifestInvalidError) as refused:
        read_manifest(path)
    assert refused.value.hint


@pytest.mark.parametrize(
    "content",
    [
        b"\xff name = 1",
        b"name = ",
        b"a = " + b"[" * 5000 + b"]" * 5000,
        (Path(__file__).resolve().parents[2] / "profiles" / "reference-cpu.toml")
        .read_bytes()
        .replace(b"seed = 0", b"seed = nan"),
    ],
    ids=["not-utf8", "not-toml", "nested", "nan"],
)
def test_every_refusal_of_a_profile_file_says_what_to_do(tmp_path: Path, content: bytes) -> None:
    from bless.core.profile import parse_profile
    from bless.errors import InputInvalidError

    with pytest.raises(InputInvalidError) as refused:
        parse_profile(content, tmp_path / "p.toml")
    assert refused.value.hint


def test_a_whole_float_is_not_an_integer_of_a_profile(tmp_path: Path) -> None:
    """``gpu_count = 1.0`` was taken as 1 for the hash and shown as "needs 1.0 GPU(s)"; a count is an integer."""
    from bless.core.profile import parse_profile
    from bless.errors import InputInvalidError

    text = (Path(__file__).resolve().parents[2] / "profiles" / "reference-cuda-local.toml").read_bytes()
    assert b"gpu_count = 1\n" in text
    with pytest.raises(InputInvalidError, match=r"hardware\.gpu_count: 1\.0 is not of type 'integer'"):
        parse_profile(text.replace(b"gpu_count = 1\n", b"gpu_count = 1.0\n"), tmp_path / "p.toml")
