"""``bless run`` for real: the CLI as a process, a real Docker Engine, the real reference image, real compiles.

Every test asserts the exit code, the store state and the container state. Engine starts are the
cost (a bootstrap is ~30 s of Inductor C++ compile on this machine, a trial ~10 s), so most tests
use ``--trials 1`` and the happy path reads the session-scoped K=3 blessing (``blessed``).

Isolation from other users of the same Docker daemon (e.g. serve-full tests running at the same
time): each test writes its profile with its own ``[env] BLESS_IT_CASE`` value, hence its own
config hash and its own deterministic container names, and its own profile name (a container
label). Container checks only look at containers/volumes of ours carrying THIS test's config
hash (and profile label / run id where known) with bless-run names (``bless-bootstrap-*`` /
``bless-trial-*``), never at every container of ours (the ``no_leftovers`` fixture would also see
other people's serve containers). "No container was ever created" is proven with
``docker events`` over the run's time window, filtered the same way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bless.container_labels import store_tag
from tests.integration.helpers import REPO, CliResult, run_cli, write_profile

pytestmark = pytest.mark.integration

OWNER = "org.bless.owner=bless"
# Wide rich output: messages (engine log tails) are not wrapped on stderr.
WIDE = {"COLUMNS": "500"}
# The environment variable that allowed test knobs before they became a parameter of the entry
# point: it must not weaken a run any more.
FORMER_OVERRIDE = {"BLESS_ALLOW_UNSAFE_ENV_FOR_TESTS": "1"}
RUN_PHASES = ("bless-bootstrap-", "bless-trial-")


# --- helpers -------------------------------------------------------------------------------------------


def case_profile(tmp_path: Path, case: str, env: dict[str, str] | None = None, **kwargs: Any) -> tuple[Path, str]:
    """A profile with its own config hash (BLESS_IT_CASE) and a unique name (the profile label)."""
    name = f"it-{case}-{uuid.uuid4().hex[:8]}"
    path = write_profile(tmp_path / f"{case}.toml", env={"BLESS_IT_CASE": case, **(env or {})}, name=name, **kwargs)
    return path, name


def bless(
    root: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 900, knobs: bool = False
) -> CliResult:
    """``bless --root ROOT ARGS``; ``knobs`` runs it through the test entry point that allows test knobs."""
    return run_cli("--root", str(root), *args, env={**WIDE, **(env or {})}, timeout=timeout, allow_test_knobs=knobs)


def config_hash_of(profile: Path) -> str:
    result = run_cli("hash", "--profile", str(profile), "--json")
    assert result.code == 0, result.stderr
    return str(result.json()["config_hash"])


def _docker_lines(*args: str) -> list[str]:
    out = subprocess.run(["docker", *args], check=True, capture_output=True, text=True, timeout=60).stdout
    return sorted(line for line in out.splitlines() if line.strip())


def run_containers(config_hash: str, *, extra_label: str | None = None, root: Path | None = None) -> list[str]:
    """Our bless-run containers (any state) of this config hash only (of the store ``root`` only, when given: another
    store may bless the same profile meanwhile, as the README blocks do with the session blessing's)."""
    filters = ["--filter", f"label={OWNER}", "--filter", f"label=org.bless.config-hash={config_hash}"]
    if extra_label:
        filters += ["--filter", f"label={extra_label}"]
    if root is not None:
        filters += ["--filter", f"label=org.bless.store={store_tag(root)}"]
    names = _docker_lines("ps", "-a", *filters, "--format", "{{.Names}}")
    return [n for n in names if n.startswith(RUN_PHASES) and config_hash[:12] in n]


def run_volumes(config_hash: str, *, root: Path | None = None) -> list[str]:
    """Our overlay volumes of this config hash (of the store ``root`` only, when given)."""
    store = ["--filter", f"label=org.bless.store={store_tag(root)}"] if root is not None else []
    return _docker_lines(
        "volume", "ls", "--filter", f"label={OWNER}", "--filter", f"label=org.bless.config-hash={config_hash}",
        *store, "--format", "{{.Name}}",
    )  # fmt: skip


def run_id_containers(run_id: str) -> list[str]:
    """Every container (any state) of one run, by its run-id label."""
    return _docker_lines("ps", "-a", "--filter", f"label=org.bless.run-id={run_id}", "--format", "{{.Names}}")


def assert_nothing_left(config_hash: str, root: Path | None = None) -> None:
    assert run_containers(config_hash, root=root) == [], "containers of ours left behind"
    assert run_volumes(config_hash, root=root) == [], "overlay volumes of ours left behind"


def created_between(since: float, until: float, label: str) -> list[str]:
    """Names of containers created in [since, until] carrying ``label`` (docker events)."""
    return _docker_lines(
        "events", "--since", f"{since:.3f}", "--until", f"{until:.3f}",
        "--filter", "type=container", "--filter", "event=create", "--filter", f"label={label}",
        "--format", "{{.Actor.Attributes.name}}",
    )  # fmt: skip


def json_failure(result: CliResult, code: int) -> dict[str, Any]:
    """``--json`` of a failing run: exactly one JSON document, ok=false, the error's exit code."""
    assert result.code == code, (result.code, result.stderr[-4000:])
    document, end = json.JSONDecoder().raw_decode(result.stdout.lstrip())
    assert result.stdout.lstrip()[end:].strip() == "", "stdout holds more than one JSON document"
    assert document["ok"] is False
    assert document["error"]["exit_code"] == code
    assert "Traceback" not in result.stderr
    return dict(document)


def manifests(root: Path) -> list[Path]:
    directory = root / "manifests"
    return sorted(p for p in directory.iterdir() if not p.name.startswith(".")) if directory.is_dir() else []


def rejected(root: Path, config_hash: str, kind: str = "rejected") -> list[Path]:
    """The evidence dirs of ``config_hash`` under ``kind``: ``rejected``, or ``interrupted`` (runs a signal stopped)."""
    directory = root / kind / config_hash
    return sorted(p for p in directory.iterdir() if not p.name.startswith(".")) if directory.is_dir() else []


def flat(text: str) -> str:
    return " ".join(text.split())


# --- 1. happy path -------------------------------------------------------------------------------------


def test_happy_path_k3_blessing_is_published_verified_and_listed(blessed: Any) -> None:
    data = blessed.result
    h = blessed.config_hash
    root = blessed.root
    # The run's JSON result: per-trial verdicts, timings, the bound, the overhead.
    assert data["ok"] is True and data["published"] is True and data["trials_planned"] == 3
    assert data["failure_rate_bound"] == pytest.approx(0.6316, abs=1e-4)
    assert isinstance(data["orchestration_overhead"], float) and 0 <= data["orchestration_overhead"] < 1
    assert data["wall_seconds"] >= data["engine_seconds"] > 0
    (candidate,) = data["candidates"]
    assert candidate["accepted"] is True and candidate["rejected_dir"] is None
    assert candidate["bootstrap"]["start_to_ready_s"] > 0 and candidate["bootstrap"]["stopped_gracefully"] is True
    assert [t["index"] for t in candidate["trials"]] == [1, 2, 3]
    for trial in candidate["trials"]:
        assert trial["passed"] is True and trial["reasons"] == []
        assert trial["start_to_ready_s"] > 0 and trial["stopped_gracefully"] is True
        assert trial["coherence"]["passed"] is True and trial["reuse"]["passed"] is True
        assert trial["container"].startswith(f"bless-trial-{h[:12]}-c1-t")

    # The manifest, as `bless show` reads it.
    show = bless(root, "show", h, "--json")
    assert show.code == 0, show.stderr
    manifest = show.json()
    assert manifest["config_hash"] == h
    trials = manifest["trials"]
    assert trials["planned"] == 3 and trials["passed"] == 3
    assert trials["failure_rate_bound"]["confidence"] == 0.95
    assert trials["failure_rate_bound"]["max_failure_rate"] == pytest.approx(0.6316, abs=1e-4)
    assert len(trials["results"]) == 3
    for result in trials["results"]:
        assert result["passed"] is True and result["start_to_ready_s"] > 0
        reuse = result["reuse"]
        assert reuse["load_markers"] >= 1, "the blessed artifact was loaded"
        assert reuse["compile_markers"] == 0, "and nothing was compiled"
        assert reuse["tree_unchanged"] is True
        assert reuse["upper_new_artifacts"] == [] and reuse["upper_unexpected"] == []
        assert result["upper"]["written"] == 0
    prompts = ["The compiled cache is", "Replay coherence means", "A blessed artifact"]
    assert [g["prompt"] for g in manifest["golden"]] == prompts
    for golden in manifest["golden"]:
        assert golden["max_tokens"] == 12
        assert 1 <= len(golden["token_ids"]) <= 12 and all(isinstance(t, int) for t in golden["token_ids"])
        # Every trial reproduced the golden output exactly.
        for result in trials["results"]:
            assert result["coherence"]["outputs"][golden["prompt"]]["token_ids"] == golden["token_ids"]
    assert manifest["artifacts"]["items"], "the compiled artifact is named"
    assert any(f["path"].endswith("megacache.bin") for f in manifest["cache"]["files"])

    verify = bless(root, "verify", h)
    assert verify.code == 0, verify.stderr
    listed = bless(root, "list", "--json")
    assert listed.code == 0, listed.stderr
    (entry,) = [m for m in listed.json()["manifests"] if m["config_hash"] == h]
    assert entry["trials_passed"] == 3 and entry["trials_planned"] == 3
    # Store: nothing staged, nothing rejected, the lock released.
    assert [p.name for p in (root / "staging").iterdir()] == []
    assert rejected(root, h) == []
    assert not (root / "locks" / f"{h}.holder").exists()
    # Containers: none of this run's left.
    assert run_id_containers(data["run_id"]) == []
    assert_nothing_left(h, root)  # the session blessing's hash: README blocks bless it too, in stores of their own


# --- 2, 3, 11. nondeterminism knob, unsafe-env refusal, --json of failures --------------------------------


def test_unsafe_knob_without_override_is_refused_before_any_container(tmp_path: Path) -> None:
    profile, name = case_profile(tmp_path, "nondet", {"BLESS_REFERENCE_NONDETERMINISTIC": "1"})
    root = tmp_path / "root"
    since = time.time()
    result = bless(root, "run", "--profile", str(profile), "--trials", "1", "--json", env=FORMER_OVERRIDE, timeout=60)
    elapsed = time.time() - since
    document = json_failure(result, 30)
    assert "BLESS_REFERENCE_NONDETERMINISTIC=1" in document["error"]["message"]
    assert "BLESS_REFERENCE_NONDETERMINISTIC" in flat(result.stderr)
    assert "no bless or serve-full command accepts them" in flat(result.stderr)
    assert "BLESS_ALLOW_UNSAFE_ENV_FOR_TESTS" not in result.stderr, "no environment variable weakens a run"
    assert elapsed < 20, f"an unsafe profile must be refused at once, took {elapsed:.1f} s"
    assert manifests(root) == [] and not (root / "rejected").exists() and not (root / "locks").exists()
    assert created_between(since - 1, time.time() + 1, f"org.bless.profile={name}") == []


def test_nondeterminism_knob_rejects_with_evidence_and_publishes_nothing(tmp_path: Path) -> None:
    profile, name = case_profile(tmp_path, "nondet", {"BLESS_REFERENCE_NONDETERMINISTIC": "1"})
    root = tmp_path / "root"
    result = bless(root, "run", "--profile", str(profile), "--trials", "1", "--json", knobs=True)
    # --json of a failing run: one document, ok=false, the error's exit code, and the full result.
    document = json_failure(result, 41)
    h = document["config_hash"]
    assert document["error"]["error"] == "TrialsFailedError"
    assert document["published"] is False and document["manifest_path"] is None
    (candidate,) = document["candidates"]
    assert candidate["accepted"] is False
    (trial,) = candidate["trials"]
    assert trial["passed"] is False and trial["coherence"]["passed"] is False
    assert any("distinct outputs" in reason for reason in trial["reasons"])

    assert manifests(root) == [], "nothing published"
    assert not (root / "blessed" / h).exists() or list((root / "blessed" / h).iterdir()) == []
    (evidence_dir,) = rejected(root, h)
    assert evidence_dir.name.endswith("-c1") and str(evidence_dir) == candidate["rejected_dir"]
    summary = (evidence_dir / "summary.md").read_text()
    assert "distinct outputs" in summary and h in summary
    evidence = json.loads((evidence_dir / "evidence.json").read_text())
    assert evidence["config_hash"] == h and evidence["trials"][0]["passed"] is False
    assert any(p.name == "megacache.bin" for p in (evidence_dir / "tree").rglob("*"))
    assert "bless-reference:" in (evidence_dir / "bootstrap.log").read_text()
    assert "bless-reference:" in (evidence_dir / "trial-1.log").read_text()
    assert document["error"]["details"]["rejected_dirs"] == [str(evidence_dir)]
    assert [p.name for p in (root / "staging").iterdir()] == []
    assert_nothing_left(h)
    assert run_containers(h, extra_label=f"org.bless.profile={name}") == []


# --- 4. ignore-cache knob -------------------------------------------------------------------------------


def test_ignore_cache_knob_fails_reuse_although_outputs_match(tmp_path: Path) -> None:
    profile, _ = case_profile(tmp_path, "ignorecache", {"BLESS_REFERENCE_IGNORE_CACHE": "1"})
    root = tmp_path / "root"
    result = bless(root, "run", "--profile", str(profile), "--trials", "1", "--json", knobs=True)
    document = json_failure(result, 41)
    h = document["config_hash"]
    assert manifests(root) == []
    (evidence_dir,) = rejected(root, h)
    evidence = json.loads((evidence_dir / "evidence.json").read_text())
    (trial,) = evidence["trials"]
    assert trial["passed"] is False
    # Coherence passed: the outputs equal the golden ones ...
    assert trial["coherence"]["passed"] is True and trial["coherence"]["reasons"] == []
    # ... but reuse failed: a recompile, seen in the log and in the overlay's upper layer.
    reuse = trial["reuse"]
    assert reuse["passed"] is False
    assert reuse["compile_markers"] >= 1 and reuse["load_markers"] == 0
    assert any(path.endswith("megacache.bin") for path in reuse["upper_new_artifacts"])
    assert reuse["tree_unchanged"] is True, "the overlay kept the staged tree itself untouched"
    reasons = " ".join(trial["reasons"])
    assert "compile/save marker" in reasons and "new compiled artifact" in reasons
    assert "Compiling model" in (evidence_dir / "trial-1.log").read_text()
    assert "new compiled artifact" in (evidence_dir / "summary.md").read_text()
    assert_nothing_left(h)


# --- 4a. compiled outside the blessing ---------------------------------------------------------------------


def test_a_kernel_compiled_outside_the_blessing_fails_the_trial_naming_it(tmp_path: Path) -> None:
    """The engine writes a kernel into a Triton-style cache under its HOME at every start (the knob): the
    cache dir is reused as it should be, but what the start compiled outside it fails the trial, named,
    with the file kept as evidence; HOME is bless's fresh private dir, not the image's."""
    profile, _ = case_profile(tmp_path, "jitoutside", {"BLESS_REFERENCE_JIT_OUTSIDE": "1"})
    root = tmp_path / "root"
    result = bless(root, "run", "--profile", str(profile), "--trials", "1", "--json", knobs=True)
    document = json_failure(result, 41)
    h = document["config_hash"]
    assert manifests(root) == []
    (evidence_dir,) = rejected(root, h)
    evidence = json.loads((evidence_dir / "evidence.json").read_text())
    assert evidence["bootstrap"]["outside"]["compiled"] == 1, "the bootstrap's own kernel is recorded"
    (trial,) = evidence["trials"]
    reuse = trial["reuse"]
    assert reuse["load_markers"] >= 1 and reuse["compile_markers"] == 0, "the blessed artifact itself was loaded"
    assert reuse["outside"]["compiled"] == 1
    (compiled,) = reuse["outside"]["compiled_files"]
    assert compiled.startswith("HOME/.triton/cache/") and "reference_kernel.cubin" in compiled
    assert any(r.startswith("compiled outside the blessing: HOME/.triton/cache/") for r in trial["reasons"])
    kept = list((evidence_dir / "trial-1-outside" / "home" / ".triton" / "cache").glob("*/reference_kernel.cubin"))
    assert len(kept) == 1, "the kernel itself is kept as evidence"
    assert_nothing_left(h)


# --- 4b. --parallel 2 on Docker ----------------------------------------------------------------------------


def test_parallel_two_trials_run_at_once_in_their_own_containers_and_publish(tmp_path: Path) -> None:
    """Both runtimes run trials in parallel: on Docker each trial is its own container with its own
    overlay volume and port; the two overlap in time; nothing is left behind."""
    profile, _ = case_profile(tmp_path, "parallel")
    root = tmp_path / "root"
    result = bless(root, "run", "--profile", str(profile), "--trials", "2", "--parallel", "2", "--json")
    assert result.code == 0, result.stderr[-4000:]
    document = result.json()
    assert document["published"] is True and document["parallel"] == 2
    assert document["orchestration_overhead"] is None  # overlapping engines: no serial overhead ratio
    (candidate,) = document["candidates"]
    trials = candidate["trials"]
    assert [t["index"] for t in trials] == [1, 2] and all(t["passed"] for t in trials)
    assert sorted(t["slot"] for t in trials) == [0, 1] and all(t["gpus"] == [] for t in trials)  # CPU slots
    assert candidate["trials_seconds"] is not None
    # The two trials ran at once: both were started before either ended (a fact of the schedule, not a timing).
    lines = result.stderr.splitlines()
    started = [i for i, line in enumerate(lines) if "candidate 1: trial " in line]
    ended = [i for i, line in enumerate(lines) if "trial 1/2: " in line or "trial 2/2: " in line]
    assert len(started) == 2 and len(ended) == 2, result.stderr[-4000:]
    assert max(started) < min(ended), result.stderr[-4000:]
    manifest = json.loads(manifests(root)[0].read_text())
    assert manifest["trials"]["parallel"] == 2 and manifest["trials"]["devices"] == []
    assert_nothing_left(document["config_hash"])


# --- 5. --candidates 2 ------------------------------------------------------------------------------------


def test_candidates_two_first_poisoned_rejected_second_published(tmp_path: Path) -> None:
    profile, _ = case_profile(tmp_path, "candidates", {"BLESS_REFERENCE_POISON_CANDIDATES": "1"})
    root = tmp_path / "root"
    result = bless(root, "run", "--profile", str(profile), "--trials", "1", "--candidates", "2", "--json", knobs=True)
    assert result.code == 0, result.stderr[-5000:]
    data = result.json()
    h = data["config_hash"]
    assert data["ok"] is True and data["published"] is True
    first, second = data["candidates"]
    assert first["index"] == 1 and first["accepted"] is False and first["trials"][0]["passed"] is False
    assert Path(first["rejected_dir"]).is_dir() and Path(first["rejected_dir"], "summary.md").is_file()
    assert Path(first["rejected_dir"]).name == f"{data['run_id']}-c1"
    assert second["index"] == 2 and second["accepted"] is True and second["rejected_dir"] is None
    assert [t["passed"] for t in second["trials"]] == [True]
    assert [p.name for p in rejected(root, h)] == [f"{data['run_id']}-c1"]
    (manifest_path,) = manifests(root)
    assert str(manifest_path) == data["manifest_path"]
    assert json.loads(manifest_path.read_text())["provenance"]["candidate"] == 2
    verify = bless(root, "verify", h)
    assert verify.code == 0, verify.stderr
    assert_nothing_left(h)


# --- 6. existing blessing: refusal, then --rebless, then gc -------------------------------------------------


def test_rebless_refused_without_flag_then_archives_prior_and_gc_drops_it(blessed: Any, tmp_path: Path) -> None:
    root = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(blessed.root), str(root)], check=True)
    h = blessed.config_hash
    # Same content as the session profile (same hash), another name: a label no one else uses.
    name = f"it-rebless-{uuid.uuid4().hex[:8]}"
    profile = write_profile(tmp_path / "rebless.toml", name=name)
    assert config_hash_of(profile) == h
    relocated = bless(root, "verify", h)
    assert relocated.code == 0, "a cp -a copy of a store is a valid store: " + relocated.stderr
    prior_path = root / "manifests" / f"{h}.json"
    prior_bytes = prior_path.read_bytes()
    prior = json.loads(prior_bytes)
    prior_dir = root / "blessed" / h / prior["cache"]["dir_id"]
    assert prior_dir.is_dir()

    since = time.time()
    refused = bless(root, "run", "--profile", str(profile), "--trials", "1", timeout=120)
    assert refused.code == 10, refused.stderr
    assert "already blessed" in flat(refused.stderr) and "--rebless" in flat(refused.stderr)
    assert created_between(since - 1, time.time() + 1, f"org.bless.profile={name}") == []
    assert prior_path.read_bytes() == prior_bytes and not (root / "archive" / h).exists()

    # K=1 replaces a 3/3 blessing: a weaker bound, published only with --allow-weaker (and a warning).
    result = bless(root, "run", "--profile", str(profile), "--rebless", "--trials", "1", "--allow-weaker", "--json")
    assert result.code == 0, result.stderr[-5000:]
    data = result.json()
    assert data["config_hash"] == h and data["published"] is True
    archived = Path(data["archived_manifest"])
    assert archived.parent == root / "archive" / h and archived.read_bytes() == prior_bytes
    new = json.loads(prior_path.read_bytes())
    assert new["config_hash"] == h and new["profile_name"] == name
    assert new["created"] != prior["created"] and new["cache"]["dir_id"] != prior["cache"]["dir_id"]
    assert new["provenance"]["run_id"] == data["run_id"] != prior["provenance"]["run_id"]
    verify = bless(root, "verify", h)
    assert verify.code == 0, verify.stderr
    new_dir = root / "blessed" / h / new["cache"]["dir_id"]
    assert prior_dir.is_dir() and new_dir.is_dir(), "the prior version stays until gc"

    gc = bless(root, "gc", "--json")
    assert gc.code == 0, gc.stderr
    assert not prior_dir.exists() and new_dir.is_dir()
    assert archived.is_file(), "gc keeps the archived manifest (history)"
    verify = bless(root, "verify", h)
    assert verify.code == 0, verify.stderr
    assert run_containers(h, extra_label=f"org.bless.profile={name}", root=root) == []
    assert run_id_containers(data["run_id"]) == []


