"""Coverage and sealed serving end to end: real Docker, the real reference engine with shape buckets.

The reference engine compiles one kernel per prompt-length bucket, lazily, on first use (as vLLM's fused-MoE
Triton kernel does per batch token count). With coverage the bootstrap sends the shortest prompt of every
bucket, the trials replay them, and serving meets nothing new. A blessing made with coverage off holds only
the bucket its golden prompts reached: serving a prompt of another bucket compiles a kernel the blessing does
not hold, which bless's Triton-style cache manager reports at once, and the ``unproven_compile`` policy acts on
(refuse: readiness exits 46 while the engine keeps answering; record: logged only; stop: exit 48).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from bless.core.unproven_evidence import event_identity
from bless.errors import BlessError
from bless.flows import serve as serve_flow
from bless.runtime import get_runtime
from bless.store import Store
from tests.integration.helpers import REPO, run_cli, serve_name, write_profile

pytestmark = pytest.mark.integration
SERVE = "bless.cli.serve"
BUCKETS = "shape_buckets = [8, 16, 32]\n"


def bucket_profile(path: Path, name: str, port: int, mode: str) -> Path:
    """The reference profile with shape buckets, one trial, the given coverage mode, on ``port``."""
    write_profile(path, name=name, serving_port=port, trials={"count": 1})
    text = path.read_text().replace("[serve]\n", f"[serve]\n{BUCKETS}", 1)
    path.write_text(text + f'\n[coverage]\nmode = "{mode}"\n')
    return path


@pytest.fixture(scope="module")
def blessings(reference_image: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two blessings of the bucketed profile: coverage on (auto) and off, each in its own store root."""
    made: dict[str, Any] = {}
    for mode in ("auto", "off"):
        base = tmp_path_factory.mktemp(f"coverage-{mode}")
        name, port = f"cov-{mode}", 18150 if mode == "auto" else 18151
        profile = bucket_profile(base / "p.toml", name, port, mode)
        result = run_cli("--root", str(base / "root"), "run", "--profile", str(profile), "--json")
        assert result.code == 0, result.stderr[-5000:]
        made[mode] = {"root": base / "root", "profile": profile, "run": result.json(), "name": name, "port": port}
    return made


def manifest(blessing: dict[str, Any]) -> dict[str, Any]:
    path = Path(blessing["root"]) / "manifests" / f"{blessing['run']['config_hash']}.json"
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def test_the_bootstrap_covers_every_bucket_and_the_trial_replays_it(blessings: dict[str, Any]) -> None:
    document = manifest(blessings["auto"])
    coverage = document["coverage"]
    (family,) = coverage["plan"]["families"]
    assert [c["token_count"] for c in family["classes"]] == [1, 9, 17]
    assert coverage["bootstrap"]["token_counts"] == [1, 9, 17]
    (trial,) = document["trials"]["results"]
    assert trial["passed"] and trial["coverage"]["token_counts"] == [1, 9, 17]
    kernels = sorted(f["path"].rsplit("/", 1)[1] for f in document["cache"]["files"] if f["path"].startswith("jit/"))
    assert [k for k in kernels if k.endswith(".bin")] == [f"reference_bucket_{b}.bin" for b in (16, 32, 8)]
    shown = run_cli("--root", str(blessings["auto"]["root"]), "show", document["config_hash"])
    said = " ".join(shown.stderr.split())  # human output is on stderr, wrapped to the terminal
    assert "shape_buckets: 3 class(es) over token counts 1..63, reached by prompts of 1, 9, 17" in said, said


def test_coverage_off_blesses_only_what_the_golden_prompts_reached(blessings: dict[str, Any]) -> None:
    document = manifest(blessings["off"])
    assert document["coverage"]["mode"] == "off" and "bootstrap" not in document["coverage"]
    kernels = [f["path"] for f in document["cache"]["files"] if f["path"].endswith(".bin") and "jit/" in f["path"]]
    assert [k.rsplit("/", 1)[1] for k in kernels] == ["reference_bucket_32.bin"]  # the golden prompts are 18-22 long


