"""Helpers for integration tests: run the real CLI as a process, write profile variants, list our containers."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bless.container_labels import STORE_ROOT

REPO = Path(__file__).resolve().parents[2]
REFERENCE_PROFILE = REPO / "profiles" / "reference-cpu.toml"
OWNER_LABEL = "org.bless.owner=bless"


@dataclass(frozen=True)
class CliResult:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


KNOBS_ENTRY = Path(__file__).with_name("knobs_entry.py")


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 900,
    program: str = "bless.cli.main",
    allow_test_knobs: bool = False,
) -> CliResult:
    """Run ``bless`` (or ``serve-full`` with program="bless.cli.serve") as a real process.

    ``allow_test_knobs`` runs ``bless`` through ``knobs_entry.py``, the only way to let the
    reference engine's test knobs through (no option or environment variable does).
    """
    command = [str(KNOBS_ENTRY)] if allow_test_knobs else ["-m", program]
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, *command, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": pythonpath, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def write_profile(
    path: Path,
    *,
    env: dict[str, str] | None = None,
    trials: dict[str, Any] | None = None,
    serving_port: int | None = None,
    name: str | None = None,
) -> Path:
    """A copy of the shipped reference profile with some tables replaced (plain text edit of TOML)."""
    text = REFERENCE_PROFILE.read_text()
    if name:
        text = text.replace('name = "reference-cpu"', f'name = "{name}"', 1)
    if env:
        lines = "\n".join(f'{key} = "{value}"' for key, value in env.items())
        text = text.replace("[env]\n", f"[env]\n{lines}\n", 1)
    for key, value in (trials or {}).items():
        rendered = json.dumps(value) if not isinstance(value, bool) else str(value).lower()
        text, count = re.subn(rf"(?m)^{key} = .*$", f"{key} = {rendered}", text, count=1)
        assert count == 1, key
    if serving_port is not None:
        text = re.sub(r"(?m)^port = .*$", f"port = {serving_port}", text, count=1)
    path.write_text(text)
    return path


def serve_name(name: str, root: Path) -> str:
    """The container a serve of profile ``name`` from store root ``root`` runs in (its name carries the root's tag)."""
    from bless.flows.serve.names import serve_container_name

    return serve_container_name(name, per_root=root)


def our_containers(*labels: str) -> list[str]:
    """Names of every container (any state) carrying our owner label (and every ``key=value`` label given)."""
    filters = [arg for label in (OWNER_LABEL, *labels) for arg in ("--filter", f"label={label}")]
    out = subprocess.run(
        ["docker", "ps", "-a", *filters, "--format", "{{.Names}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return sorted(out.split())


def our_containers_and_roots() -> dict[str, str]:
    """Every container of ours (any state) by name, with the store root it is labelled with ("" for none)."""
    out = subprocess.run(
        [
            "docker", "ps", "-a", "--filter", f"label={OWNER_LABEL}",
            "--format", f'{{{{.Names}}}}\t{{{{.Label "{STORE_ROOT}"}}}}',
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout  # fmt: skip
    found: dict[str, str] = {}
    for line in out.splitlines():
        name, _, root = line.partition("\t")
        if name:
            found[name] = root
    return found


@contextmanager
def imported_image(client: Any, name: str, rootfs: bytes, changes: Sequence[str] = ()) -> Iterator[str]:
    """``name`` imported from a rootfs tar for the ``with`` body, and removed after it.

    An image that was already there is used as it is and left alone: the tests remove only what
    they made (containers still using the image are the test's own to stop first).
    """
    import docker

    try:
        client.images.get(name)
    except docker.errors.ImageNotFound:
        pass
    else:
        yield name
        return
    repository, tag = name.split(":")
    client.api.import_image_from_data(rootfs, repository=repository, tag=tag, changes=list(changes))
    client.images.get(name)
    try:
        yield name
    finally:
        # Still in use by a container someone keeps: left, never forced.
        with contextlib.suppress(docker.errors.APIError):
            client.images.remove(name)
