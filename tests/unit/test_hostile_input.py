"""Hostile names, manifests and profiles through the real CLI: escaped output, valid JSON, the right exit codes.

Names on disk and fields of manifests are data someone else may have chosen: a newline and ANSI
escapes in one must not forge a line, a byte that is not UTF-8 must not break ``--json``, a field of
the wrong type must not crash a command. The fuzz tests at the end keep this true for what
hypothesis can think of: whatever a profile or a manifest holds, a command ends with a documented
refusal, never exit 1 (INTERNAL) and never a traceback.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from rich.console import Console
from typer.testing import CliRunner, Result

from bless.cli.gate import render_gate
from bless.cli.main import app
from bless.cli.run import render_run
from bless.cli.serve_views import render_finished
from bless.core.factors import config_hash
from bless.core.manifest import Manifest, manifest_from_dict
from bless.core.relpath import BIDI_CONTROLS, check_relative_path
from bless.core.schemas import SCHEMA_DIR
from bless.core.untrusted_text import json_safe, shown
from bless.errors import ExitCode
from bless.store import Store
from tests.support.cli import cli_runner
from tests.unit.store_helpers import make_manifest, mutate_json, paths_of, write_tree

REPO = Path(__file__).resolve().parents[2]
IMAGE_ID = "sha256:" + "ab" * 32
#: A line that, printed raw, would look like bless's own success line.
FORGED = "evil\n\x1b[1;32mverified\x1b[0m all files match\x1b[2K\r"

# --- helpers --------------------------------------------------------------------------------------------


@pytest.fixture
def runner() -> CliRunner:
    return cli_runner()


Invoke = Callable[..., Result]


def invoker(runner: CliRunner, root: Path) -> Invoke:
    def invoke(*args: str) -> Result:
        return runner.invoke(app, ["--root", str(root), *args])

    return invoke


def blessed_store(tmp_path: Path) -> tuple[Store, Manifest]:
    store = Store(tmp_path / "root")
    manifest = make_manifest(write_tree(tmp_path / "tree"))
    store.publish(tmp_path / "tree", manifest)
    return store, manifest


def writable(directory: Path) -> None:
    """Blessed dirs are 0555: make one writable to tamper with it, as an attacker with write access would."""
    directory.chmod(0o755)


def no_raw_controls(text: str) -> None:
    """Nothing a terminal would act on: no ESC, no C1 control, no bidi control, no carriage return."""
    acted_on = [c for c in text if c in "\x1b\r\x07\x08" or 0x80 <= ord(c) <= 0x9F or c in BIDI_CONTROLS]
    assert acted_on == [], f"raw control characters reached the terminal: {acted_on!r}"


def no_forged_line(text: str) -> None:
    for line in text.splitlines():
        assert not line.lstrip(" │|").startswith("verified"), f"a name forged a line: {line!r}"


def run_bless(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """``bless`` as a real process, stdout as bytes (to check it is valid UTF-8)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "250", "GITHUB_ACTIONS": "", **(env or {})}
    env.pop("BLESS_MANIFESTS_DIR", None)
    return subprocess.run(
        [sys.executable, "-m", "bless.cli.main", "--root", str(root), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=120,
    )


# --- item 7: terminal injection -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain/name-1.bin", "plain/name-1.bin"),
        ("ünïcødé 名前", "ünïcødé 名前"),
        ("a\nb", "a\\x0ab"),
        ("\x1b[31m", "\\x1b[31m"),
        ("\x85\x9b", "\\u0085\\u009b"),  # C1 controls (NEL, 8-bit CSI)
        ("\u202eevil", "\\u202eevil"),
        ("\u2028", "\\u2028"),
        ("back\\slash", "back\\\\slash"),
        ("\udcff\udc80", "\\xff\\x80"),  # bytes of a file name that is not UTF-8
    ],
)
def test_shown_escapes_every_non_printable(text: str, expected: str) -> None:
    assert shown(text) == expected
    assert shown(text).isprintable()


def test_json_safe_takes_documents_as_deep_as_json_loads_does() -> None:
    """A manifest nested ~900 levels deep is valid JSON (``bless show --json`` crashed on one at 500)."""
    deep = json.loads("[" * 900 + '"\\udcff"' + "]" * 900)
    safe = json_safe({"provenance": deep})
    for _ in range(901):
        safe = safe[0] if isinstance(safe, list) else safe["provenance"]
    assert safe == "\\xff"


