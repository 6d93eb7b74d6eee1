"""The public Python API (``import bless``): its surface, and every example of docs/reference/python-api.md run.

The examples run as written, in order, in one scratch directory holding this checkout's ``profiles/`` with
``$BLESS_ROOT`` there. The engine is the one fake: ``bless.runtime.get_runtime`` hands out a
:class:`~tests.support.fakes.FakeRuntime` (bless's own Runtime interface; its engines answer coherently), so a
blessing takes a second; the store, the adapter, the trial protocol, verify, the serve plan and TUF signing
are the real ones. The ``registry`` example pushes and pulls through a real Docker Distribution.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import re
import shutil
import subprocess
import sys
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import bless
import bless.runtime
from tests.support.fakes import FakeRuntime
from tests.support.registry import running_registry

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "reference" / "python-api.md"
MARKER = re.compile(r"<!-- python-api: (offline|registry) -->")


@dataclass(frozen=True)
class Example:
    line: int
    marker: str
    code: str


def examples() -> list[Example]:
    """The page's ``python`` blocks, each with the marker on the line before its fence (every block has one)."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    found: list[Example] = []
    for index, line in enumerate(lines):
        if line.strip() != "```python":
            continue
        marker = MARKER.fullmatch(lines[index - 1].strip()) if index else None
        assert marker, f"python-api.md:{index + 1}: a python block without a python-api marker"
        end = lines.index("```", index + 1)
        found.append(Example(index + 1, marker.group(1), "\n".join(lines[index + 1 : end]) + "\n"))
    return found


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The examples' directory: profiles/, $BLESS_ROOT and $HOME (where the trust repository goes), the fake
    runtime."""
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BLESS_ROOT", str(tmp_path / "root"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    runtime = FakeRuntime()
    monkeypatch.setattr(bless.runtime, "get_runtime", lambda kind: runtime)
    yield tmp_path
    runtime.close()


def run_examples(markers: tuple[str, ...], namespace: dict[str, object]) -> None:
    for example in examples():
        if example.marker in markers:
            code = compile(example.code, f"python-api.md:{example.line}", "exec")
            exec(code, dict(namespace))  # the page's own examples, run as a reader would


def test_every_name_of_the_api_is_documented_and_nothing_else_is_public() -> None:
    page = PAGE.read_text(encoding="utf-8")
    for name in bless.__all__:
        if name != "__version__":
            assert f"bless.{name}" in page, name
    public = {name for name in vars(bless) if not name.startswith("_") and callable(getattr(bless, name))}
    modules = {name for name in public if isinstance(getattr(bless, name), type(bless))}
    assert public - modules - {"annotations", "StrPath", "TYPE_CHECKING", "timedelta", "Path"} <= set(bless.__all__)


def test_import_bless_loads_no_engine_runtime_or_command_line() -> None:
    """The API's types are importable from ``bless`` (so its names resolve for type checkers and
    ``typing.get_type_hints``); the Docker SDK, the engines, the runtimes and the command line are imported
    only by the calls that need them."""
    script = "import sys, bless\nprint(sorted(m for m in sys.modules if m.split('.')[0] in ('docker', 'typer', "
    script += (
        "'rich', 'huggingface_hub', 'torch', 'oras', 'requests') or m.startswith(('bless.runtime.docker', 'bless.cli', "
    )
    script += "'bless.engines.reference'))))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def _named_types(hint: object) -> Iterator[type]:
    """The classes a type hint names (``X | None``, ``Callable[[Event], None]``, ``Mapping[str, Any]``...)."""
    origin = typing.get_origin(hint)
    if origin is None:
        if isinstance(hint, type) and hint.__module__ not in ("builtins", "typing"):
            yield hint
        return
    if isinstance(origin, type) and origin.__module__.startswith("bless"):
        yield origin
    for argument in typing.get_args(hint):
        if isinstance(argument, list):
            for item in argument:
                yield from _named_types(item)
        else:
            yield from _named_types(argument)


PUBLIC_CALLS = sorted(
    name for name in bless.__all__ if inspect.isfunction(getattr(bless, name)) and name != "__version__"
)


@pytest.mark.parametrize("name", PUBLIC_CALLS)
def test_every_type_a_call_takes_or_returns_is_exported(name: str) -> None:
    """``typing.get_type_hints`` resolves every public call, and each class it names is ``bless.<Name>``."""
    hints = typing.get_type_hints(getattr(bless, name))
    exported = {id(getattr(bless, n)) for n in bless.__all__}
    allowed_elsewhere = {"pathlib", "os", "datetime", "collections.abc"}
    missing = sorted(
        f"{t.__module__}.{t.__qualname__}"
        for hint in hints.values()
        for t in _named_types(hint)
        if id(t) not in exported and t.__module__.split(".")[0] not in allowed_elsewhere
    )
    assert missing == [], f"bless.{name} names types bless does not export: {missing}"


def test_every_exit_code_has_one_family_a_caller_can_catch() -> None:
    """Families by who is at fault (python-tuf's exceptions.py): every class with an exit code but internal (1)
    and interrupted (130) is in one (TRUST_EXISTS in two: a conflict and a trust problem); codes unchanged."""
    from bless.errors import EXIT_CODES, FAMILIES

    assert all(family.__name__ in bless.__all__ for family in FAMILIES)
    assert len(EXIT_CODES) == len(bless.ExitCode)
    classes = [getattr(bless, name) for name in bless.__all__]
    errors = [cls for cls in classes if isinstance(cls, type) and issubclass(cls, bless.BlessError)]
    declaring = {cls.exit_code: cls for cls in errors if "exit_code" in vars(cls)}
    assert set(declaring) == set(bless.ExitCode) - {bless.ExitCode.OK}
    outside = (bless.ExitCode.INTERNAL, bless.ExitCode.INTERRUPTED)
    for code, cls in declaring.items():
        families = [family.__name__ for family in FAMILIES if issubclass(cls, family)]
        expected = 0 if code in outside else 2 if code is bless.ExitCode.TRUST_EXISTS else 1
        assert len(families) == expected, (cls.__name__, families)
    assert bless.UsageError.exit_code == 2 and issubclass(bless.UsageError, bless.ConfigError)
    assert issubclass(bless.UnsignedError, bless.TrustError) and bless.UnsignedError.exit_code == 60
    assert issubclass(bless.RuntimeUnavailableError, bless.HostError)
    assert issubclass(bless.VerifyFailedError, bless.VerificationError)
    assert issubclass(bless.RegistryUnavailableError, bless.RegistryError)


def test_the_offline_examples_run(scratch: Path) -> None:
    assert [e.marker for e in examples()].count("offline") >= 6
    for example in examples():  # every name an example uses is its own or bless's (python-api.md's NameError)
        assert "registry}" not in example.code or "registry = " in example.code
    run_examples(("offline",), {})
    assert any((scratch / "root" / "archive").iterdir())  # the rebless example replaced the first blessing
    # the private keys went outside the checkout's copy (into $HOME), never next to profiles/
    assert (scratch / "home" / ".config" / "bless-example-trust" / "keys").is_dir()
    assert sorted(p.name for p in scratch.iterdir()) == ["home", "profiles", "root"]


def test_every_field_of_every_result_is_documented() -> None:
    """The page's Results table names each dataclass field of each result type ``bless`` exports."""
    rows = {
        row.split("|")[1].strip().strip("`"): row.split("|")[2]
        for row in PAGE.read_text(encoding="utf-8").split("\n## Results\n", 1)[1].splitlines()
        if row.startswith("| `")
    }
    suffixes = ("Result", "List", "Blessing", "Diff", "Config", "Record", "Signing")
    results = [name for name in bless.__all__ if name.endswith(suffixes)]
    for name in [*results, "Event"]:
        cls = getattr(bless, name)
        # a row under this name, else under another name bless gives the class (VerifyOutcome: VerifyResult)
        documented = name if name in rows else next(key for key in rows if getattr(bless, key) is cls)
        missing = [f.name for f in dataclasses.fields(cls) if f"`{f.name}`" not in rows[documented]]
        assert missing == [], f"{name}: undocumented fields {missing}"


def test_the_registry_example_runs(
    scratch: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    for registry in running_registry(tmp_path_factory.mktemp("registry")):
        monkeypatch.setenv("REGISTRY", registry.host)
        run_examples(("offline",), {})
        run_examples(("registry",), {})
        assert (scratch / "elsewhere" / "manifests").is_dir()


# ----------------------------------------------------------------------------------------- options are checked first

PROFILE = "profiles/reference-cpu.toml"
LONG = "x" * 5000
DEEP = "/".join(["y" * 300, "z"])
H = "0123456789abcdef"

#: Each call with a bad option, as a Python caller passes it: the wrong type, NUL bytes, over-long paths,
#: negative or zero counts, NaN and the infinities, an empty trust dir. Each must be a UsageError (2) before any
#: engine starts, any key is read or the store is touched.
BAD_CALLS: list[tuple[str, dict[str, object]]] = [
    ("load_profile", {"path": "profiles/\0x.toml"}),
    ("load_profile", {"path": LONG}),
    ("load_profile", {"path": DEEP}),
    ("load_profile", {"path": 42}),
    ("load_profile", {"path": b"profiles/reference-cpu.toml"}),
    ("open_store", {"root": "\0"}),
    ("open_store", {"root": ""}),
    ("open_store", {"manifests_dir": 3.5}),
    ("resolve_profile", {"profile": None}),
    ("resolve_profile", {"profile": PROFILE, "offline": "yes"}),
    ("resolve_profile", {"profile": PROFILE, "runtime": object()}),
    ("run_blessing", {"profile": PROFILE, "trials": -1}),
    ("run_blessing", {"profile": PROFILE, "trials": 0}),
    ("run_blessing", {"profile": PROFILE, "trials": 1001}),
    ("run_blessing", {"profile": PROFILE, "trials": 2.0}),
    ("run_blessing", {"profile": PROFILE, "trials": True}),
    ("run_blessing", {"profile": PROFILE, "parallel": -5}),
    ("run_blessing", {"profile": PROFILE, "parallel": 0}),
    ("run_blessing", {"profile": PROFILE, "candidates": 0}),
    ("run_blessing", {"profile": PROFILE, "confidence": math.nan, "rebless": True}),
    ("run_blessing", {"profile": PROFILE, "confidence": math.inf}),
    ("run_blessing", {"profile": PROFILE, "confidence": 1.0}),
    ("run_blessing", {"profile": PROFILE, "confidence": "0.9"}),
    ("run_blessing", {"profile": PROFILE, "rebless": "no"}),
    ("run_blessing", {"profile": PROFILE, "wait": 1}),
    ("run_blessing", {"profile": PROFILE, "store": "root"}),
    ("run_blessing", {"profile": PROFILE, "events": "print"}),
    ("run_blessing", {"profile": "profiles/\0"}),
    ("run_blessing", {"profile": PROFILE, "options": bless.BlessOptions(trials=0)}),
    ("run_blessing", {"profile": PROFILE, "options": bless.BlessOptions(), "trials": 3}),
    ("run_blessing", {"profile": PROFILE, "options": {"trials": 3}}),
    ("serve", {"profile": PROFILE, "options": bless.ServeOptions(canary="no")}),  # type: ignore[arg-type]
    ("serve", {"profile": PROFILE, "options": bless.ServeOptions(), "dry_run": True}),
    ("run_blessing", {"profile": ["profiles/reference-cpu.toml"]}),
    ("verify", {"config_hash": H, "trust_dir": ""}),
    ("verify", {"config_hash": H, "trust_dir": "a\0b"}),
    ("verify", {"config_hash": 123}),
    ("verify", {"config_hash": ""}),
    ("verify", {"config_hash": H + "\0"}),
    ("verify", {"config_hash": H, "progress": 5}),
    ("verify", {"config_hash": H, "max_workers": 0}),
    ("serve", {"profile": PROFILE, "trust_dir": ""}),
    ("serve", {"profile": PROFILE, "dry_run": "true"}),
    ("serve", {"profile": PROFILE, "hooks": {}}),
    ("pull", {"reference": None}),
    ("pull", {"reference": "localhost:5000/x:1", "trust_dir": ""}),
    ("pull", {"reference": "localhost:5000/x:1", "max_workers": 0}),
    ("pull", {"reference": "localhost:5000/x:1", "wait": "no"}),
    ("pull", {"reference": "localhost:5000/x:1", "plain_http": "yes"}),
    ("push", {"config_hash": H, "reference": 7}),
    ("push", {"config_hash": H, "reference": "localhost:5000/x:1", "trust_dir": ""}),
    ("sign", {"config_hash": H, "trust_dir": ""}),
    ("sign", {"config_hash": H, "trust_dir": "trust", "passphrase": "secret"}),
    ("sign", {"config_hash": H, "trust_dir": "trust", "expires": -1}),
    ("sign", {"config_hash": H, "trust_dir": LONG}),
    ("init_trust", {"trust_dir": "new-trust"}),
    ("init_trust", {"trust_dir": "new-trust", "passphrase": b"x", "unencrypted": True}),
    ("init_trust", {"trust_dir": "\0"}),
    ("show", {"config_hash": None}),
    ("diff", {"config_hash": H, "profile": 1}),
    ("serve", {"profile": PROFILE, "from_reference": ""}),
    ("serve_stop", {"name": "x", "timeout_s": 0}),
    ("serve_stop", {"name": 5}),
    ("serve_ready", {"name": "x", "accept_skipped_canary": "yes"}),
    ("rotate_trust", {"trust_dir": "trust", "role": "targets", "passphrase": "text"}),
    ("rotate_trust", {"trust_dir": "", "role": "targets"}),
    ("gate", {"profiles": PROFILE}),
    ("gate", {"profiles": ["profiles/\0.toml"]}),
    ("gate", {"verify": 1}),
    ("collect_garbage", {"keep": -1}),
    ("collect_garbage", {"dry_run": None}),
]


@pytest.mark.parametrize(("call", "kwargs"), BAD_CALLS, ids=[f"{c}-{i}" for i, (c, _) in enumerate(BAD_CALLS)])
def test_a_bad_option_is_refused_with_a_usage_error_before_any_work(
    scratch: Path, call: str, kwargs: dict[str, object]
) -> None:
    runtime = bless.runtime.get_runtime("docker")
    assert isinstance(runtime, FakeRuntime)
    with pytest.raises(bless.UsageError) as refused:
        getattr(bless, call)(**kwargs)
    assert refused.value.exit_code == bless.ExitCode.USAGE
    assert refused.value.hint, "a refusal says what to do"
    assert runtime.containers == [] and runtime.calls == [], "an engine or runtime was used before the check"
    assert not (scratch / "root").exists(), "the store was touched before the check"
    assert not (scratch / "new-trust").exists()


def test_a_nan_confidence_never_reaches_a_published_manifest(scratch: Path) -> None:
    """NaN is not JSON and passes the schema's bounds: the call refuses it, and the manifest writer refuses it too."""
    first = bless.run_blessing(PROFILE, trials=2)
    path = bless.open_store().manifest_path(first.config_hash)
    assert path is not None
    before = path.read_bytes()
    with pytest.raises(bless.UsageError):
        bless.run_blessing(PROFILE, confidence=float("nan"), rebless=True)
    assert path.read_bytes() == before
    from bless.core.manifest import validate_document

    manifest = bless.show(first.config_hash).manifest
    trials = dict(manifest.trials)
    trials["failure_rate_bound"] = {**trials["failure_rate_bound"], "confidence": math.nan}
    with pytest.raises(bless.ManifestInvalidError, match="not a JSON number"):
        dataclasses.replace(manifest, trials=trials).to_json_bytes()
    document = manifest.to_dict()
    document["trials"]["failure_rate_bound"]["max_failure_rate"] = math.inf
    with pytest.raises(bless.ManifestInvalidError, match="max_failure_rate"):
        validate_document(document, where="m")


def test_sign_verifies_the_tree_before_signing(scratch: Path) -> None:
    """A signature vouches for the files: a tampered blessed tree is refused (21) and nothing is signed."""
    result = bless.run_blessing(PROFILE, trials=2)
    shown = bless.show(result.config_hash)
    victim = next(path for path in sorted(shown.blessed_dir.rglob("*")) if path.is_file())
    victim.chmod(0o644)
    victim.write_bytes(victim.read_bytes() + b"tampered")
    bless.init_trust(scratch / "trust", unencrypted=True)
    targets = scratch / "trust" / "metadata" / "targets.json"
    before = targets.read_bytes()
    with pytest.raises(bless.VerificationError) as refused:
        bless.sign(result.config_hash, scratch / "trust")
    assert refused.value.exit_code == bless.ExitCode.VERIFY_FAILED
    assert targets.read_bytes() == before
    check = bless.verify(result.config_hash)
    assert not check.ok  # verify reports the same difference as a result, without raising


def test_the_examples_type_check_under_mypy_strict(tmp_path: Path) -> None:
    """The page's examples are typed programs against the public API alone: ``mypy --strict`` accepts each.

    The checkout's mypy cache is copied when present (a cold check of bless takes about half a minute)."""
    for index, example in enumerate(examples()):
        (tmp_path / f"example_{index}.py").write_text(example.code, encoding="utf-8")
    # A caller's store offers no writer operations: mypy refuses each (the expected errors, one a line).
    writers = ("publish", "reject", "gc", "lock", "recover")
    misuse = "import bless\n\nstore = bless.open_store()\n" + "".join(f"store.{name}\n" for name in writers)
    (tmp_path / "misuse.py").write_text(misuse, encoding="utf-8")
    cache = tmp_path / ".mypy_cache"
    if (REPO / ".mypy_cache").is_dir():
        shutil.copytree(REPO / ".mypy_cache", cache)
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache), *sorted(map(str, tmp_path.glob("*.py")))],
        cwd=REPO,  # bless from the checkout (an editable install's finder is not followed by mypy)
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    errors = [line for line in checked.stdout.splitlines() if ": error:" in line]
    assert [line.split(":")[0] for line in errors] == [str(tmp_path / "misuse.py")] * len(writers), checked.stdout
    assert all('"Store" has no attribute' in line for line in errors), errors
    assert not any(hasattr(bless.Store, name) for name in writers)
    for example in examples():  # the public API alone: nothing internal is imported
        assert not re.search(r"^\s*(from|import) bless\.", example.code, re.MULTILINE), example.line