# --- 7. concurrency, Ctrl-C and SIGTERM ------------------------------------------------------------------


def _popen_run(root: Path, profile: Path, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bless.cli.main",
            "--root",
            str(root),
            "run",
            "--profile",
            str(profile),
            "--trials",
            "1",
        ],
        cwd=REPO,
        env={**os.environ, **WIDE},
        stdout=(out / "stdout").open("wb"),
        stderr=(out / "stderr").open("wb"),
    )


def _wait_for(predicate: Any, timeout: float, what: str, proc: subprocess.Popen[bytes] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture
def reaper() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test started: never leave one running, whatever failed."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _interrupt_during_bootstrap(
    proc: subprocess.Popen[bytes], root: Path, h: str, out: Path, signum: signal.Signals
) -> None:
    """Send ``signum`` once the bootstrap container runs; the run must stop it, keep evidence, exit 130."""
    boot = f"bless-bootstrap-{h[:12]}-c1-{store_tag(root)}"
    _wait_for(lambda: boot in run_containers(h), 120, "the bootstrap container", proc)
    time.sleep(1.0)  # the engine is booting (importing torch / compiling) when the signal lands
    began = time.monotonic()
    proc.send_signal(signum)
    code = proc.wait(120)
    stopped_in = time.monotonic() - began
    stderr = (out / "stderr").read_text()
    assert code == 130, stderr[-4000:]
    assert "interrupted" in flat(stderr) and "Traceback" not in stderr
    assert stopped_in < 60, f"stopping took {stopped_in:.1f} s"
    assert manifests(root) == [], "nothing published"
    (evidence_dir,) = rejected(root, h, "interrupted")
    assert rejected(root, h) == [], "an interrupted run is no rejection"
    assert "interrupted" in (evidence_dir / "summary.md").read_text()
    assert json.loads((evidence_dir / "evidence.json").read_text())["reasons"] == ["interrupted"]
    assert (evidence_dir / "bootstrap.log").is_file(), "the interrupted engine's log is kept"
    assert [p.name for p in (root / "staging").iterdir()] == []
    assert not (root / "locks" / f"{h}.holder").exists(), "the lock was released"
    assert_nothing_left(h)