def test_json_safe_changes_only_what_utf8_cannot_hold() -> None:
    document = {"ok": "a\nb\x1b", "bad\udcff": ["x\udcfe", 1, None], "n": 2}
    assert json_safe(document) == {"ok": "a\nb\x1b", "bad\\xff": ["x\\xfe", 1, None], "n": 2}


def test_verify_shows_hostile_names_from_disk_escaped(runner: CliRunner, tmp_path: Path) -> None:
    store, manifest = blessed_store(tmp_path)
    blessed = store.blessed_dir(manifest)
    writable(blessed)
    (blessed / FORGED).write_bytes(b"x")
    bless = invoker(runner, store.root)
    result = bless("verify", manifest.config_hash)
    assert result.exit_code == ExitCode.VERIFY_FAILED, result.stderr
    no_raw_controls(result.stderr)
    no_forged_line(result.stderr)
    assert shown(FORGED) in result.stderr
    document = json.loads(bless("verify", manifest.config_hash, "--json").stdout)
    assert [p["path"] for p in document["result"]["problems"]] == [FORGED], "--json keeps the exact name"


def test_list_shows_hostile_manifest_file_names_escaped(runner: CliRunner, tmp_path: Path) -> None:
    store, _ = blessed_store(tmp_path)
    (store.manifests_dir / f"{FORGED}.json").write_text("{}")
    result = invoker(runner, store.root)("list")
    assert result.exit_code == ExitCode.MANIFEST_INVALID, result.stderr
    no_raw_controls(result.stderr)
    no_forged_line(result.stderr)
    assert shown(FORGED) in result.stderr


def test_show_escapes_manifest_fields(runner: CliRunner, tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    manifest = make_manifest(write_tree(tmp_path / "tree"))
    hostile = Manifest(**{**manifest.__dict__, "profile_name": FORGED})
    store.publish(tmp_path / "tree", hostile)
    result = invoker(runner, store.root)("show", hostile.config_hash)
    assert result.exit_code == 0, result.stderr
    no_raw_controls(result.stderr)
    no_forged_line(result.stderr)


# Everything check_relative_path refuses for being a control or a bidi character.
FORBIDDEN = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))] + sorted(BIDI_CONTROLS)


@pytest.mark.parametrize("char", FORBIDDEN, ids=lambda c: f"U+{ord(c):04X}")
def test_manifest_paths_refuse_controls_and_bidi_in_code_and_schema(char: str) -> None:
    path = f"dir/a{char}b"
    with pytest.raises(ValueError, match=r"control|NUL"):
        check_relative_path(path)
    assert not relpath_validator().is_valid(path)


def relpath_validator() -> Draft202012Validator:
    schema = json.loads((SCHEMA_DIR / "manifest.v1.json").read_text())
    return Draft202012Validator({"$ref": "#/$defs/relpath", "$defs": schema["$defs"]})


def test_code_and_schema_agree_on_every_character_of_the_bmp_start() -> None:
    """One rule in two languages: for each character, the schema and check_relative_path agree."""
    validator = relpath_validator()
    for code in (*range(0x3000), 0xFEFF, 0xFFFC):
        path = f"a{chr(code)}b"
        try:
            check_relative_path(path)
            accepted = True
        except ValueError:
            accepted = False
        assert validator.is_valid(path) == accepted, f"U+{code:04X}"


# --- item 8: fields of the wrong type -------------------------------------------------------------------


def rewritten(store: Store, manifest: Manifest, change: Callable[[dict[str, Any]], None]) -> str:
    """Rewrite the live manifest with ``change`` applied and a config hash that matches its factors."""
    document = manifest.to_dict()
    change(document)
    document["config_hash"] = config_hash(document["factors"])
    path = store.manifest_path(manifest.config_hash)
    assert path is not None
    path.unlink()
    (store.manifests_dir / f"{document['config_hash']}.json").write_text(json.dumps(document))
    return str(document["config_hash"])


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["factors"].update(model="not-an-object"),
        lambda d: d["factors"]["model"].update(revision=7),
        lambda d: d["factors"].update(engine=["reference"]),
        lambda d: d["factors"]["hardware"].update(gpu_count="two"),
        lambda d: d["trials"]["results"][0].update(start_to_ready_s="fast"),
    ],
    ids=["model-not-object", "revision-int", "engine-list", "gpu-count-str", "ready-str"],
)
def test_wrongly_typed_manifest_fields_are_invalid_not_internal(
    runner: CliRunner, tmp_path: Path, change: Callable[[dict[str, Any]], None]
) -> None:
    store, manifest = blessed_store(tmp_path)
    new_hash = rewritten(store, manifest, change)
    bless = invoker(runner, store.root)
    for args in (("list",), ("list", "--json"), ("show", new_hash), ("show", new_hash, "--json")):
        result = bless(*args)
        assert result.exit_code == ExitCode.MANIFEST_INVALID, (args, result.stderr, result.stdout)
        assert "Traceback" not in result.stderr and "internal error" not in result.stderr


