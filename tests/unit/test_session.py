"""engine_spec: where the engine listens and where we reach it, per runtime (the serve-full port rule)."""

from __future__ import annotations

import os
from pathlib import Path

from bless.core.profile import ModelSpec, Profile
from bless.engines.base import ENGINE_TMP
from bless.engines.reference import ReferenceAdapter
from bless.flows.engine_start import DEFAULT_ENGINE_PORT, SEAL_DIR, engine_spec
from bless.runtime.base import Mount
from bless.runtime.docker import DockerRuntime
from bless.runtime.local import LocalRuntime
from tests.support.resolving import resolved_offline


def profile(kind: str) -> Profile:
    return Profile(
        name="p",
        engine="reference",
        runtime_kind=kind,  # type: ignore[arg-type]
        image="sha256:" + "ab" * 32 if kind == "docker" else None,
        python="python3" if kind == "local" else None,
        model=ModelSpec(source="builtin", id="reference-tiny"),
    )


def spec_for(kind: str, host_port: int | None):
    runtime = DockerRuntime() if kind == "docker" else LocalRuntime(use_mount_namespace=False)
    return engine_spec(
        resolved_offline(profile(kind), ReferenceAdapter()),
        ReferenceAdapter(),
        runtime,
        name="bless-serve-p",
        labels={"org.bless.owner": "bless"},
        cache_mount=None,
        image=None,
        host_port=host_port,
        log_path=Path("/tmp/unused.log"),
    )


def test_local_engine_listens_on_the_serving_port_itself() -> None:
    spec = spec_for("local", 18123)
    assert spec.port == 18123
    assert spec.host_port is None  # nothing to publish: the engine is on the host
    assert "--port" in spec.command and spec.command[spec.command.index("--port") + 1] == "18123"


def test_docker_maps_the_serving_port_to_the_fixed_container_port() -> None:
    spec = spec_for("docker", 18123)
    assert spec.port == DEFAULT_ENGINE_PORT
    assert spec.host_port == 18123
    assert spec.command[spec.command.index("--port") + 1] == str(DEFAULT_ENGINE_PORT)


def test_without_a_serving_port_the_local_engine_gets_a_free_one() -> None:
    spec = spec_for("local", None)
    assert spec.port is not None and spec.port > 0
    assert spec.host_port is None


def test_a_sealed_local_reference_start_sets_no_pythonpath_and_puts_only_the_seal_first(tmp_path: Path) -> None:
    """The PYTHONPATH the local runtime passes through stays as it is (the host's), behind bless's seal module."""
    spec = engine_spec(
        resolved_offline(profile("local"), ReferenceAdapter()),
        ReferenceAdapter(),
        LocalRuntime(use_mount_namespace=False),
        name="bless-trial-p",
        labels={"org.bless.owner": "bless"},
        cache_mount=Mount("overlay", tmp_path / "tree", "/var/cache/bless-engine"),
        image=None,
        private_dir=tmp_path / "private",
        seal=True,
    )
    assert spec.python_path == (f"{ENGINE_TMP}/{SEAL_DIR}",)
    assert "PYTHONPATH" not in spec.env


def test_private_dirs_are_made_fresh_and_list_files_links_and_sockets(tmp_path: Path) -> None:
    import socket

    from bless.flows.engine_start import PRIVATE_DIRS, list_private, make_private_dirs
    from bless.runtime.base import ContainerSpec, Mount

    private = tmp_path / "private"
    spec = ContainerSpec(
        name="x",
        command=("true",),
        env={},
        labels={},
        mounts=tuple(Mount("private", private / name, target) for _, name, target in PRIVATE_DIRS),
    )
    (private / "home").mkdir(parents=True)
    (private / "home" / "left-by-a-previous-start").write_text("old")
    make_private_dirs(spec)
    assert list_private(private) == [], "what a previous start left is gone"
    assert (private / "home").stat().st_mode & 0o777 == 0o777
    (private / "home" / ".triton" / "cache").mkdir(parents=True)
    (private / "home" / ".triton" / "cache" / "k.cubin").write_bytes(b"12345")
    (private / "home" / "link").symlink_to("/etc/passwd")
    with socket.socket(socket.AF_UNIX) as sock:
        # bind() by a relative name: pytest's tmp paths can exceed AF_UNIX's 108 bytes.
        cwd = os.getcwd()
        os.chdir(private / "tmp")
        try:
            sock.bind("0f4773f1-2853-4348-9f2e-433463316151")
        finally:
            os.chdir(cwd)
        found = {(entry.shown, entry.kind, entry.size) for entry in list_private(private)}
    assert found == {
        ("HOME/.triton/cache/k.cubin", "file", 5),
        ("HOME/link", "link", len("/etc/passwd")),
        ("TMPDIR/0f4773f1-2853-4348-9f2e-433463316151", "socket", 0),
    }


def test_outside_rules_name_noise_and_call_everything_else_compiled() -> None:
    from bless.engines.base import classify_outside
    from bless.engines.vllm.evidence import OUTSIDE_RULES
    from bless.evidence_types import OutsideEntry

    socket_name = "0f4773f1-2853-4348-9f2e-433463316151"
    verdict = classify_outside(
        OUTSIDE_RULES,
        [
            OutsideEntry("TMPDIR", socket_name, 0, "socket"),  # vLLM's ZeroMQ endpoint
            OutsideEntry("TMPDIR", socket_name, 10, "file"),  # the same name as a file: not a socket
            OutsideEntry("HOME", ".triton/cache/X/k.cubin", 10),
            OutsideEntry("HOME", ".config/unknown/state.json", 10),
            OutsideEntry("container", "/usr/lib/python3/dist-packages/x/__pycache__/y.cpython-311.pyc", 10),
        ],
    )
    assert [item.split(":")[0] for item in verdict.noise] == [
        f"TMPDIR/{socket_name}",
        "/usr/lib/python3/dist-packages/x/__pycache__/y.cpython-311.pyc",
    ]
    assert verdict.compiled == (
        f"TMPDIR/{socket_name}: written outside the blessed tree and named by no rule of the adapter",
        "HOME/.triton/cache/X/k.cubin: compiled code or a kernel",
        "HOME/.config/unknown/state.json: written outside the blessed tree and named by no rule of the adapter",
    )
    assert verdict.counts() == {"written": 5, "noise": 2, "compiled": 3}


def test_list_private_skips_the_seal_module_bless_placed_but_not_what_the_engine_wrote(tmp_path: Path) -> None:
    from bless.flows.engine_start import SEAL_DIR, SEAL_MODULE_FILE, list_private, seal_hook_source

    hook_dir = tmp_path / "tmp" / SEAL_DIR
    (hook_dir / "__pycache__").mkdir(parents=True)
    (tmp_path / "home").mkdir()
    (hook_dir / SEAL_MODULE_FILE).write_bytes(seal_hook_source())
    (hook_dir / "__pycache__" / "bless_seal.cpython-312.pyc").write_bytes(b"bytecode")
    (hook_dir / "kernel.cubin").write_bytes(b"\x7fELF")  # the engine's write, beside bless's file
    assert [entry.shown for entry in list_private(tmp_path)] == [f"TMPDIR/{SEAL_DIR}/kernel.cubin"]
    (hook_dir / SEAL_MODULE_FILE).write_bytes(b"# changed by the engine\n")
    assert f"TMPDIR/{SEAL_DIR}/{SEAL_MODULE_FILE}" in [entry.shown for entry in list_private(tmp_path)]