def test_concurrent_runs_one_proceeds_other_refused_then_ctrl_c(
    tmp_path: Path, reaper: list[subprocess.Popen[bytes]]
) -> None:
    profile, _ = case_profile(tmp_path, "concurrent")
    h = config_hash_of(profile)
    root = tmp_path / "root"
    out = tmp_path / "first"
    out.mkdir()
    first = _popen_run(root, profile, out)
    reaper.append(first)
    holder = root / "locks" / f"{h}.holder"
    _wait_for(holder.exists, 60, "the first run to take the lock", first)

    began = time.monotonic()
    second = bless(root, "run", "--profile", str(profile), "--trials", "1", "--json", timeout=120)
    took = time.monotonic() - began
    document = json_failure(second, 11)
    assert f"pid {first.pid}" in document["error"]["message"]
    assert f"pid {first.pid}" in flat(second.stderr)
    assert took < 20, f"the lock refusal took {took:.1f} s"
    assert first.poll() is None, "the first run proceeds"

    # Ctrl-C of the first run, in the middle of its bootstrap.
    _interrupt_during_bootstrap(first, root, h, out, signal.SIGINT)


def test_sigterm_stops_the_run_like_ctrl_c(tmp_path: Path, reaper: list[subprocess.Popen[bytes]]) -> None:
    profile, _ = case_profile(tmp_path, "sigterm")
    h = config_hash_of(profile)
    root = tmp_path / "root"
    out = tmp_path / "run"
    out.mkdir()
    proc = _popen_run(root, profile, out)
    reaper.append(proc)
    _interrupt_during_bootstrap(proc, root, h, out, signal.SIGTERM)