def test_manifest_reads_are_defensive() -> None:
    """A Manifest built without the schema (from code) still labels itself instead of raising."""
    manifest = manifest_from_dict(make_manifest_document())
    odd = Manifest(**{**manifest.__dict__, "factors": {"engine": "x", "model": {"id": 3, "revision": 7}}})
    assert odd.engine == "?"
    assert odd.model_label == "?"


def make_manifest_document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(
        (REPO / "tests" / "fixtures" / "manifests" / "reference-cpu.v1.json").read_text()
    )
    return document


# --- item 9: NUL bytes in a profile ------------------------------------------------------------------------


def nul_in_runtime_python(document: dict[str, Any]) -> None:
    document["runtime"] = {"kind": "local", "python": "/usr/bin/py\0thon"}


@pytest.mark.parametrize(
    "edit",
    [
        nul_in_runtime_python,
        lambda document: document["env"].update(SOME_FLAG="1\0; rm -rf /"),
        lambda document: document["model"].update(id="reference-tiny\0"),
    ],
    ids=["runtime-python", "env-value", "model-id"],
)
def test_a_nul_character_in_a_profile_is_invalid_input(
    runner: CliRunner, tmp_path: Path, edit: Callable[[dict[str, Any]], None]
) -> None:
    document = base_profile()
    edit(document)
    profile = write_toml(tmp_path / "p.toml", document)
    for extra in ((), ("--json",)):
        result = invoker(runner, tmp_path / "root")("hash", "--profile", str(profile), "--offline", *extra)
        assert result.exit_code == ExitCode.INPUT_INVALID, (result.stderr, result.stdout)
        assert "NUL" in result.stderr


# --- item 10: file names that are not UTF-8 in --json ---------------------------------------------------


def test_verify_json_with_a_non_utf8_file_name_is_valid_json_and_exit_21(tmp_path: Path) -> None:
    store, manifest = blessed_store(tmp_path)
    blessed = store.blessed_dir(manifest)
    writable(blessed)
    with open(os.path.join(os.fsencode(blessed), b"bad-\xff\xfe-name"), "wb") as handle:
        handle.write(b"x")
    proc = run_bless(store.root, "verify", manifest.config_hash, "--json")
    assert proc.returncode == ExitCode.VERIFY_FAILED, proc.stderr.decode(errors="replace")
    document = json.loads(proc.stdout.decode("utf-8"))  # strict: valid UTF-8
    assert [p["path"] for p in document["result"]["problems"]] == ["bad-\\xff\\xfe-name"]
    assert document["error"]["exit_code"] == ExitCode.VERIFY_FAILED
    human = run_bless(store.root, "verify", manifest.config_hash)
    assert human.returncode == ExitCode.VERIFY_FAILED
    assert "bad-\\xff\\xfe-name" in human.stderr.decode("utf-8")


def test_list_json_with_a_non_utf8_manifest_file_name_is_valid_json(tmp_path: Path) -> None:
    store, _ = blessed_store(tmp_path)
    with open(os.path.join(os.fsencode(store.manifests_dir), b"\xff.json"), "wb") as handle:
        handle.write(b"{}")
    proc = run_bless(store.root, "list", "--json")
    assert proc.returncode == ExitCode.MANIFEST_INVALID, proc.stderr.decode(errors="replace")
    document = json.loads(proc.stdout.decode("utf-8"))
    assert [item["path"].rsplit("/", 1)[-1] for item in document["invalid"]] == ["\\xff.json"]


# --- fuzz: manifests through list, show and verify ------------------------------------------------------

hostile_text = st.text(
    alphabet=st.sampled_from(["a", "/", ".", "\\", "\n", "\r", "\x00", "\x1b", "\x85", "\u202e", "\udcff", "é", "0"]),
    max_size=8,
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**64), max_value=2**64) | st.floats() | hostile_text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(hostile_text, children, max_size=3),
    max_leaves=8,
)


