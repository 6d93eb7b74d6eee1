"""The smaller findings of issue 25, item 11, on what ``bless k8s render`` and the registry client are handed.

A newline at the end of ``--from`` was written into the Deployment's annotation; a reference holding
``user:pass@`` was echoed back whole in its refusal; the profile ConfigMap must hold the profile's bytes,
CRLF line ends included, through the YAML that is applied. (Profile names that render the same
Deployment: tests/unit/test_k8s_render.py; a manifest listing past its limit: tests/unit/test_manifest.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from bless.cli.k8s import to_yaml
from bless.core.untrusted_text import without_credentials
from bless.errors import InputInvalidError, UsageError
from bless.oci.client import parse_reference
from tests.unit.test_k8s_render import ARTIFACT, DIGEST, profile_text, rendered


@pytest.mark.parametrize(
    "artifact", [ARTIFACT + "\n", ARTIFACT + " ", " " + ARTIFACT, ARTIFACT + "\r", "a\x85b@" + DIGEST]
)
def test_a_reference_with_a_newline_or_blank_is_refused_never_annotated(tmp_path: Path, artifact: str) -> None:
    with pytest.raises(InputInvalidError, match="blanks or control characters") as info:
        rendered(tmp_path, artifact=artifact)
    assert "\n" not in info.value.message and info.value.hint


def test_the_command_refuses_a_from_with_a_newline_before_any_request(tmp_path: Path) -> None:
    from bless.cli.main import app

    path = tmp_path / "profile.toml"
    path.write_text(profile_text())
    args = ["k8s", "render", "--image", "e@" + DIGEST, "--bless-image", "b@" + DIGEST, "--profile", str(path)]
    result = CliRunner().invoke(app, [*args, "--from", f"127.0.0.1:9/b@{DIGEST}\n", "--json"])
    assert result.exit_code == 3, result.stdout
    assert "blanks or control characters" in json.loads(result.stdout)["error"]["message"]


SECRET = "hunter2-s3cret"


@pytest.mark.parametrize(
    "reference",
    [
        f"user:{SECRET}@localhost:5000/blessings/tiny@{DIGEST}",
        f"user:{SECRET}@localhost:5000/blessings/tiny:v1",
        f"https://user:{SECRET}@localhost:5000/blessings/tiny:v1",
        f"user:{SECRET}@localhost",
    ],
)
def test_a_reference_with_credentials_is_refused_and_never_echoed(reference: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_reference(reference)
    assert SECRET not in info.value.diagnostics() and SECRET not in json.dumps(info.value.details)
    assert "credentials" in info.value.message and "***@" in info.value.message


def test_k8s_render_never_echoes_credentials(tmp_path: Path) -> None:
    for artifact in (f"user:{SECRET}@registry.example.com/b:v1", f"user:{SECRET}@registry.example.com/b:v1\n"):
        with pytest.raises(InputInvalidError) as info:
            rendered(tmp_path, artifact=artifact)
        assert SECRET not in info.value.diagnostics()


def test_bless_pull_never_echoes_credentials(tmp_path: Path) -> None:
    from bless.cli.main import app

    reference = f"admin:{SECRET}@127.0.0.1:9/blessings/tiny@{DIGEST}"
    result = CliRunner().invoke(app, ["--root", str(tmp_path / "root"), "pull", reference, "--json"])
    assert result.exit_code != 0 and SECRET not in result.stdout + (result.stderr or ""), result.stdout


def test_without_credentials_masks_only_the_user_info() -> None:
    assert without_credentials(f"u:p@localhost:5000/r@{DIGEST}") == f"***@localhost:5000/r@{DIGEST}"
    assert without_credentials(f"localhost:5000/r@{DIGEST}") == f"localhost:5000/r@{DIGEST}"
    assert without_credentials("https://u:p@h/r") == "https://***@h/r"


def test_the_profile_configmap_keeps_crlf_line_ends_through_the_yaml(tmp_path: Path) -> None:
    """kubectl applies the YAML: what the pod's serve-full reads is what was loaded from it, byte for byte."""
    text = profile_text().replace("\n", "\r\n") + "# " + "long comment " * 20 + "\r\n"
    documents = rendered(tmp_path, text=text).documents
    assert documents[0]["data"] == {"profile.toml": text}
    loaded = list(yaml.safe_load_all(to_yaml(list(documents))))
    assert loaded[0]["data"]["profile.toml"].encode() == text.encode()