def test_the_serve_plan_is_typed_and_holds_what_its_type_says(scratch: Path) -> None:
    """``ServeResult.plan`` is a ``bless.ServePlan`` (a TypedDict), not an untyped mapping; a dry run's plan has
    exactly its keys (``trust`` for a blessed plan; ``from`` only when pulled first)."""
    assert typing.get_type_hints(bless.ServeResult)["plan"] is bless.ServePlan
    bless.run_blessing(PROFILE, trials=2)
    planned = bless.serve(PROFILE, dry_run=True)
    declared = set(bless.ServePlan.__required_keys__) | set(bless.ServePlan.__optional_keys__)
    assert set(planned.plan) == declared - {"from"}
    assert set(planned.plan["container"]) == set(typing.get_type_hints(bless.PlanContainer))
    mount = planned.plan["mount"]
    assert mount is not None and set(mount) == set(typing.get_type_hints(bless.PlanMount))


def test_every_path_a_result_holds_is_a_path() -> None:
    """One type per concept: a directory or file a result names is a ``pathlib.Path`` (it was a str in RunResult
    and a Path elsewhere)."""
    offenders = []
    for name in bless.__all__:
        cls = getattr(bless, name)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)) or name.endswith("Options"):
            continue  # options take any path a caller has (bless.StrPath)
        for field_name, hint in typing.get_type_hints(cls).items():
            if (name, field_name) == ("CacheTree", "mount_path"):
                continue  # where the engine sees the cache inside its container, not a path of this host
            if field_name.endswith(("_dir", "_path", "archived_manifest")) and hint not in (Path, Path | None):
                offenders.append(f"{name}.{field_name}: {hint}")
    assert offenders == []