def assert_documented_outcome(result: Result, as_json: bool) -> None:
    """A documented exit code, never INTERNAL; no traceback; with --json exactly one JSON document."""
    codes = {int(code) for code in ExitCode} - {int(ExitCode.INTERNAL)}
    assert result.exit_code in codes, (result.exit_code, result.stderr[-2000:], result.stdout[-2000:])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.stderr
    if as_json:
        document = json.loads(result.stdout)
        assert document["ok"] is (result.exit_code == 0)


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, Manifest]:
    return blessed_store(tmp_path_factory.mktemp("fuzz-store"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_manifests_through_list_show_verify(
    runner: CliRunner, fuzz_store: tuple[Store, Manifest], data: st.DataObject
) -> None:
    store, manifest = fuzz_store
    document = copy.deepcopy(manifest.to_dict())  # to_dict shares nested values with the manifest
    mutate_json(document, data, json_values)
    if data.draw(st.booleans(), label="rehash"):  # let changed factors through the hash check, to reach the readers
        with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError, RecursionError):
            document["config_hash"] = config_hash(document["factors"])
    live = store.manifests_dir / f"{manifest.config_hash}.json"
    original = live.read_bytes()
    names: list[str | bytes] = ["fuzz.json", "fuzz\n\x1b[2K.json", b"\xff.json"]
    name = data.draw(st.sampled_from(names), label="file name")
    fuzz_file = os.path.join(os.fsencode(store.manifests_dir), name if isinstance(name, bytes) else name.encode())
    live.unlink()
    try:
        with open(fuzz_file, "wb") as handle:
            handle.write(json.dumps(document).encode("utf-8", "surrogatepass"))
        claimed = document.get("config_hash")
        wanted = claimed if isinstance(claimed, str) and len(claimed) >= 8 else manifest.config_hash
        bless = invoker(runner, store.root)
        for args in (("list",), ("show", wanted), ("verify", wanted)):
            for as_json in (False, True):
                result = bless(*args, *(("--json",) if as_json else ()))
                assert_documented_outcome(result, as_json)
                no_raw_controls(result.stderr)
    finally:
        os.unlink(fuzz_file)
        live.write_bytes(original)


# --- fuzz: profiles through bless hash -------------------------------------------------------------------


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        return repr(value) if abs(value) != float("inf") else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are TOML basic-string escapes (lone surrogates: invalid TOML)
    if isinstance(value, list):  # TOML has no null: a None is left out (keys with None, below, too)
        return "[" + ", ".join(toml_value(item) for item in value if item is not None) + "]"
    if isinstance(value, dict):
        items = [(k, v) for k, v in value.items() if v is not None]
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in items) + "}"
    raise TypeError(type(value))


def write_toml(path: Path, document: dict[str, Any]) -> Path:
    """``document`` as a TOML file (inline tables; a lone surrogate is written as is and makes it invalid)."""
    lines = [f"{json.dumps(key)} = {toml_value(value)}" for key, value in document.items() if value is not None]
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass"))
    return path


def base_profile() -> dict[str, Any]:
    return {
        "profile_version": 1,
        "name": "fuzz",
        "engine": {"name": "reference"},
        "runtime": {"kind": "docker", "image": IMAGE_ID},
        "model": {"source": "builtin", "id": "reference-tiny"},
        "serve": {"layers": 2, "device": "cpu"},
        "env": {"SOME_FLAG": "1"},
        "hardware": {"accelerator": "cpu", "cpu_isa": "x86-64-v2"},
        "trials": {"count": 3, "prompts": ["a"]},
        "serving": {"host": "127.0.0.1", "port": 8000},
    }