# --- 8. a foreign container holding our name ------------------------------------------------------------


def test_foreign_container_with_our_name_is_refused_and_untouched(
    tmp_path: Path, docker_client: Any, busybox_image: str
) -> None:
    profile, name = case_profile(tmp_path, "foreign")
    h = config_hash_of(profile)
    root = tmp_path / "root"
    squatter = f"bless-bootstrap-{h[:12]}-c1-{store_tag(root)}"
    foreign = docker_client.containers.run(busybox_image, ["sleep", "600"], name=squatter, detach=True)
    try:
        since = time.time()
        result = bless(root, "run", "--profile", str(profile), "--trials", "1", timeout=120)
        assert result.code == 12, result.stderr
        message = flat(result.stderr)
        assert squatter in message and "not ours" in message and "WITHOUT our labels" in message
        foreign.reload()
        assert foreign.status == "running", "the foreign container is untouched"
        assert foreign.name == squatter and not foreign.labels
        assert docker_client.containers.get(squatter).id == foreign.id
        assert created_between(since - 1, time.time() + 1, f"org.bless.profile={name}") == []
        assert manifests(root) == [] and rejected(root, h) == []
        assert [p.name for p in (root / "staging").iterdir()] == []
        assert run_containers(h) == [] and run_volumes(h) == []
    finally:
        foreign.remove(force=True)


