"""The measurement and proof scripts: they must fail loudly and run on the hosts they are meant for."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bless import container_labels

REPO = Path(__file__).resolve().parents[2]
PROOF_SCRIPTS = sorted((REPO / "scripts" / "gpu").glob("gpu-proof-*.sh"))


def _load_script(name: str) -> ModuleType:
    path = REPO / "scripts" / name
    spec = importlib.util.spec_from_file_location(f"_script_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# What a newcomer runs sits at the top of scripts/; benchmarks, GPU proofs and image builds each have a folder.
TOP_LEVEL_SCRIPTS = {
    "setup.sh", "main.sh", "test.sh", "ensure-docker.sh", "ensure-podman.sh", "start-registry.sh", "common.sh",
    "gen_docs.py", "vllm_rules.py", "vllm_moe_tables.py", "vllm_coverage_cites.py",  # data from a release's source
}  # fmt: skip
SCRIPT_FOLDERS = {"bench": "bench_*.py", "gpu": "gpu-proof-*.sh", "images": "build-*-image.sh"}


def test_scripts_are_grouped_in_folders() -> None:
    top = {p.name for p in (REPO / "scripts").iterdir() if p.name != "__pycache__"}
    assert top == TOP_LEVEL_SCRIPTS | set(SCRIPT_FOLDERS), "a new script belongs in bench/, gpu/ or images/"
    for folder, pattern in SCRIPT_FOLDERS.items():
        assert list((REPO / "scripts" / folder).glob(pattern)), f"scripts/{folder} holds no {pattern}"


def test_there_are_proof_scripts() -> None:
    assert len(PROOF_SCRIPTS) >= 2


@pytest.mark.parametrize("script", PROOF_SCRIPTS, ids=lambda p: p.name)
def test_proof_scripts_stop_at_an_unexpected_failure(script: Path) -> None:
    """Without -e a failed step goes unnoticed and the proof records whatever came after it."""
    assert re.search(r"^set -euo pipefail$", script.read_text(), re.MULTILINE), f"{script.name} lacks set -euo"


@pytest.mark.parametrize("script", PROOF_SCRIPTS, ids=lambda p: p.name)
def test_every_captured_exit_code_is_checked(script: Path) -> None:
    """A step run as ``|| rc=$?`` goes on past a failure; ``expect_rc`` must then say what it had to be (issue 26:
    gpu-proof-parallel.sh exited 0 while every trial was rejected)."""
    lines = script.read_text().splitlines()
    assert "source scripts/gpu/proof-lib.sh" in lines, f"{script.name} does not source scripts/gpu/proof-lib.sh"
    for number, line in enumerate(lines):
        captured = re.search(r"\|\| (\w+)=\$\?", line)
        if captured is None or line.lstrip().startswith("#"):
            continue
        variable = captured.group(1)
        checked = []
        for later in lines[number + 1 :]:
            if re.search(rf"(^|[\s;]){variable}=", later):
                break  # reassigned before any check: this capture was never checked
            if re.search(rf'expect_rc .* "\${{?{variable}', later):
                checked.append(later)
        assert checked, f"{script.name}:{number + 1}: the exit code in ${variable} is never checked: {line.strip()}"


def _proof(body: str) -> subprocess.CompletedProcess[str]:
    script = f"set -euo pipefail\nsource scripts/gpu/proof-lib.sh\n{body}\necho reached the end"
    return subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=30)


def test_a_proof_with_a_failed_step_exits_1_naming_it_after_recording_the_rest() -> None:
    result = _proof('rc=0; false || rc=$?; expect_rc "bless run" 0 "$rc"\nrc=0; exit 21 || true')
    assert result.returncode == 21  # a proof already failing keeps its own code
    result = _proof('rc=0; false || rc=$?; expect_rc "bless run" 0 "$rc"')
    assert result.returncode == 1, result.stderr
    assert "reached the end" in result.stdout  # the rest of the proof was still recorded
    assert "proof FAILED: bless run exited 1, expected 0" in result.stderr


def test_a_proof_whose_steps_exit_as_expected_exits_0() -> None:
    """A refusal that is the evidence (a tampered store: 21) is expected, not a failure."""
    result = _proof('rc=0; true || rc=$?; expect_rc run 0 "$rc"\nrc=0; (exit 21) || rc=$?; expect_rc tampered 21 "$rc"')
    assert result.returncode == 0, result.stderr
    assert "reached the end" in result.stdout and "FAILED" not in result.stderr


@pytest.mark.parametrize("script", PROOF_SCRIPTS, ids=lambda p: p.name)
def test_tar_options_come_before_member_names(script: Path) -> None:
    """GNU tar applies --exclude only to the names after it: one placed last excludes nothing."""
    for line in script.read_text().splitlines():
        if not re.search(r"\btar\b", line) or line.lstrip().startswith("#"):
            continue
        words = shlex.split(line.split("tar ", 1)[1].split(";")[0])
        first_name = next(
            (i for i, w in enumerate(words) if not w.startswith("-") and words[i - 1] not in ("-C", "-czf")), None
        )
        late = [w for w in words[first_name or len(words) :] if w.startswith("--exclude")]
        assert not late, f"{script.name}: {late} after the member names in: {line.strip()}"


def test_bench_serve_describes_a_host_without_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU hosts run the local runtime with no docker binary: describing the machine must not crash."""
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty dir: no docker here
    bench_serve = _load_script("bench/bench_serve.py")
    assert bench_serve.machine()["docker"] == "none"


