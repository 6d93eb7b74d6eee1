"""One Docker Engine, two store roots: both bless and serve the same profile at the same time, and both succeed.

Machines are shared (CI runners, team GPU boxes): every container and volume bless makes is named and labelled
per store root, so a second root blessing or serving a profile is never refused because another root is doing the
same, and neither root's clean-up touches the other's. Real Docker, the reference image, real compiles; K=1 to
keep it lean (each root: one bootstrap, one trial, one serve).
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bless.container_labels import store_tag
from tests.integration.helpers import CliResult, our_containers, run_cli, serve_name, write_profile

pytestmark = pytest.mark.integration

SERVE = "bless.cli.serve"
WIDE = {"COLUMNS": "500"}


def _both(calls: list[tuple[str, ...]], program: str = "bless.cli.main") -> list[CliResult]:
    """The command lines run at the same time, as two users would; their results in order."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        running = [pool.submit(run_cli, *args, env=WIDE, program=program, timeout=900) for args in calls]
        return [future.result() for future in running]


def test_two_store_roots_bless_and_serve_one_profile_at_once(tmp_path: Path, no_leftovers: None) -> None:
    name = f"it-shared-{uuid.uuid4().hex[:8]}"
    # Its own config hash (no other test blesses it), the same for both roots.
    profile = write_profile(tmp_path / "shared.toml", env={"BLESS_IT_CASE": f"shared-{name}"}, name=name)
    roots = [tmp_path / "alice", tmp_path / "bob"]
    assert store_tag(roots[0]) != store_tag(roots[1])

    blessed = _both(
        [("--root", str(root), "run", "--profile", str(profile), "--trials", "1", "--json") for root in roots]
    )
    for root, result in zip(roots, blessed, strict=True):
        assert result.code == 0, (root.name, result.stderr[-4000:])
        document = result.json()
        assert document["published"] is True
        (candidate,) = document["candidates"]
        assert candidate["trials"][0]["container"].endswith(f"-{store_tag(root)}"), "run names carry the root"
    assert blessed[0].json()["config_hash"] == blessed[1].json()["config_hash"]

    try:
        # --port 0: each serve on a free port of its own (the profile's port is the same for both).
        served = _both(
            [("--profile", str(profile), "--root", str(root), "--port", "0", "--detach", "--json") for root in roots],
            program=SERVE,
        )
        for root, result in zip(roots, served, strict=True):
            assert result.code == 0, (root.name, result.stderr[-4000:])
            assert result.json()["result"]["container"]["name"] == serve_name(name, root)
        ports = {result.json()["result"]["host_port"] for result in served}
        assert len(ports) == 2 and all(isinstance(port, int) and port > 0 for port in ports)
        for root in roots:
            ready = run_cli("ready", name, "--root", str(root), program=SERVE)
            assert ready.code == 0, (root.name, ready.stderr[-2000:])
    finally:
        stopped = [run_cli("stop", name, "--root", str(root), "--json", program=SERVE) for root in roots]
    for root, result in zip(roots, stopped, strict=True):
        assert result.code == 0, (root.name, result.stderr[-2000:])
        assert serve_name(name, root) in result.json()["stopped"], "each root stops its own serve, and only it"
    assert [n for n in our_containers(f"org.bless.profile={name}")] == [], "nothing of either root is left"