def test_without_events_progress_goes_to_the_bless_logger(scratch: Path, caplog: pytest.LogCaptureFixture) -> None:
    """What the command line shows as progress is logged (``bless.logger``, INFO) when no ``events=`` is given;
    the logger has a NullHandler, so nothing reaches stderr unless the caller configures logging."""
    assert any(isinstance(handler, logging.NullHandler) for handler in bless.logger.handlers)
    with caplog.at_level(logging.INFO, logger="bless"):
        bless.run_blessing(PROFILE, trials=2)
    records = [record for record in caplog.records if record.name == "bless"]
    assert records, "no progress was logged"
    assert all(isinstance(getattr(record, "bless_event", None), bless.Event) for record in records)


#: A trial's evidence records: read through ``to_dict()``; their classes stay internal (documented on the API page).
EVIDENCE_FIELDS = {("TrialResult", "coherence"), ("TrialResult", "reuse"), ("TrialResult", "coverage"),
                   ("TrialResult", "slot"), ("RunResult", "slots")}  # fmt: skip


@pytest.mark.parametrize(
    "name", ["RunResult", "VerifyResult", "GateResult", "GcResult", "ShownBlessing", "PullResult", "TrustInitResult"]
)
def test_the_data_a_result_holds_is_of_exported_types_all_the_way_down(name: str) -> None:
    """A caller annotates what it reads (``result.report.rows``, ``shown.manifest.cache.files``): each class a
    field names is ``bless.<Name>`` under its own class name, down to plain data."""
    exported = {id(getattr(bless, n)) for n in bless.__all__}
    missing: list[str] = []
    seen: set[type] = set()
    todo: list[type] = [getattr(bless, name)]
    while todo:
        cls = todo.pop()
        if cls in seen or not dataclasses.is_dataclass(cls):
            continue
        seen.add(cls)
        for field_name, hint in typing.get_type_hints(cls).items():
            if (cls.__name__, field_name) in EVIDENCE_FIELDS:
                continue
            for held in _named_types(hint):
                if held.__module__.split(".")[0] != "bless":
                    continue
                if id(held) not in exported or getattr(bless, held.__name__, None) is not held:
                    missing.append(f"{cls.__name__}.{field_name}: {held.__module__}.{held.__qualname__}")
                todo.append(held)
    assert missing == []
