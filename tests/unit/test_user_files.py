"""Every file a user names goes through the one bounded reader (issue 25, item 3).

Profiles (every ``--profile`` command), a local model's ``config.json``, the docker config that holds
pull secrets and the ``--junit`` target: a FIFO must not hang bless, ``/dev/zero`` or a huge sparse file
must not be read whole, and each is refused as invalid input (3), naming the file and why. Each runs in a
real ``bless`` process (or a Python child) under a memory limit and a timeout: a hang or an unbounded
read fails the test instead of the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bless.core.profile import load_profile, read_profile
from bless.errors import ExitCode, InputInvalidError

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "profiles" / "reference-cpu.toml"
#: Runs the rest of argv under a 2 GiB address-space limit (an unbounded read ends in MemoryError: exit 1).
LIMITED = (
    "import os, resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def run_python(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` from the checkout, memory-limited, killed after 30 s (a FIFO read would block forever)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "250", **(env or {})}
    full_env.pop("BLESS_ROOT", None)
    return subprocess.run(
        [sys.executable, "-c", LIMITED, *args], env=full_env, capture_output=True, text=True, timeout=30, check=False
    )


def hostile(directory: Path, name: str, kind: str) -> Path:
    """``directory/name`` as a FIFO, a link to /dev/zero, a sparse 4 GiB file or a directory."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "sparse":
        with path.open("wb") as handle:  # costs no disk
            handle.truncate(4 << 30)
    else:
        path.mkdir()
    return path


KINDS = ["fifo", "zero", "sparse", "directory"]
WHY = {
    "fifo": "is a FIFO, not a regular file",
    "zero": "is a character device, not a regular file",
    "sparse": "bytes it may be",
    "directory": "is a directory, not a regular file",
}


@pytest.mark.parametrize("kind", KINDS)
def test_profile_that_is_not_a_small_regular_file_is_input_invalid(tmp_path: Path, kind: str) -> None:
    profile = hostile(tmp_path, "profile.toml", kind)
    proc = run_python("-m", "bless.cli.main", "--root", str(tmp_path / "root"), "hash", "--profile", str(profile))
    assert proc.returncode == ExitCode.INPUT_INVALID, proc.stderr[-2000:]
    assert WHY[kind] in proc.stderr and "Traceback" not in proc.stderr


def test_profile_through_a_symlink_is_read(tmp_path: Path) -> None:
    # A Kubernetes ConfigMap mount is all links: the profile a pod serves with is one.
    link = tmp_path / "profile.toml"
    link.symlink_to(PROFILE)
    assert load_profile(link).name == load_profile(PROFILE).name


@pytest.mark.parametrize("kind", ["fifo", "zero", "sparse"])
def test_model_config_that_is_not_a_regular_file_is_input_invalid(tmp_path: Path, kind: str) -> None:
    model = tmp_path / "model"
    hostile(model, "config.json", kind)
    code = (
        "import sys\n"
        "from bless.engines.vllm.adapter import model_architectures\n"
        "from bless.errors import BlessError\n"
        "try:\n"
        f"    model_architectures({{'source': 'local', 'path': {str(model)!r}}})\n"
        "except BlessError as exc:\n"
        "    print(exc.message, file=sys.stderr)\n"
        "    sys.exit(int(exc.exit_code))\n"
    )
    proc = run_python("-c", code)
    assert proc.returncode == ExitCode.INPUT_INVALID, proc.stderr[-2000:]
    assert "model config" in proc.stderr and WHY[kind] in proc.stderr


@pytest.mark.parametrize("kind", ["fifo", "zero", "sparse"])
def test_docker_config_is_read_bounded_before_any_request(tmp_path: Path, kind: str) -> None:
    # The pull secret a pod mounts as $DOCKER_CONFIG/config.json: refused (3) before the registry is asked
    # (127.0.0.1:9 refuses connections: reading the config after the first request gave 70 there).
    hostile(tmp_path / "docker", "config.json", kind)
    proc = run_python(
        "-m",
        "bless.cli.main",
        "--root",
        str(tmp_path / "root"),
        "pull",
        "127.0.0.1:9/repo:tag",
        env={"DOCKER_CONFIG": str(tmp_path / "docker"), "HOME": str(tmp_path)},
    )
    assert proc.returncode == ExitCode.INPUT_INVALID, proc.stderr[-2000:]
    assert "docker config" in proc.stderr and WHY[kind] in proc.stderr


def test_docker_config_credentials_still_reach_the_client(tmp_path: Path) -> None:
    docker = tmp_path / "docker"
    docker.mkdir()
    (docker / "config.json").write_text('{"auths": {"r.example": {"auth": "dTpw"}}, "credsStore": "x"}')
    code = (
        "from bless.oci.client import _docker_auth_config\n"
        "config = _docker_auth_config()\n"
        "assert config['auths'] == {'r.example': {'auth': 'dTpw'}}, config\n"
        "assert config['credsStore'] == 'x', config\n"
    )
    proc = run_python("-c", code, env={"DOCKER_CONFIG": str(docker), "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_junit_target_that_is_not_a_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    # An atomic write renames over the target: a FIFO (or /dev/null as root) would be replaced, a link
    # replaced instead of followed. Refused before the gate runs, and the node left as it was.
    target = tmp_path / "report.xml"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        (tmp_path / "elsewhere.xml").write_text("keep\n")
        target.symlink_to(tmp_path / "elsewhere.xml")
    before = os.lstat(target).st_mode
    (tmp_path / "root" / "manifests").mkdir(parents=True)
    proc = run_python(
        "-m",
        "bless.cli.main",
        "--root",
        str(tmp_path / "root"),
        "gate",
        str(PROFILE),
        "--manifests-dir",
        str(tmp_path / "root" / "manifests"),
        "--junit",
        str(target),
    )
    assert proc.returncode == ExitCode.INPUT_INVALID, proc.stderr[-2000:]
    assert "JUnit report" in proc.stderr and "not a regular file" in proc.stderr
    assert os.lstat(target).st_mode == before


# -- a mistyped profile path: did you mean ...? --------------------------------------------------------------


def test_a_mistyped_profile_path_suggests_the_near_names_beside_it(tmp_path: Path) -> None:
    (tmp_path / "vllm-llama-8b.toml").write_text("profile_version = 1\n")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(InputInvalidError) as info:
        read_profile(tmp_path / "vllm-lama-8b.toml")
    assert info.value.message.endswith("vllm-lama-8b.toml: no such profile file")
    assert info.value.hint is not None
    assert info.value.hint.startswith(f"did you mean {tmp_path / 'vllm-llama-8b.toml'}")
    assert "notes.txt" not in info.value.hint


def test_a_mistyped_profile_name_suggests_the_shipped_profiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """From a checkout (the README's working directory), a typo of a shipped profile names it."""
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    with pytest.raises(InputInvalidError) as info:
        read_profile(Path("profiles/refrence-cpu.toml"))
    assert info.value.hint is not None and info.value.hint.startswith("did you mean profiles/reference-cpu.toml")


def test_nothing_near_keeps_the_plain_hint(tmp_path: Path) -> None:
    with pytest.raises(InputInvalidError) as info:
        read_profile(tmp_path / "zzzz.toml")
    assert info.value.hint == "name a profile TOML file (see profiles/)" and info.value.remedy == "profile_file"