def keep_offline(document: dict[str, Any]) -> None:
    """Nothing a fuzzed profile says may reach Docker or start a program it names (unless refused first)."""
    runtime = document.get("runtime")
    if not isinstance(runtime, dict):
        return
    image = runtime.get("image")
    if isinstance(image, str) and "\0" not in image:
        runtime["image"] = IMAGE_ID
    python = runtime.get("python")
    if isinstance(python, str) and "\0" not in python:
        runtime["python"] = "/nonexistent/bless-fuzz-python"
    if runtime.get("kind") == "local" and "python" not in runtime:
        runtime["python"] = "/nonexistent/bless-fuzz-python"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_profiles_through_bless_hash(runner: CliRunner, tmp_path: Path, data: st.DataObject) -> None:
    document = base_profile()
    target = data.draw(st.sampled_from(paths_of(document)[1:]), label="path")
    parent: Any = document
    for key in target[:-1]:
        parent = parent[key]
    action = data.draw(st.sampled_from(["replace", "delete", "add"]), label="action")
    if action == "delete":
        del parent[target[-1]]
    elif action == "add" and isinstance(parent[target[-1]], dict):
        parent[target[-1]][data.draw(hostile_text, label="key")] = data.draw(json_values, label="value")
    else:
        parent[target[-1]] = data.draw(json_values, label="value")
    keep_offline(document)
    profile = write_toml(tmp_path / "fuzz.toml", document)
    bless = invoker(runner, tmp_path / "root")
    for extra in ((), ("--json",)):
        result = bless("hash", "--profile", str(profile), "--offline", "--declared-hardware", *extra)
        assert_documented_outcome(result, bool(extra))
        no_raw_controls(result.stderr)


# --- item 7 beyond list/show/verify: run, gate and serve-full views ---------------------------------------


def captured(render_view: Callable[[Console, Any], None], data: Any) -> str:
    buffer = io.StringIO()
    render_view(Console(file=buffer, width=300, highlight=False, soft_wrap=False), data)
    return buffer.getvalue()


def test_run_view_shows_engine_reasons_as_text_not_markup() -> None:
    """A trial reason quotes the engine's log: "[/x]" in it was read as rich markup (and raised), ESC went raw."""
    reason = f"log said [/x] {FORGED}"
    trial = {"index": 1, "passed": False, "reasons": [reason], "timings": {}, "coherence": None}
    candidate = {"index": 1, "bootstrap": {"timings": {}}, "trials": [trial]}
    data = {"candidates": [candidate], "wall_seconds": 1.0, "engine_seconds": 1.0, "published": False}
    out = captured(render_run, data)
    no_raw_controls(out)
    no_forged_line(out)
    assert "log said [/x]" in out


def test_gate_view_shows_profile_paths_and_reasons_escaped() -> None:
    row = {
        "profile": f"profiles/{FORGED}.toml",
        "config_hash": None,
        "status": "failed",
        "reason": f"nearest blessing ({FORGED}) differs",
        "hardware": "declared",
        "notes": [FORGED],
    }
    data = {"manifests_dir": "m", "rows": [row], "failed": 1, "passed": False, "profiles": 1}
    out = captured(render_gate, data)
    no_raw_controls(out)
    no_forged_line(out)


def test_serve_view_shows_upper_layer_paths_escaped() -> None:
    """Paths the engine wrote to the overlay's upper layer are names on disk like any other."""
    finish = {
        "stopped_gracefully": True,
        "exit_code": 0,
        "upper_kept": True,
        "upper_dir": "/srv/upper",
        "upper_written": 1,
        "upper_entries": [{"kind": "new", "path": FORGED, "size": 1}],
        "notes": [],
    }
    out = captured(render_finished, {"finish": finish, "ended_by": "SIGTERM"})
    no_raw_controls(out)
    no_forged_line(out)


def test_gate_outputs_for_ci_hold_any_profile_file_name(tmp_path: Path) -> None:
    """JUnit XML must parse and GitHub annotations must be UTF-8, whatever bytes a profile's file name holds."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    name = os.path.join(os.fsencode(profiles), b"drift-\xff-\x1b[31m.toml")
    with open(name, "wb") as handle:
        handle.write(write_toml(tmp_path / "base.toml", base_profile()).read_bytes())
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    junit = tmp_path / "gate.xml"
    args = ("gate", os.fsdecode(name), "--manifests-dir", str(manifests))
    as_json = run_bless(tmp_path / "root", *args, "--junit", str(junit), "--json")
    assert as_json.returncode == ExitCode.GATE_FAILED, as_json.stderr.decode(errors="replace")
    assert json.loads(as_json.stdout.decode("utf-8"))["ok"] is False
    case = ElementTree.fromstring(junit.read_bytes()).find("testsuite/testcase")
    assert case is not None and case.get("name", "").endswith("drift-\\xff-\\x1b[31m.toml")
    annotated = run_bless(tmp_path / "root", *args, env={"GITHUB_ACTIONS": "true"})
    assert annotated.returncode == ExitCode.GATE_FAILED, annotated.stderr.decode(errors="replace")
    assert annotated.stdout.decode("utf-8").startswith("::error file=")