# --- 9. engine crashes at boot / never becomes ready -------------------------------------------------------


def test_engine_crash_at_boot_is_a_bootstrap_failure_with_the_log_tail(tmp_path: Path) -> None:
    profile, _ = case_profile(tmp_path, "crash", {"BLESS_REFERENCE_CRASH_AT_BOOT": "1"})
    root = tmp_path / "root"
    result = bless(root, "run", "--profile", str(profile), "--trials", "1", knobs=True, timeout=300)
    assert result.code == 40, result.stderr[-4000:]
    stderr = result.stderr
    assert "bless-reference: FATAL simulated crash at boot" in stderr, stderr[-4000:]
    assert "exited before it became ready" in flat(stderr)
    h = config_hash_of(profile)
    assert manifests(root) == []
    (evidence_dir,) = rejected(root, h)
    assert "FATAL simulated crash at boot" in (evidence_dir / "bootstrap.log").read_text()
    assert_nothing_left(h)


def test_engine_never_ready_is_a_bootstrap_failure_after_the_timeout(tmp_path: Path) -> None:
    profile, _ = case_profile(
        tmp_path, "neverready", {"BLESS_REFERENCE_NEVER_READY": "1"}, trials={"ready_timeout_s": 8}
    )
    root = tmp_path / "root"
    began = time.monotonic()
    result = bless(root, "run", "--profile", str(profile), "--trials", "1", "--json", knobs=True, timeout=300)
    took = time.monotonic() - began
    document = json_failure(result, 40)
    assert "not ready after 8 s" in document["error"]["message"]
    assert "never ready (test knob)" in document["error"]["message"], "the engine's log tail is in the message"
    assert "not ready after 8 s" in flat(result.stderr)
    assert took < 90, f"an 8 s readiness timeout took {took:.1f} s"
    h = config_hash_of(profile)
    assert manifests(root) == [] and len(rejected(root, h)) == 1
    assert_nothing_left(h)


# --- 10. Docker unreachable --------------------------------------------------------------------------------


def test_docker_daemon_unreachable_is_an_environment_error_not_a_traceback(tmp_path: Path) -> None:
    profile, _ = case_profile(tmp_path, "nodaemon")
    root = tmp_path / "root"
    env = {"DOCKER_HOST": "unix:///nonexistent.sock"}
    result = bless(root, "run", "--profile", str(profile), "--trials", "1", env=env, timeout=120)
    assert result.code == 50, result.stderr
    assert "Traceback" not in result.stderr
    assert "Docker" in result.stderr and "/nonexistent.sock" in flat(result.stderr)
    as_json = bless(root, "run", "--profile", str(profile), "--trials", "1", "--json", env=env, timeout=120)
    json_failure(as_json, 50)
    assert manifests(root) == [] and not (root / "rejected").exists()
