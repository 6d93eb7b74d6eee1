"""The public API as an outside rollout tool calls it (docs/reference/python-api.md), engine-free.

Each test is a promise of that page that a call once broke: ``resolve_profile`` is ``bless hash`` (a GPU
profile's declarations resolve on a CPU machine), every result has ``to_dict()``, ``gate`` refuses a manifests
dir that does not exist as the command does, and ``serve`` refuses an option given in both spellings before it
touches the store.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bless
from bless.flows.inspect.profile_hash import hash_profile

REPO = Path(__file__).resolve().parents[2]
#: Shipped GPU profiles whose [hardware], [runtime] and [model] are declared: they hash on any machine.
DECLARED_GPU_PROFILES = [
    REPO / "profiles" / "reference-cuda-local.toml",
    REPO / "profiles" / "vllm-0.26-llama-3.1-8b-dummy-local.toml",
]


def tree(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*")) if root.exists() else []


@pytest.mark.parametrize("profile", DECLARED_GPU_PROFILES, ids=lambda path: path.stem)
def test_resolve_profile_is_bless_hash_for_a_declared_gpu_profile(profile: Path) -> None:
    """The table says ``resolve_profile`` is ``bless hash``: declarations taken as written, no live probe."""
    expected = hash_profile(profile, offline=True)
    assert expected.hardware_source == "declared"
    by_path = bless.resolve_profile(profile, offline=True)
    by_profile = bless.resolve_profile(bless.load_profile(profile), offline=True)
    assert by_path.config_hash == by_profile.config_hash == expected.resolved.config_hash
    assert by_path.factors["hardware"]["accelerator"] == "cuda"


def test_init_trust_result_has_the_commands_json(tmp_path: Path) -> None:
    """Every result has ``to_dict()``, the document the command prints with ``--json``."""
    result = bless.init_trust(tmp_path / "trust", unencrypted=True)
    document = result.to_dict()
    assert json.loads(json.dumps(document)) == document
    assert document["keys_dir"] == str(result.keys_dir)
    assert document["root"] == str(result.metadata_dir / "root.json")
    assert document["encrypted_keys"] is False
    assert set(document["roles"]) == set(result.roles)


def test_gate_refuses_a_manifests_dir_that_does_not_exist(tmp_path: Path) -> None:
    """``bless gate`` exits 2 for a manifests dir that is not there; the call gives the same refusal, not a
    "not blessed" verdict, and touches nothing."""
    missing = tmp_path / "typo"
    store = bless.open_store(tmp_path / "root", manifests_dir=missing)
    with pytest.raises(bless.UsageError) as refused:
        bless.gate([DECLARED_GPU_PROFILES[0]], store=store, junit=tmp_path / "out" / "gate.xml")
    assert refused.value.exit_code == bless.ExitCode.USAGE
    assert str(missing) in refused.value.message
    assert "--" not in (refused.value.hint or "")  # the hint never names a command-line flag
    assert tree(tmp_path) == []


def test_serve_refuses_canary_in_both_spellings_before_the_store(tmp_path: Path) -> None:
    """``canary=False`` and its older spelling ``no_canary`` together are a usage error, not one silently winning."""
    root = tmp_path / "root"
    with pytest.raises(bless.UsageError) as refused:
        bless.serve(DECLARED_GPU_PROFILES[0], store=bless.open_store(root), canary=False, no_canary=False)
    assert refused.value.exit_code == bless.ExitCode.USAGE
    assert tree(tmp_path) == []
