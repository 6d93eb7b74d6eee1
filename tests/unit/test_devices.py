"""GPU slots for parallel trials, the per-slot memory check, and cross-device agreement (pure logic)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bless.cli.error_hints import command_line_hint
from bless.core.factors import GpuInfo
from bless.core.profile import HardwareSpec
from bless.errors import GpuSelectionError, HardwareMismatchError, InsufficientGpuError, ResolutionError
from bless.probes import parse_gpu_query
from bless.replay.devices import (
    GpuRank,
    GpuSlot,
    check_slot_memory,
    cross_device_reasons,
    serving_slot,
    trial_slots,
    visible_gpus,
)
from bless.runtime.base import ContainerSpec, rank_order_env
from bless.runtime.docker import DockerRuntime, device_requests

GIB = 1024


def gpus(count: int, name: str = "NVIDIA H200", free_gib: float = 100) -> list[GpuInfo]:
    return [GpuInfo(name, "9.0", 140 * GIB, int(free_gib * GIB), i, f"GPU-{i}abc") for i in range(count)]


CUDA = HardwareSpec(accelerator="cuda", gpu_count=1)


def test_nvidia_smi_query_gives_index_and_uuid() -> None:
    out = (
        "0, GPU-5d2c1a4e-0000-1111-2222-333344445555, NVIDIA H200, 9.0, 143771, 143190\n"
        "1, GPU-9f00aa11-0000-1111-2222-333344445555, NVIDIA H200, 9.0, 143771, 12000\n"
    )
    first, second = parse_gpu_query(out)
    assert (first.index, first.uuid, first.memory_free_mib) == (0, "GPU-5d2c1a4e-0000-1111-2222-333344445555", 143190)
    assert second.label == "GPU 1 (GPU-9f00aa11-0000-1111-2222-333344445555)"
    with pytest.raises(ResolutionError):
        parse_gpu_query("NVIDIA H200, 9.0, 143771, 143190")  # the old 4-column form: not silently misread


@pytest.mark.parametrize(
    ("per_trial", "requested", "trials", "expected"),
    [
        (1, None, 8, [[0], [1], [2], [3], [4], [5], [6], [7]]),  # default: one slot per GPU
        (2, None, 8, [[0, 1], [2, 3], [4, 5], [6, 7]]),  # tensor parallel 2: 4 slots
        (4, None, 8, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        (8, None, 3, [[0, 1, 2, 3, 4, 5, 6, 7]]),
        (3, None, 8, [[0, 1, 2], [3, 4, 5]]),  # 2 GPUs left over
        (1, 3, 8, [[0], [1], [2]]),
        (1, 1, 8, [[0]]),  # --parallel 1: today's behaviour, the first GPU
        (1, None, 2, [[0], [1]]),  # never more slots than trials
    ],
)
def test_slots_on_8_gpus(per_trial: int, requested: int | None, trials: int, expected: list[list[int]]) -> None:
    spec = HardwareSpec(accelerator="cuda", gpu_count=per_trial)
    slots = trial_slots(spec, gpus(8), requested=requested, trials=trials)
    assert [[gpu.index for gpu in slot.gpus] for slot in slots] == expected
    assert [slot.index for slot in slots] == list(range(len(expected)))
    every = [gpu.index for slot in slots for gpu in slot.gpus]
    assert len(every) == len(set(every)), "no GPU in two slots"


def test_too_many_slots_is_refused_with_what_fits() -> None:
    with pytest.raises(InsufficientGpuError) as caught:
        trial_slots(HardwareSpec(accelerator="cuda", gpu_count=2), gpus(8), requested=5, trials=8)
    assert caught.value.exit_code == 52
    assert "--parallel 5 needs 10 GPUs (2 per trial)" in caught.value.message
    assert "run 4 parallel trials or fewer" in (caught.value.hint or "")  # the library's hint names no flag
    assert "--parallel 4" in (command_line_hint(caught.value) or "")
    with pytest.raises(InsufficientGpuError, match="a trial needs 4 GPU"):
        trial_slots(HardwareSpec(accelerator="cuda", gpu_count=4), gpus(2), requested=None, trials=1)


def test_only_gpus_of_the_first_gpus_model_make_slots() -> None:
    mixed = [*gpus(2), *[GpuInfo("NVIDIA A100", "8.0", 80 * GIB, 70 * GIB, 2 + i, f"GPU-a{i}") for i in range(2)]]
    slots = trial_slots(CUDA, mixed, requested=None, trials=8)
    assert [slot.short for slot in slots] == ["0", "1"]


def test_cpu_profiles_get_slots_without_gpus() -> None:
    cpu = HardwareSpec(accelerator="cpu")
    assert trial_slots(cpu, [], requested=None, trials=5) == (GpuSlot(0),)
    assert trial_slots(cpu, [], requested=3, trials=5) == (GpuSlot(0), GpuSlot(1), GpuSlot(2))
    assert GpuSlot(0).label == "cpu" and GpuSlot(0).device_ids == ()


def test_slot_names_its_gpus_by_uuid_for_the_runtime() -> None:
    slot = trial_slots(HardwareSpec(accelerator="cuda", gpu_count=2), gpus(4), requested=None, trials=4)[1]
    assert slot.device_ids == ("GPU-2abc", "GPU-3abc")
    assert slot.label == "GPUs 2,3" and slot.short == "2,3"
    assert slot.records() == [
        {"rank": 0, "index": 2, "uuid": "GPU-2abc", "name": "NVIDIA H200"},
        {"rank": 1, "index": 3, "uuid": "GPU-3abc", "name": "NVIDIA H200"},
    ]
    no_uuid = GpuSlot(0, (GpuInfo("NVIDIA H200", "9.0", 1, 1, 5, ""),))
    assert no_uuid.device_ids == ("5",)


def test_the_operators_cuda_visible_devices_limits_the_gpus() -> None:
    host = gpus(8)
    assert [g.index for g in visible_gpus(host, None)] == list(range(8))
    assert [g.index for g in visible_gpus(host, "6,2")] == [6, 2]
    assert [g.index for g in visible_gpus(host, "GPU-3abc, GPU-5")] == [3, 5]  # full UUID, then a prefix
    assert visible_gpus(host, "") == []  # CUDA's "no GPU"


@pytest.mark.parametrize(
    ("selection", "why"),
    [
        ("9", "entry 0 ('9') names no GPU of this host"),  # a typo: never skipped (ranks would shift)
        ("0,9,1", "entry 1 ('9') names no GPU of this host"),
        ("GPU-zz", "entry 0 ('GPU-zz') names no GPU of this host"),
        ("0,", "entry 1 ('') names no GPU of this host"),
        ("1,1", "entry 1 ('1') names GPU 1 again"),
        ("2,GPU-2abc", "entry 1 ('GPU-2abc') names GPU 2 again"),  # index and UUID of one GPU
        ("GPU-", "entry 0 ('GPU-') names 8 GPUs (an ambiguous prefix)"),
    ],
)
def test_a_selection_naming_no_gpu_or_one_twice_is_refused(selection: str, why: str) -> None:
    with pytest.raises(GpuSelectionError) as caught:
        visible_gpus(gpus(8), selection)
    assert caught.value.exit_code == 53
    assert why in caught.value.message and "GPU-7abc" in caught.value.message  # lists the host's GPUs


TP2 = HardwareSpec(accelerator="cuda", gpu_count=2, gpu_name="NVIDIA H200", compute_capability="9.0")


def test_a_served_engine_binds_its_ranks_in_the_operators_order() -> None:
    host = gpus(2)
    assert serving_slot(TP2, host, None).device_ids == ("GPU-0abc", "GPU-1abc")  # unset: nvidia-smi's order
    swapped = serving_slot(TP2, host, "1,0")
    assert swapped.device_ids == ("GPU-1abc", "GPU-0abc")
    assert [rank.line for rank in swapped.ranks] == ["rank 0 -> GPU 1 (GPU-1abc)", "rank 1 -> GPU 0 (GPU-0abc)"]
    assert swapped.records()[0] == {"rank": 0, "index": 1, "uuid": "GPU-1abc", "name": "NVIDIA H200"}
    by_prefix = serving_slot(TP2, gpus(4), "GPU-3, GPU-1abc,0")  # UUID prefixes, the first gpu_count taken
    assert [(rank.rank, rank.index) for rank in by_prefix.ranks] == [(0, 3), (1, 1)]
    assert GpuRank.from_dict(by_prefix.ranks[1].to_dict()) == by_prefix.ranks[1]
    assert serving_slot(HardwareSpec(accelerator="cpu"), [], "1,0") == GpuSlot(0)  # a CPU profile: no ranks


def test_a_served_engine_refuses_too_few_gpus_and_typos() -> None:
    with pytest.raises(InsufficientGpuError) as few:
        serving_slot(TP2, gpus(4), "2")
    assert few.value.exit_code == 52 and "needs 2 GPU(s)" in few.value.message and "'2'" in few.value.message
    with pytest.raises(InsufficientGpuError):
        serving_slot(TP2, gpus(1), None)
    with pytest.raises(GpuSelectionError):
        serving_slot(TP2, gpus(2), "0,2")  # never "GPU 0 alone, too few": the typo is named
    with pytest.raises(GpuSelectionError):
        serving_slot(TP2, gpus(2), "0,0")


def test_a_served_engine_refuses_another_or_a_mixed_product_among_the_chosen_gpus() -> None:
    a100 = [GpuInfo("NVIDIA A100", "8.0", 80 * GIB, 70 * GIB, 2 + i, f"GPU-a{i}") for i in range(2)]
    host = [*gpus(2), *a100]  # H200 0,1 then A100 2,3
    assert serving_slot(TP2, host, None).device_ids == ("GPU-0abc", "GPU-1abc")
    with pytest.raises(HardwareMismatchError) as other:
        serving_slot(TP2, host, "2,3")  # the chosen ones are checked, not the host's first
    assert other.value.exit_code == 32 and "hardware.gpu_name='NVIDIA H200'" in other.value.message
    assert "rank 0: GPU 2 NVIDIA A100" in other.value.message
    with pytest.raises(HardwareMismatchError) as mixed:
        serving_slot(HardwareSpec(accelerator="cuda", gpu_count=2), host, "1,2")  # nothing declared: still refused
    assert "mixed products" in mixed.value.message and "rank 1: GPU 2 NVIDIA A100" in mixed.value.message
    capability = HardwareSpec(accelerator="cuda", gpu_count=2, compute_capability="8.0")
    with pytest.raises(HardwareMismatchError, match=r"compute_capability='8\.0'"):
        serving_slot(capability, host, None)


def test_memory_is_checked_per_slot_and_names_the_gpu() -> None:
    spec = HardwareSpec(accelerator="cuda", gpu_count=2, min_gpu_memory_gib=40)
    planned = trial_slots(spec, gpus(8), requested=None, trials=8)
    now = gpus(8)
    now[5] = GpuInfo("NVIDIA H200", "9.0", 140 * GIB, 3 * GIB, 5, "GPU-5abc")
    with pytest.raises(InsufficientGpuError) as caught:
        check_slot_memory(spec, planned, now)
    assert caught.value.exit_code == 52
    assert "GPU 5 (GPU-5abc) (slot 2): 3.0 GiB free of 140.0" in caught.value.message
    assert caught.value.details["short"] == [{"slot": 2, "index": 5, "uuid": "GPU-5abc", "free_mib": 3 * GIB}]
    check_slot_memory(spec, planned[:2], now)  # slots 0 and 1 do not use GPU 5
    check_slot_memory(HardwareSpec(accelerator="cuda", gpu_count=2), planned, now)  # no minimum declared


def test_cross_device_disagreement_names_the_device() -> None:
    reference = {"a": ("x", (1,)), "b": ("y", (2,))}
    same: dict[str, set[tuple[str, tuple[int, ...]]]] = {"a": {("x", (1,))}, "b": {("y", (2,))}}
    other: dict[str, set[tuple[str, tuple[int, ...]]]] = {"a": {("x", (1,))}, "b": {("z", (3,))}}
    assert cross_device_reasons("GPU 0", reference, [("GPU 0", same), ("GPU 1", same)]) == []
    (reason,) = cross_device_reasons("GPU 0", reference, [("GPU 0", same), ("GPU 1", same), ("GPU 1", other)])
    assert reason.startswith("cross-device: GPU 1 answers 1 prompt(s) differently from GPU 0")
    assert "'b'" in reason
    # The compile device's own mismatches are the golden check's business, not a device disagreement.
    assert cross_device_reasons("GPU 0", reference, [("GPU 0", other)]) == []


def test_docker_gets_exactly_the_slots_gpus() -> None:
    pinned = ContainerSpec(name="t", command=("x",), env={}, labels={}, gpus=2, gpu_ids=("GPU-2abc", "GPU-3abc"))
    (request,) = device_requests(pinned)
    assert request["DeviceIDs"] == ["GPU-2abc", "GPU-3abc"] and request["Count"] == 0
    (counted,) = device_requests(ContainerSpec(name="t", command=("x",), env={}, labels={}, gpus=1))
    assert counted["Count"] == 1 and not counted["DeviceIDs"]
    assert device_requests(ContainerSpec(name="t", command=("x",), env={}, labels={}, log_path=Path("/x"))) == []


def test_both_runtimes_present_the_gpus_in_rank_order() -> None:
    """Rank r on the r-th of gpu_ids: the local runtime's CUDA_VISIBLE_DEVICES, and the container's own (Docker hands
    its devices over as a set, which CUDA would enumerate in its own order)."""
    swapped = ContainerSpec(name="t", command=("x",), env={}, labels={}, gpus=2, gpu_ids=("GPU-1abc", "GPU-0abc"))
    assert rank_order_env(swapped) == {"CUDA_VISIBLE_DEVICES": "GPU-1abc,GPU-0abc"}
    environment = DockerRuntime()._create_kwargs(swapped, [])["environment"]
    assert environment["CUDA_VISIBLE_DEVICES"] == "GPU-1abc,GPU-0abc"
    one = ContainerSpec(name="t", command=("x",), env={}, labels={}, gpus=1, gpu_ids=("GPU-1abc",))
    assert "CUDA_VISIBLE_DEVICES" not in DockerRuntime()._create_kwargs(one, [])["environment"]  # no order to keep
    indices = ContainerSpec(name="t", command=("x",), env={}, labels={}, gpus=2, gpu_ids=("1", "0"))
    assert rank_order_env(indices, container=True) == {}  # an index names another GPU inside a container
    assert rank_order_env(indices) == {"CUDA_VISIBLE_DEVICES": "1,0"}