def _hint(venv: str, active: str | None) -> str:
    env = {"PATH": "/usr/bin:/bin"} | ({"VIRTUAL_ENV": active} if active else {})
    result = subprocess.run(
        ["bash", "-c", f'source scripts/common.sh && activation_hint "{venv}"'],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout == "", "the hint must not mix into a command's stdout (main.sh passes --json through)"
    return result.stderr


def test_main_ends_by_saying_how_to_activate_the_venv() -> None:
    """After main.sh, the README's next command is ``bless list``: without the venv on PATH it is not found."""
    lines = [line for line in (REPO / "scripts" / "main.sh").read_text().splitlines() if line.strip()]
    assert "source scripts/common.sh" in lines
    assert lines[-1] == 'activation_hint "$PWD/.venv"'
    hint = _hint("/srv/clone/.venv", None)
    assert "\n    source /srv/clone/.venv/bin/activate\n" in hint  # on a line of its own, to copy
    assert "/srv/clone/.venv/bin/bless" in hint
    assert "is active" in _hint("/srv/clone/.venv", "/srv/clone/.venv")
    assert "source /srv/clone/.venv/bin/activate" in _hint("/srv/clone/.venv", "/elsewhere/.venv")


def test_setup_says_how_to_activate_the_venv_whichever_way_it_ends() -> None:
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert setup.count('say "ready: source .venv/bin/activate puts bless and serve-full on PATH"') == 2


# ------------------------------------------------------------------ cleaning up what the scripts started


def _script(name: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / name), *args],
        cwd=cwd,
        env=os.environ | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_start_registry_help_is_usage_not_a_storage_dir(tmp_path: Path) -> None:
    result = _script("start-registry.sh", "--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "usage:" in result.stdout and "--stop STORAGE_DIR" in result.stdout
    assert list(tmp_path.iterdir()) == [], "--help was taken for a directory"
    unknown = _script("start-registry.sh", "--bogus", cwd=tmp_path)
    assert unknown.returncode == 2 and "unknown option: --bogus" in unknown.stderr
    assert list(tmp_path.iterdir()) == []


def test_start_registry_stops_what_it_started_and_says_how(tmp_path: Path) -> None:
    from tests.support.registry import free_port, registry_binary

    registry_binary()  # skips (or fails under scripts/test.sh) without docker-registry
    storage = tmp_path / "registry"
    started = _script("start-registry.sh", str(storage), f"127.0.0.1:{free_port()}", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    assert f"stop it with: bash scripts/start-registry.sh --stop {storage}" in started.stderr
    pid = int((storage / "registry.pid").read_text())
    assert Path(f"/proc/{pid}").exists()
    stopped = _script("start-registry.sh", "--stop", str(storage), cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped the registry of {storage} (pid {pid})" in stopped.stderr
    assert not _running(pid) and not (storage / "registry.pid").exists()
    assert (storage / "data").is_dir(), "stopping keeps the blobs"
    again = _script("start-registry.sh", "--stop", str(storage), cwd=tmp_path)
    assert again.returncode == 0 and "nothing to stop" in again.stderr


def test_start_registry_without_an_address_takes_a_free_port_and_says_which(tmp_path: Path) -> None:
    """Two users' (or two checkouts') registries side by side: no fixed port 5000 to collide on."""
    import urllib.request

    from tests.support.registry import registry_binary

    registry_binary()
    storages = [tmp_path / "a", tmp_path / "b"]
    try:
        addresses = []
        for storage in storages:
            started = _script("start-registry.sh", str(storage), cwd=tmp_path)
            assert started.returncode == 0, started.stderr
            addresses.append(started.stdout.strip())
            assert (storage / "registry.addr").read_text().strip() == addresses[-1]
        assert addresses[0] != addresses[1] and all(a.startswith("127.0.0.1:") for a in addresses)
        for address in addresses:
            with urllib.request.urlopen(f"http://{address}/v2/", timeout=5) as reply:
                assert reply.status == 200
    finally:
        for storage in storages:
            _script("start-registry.sh", "--stop", str(storage), cwd=tmp_path)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a stopped child of ours stays in /proc until reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.parametrize("script", ["start-registry.sh", "ensure-docker.sh"])
def test_a_stale_pid_file_kills_nothing(script: str, tmp_path: Path) -> None:
    """A pid file can outlive its process and the pid be reused: --stop checks what the pid is before a kill."""
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        if script == "start-registry.sh":
            pidfile, args, env = tmp_path / "registry.pid", ["--stop", str(tmp_path)], None
        else:
            pidfile = tmp_path / "dockerd.pid"
            args, env = ["--stop"], {"BLESS_DOCKERD_PIDFILE": str(pidfile)}
        pidfile.write_text(f"{bystander.pid}\n")
        result = _script(script, *args, cwd=tmp_path, env=env)
        assert result.returncode == 0, result.stderr
        assert "not running" in result.stderr
        assert bystander.poll() is None, "--stop killed a process it did not start"
        assert not pidfile.exists(), "the stale pid file is left behind"
    finally:
        bystander.kill()
        bystander.wait()


def test_ensure_docker_stop_without_its_pid_file_leaves_docker_alone(tmp_path: Path) -> None:
    result = _script("ensure-docker.sh", "--stop", cwd=tmp_path, env={"BLESS_DOCKERD_PIDFILE": str(tmp_path / "none")})
    assert result.returncode == 0
    assert "started no dockerd; a Docker Engine started otherwise is left alone" in result.stderr
    usage = _script("ensure-docker.sh", "--help", cwd=tmp_path)
    assert usage.returncode == 0 and "--stop" in usage.stderr


def test_ensure_docker_records_the_pid_of_the_dockerd_it_starts() -> None:
    """--stop can only find the daemon through that record: it must be written right after the start."""
    text = (REPO / "scripts" / "ensure-docker.sh").read_text()
    start = text.index("setsid nohup dockerd")
    record = 'echo "$pid $(setup_user) $(proc_start "$pid")" >"$PIDFILE"'
    assert text.index(record) > start
    assert text.index(record) < text.index("wait_for_docker", start)


def test_ensure_docker_knows_bless_containers_by_the_label_bless_puts_on_them() -> None:
    text = (REPO / "scripts" / "ensure-docker.sh").read_text()
    assert f'BLESS_OWNER_LABEL="{container_labels.OWNER}"' in text
    assert f'BLESS_OWNER_VALUE="{container_labels.OWNER_VALUE}"' in text


def _started_dockerd(tmp_path: Path) -> subprocess.Popen[bytes]:
    """A real process named dockerd (a copy of sleep), as the one ensure-docker.sh started would be."""
    binary = tmp_path / "dockerd"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", binary)
    return subprocess.Popen([str(binary), "60"])


def _proc_start(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def _stop_with_containers(
    tmp_path: Path, docker_ps: str, *, record: str | None = None, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], bool, bool]:
    """``ensure-docker.sh --stop`` against a started dockerd whose ``docker ps`` answers ``docker_ps`` (a shell
    snippet); the result, whether the daemon still runs and whether its pid file is still there.

    ``record``: the pid file's line after the pid, ``{start}`` replaced by the daemon's start time (default: this
    user and that start time, as setup writes it).
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f"#!/bin/sh\n{docker_ps}\n")
    (bin_dir / "docker").chmod(0o755)
    daemon = _started_dockerd(tmp_path)
    pidfile = tmp_path / "dockerd.pid"
    line = (record if record is not None else f"{os.getuid()} {{start}}").format(start=_proc_start(daemon.pid))
    pidfile.write_text(f"{daemon.pid} {line}\n")
    try:
        env = {
            "BLESS_DOCKERD_PIDFILE": str(pidfile),
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "BLESS_DOCKERD_TIMEOUT": "10",
            **(env or {}),
        }
        result = _script("ensure-docker.sh", "--stop", cwd=tmp_path, env=env)
        return result, _running(daemon.pid), pidfile.exists()
    finally:
        daemon.kill()
        daemon.wait()


def test_ensure_docker_stop_leaves_a_dockerd_others_run_containers_on(tmp_path: Path) -> None:
    """Setup started it, but a container someone else started since runs on it: stopping it would stop theirs."""
    listing = "printf 'webapp\\tnginx:1\\trunning\\t\\nold\\tnginx:0\\texited\\t\\n'"
    result, running, recorded = _stop_with_containers(tmp_path, listing)
    assert result.returncode == 0, result.stderr
    assert running and recorded, "a daemon others use was stopped (or forgotten)"
    assert "left running: the dockerd this script started" in result.stderr
    assert "containers use it (running, or made by bless for some store): webapp (nginx:1)" in result.stderr
    assert "old (nginx:0)" not in result.stderr, "a stopped container of someone else's uses nothing"
    assert "run this again" in result.stderr


@pytest.mark.parametrize(
    "listing",
    [
        "printf 'bless-serve-x-1a2b3c4d\\tbless-reference:0.1.0\\trunning\\tbless\\n'",
        "printf 'bless-serve-x-1a2b3c4d\\tbless-reference:0.1.0\\texited\\tbless\\n'",
    ],
)
def test_ensure_docker_stop_leaves_a_dockerd_that_any_bless_container_is_on(listing: str, tmp_path: Path) -> None:
    """bless's containers are not the clean-up's own: another user's store may be serving (or own a stopped serve)."""
    result, running, recorded = _stop_with_containers(tmp_path, listing)
    assert result.returncode == 0, result.stderr
    assert running and recorded, "a daemon other users' bless containers are on was stopped"
    assert "bless-serve-x-1a2b3c4d (bless-reference:0.1.0)" in result.stderr


@pytest.mark.parametrize(
    ("record", "said"),
    [
        ("4242 {start}", "started by the setup of user 4242"),  # another user's setup
        ("", "does not say who started it"),  # an older setup's record (the pid alone)
    ],
)
def test_ensure_docker_stop_leaves_a_dockerd_another_setup_started(record: str, said: str, tmp_path: Path) -> None:
    result, running, recorded = _stop_with_containers(tmp_path, "true", record=record)
    assert result.returncode == 0, result.stderr
    assert running and recorded, "another user's daemon was stopped"
    assert said in result.stderr


def test_ensure_docker_stop_kills_nothing_when_the_pid_is_another_dockerd_now(tmp_path: Path) -> None:
    """The recorded pid runs a dockerd again, but one started later (another start time): not the one setup started."""
    result, running, recorded = _stop_with_containers(tmp_path, "true", record=f"{os.getuid()} 1")
    assert result.returncode == 0, result.stderr
    assert running and not recorded
    assert "is not running" in result.stderr


def test_ensure_docker_stop_leaves_a_dockerd_whose_containers_cannot_be_listed(tmp_path: Path) -> None:
    result, running, recorded = _stop_with_containers(
        tmp_path, "echo 'Cannot connect to the Docker daemon' >&2; exit 1"
    )
    assert result.returncode == 0, result.stderr
    assert running and recorded
    assert "its containers cannot be listed ('docker ps' failed: Cannot connect to the Docker daemon)" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="stopping the daemon is root's (the script refuses otherwise)")
def test_ensure_docker_stop_stops_its_dockerd_when_nothing_uses_it(tmp_path: Path) -> None:
    result, running, recorded = _stop_with_containers(tmp_path, "true")
    assert result.returncode == 0, result.stderr
    assert not running and not recorded
    assert "stopped dockerd (pid" in result.stderr


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"BLESS_ROOT": "/srv/bless-root"}, "/srv/bless-root/build"),
        ({"BLESS_ROOT": "/srv/bless-root", "BLESS_BUILD_CACHE": "/srv/cache"}, "/srv/cache"),
        ({"HOME": "/home/someone"}, "/home/someone/.cache/bless/build"),
    ],
)
def test_the_build_cache_follows_the_store_root(env: dict[str, str], expected: str, tmp_path: Path) -> None:
    """The wheelhouse (a torch wheel) goes where BLESS_ROOT puts the store, not always to ~/.cache."""
    base = {k: v for k, v in os.environ.items() if k not in ("BLESS_ROOT", "BLESS_BUILD_CACHE", "XDG_CACHE_HOME")}
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "images" / "build-reference-image.sh"), "--cache-dir"],
        cwd=tmp_path,
        env=base | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{expected}\n"


