"""Secrets in profile env never reach factors or manifests; ids and paths never become engine flags."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest

from bless.core.factors import REDACTED, resolve
from bless.core.profile import HardwareSpec, ModelSpec, Profile, profile_from_dict
from bless.engines.base import EnvPolicy, looks_secret
from bless.engines.reference import ReferenceAdapter
from bless.engines.vllm import VllmAdapter, versions
from bless.engines.vllm.env import VLLM_HASHED_SECRETS, VLLM_NOT_SECRETS
from bless.errors import ExitCode, InputInvalidError, ResolutionError
from tests.support.resolving import resolved_offline

PINNED_IMAGE = "sha256:" + "ab" * 32
HEX40 = "0123456789abcdef0123456789abcdef01234567"
GPU = {"accelerator": "cuda", "gpu_count": 1, "gpu_name": "NVIDIA H200", "compute_capability": "9.0"}

REAL_SECRETS = [
    "hf_token",
    "HF_TOKEN",
    "HF_TOKEN_1",
    "HUGGING_FACE_HUB_TOKEN",
    "hfToken",
    "GITHUB_PAT",
    "GH_TOKEN",
    "DB_PASS",
    "DB_PASSWORD",
    "MYSQL_PWD_PASSWD",
    "AUTH_HEADER",
    "AUTHORIZATION",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_ACCESS_KEY_ID",
    "OPENAI_API_KEY",
    "VLLM_API_KEY",
    "MYAPIKEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "DOCKER_CREDS",
    "SENTRY_DSN",
    "SESSION_COOKIE",
    "client-secret",
    "wandb.api.key",
]
NOT_SECRETS = [
    "VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE",
    "VLLM_MAX_TOKENS",
    "MAX_NUM_BATCHED_TOKENS",
    "TOKENIZERS_PARALLELISM",
    "VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD",
    "KEYS_DIR",
    "MONKEY_PATCH",
    "PASSES",
    "VLLM_ATTENTION_BACKEND",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "TORCHINDUCTOR_COMPILE_THREADS",
]


@pytest.mark.parametrize("name", REAL_SECRETS)
@pytest.mark.parametrize("policy", [VllmAdapter().env_policy, ReferenceAdapter().env_policy], ids=["vllm", "ref"])
def test_real_world_secret_names_are_secrets(policy: EnvPolicy, name: str) -> None:
    assert policy.is_secret(name)
    assert policy.is_ignored(name)


@pytest.mark.parametrize("name", NOT_SECRETS)
def test_knobs_that_mention_tokens_or_keys_stay_hashed(name: str) -> None:
    policy = VllmAdapter().env_policy
    assert not policy.is_secret(name)
    assert not policy.is_ignored(name) or name == "CUDA_VISIBLE_DEVICES"


def test_every_name_vllm_hashes_that_looks_secret_was_decided() -> None:
    """A new release's hashed name that a secret word matches must be listed as a knob or as a real secret."""
    hashed = set().union(*(rules.hashed_env for rules in versions.all_rules().values()))
    looking_secret = {name for name in hashed if looks_secret(name)}
    assert looking_secret - VLLM_NOT_SECRETS - VLLM_HASHED_SECRETS == set()
    policy = VllmAdapter().env_policy
    assert all(not policy.is_secret(name) and not policy.is_ignored(name) for name in VLLM_NOT_SECRETS & hashed)


def test_secret_values_never_reach_factors_or_the_record() -> None:
    names = [name for name in REAL_SECRETS if name.replace("_", "").isalnum()]  # what a profile's env accepts
    env = {name: f"value-of-{index}" for index, name in enumerate(names)}
    doc = _vllm_doc(env={**env, "VLLM_MAX_TOKENS": "7"})
    resolved = resolve(profile_from_dict(doc), VllmAdapter(), image_resolver=None, hardware_probe=_gpu)
    written = json.dumps(resolved.to_dict())
    assert not any(f"value-of-{index}" in written for index in range(len(names)))
    assert resolved.factors["env"] == {"VLLM_MAX_TOKENS": "7"}
    assert resolved.recorded_env == dict.fromkeys(names, REDACTED)


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ({"id": "--enforce-eager"}, "model.id"),
        ({"id": "-O0"}, "model.id"),
        ({"id": "org/model\nx"}, "model.id"),
    ],
)
def test_a_model_id_or_revision_never_becomes_a_flag(model: dict[str, Any], field: str) -> None:
    doc = _vllm_doc()
    doc["model"].update(model)
    with pytest.raises(InputInvalidError) as caught:
        _launch(doc)
    assert caught.value.exit_code == ExitCode.INPUT_INVALID
    assert field in caught.value.message


