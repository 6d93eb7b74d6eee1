"""``bless k8s render`` never writes a secret env value (issue 25, item 5).

A profile's secret env values (names the engine's policy keeps secret) went into the profile ConfigMap
and stdout in clear. Now a value there is refused (3); the profile leaves the name empty, the engine
container takes it from the Secret named by ``--env-secret`` (``valueFrom.secretKeyRef``), and serve-full
fills an empty secret from its environment (never hashed: the config hash is the same).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

import bless.probes as probes
from bless.cli.error_hints import command_line_hint
from bless.core.factors import declared_hardware_factor
from bless.core.profile import load_profile
from bless.engines import get_adapter
from bless.errors import InputInvalidError
from bless.flows.k8s import render_blessing
from bless.flows.push import push_blessing
from bless.flows.resolve import resolve_profile
from bless.oci.client import parse_reference
from bless.store import Store
from tests.support.registry_simulator import RegistrySimulator
from tests.unit.store_helpers import make_manifest, write_tree
from tests.unit.test_k8s_render import KUBERNETES_VERSIONS, options, profile_text, resolved_factors

SECRET_VALUE = "hf_live_do_not_print_me"
IMAGES = ("--image", "e@sha256:" + "ab" * 32, "--bless-image", "b@sha256:" + "ab" * 32)


def pushed_blessing(tmp_path: Path) -> tuple[RegistrySimulator, str]:
    registry = RegistrySimulator()
    store = Store(tmp_path / "root")
    tree = write_tree(tmp_path / "tree")
    manifest = make_manifest(
        tree, resolved_factors(profile_text() + '\n[env]\nHF_TOKEN = ""\nLOG_LEVEL = "info"\n', tmp_path)
    )
    store.publish(tree, manifest)
    pushed = push_blessing(store, manifest, parse_reference(registry.ref("blessings/tiny:v1")), transport=registry)
    return registry, pushed.pinned


def with_env(tmp_path: Path, value: str, *, hardware: str = "gpu_count = 2") -> Path:
    path = tmp_path / "profile.toml"
    path.write_text(profile_text(hardware_extra=hardware) + f'\n[env]\nHF_TOKEN = "{value}"\nLOG_LEVEL = "info"\n')
    return path


def render(tmp_path: Path, value: str, **changes: Any) -> Any:
    registry, pinned = pushed_blessing(tmp_path)
    return render_blessing(with_env(tmp_path, value), options(artifact=pinned, **changes), transport=registry)


@pytest.mark.parametrize("env_secret", [None, "hf-token"])
def test_a_secret_value_in_the_profile_is_refused_never_rendered(tmp_path: Path, env_secret: str | None) -> None:
    with pytest.raises(InputInvalidError, match="HF_TOKEN") as info:
        render(tmp_path, SECRET_VALUE, env_secret=env_secret)
    assert SECRET_VALUE not in info.value.diagnostics()
    assert "--env-secret" in (command_line_hint(info.value) or "")


def test_an_empty_secret_needs_the_secret_that_holds_it(tmp_path: Path) -> None:
    with pytest.raises(InputInvalidError, match="names secret HF_TOKEN") as info:
        render(tmp_path, "")
    assert "--env-secret" in (command_line_hint(info.value) or "")


def test_an_empty_secret_is_rendered_as_a_secret_key_ref(tmp_path: Path) -> None:
    result = render(tmp_path, "", env_secret="hf-token")
    (deployment,) = [doc for doc in result.documents if doc["kind"] == "Deployment"]
    (engine,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}} in engine["env"]
    assert not any(e["name"] == "LOG_LEVEL" for e in engine["env"]), "only secrets come from the Secret"
    for document in result.documents:
        kubernetes_validate.validate(dict(document), KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("name", ["Hf_Token", "a b", "x" * 254, "-x"])
def test_an_env_secret_that_is_not_a_secret_name_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InputInvalidError, match="not a Kubernetes Secret name"):
        render(tmp_path, "", env_secret=name)


def test_the_cli_never_prints_a_secret(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from bless.cli.main import app

    path = with_env(tmp_path, SECRET_VALUE)
    result = CliRunner().invoke(
        app,
        [*("k8s", "render", "--profile", str(path), "--from", f"127.0.0.1:9/b@sha256:{'ab' * 32}", "--json"), *IMAGES],
    )
    assert result.exit_code == 3, result.stdout
    assert SECRET_VALUE not in result.stdout + result.stderr
    assert "HF_TOKEN" in json.loads(result.stdout)["error"]["message"]


def test_serve_full_fills_an_empty_secret_from_its_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    declared = 'gpu_count = 1\ngpu_name = "NVIDIA H100 80GB HBM3"\ncompute_capability = "9.0"'
    profile = load_profile(with_env(tmp_path, "", hardware=declared))
    adapter = get_adapter(profile.engine)
    packages = {"vllm": "0.26.0", "torch": "2.11.0", "triton": "3.6.0", "transformers": "5.17.0"}
    installed: dict[str, Any] = {"python_version": "3.12.3", "packages": packages}
    monkeypatch.setattr(probes, "probe_python_environment", lambda python, packages: installed)  # the serving host's
    monkeypatch.delenv("HF_TOKEN", raising=False)
    without = resolve_profile(profile, image_resolver=None, adapter=adapter, hardware_probe=declared_hardware_factor)
    monkeypatch.setenv("HF_TOKEN", SECRET_VALUE)
    filled = resolve_profile(profile, image_resolver=None, adapter=adapter, hardware_probe=declared_hardware_factor)
    assert filled.secret_env["HF_TOKEN"] == SECRET_VALUE and without.secret_env["HF_TOKEN"] == ""
    assert filled.config_hash == without.config_hash, "secrets are never hashed"