def ready_code(name: str, root: Path) -> int:
    """What ``serve-full ready NAME --root ROOT`` exits with, from the one library call the command makes.

    For polling: a ``serve-full ready`` process costs over half a CPU-second (imports) per probe, and polls
    run every 0.25-0.5 s; every poll that decides ends with the command itself, as a probe runs it.
    """
    try:
        serve_flow.check_ready(Store(root), name, docker=partial(get_runtime, "docker"))
    except BlessError as exc:
        return int(exc.exit_code)
    return 0


class Serving:
    """serve-full in the foreground, in a subprocess, until stopped."""

    def __init__(self, blessing: dict[str, Any], *extra: str) -> None:
        self.blessing = blessing
        command = [sys.executable, "-m", SERVE, "--root", str(blessing["root"]), "--profile", str(blessing["profile"])]
        self.process = subprocess.Popen(
            [*command, *extra], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.port = int(blessing["port"])

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if self.ready_in_process() == 0:
                assert self.ready() == 0, "the library call said ready, serve-full ready did not"
                return
            assert self.process.poll() is None, self.process.communicate()[1][-4000:]
            time.sleep(0.5)
        raise AssertionError("serve-full never became ready")

    def ready(self) -> int:
        """``serve-full ready NAME --root ROOT``, the command, as a readiness probe runs it: its exit code."""
        return run_cli("ready", self.blessing["name"], "--root", str(self.blessing["root"]), program=SERVE).code

    def ready_in_process(self) -> int:
        return ready_code(self.blessing["name"], Path(self.blessing["root"]))

    def complete(self, length: int) -> dict[str, Any]:
        return complete_at(self.port, length)

    def stop(self) -> tuple[int, str]:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        _, stderr = self.process.communicate(timeout=120)
        return self.process.returncode, stderr


def complete_at(port: int, length: int) -> dict[str, Any]:
    """A completion of a prompt of ``length`` token ids (its bucket's kernel compiles on first use)."""
    body = json.dumps({"prompt": [65] * length, "max_tokens": 2}).encode()
    url = f"http://127.0.0.1:{port}/v1/completions"
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        answer: dict[str, Any] = json.loads(reply.read())
        return answer


def first_refusal_within(serving: Serving, seconds: float) -> float | None:
    """Seconds until ``serve-full ready`` first refuses, None when it never does within ``seconds``.

    Polled in process every 0.25 s (:func:`ready_code`); the window's last probe is the command itself.
    """
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if serving.ready_in_process() == 46:
            return time.monotonic() - started
        time.sleep(0.25)
    return time.monotonic() - started if serving.ready() == 46 else None


def test_a_covered_blessing_serves_every_bucket_without_an_event(blessings: dict[str, Any]) -> None:
    serving = Serving(blessings["auto"])
    try:
        serving.wait_ready()
        for length in (1, 5, 9, 12, 17, 40, 63):
            assert serving.complete(length)["choices"][0]["token_ids"]
        assert first_refusal_within(serving, 4) is None
    finally:
        code, stderr = serving.stop()
    assert code == 0, stderr[-3000:]
    assert "UNPROVEN COMPILE" not in stderr and "bless-seal:" not in stderr


def test_refuse_an_unproven_bucket_flips_readiness_to_46_and_the_engine_keeps_answering(
    blessings: dict[str, Any],
) -> None:
    serving = Serving(blessings["off"])
    try:
        serving.wait_ready()
        serving.complete(5)  # bucket 8: not in the blessing
        after = first_refusal_within(serving, 10)
        assert after is not None, "readiness did not refuse within 10 s"
        refusal = run_cli("ready", "cov-off", "--root", str(blessings["off"]["root"]), program=SERVE)
        assert refusal.code == 46 and "reference_bucket_8" in refusal.stderr, refusal.stderr[-2000:]
        assert serving.complete(5)["choices"][0]["token_ids"], "the engine stopped answering"
    finally:
        code, stderr = serving.stop()
    assert code == 0, stderr[-3000:]
    assert "UNPROVEN COMPILE (refuse): kernel reference_bucket_8" in stderr


def test_record_only_logs_and_stop_exits_48(blessings: dict[str, Any]) -> None:
    recording = Serving(blessings["off"], "--unproven-compile", "record")
    try:
        recording.wait_ready()
        recording.complete(5)
        assert first_refusal_within(recording, 4) is None
    finally:
        code, stderr = recording.stop()
    assert code == 0 and "UNPROVEN COMPILE (record): kernel reference_bucket_8" in stderr, stderr[-3000:]

    stopping = Serving(blessings["off"], "--unproven-compile", "stop")
    stopping.wait_ready()
    stopping.complete(12)  # bucket 16
    try:
        code = stopping.process.wait(timeout=60)
    finally:
        _, stderr = stopping.stop()
    assert code == 48, stderr[-3000:]
    assert "reference_bucket_16" in stderr


def seal_watchers(root: Path) -> list[int]:
    """The pids of seal watcher processes (python -m bless.cli.seal_watch) of serves under ``root``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"bless.cli.seal_watch" in argv and any(str(root).encode() in arg for arg in argv):
            found.append(int(entry.name))
    return found


def containers_named(name: str) -> list[str]:
    listed = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"name=^{name}$"], capture_output=True, text=True, check=True, timeout=60
    )
    return listed.stdout.split()


def test_a_detached_serve_is_sealed_until_serve_full_stop_ends_it(blessings: dict[str, Any]) -> None:
    """--detach: the serve's own watcher refuses readiness (46) on an unproven bucket; stop ends it and the engine."""
    blessing = blessings["off"]
    root, name, port = Path(blessing["root"]), blessing["name"], int(blessing["port"])
    ready = ("ready", name, "--root", str(root))
    started = run_cli("--root", str(root), "--profile", str(blessing["profile"]), "--detach", "--json", program=SERVE)
    try:
        assert started.code == 0, started.stderr[-4000:]
        watcher = started.json()["result"]["seal_watcher"]
        assert watcher is not None and seal_watchers(root) == [watcher["pid"]]
        assert run_cli(*ready, program=SERVE).code == 0, "sealed and canary-checked: ready"
        complete_at(port, 5)  # bucket 8: not in the blessing
        deadline = time.monotonic() + 10
        while ready_code(name, root) != 46:  # polled in process; the command confirms just below
            assert time.monotonic() < deadline, "readiness did not refuse within 10 s"
            time.sleep(0.25)
        refusal = run_cli(*ready, program=SERVE)
        assert refusal.code == 46 and "reference_bucket_8" in refusal.stderr, refusal.stderr[-2000:]
        assert complete_at(port, 5)["choices"][0]["token_ids"], "refuse keeps the engine answering"
    finally:
        stopped = run_cli("stop", name, "--root", str(root), "--json", program=SERVE)
    assert stopped.code == 0, stopped.stderr[-3000:]
    assert f"seal watcher pid {watcher['pid']}" in stopped.json()["stopped"]
    assert seal_watchers(root) == [], "no watcher outlives serve-full stop"
    assert containers_named(serve_name(name, root)) == [], "no container is left"
    # What the refusal's hint names is kept for the next bless run: the serve dir with unproven-compiles.jsonl.
    (kept,) = [note for note in stopped.json()["notes"] if "kept as evidence" in note]
    evidence = Path(kept.rsplit(": ", 1)[-1]) / "unproven-compiles.jsonl"
    lines = [json.loads(line) for line in evidence.read_text().splitlines()]
    assert [line.get("kernel") for line in lines].count("reference_bucket_8") == 1, lines  # and the watcher's files
    assert len({event_identity(line) for line in lines}) == len(lines), "one line per distinct compile"