# ------------------------------------------------------------------ setup's steps: one line each, noise in a log


def _steps(script: str, log: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (bash) with scripts/common.sh sourced and STEP_LOG at ``log``."""
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", f"source scripts/common.sh\n{script}"],
        cwd=REPO,
        env={"PATH": os.environ["PATH"], "STEP_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_step_shows_one_line_and_logs_its_noise(tmp_path: Path) -> None:
    log = tmp_path / "setup.log"
    log.touch()
    result = _steps(
        "run_step 'installing things' sh -c 'echo Get:1 http://deb.example bookworm; echo Collecting pip >&2'\n"
        "step_said '^Collecting'\n",
        log,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "setup: installing things\n"
    assert result.stdout == "Collecting pip\n"  # step_said reads back what the last step printed
    text = log.read_text()
    assert "installing things" in text and "Get:1 http://deb.example" in text and "Collecting pip" in text


def test_a_failed_step_shows_the_log_tail_and_where_the_log_is(tmp_path: Path) -> None:
    log = tmp_path / "setup.log"
    log.touch()
    result = _steps(
        "run_step 'first' true\n"
        "failing() { echo E: Unable to locate package nope && return 7; }\n"
        "run_step 'installing nope' failing\n"
        "echo not reached >&2\n",
        log,
    )
    assert result.returncode == 7
    assert result.stderr.startswith("setup: first\nsetup: installing nope\n")
    assert "setup: FAILED (exit 7): installing nope" in result.stderr
    assert "  | E: Unable to locate package nope" in result.stderr
    assert f"the whole log: {log}" in result.stderr
    assert "not reached" not in result.stderr, "setup must stop at the failed step"


def test_setup_runs_apt_get_and_pip_only_as_logged_steps() -> None:
    """apt-get and pip print hundreds of lines: setup.sh runs them only inside functions given to run_step."""
    text = (REPO / "scripts" / "setup.sh").read_text()
    functions = dict(re.findall(r"^(\w+)\(\) \{\n(.*?)^\}", text, re.MULTILINE | re.DOTALL))
    stepped = {name for name in functions if re.search(rf"^\s*run_step .*\\?\n?\s*{name}\b", text, re.MULTILINE)}
    assert {"install_bless", "apt_install"} <= stepped, stepped
    outside = text
    for name in stepped:
        outside = outside.replace(functions[name], "")
    outside = "\n".join(line for line in outside.splitlines() if not line.lstrip().startswith("#"))
    for tool in ("apt-get install", "apt-get update", "pip install"):
        assert tool not in outside, f"setup.sh runs {tool} outside a logged step"
    assert "STEP_LOG=$PWD/.venv/setup.log" in text
    assert 'say "the output of each step goes to $STEP_LOG (the previous run\'s: $STEP_LOG.1)"' in text
    assert text.index("start_step_log") < text.index("run_step")


def test_each_setup_run_keeps_the_previous_runs_log(tmp_path: Path) -> None:
    """A failed run's log must survive the re-run that follows it (the first thing a user does after a failure)."""
    log = tmp_path / ".venv" / "setup.log"
    for run in ("first", "second", "third"):
        result = _steps(f"start_step_log\nrun_step '{run} run' echo {run}-output\n", log)
        assert result.returncode == 0, result.stderr
    assert "third-output" in log.read_text() and "second" not in log.read_text()
    previous = log.with_name("setup.log.1").read_text()
    assert "second-output" in previous and "first" not in previous


# ------------------------------------------------------------------ the image scripts and podman

IMAGE_SCRIPTS = [
    "images/build-bless-image.sh",
    "images/build-engine-image.sh",
    "ensure-podman.sh",
    "images/podman-load-image.sh",
]


@pytest.mark.parametrize("script", [*IMAGE_SCRIPTS, "images/image-lib.sh", "images/build-reference-image.sh"])
def test_image_scripts_parse_and_stop_at_a_failure(script: str) -> None:
    text = (REPO / "scripts" / script).read_text()
    subprocess.run(["bash", "-n", str(REPO / "scripts" / script)], check=True)
    if script != "images/image-lib.sh":  # sourced: the scripts that source it set the options
        assert re.search(r"^set -euo pipefail$", text, re.MULTILINE), f"{script} lacks set -euo pipefail"


@pytest.mark.parametrize("script", IMAGE_SCRIPTS)
def test_image_scripts_answer_help_without_docker(script: str, tmp_path: Path) -> None:
    result = _script(script, "--help", cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(f"usage: scripts/{script}")
    assert result.stdout == "", "stdout is for image IDs and names only"


def test_the_engine_image_script_checks_its_arguments_before_docker(tmp_path: Path) -> None:
    few = _script("images/build-engine-image.sh", "bless-reference:0.1.0", cwd=tmp_path)
    assert few.returncode == 1 and "need ENGINE_IMAGE and TAG (got 1 arguments)" in few.stderr
    same = _script("images/build-engine-image.sh", "bless-reference:0.1.0", "bless-reference:0.1.0", cwd=tmp_path)
    assert same.returncode == 1 and "the engine image's own tag is never replaced" in same.stderr
    untagged = _script("images/build-engine-image.sh", "bless-reference:0.1.0", "my-engine", cwd=tmp_path)
    assert untagged.returncode == 1 and "TAG must be a lowercase image name with a tag" in untagged.stderr


def _lib(script: str, tmp_path: Path, path: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (bash) with scripts/images/image-lib.sh sourced, the cache in ``tmp_path``."""
    env = {"PATH": path or os.environ["PATH"], "HOME": str(tmp_path), "BLESS_BUILD_CACHE": str(tmp_path / "cache")}
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", f'PROG=test; source "{REPO}/scripts/images/image-lib.sh"\n{script}'],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_bless_source_hash_follows_the_symlinks_the_wheel_follows(tmp_path: Path) -> None:
    """bless/cli and bless/schema are links: a change under cli/ changes the wheel, so it must change the hash."""
    copy = tmp_path / "src"
    result = _lib(
        f'copy_bless_source "{copy}"\n'
        f'bless_source_hash "{REPO}"; bless_source_hash "{copy}"\n'
        f'mkdir -p "{copy}/bless/__pycache__" && echo x > "{copy}/bless/__pycache__/m.cpython-311.pyc"\n'
        f'bless_source_hash "{copy}"\n'
        f'echo "# changed" >> "{copy}/cli/main.py"\n'
        f'bless_source_hash "{copy}"\n',
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    repo, copied, with_bytecode, changed = result.stdout.split()
    assert repo == copied == with_bytecode, "the copy is what the repo hashes to; bytecode is not an input"
    assert changed != copied
    assert (copy / "bless" / "cli").is_symlink() and (copy / "pyproject.toml").is_file()


def test_the_wheelhouse_target_lists_every_manylinux_tag_the_images_glibc_accepts(tmp_path: Path) -> None:
    """pip takes --platform literally: manylinux_2_35 alone misses wheels tagged only manylinux_2_17 (rpds-py)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text('#!/bin/sh\necho "cpython 3.12 2.35 x86_64"\n')
    (fake / "docker").chmod(0o755)
    result = _lib('pip_target_args engine:1; printf "%s\\n" "${PIP_TARGET[@]}"', tmp_path, f"{fake}:/usr/bin:/bin")
    assert result.returncode == 0, result.stderr
    args = result.stdout.split()
    assert args[:7] == ["--only-binary=:all:", "--implementation", "cp", "--python-version", "3.12", "--abi", "cp312"]
    platforms = [args[i + 1] for i, arg in enumerate(args) if arg == "--platform"]
    assert platforms == [f"manylinux_2_{minor}_x86_64" for minor in range(35, 16, -1)] + ["manylinux2014_x86_64"]
    assert "wheelhouse target: CPython 3.12, glibc 2.35, x86_64 (read from engine:1)" in result.stderr

    (fake / "docker").write_text('#!/bin/sh\necho "cpython 3.12 none x86_64"\n')
    musl = _lib("pip_target_args alpine:1", tmp_path, f"{fake}:/usr/bin:/bin")
    assert musl.returncode == 1 and "musl images are not supported" in musl.stderr


def test_a_proof_on_another_gpu_product_proves_a_copy_declaring_it(tmp_path: Path) -> None:
    """The shipped GPU profiles declare an H100 (CPU-only gating); on an H200 the proof must not die on exit 32."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H200'\n")
    fake.chmod(0o755)
    script = 'set -euo pipefail\nsource scripts/gpu/proof-lib.sh\nfor_this_gpu profiles/reference-cuda-local.toml "$1"'
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["bash", "-c", script, "x", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    copy = Path(result.stdout.strip())
    assert copy.parent == tmp_path and 'gpu_name = "NVIDIA H200"' in copy.read_text()
    assert "this machine has NVIDIA H200" in result.stderr
    same = subprocess.run(
        ["bash", "-c", script.replace("H200", "H100"), "x", str(tmp_path)],
        cwd=REPO, env={**env, "PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert same.stdout.strip() == "profiles/reference-cuda-local.toml"  # no nvidia-smi here: the profile as it is


def _fake_docker(tmp_path: Path) -> tuple[str, Path]:
    """A docker CLI that knows no image and whose pulls fail; each call logged. The PATH that finds it first."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "docker-calls"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\nexit 1\n')
    (bin_dir / "docker").chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}", calls


def test_auto_prefers_the_offline_inputs_on_the_machine_to_a_pull(tmp_path: Path) -> None:
    path, calls = _fake_docker(tmp_path)
    result = _lib(
        "ONLINE_BASE=python:3.11-slim PULL_TIMEOUT=5\n"
        "offline_inputs_local() { echo 'the torch wheel t.whl and the base image b are local'; }\n"
        'choose_path auto; echo "$path"\n',
        tmp_path,
        path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "offline\n"
    assert "because the torch wheel t.whl and the base image b are local: the offline path's inputs" in result.stderr
    assert not calls.exists(), "docker was asked (a pull tried) though everything was here"


def test_auto_says_it_tries_a_pull_before_falling_back_to_offline(tmp_path: Path) -> None:
    path, calls = _fake_docker(tmp_path)
    result = _lib(
        "ONLINE_BASE=python:3.11-slim PULL_TIMEOUT=5\n"
        "offline_inputs_local() { return 1; }\n"
        'choose_path auto; echo "$path"\n',
        tmp_path,
        path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "offline\n"
    assert "trying 'docker pull python:3.11-slim' (timeout 5s; the offline path if that fails)" in result.stderr
    assert "pull python:3.11-slim" in calls.read_text()


def test_wait_for_verdict_returns_on_the_canary_line_or_when_serve_full_exits(tmp_path: Path) -> None:
    """The proofs read serve-full's verdict only after this returns: on the line, or at once once it exited."""
    log = tmp_path / "serve.stderr"
    passed = _proof(
        f'(sleep 1; echo "canary passed: 3 prompt(s)" >> {log}; sleep 30) & pid=$!\n'
        f'SECONDS=0; wait_for_verdict {log} "$pid" 20; echo "waited $SECONDS"; kill "$pid"'
    )
    assert passed.returncode == 0, passed.stderr
    assert re.search(r"waited [1-3]\b", passed.stdout), passed.stdout
    exited = _proof(
        f'(sleep 1; exit 3) & pid=$!\nSECONDS=0; wait_for_verdict {tmp_path / "none"} "$pid" 20; echo "waited $SECONDS"'
    )
    assert re.search(r"waited [1-3]\b", exited.stdout), exited.stdout
