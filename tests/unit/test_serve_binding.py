"""serve-full's device binding: the GPUs each rank of the served engine runs on (docs/concepts/serve-full.md).

A blessing records logical ranks; serve-full binds them, before anything starts, to the probed GPUs as the
operator's ``CUDA_VISIBLE_DEVICES`` selects and orders them, hands their UUIDs to the runtime in rank order, and
reports the binding in the plan, on stderr and in the readiness record. Refusals: a selection naming no GPU or
one twice (53), too few GPUs (52), another or a mixed product among the chosen GPUs (32).
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from bless.cli.serve import ready_app
from bless.cli.serve_views import render_plan, render_ready
from bless.core.factors import GpuInfo
from bless.core.profile import HardwareSpec, Profile
from bless.engines.reference import ReferenceAdapter
from bless.errors import BlessError, ExitCode, GpuSelectionError, HardwareMismatchError, InsufficientGpuError
from bless.flows import serve
from bless.store import Store
from tests.support.fakes import ARTIFACT_KEY, FakeEngineServer, FakeRuntime, openai_engine
from tests.unit.store_helpers import make_manifest, write_tree
from tests.unit.test_serve import GIB, GOLDEN, H100, make_profile, serving_runtime

#: Two H100s as nvidia-smi lists them (index order), each with its UUID.
HOST = [GpuInfo(H100.name, "9.0", 80 * GIB, 70 * GIB, index, f"GPU-{index}{index}aa-uuid") for index in range(2)]
A100 = GpuInfo("NVIDIA A100-SXM4-80GB", "8.0", 80 * GIB, 70 * GIB, 2, "GPU-22aa-uuid")


def tp2(*, declared: bool = True) -> Profile:
    """The unit profile over two GPUs (tensor parallel 2), declaring the H100 unless told not to."""
    hardware = HardwareSpec(
        accelerator="cuda",
        gpu_count=2,
        gpu_name=H100.name if declared else None,
        compute_capability="9.0" if declared else None,
    )
    return dataclasses.replace(make_profile(accelerator="cuda"), hardware=hardware)


def plan_on(
    profile: Profile,
    store: Store,
    runtime: FakeRuntime,
    gpus: Sequence[GpuInfo],
    visible: str | None,
    **kwargs: Any,
) -> serve.LaunchPlan:
    return serve.plan(
        profile,
        store=store,
        runtime=runtime,
        adapter=ReferenceAdapter(),
        gpu_probe=lambda: list(gpus),
        cuda_visible_devices=visible,
        **kwargs,
    )


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "root")


def test_swapped_gpus_give_swapped_ranks_and_the_runtime_gets_their_uuids_in_rank_order(store: Store) -> None:
    in_order = plan_on(tp2(), store, serving_runtime(), HOST, None, debug=True)
    assert in_order.spec.gpu_ids == ("GPU-00aa-uuid", "GPU-11aa-uuid")
    swapped = plan_on(tp2(), store, serving_runtime(), HOST, "1,0", debug=True)
    assert swapped.spec.gpu_ids == ("GPU-11aa-uuid", "GPU-00aa-uuid")
    assert swapped.to_dict()["ranks"] == [
        {"rank": 0, "index": 1, "uuid": "GPU-11aa-uuid", "name": H100.name},
        {"rank": 1, "index": 0, "uuid": "GPU-00aa-uuid", "name": H100.name},
    ]
    # A logical blessing: the same config hash on either binding.
    assert swapped.config_hash == in_order.config_hash
    by_prefix = plan_on(tp2(), store, serving_runtime(), HOST, "GPU-11,GPU-00aa", debug=True)
    assert by_prefix.spec.gpu_ids == ("GPU-11aa-uuid", "GPU-00aa-uuid")


@pytest.mark.parametrize(
    ("visible", "error", "code"),
    [
        ("0,2", GpuSelectionError, 53),  # a typo: never GPU 0 alone, never a shifted rank
        ("1,1", GpuSelectionError, 53),
        ("1", InsufficientGpuError, 52),
        ("", InsufficientGpuError, 52),  # CUDA's "no GPU"
    ],
)
def test_a_bad_selection_is_refused_before_anything_starts(
    store: Store, visible: str, error: type[BlessError], code: int
) -> None:
    runtime = serving_runtime()
    with pytest.raises(error) as caught:
        plan_on(tp2(), store, runtime, HOST, visible)
    assert int(caught.value.exit_code) == code
    assert "name_holder" not in runtime.calls and "start" not in runtime.calls


def test_the_chosen_gpus_are_the_ones_checked_for_the_product(store: Store) -> None:
    """Not the host's first GPUs: the hardware factor, the declared product and the memory are the chosen GPUs'."""
    host = [A100, *HOST]  # an A100 listed first
    one = dataclasses.replace(tp2(declared=False), hardware=HardwareSpec(accelerator="cuda", gpu_count=1))
    resolved = plan_on(one, store, serving_runtime(), host, "1", debug=True).resolved
    assert resolved.factors["hardware"]["gpu_name"] == H100.name  # GPU 1 (an H100), not the A100 at index 2
    with pytest.raises(HardwareMismatchError) as wrong:
        plan_on(tp2(), store, serving_runtime(), host, "2,0")
    assert wrong.value.exit_code == ExitCode.HARDWARE_MISMATCH and "rank 0: GPU 2 NVIDIA A100" in wrong.value.message
    with pytest.raises(HardwareMismatchError, match="mixed products"):
        plan_on(tp2(declared=False), store, serving_runtime(), host, "0,2")
    busy = [dataclasses.replace(HOST[0], memory_free_mib=GIB), HOST[1]]
    hungry = dataclasses.replace(tp2(), hardware=dataclasses.replace(tp2().hardware, min_gpu_memory_gib=40))
    # GPU 0 is busy: a selection without it serves, one that binds it is refused naming its rank.
    plan_on(
        hungry,
        store,
        serving_runtime(),
        [*busy, dataclasses.replace(HOST[1], index=2, uuid="GPU-2")],
        "1,2",
        debug=True,
    )
    with pytest.raises(InsufficientGpuError, match="rank 1 on GPU 0"):
        plan_on(hungry, store, serving_runtime(), busy, "1,0")


def test_a_cpu_profile_binds_no_ranks(store: Store) -> None:
    plan = plan_on(make_profile(), store, serving_runtime(), [], "3", debug=True)
    assert plan.to_dict()["ranks"] == [] and plan.spec.gpu_ids is None


@pytest.fixture
def engine() -> Iterator[int]:
    replies = {str(g["prompt"]): list(g["token_ids"]) for g in GOLDEN}
    with FakeEngineServer(openai_engine(lambda prompt, max_tokens: replies.get(prompt, [0])[:max_tokens])) as server:
        yield server.port


def test_the_binding_is_printed_per_rank_and_kept_in_the_readiness_record(
    store: Store, tmp_path: Path, engine: int
) -> None:
    profile = tp2()
    resolved = plan_on(profile, store, serving_runtime(), HOST, None, debug=True).resolved
    tree = write_tree(tmp_path / "tree")
    manifest = dataclasses.replace(
        make_manifest(tree, resolved.factors),
        golden=GOLDEN,
        artifacts={"items": ["artifact.bin"], "engine_keys": {"artifact_keys": [ARTIFACT_KEY]}},
    )
    store.publish(tree, manifest)
    runtime = serving_runtime(host_port=engine)
    plan = plan_on(profile, store, runtime, HOST, "1,0")

    err = io.StringIO()
    render_plan(Console(file=err, width=1000), plan.to_dict())
    lines = err.getvalue().splitlines()
    assert "rank 0 -> GPU 1 (GPU-11aa-uuid)" in lines and "rank 1 -> GPU 0 (GPU-00aa-uuid)" in lines

    result = serve.start(plan, runtime=runtime)  # foreground: this process keeps serving
    try:
        assert runtime.container(result.started.name).spec.gpu_ids == ("GPU-11aa-uuid", "GPU-00aa-uuid")
        answer = CliRunner().invoke(ready_app, [profile.name, "--root", str(store.root), "--json"])
        assert answer.exit_code == 0, answer.stdout
        assert json.loads(answer.stdout)["ranks"] == [
            {"rank": 0, "index": 1, "uuid": "GPU-11aa-uuid", "name": H100.name},
            {"rank": 1, "index": 0, "uuid": "GPU-00aa-uuid", "name": H100.name},
        ]
        record = serve.check_ready(store, profile.name)
        assert [(rank.rank, rank.uuid) for rank in record.ranks] == [(0, "GPU-11aa-uuid"), (1, "GPU-00aa-uuid")]
        shown = io.StringIO()
        render_ready(Console(file=shown, width=1000), record.to_dict())
        assert "rank 1 -> GPU 0 (GPU-00aa-uuid)" in shown.getvalue().splitlines()
    finally:
        serve.finish(plan, result, runtime=runtime, keep_upper=False, failed=False)


def test_a_record_written_before_ranks_were_reads_as_none_and_a_malformed_one_is_not_ready(store: Store) -> None:
    record = serve.mark_ready(
        store, name="p", config_hash="ab" * 32, host="127.0.0.1", port=8000, canary="passed", holder={}
    )
    document = record.to_dict()
    assert document["ranks"] == []
    del document["ranks"]
    assert serve.ReadyRecord.from_dict(document).ranks == ()
    with pytest.raises(ValueError):
        serve.ReadyRecord.from_dict({**document, "ranks": [{"rank": "0", "index": 1, "uuid": "u", "name": "n"}]})