def test_a_revision_reaches_argv_only_as_the_resolved_commit() -> None:
    doc = _vllm_doc()
    doc["model"]["revision"] = "--enforce-eager"
    with pytest.raises(ResolutionError, match="40-hex"):
        _launch(doc)


def test_a_local_model_path_never_becomes_a_flag() -> None:
    doc = _vllm_doc(runtime={"kind": "local", "python": "python3"})
    doc["model"] = {"source": "local", "id": "m", "path": "--enforce-eager"}
    with pytest.raises(InputInvalidError, match=r"model\.path"):
        _launch(doc)


def test_the_launch_is_what_was_hashed_not_the_profile() -> None:
    """Adapters read the resolved factors and env: a profile changed after resolving changes nothing that runs."""
    doc = _vllm_doc(env={"OMP_NUM_THREADS": "2", "HF_TOKEN": "t0ken"})
    resolved = resolved_offline(profile_from_dict(doc), VllmAdapter())
    expected = VllmAdapter().launch(resolved, port=1)

    tampered = copy.deepcopy(doc)
    tampered["model"]["id"] = "other/model"
    tampered["serve"].update(enforce_eager=True, max_model_len=64, compilation_config={"mode": "NONE"})
    tampered["env"] = {"TORCH_COMPILE_DEBUG": "1", "VLLM_DISABLE_COMPILE_CACHE": "1"}
    drifted = dataclasses.replace(resolved, profile=profile_from_dict(tampered))

    launch = VllmAdapter().launch(drifted, port=1)
    assert launch.command == expected.command
    assert dict(launch.env) == dict(expected.env)
    assert launch.env["OMP_NUM_THREADS"] == "2" and launch.env["HF_TOKEN"] == "t0ken"
    assert "--enforce-eager" not in launch.command and "other/model" not in launch.command
    assert VllmAdapter().unsafe_settings(drifted) == []
    reference = Profile(
        name="ref",
        engine="reference",
        runtime_kind="docker",
        image=PINNED_IMAGE,
        model=ModelSpec("builtin", "reference-tiny"),
        serve={"layers": 2},
    )
    ref_resolved = resolved_offline(reference, ReferenceAdapter())
    ref_expected = ReferenceAdapter().launch(ref_resolved, port=1)
    changed = dataclasses.replace(
        reference, serve={"layers": 3, "compile": False}, env={"BLESS_REFERENCE_IGNORE_CACHE": "1"}
    )
    ref_drifted = dataclasses.replace(ref_resolved, profile=changed)
    assert ReferenceAdapter().launch(ref_drifted, port=1) == ref_expected
    assert ReferenceAdapter().unsafe_settings(ref_drifted) == []


def test_a_debug_launch_never_changes_the_hashed_factors() -> None:
    resolved = resolved_offline(profile_from_dict(_vllm_doc()), VllmAdapter())
    before = json.dumps(resolved.to_dict(), sort_keys=True)
    assert "--enforce-eager" in VllmAdapter().launch(resolved, port=1, debug=True).command
    assert json.dumps(resolved.to_dict(), sort_keys=True) == before


@pytest.mark.parametrize("value", ["--enforce-eager", "-x", "name\x1b[2J"])
def test_string_serve_arguments_never_become_flags(value: str) -> None:
    with pytest.raises(InputInvalidError, match="served_model_name"):
        VllmAdapter().normalize_serve({"served_model_name": value}, where="p")
    with pytest.raises(InputInvalidError, match="served_model_name"):
        ReferenceAdapter().normalize_serve({"served_model_name": value}, where="p")


def test_extra_args_refuse_control_characters() -> None:
    with pytest.raises(InputInvalidError, match="control character"):
        VllmAdapter().normalize_serve({"extra_args": ["--max-logprobs\n--enforce-eager"]}, where="p")


def test_a_plain_model_id_still_launches() -> None:
    command = _launch(_vllm_doc())
    assert command[command.index("serve") + 1] == "org/model"


def _vllm_doc(**sections: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "profile_version": 1,
        "name": "vllm-test",
        "engine": {"name": "vllm"},
        "runtime": {"kind": "docker", "image": PINNED_IMAGE},
        "model": {"source": "huggingface", "id": "org/model", "revision": HEX40, "hf_home": "/srv/hf"},
        "serve": {"served_model_name": "m"},
        "env": {},
        "hardware": {"accelerator": "cuda", "gpu_count": 1},
    }
    doc.update(sections)
    return doc


def _gpu(spec: HardwareSpec) -> dict[str, Any]:
    return dict(GPU)


def _launch(doc: dict[str, Any]) -> tuple[str, ...]:
    return VllmAdapter().launch(resolved_offline(profile_from_dict(doc), VllmAdapter()), port=1).command
