"""The fleet loop end to end: the session's real blessing of the reference profile is signed, pushed to a
real registry (Docker Distribution on 127.0.0.1), pulled into a second, empty store root under --trust,
and served from there with ``serve-full --from`` (real Docker, the real reference engine, the canary).

The session blessing is only read: signing writes the keys dir, pushing reads the blessed tree.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import run_cli, serve_name, write_profile
from tests.integration.test_serve_full import remove_serving, serve
from tests.support.registry import Registry
from tests.support.trust_keys import KEY_ENV

pytestmark = pytest.mark.integration


def test_push_pull_serve_from_a_registry_under_trust(
    blessed: Any, registry: Registry, tmp_path: Path, docker_client: Any, no_leftovers: None
) -> None:
    keys = tmp_path / "signing"
    assert run_cli("trust", "init", "--keys", str(keys), env=KEY_ENV).code == 0
    signed = run_cli(
        "--root", str(blessed.root), "sign", blessed.config_hash, "--keys", str(keys), "--json", env=KEY_ENV
    )
    assert signed.code == 0, signed.stderr[-3000:]
    reference = registry.ref("caches/reference:v1")
    metadata = str(keys / "metadata")
    root = str(blessed.root)
    pushed = run_cli("--root", root, "push", blessed.config_hash, reference, "--metadata", metadata, "--json")
    assert pushed.code == 0, pushed.stderr[-3000:]
    digest = pushed.json()["digest"]

    host_trust = tmp_path / "host-trust"
    host_trust.mkdir()
    shutil.copy(keys / "metadata" / "root.json", host_trust / "root.json")
    host = tmp_path / "host"
    pulled = run_cli("--root", str(host), "pull", reference, "--trust", str(host_trust), "--json")
    assert pulled.code == 0, pulled.stderr[-3000:]
    document = pulled.json()
    assert document["digest"] == digest and document["installed"] is True
    assert document["config_hash"] == blessed.config_hash and document["trust"]["signed"] is True
    verified = run_cli("--root", str(host), "verify", blessed.config_hash, "--trust", str(host_trust), "--json")
    assert verified.code == 0, verified.stderr[-3000:]

    name, port = "fleet-from", 18131
    profile = write_profile(tmp_path / f"{name}.toml", name=name, serving_port=port)
    container = serve_name(name, host)
    try:
        result = serve(
            "--profile", str(profile), "--root", str(host), "--from", f"{registry.ref('caches/reference')}@{digest}",
            "--trust", str(host_trust), "--detach", "--json",
        )  # fmt: skip
        assert result.code == 0, result.stderr[-4000:]
        served = result.json()
        assert served["plan"]["from"]["installed"] is False  # already pulled: a no-op
        assert served["plan"]["trust"]["signed"] is True
        assert served["result"]["canary"]["status"] == "passed"
    finally:
        remove_serving(docker_client, container)

    # Without --trust the same serve still works, and says the blessing is unsigned (dry run: nothing starts).
    dry = serve("--profile", str(profile), "--root", str(host), "--dry-run", "--json")
    assert dry.code == 0, dry.stderr[-3000:]
    assert dry.json()["plan"]["trust"]["signed"] is False
