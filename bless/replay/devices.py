"""Trial slots on the GPUs of one host, and whether a cache answers the same on every device.

A *slot* is the GPU set one engine uses (``hardware.gpu_count`` GPUs, the tensor-parallel
size): ``bless run --parallel N`` runs up to N trials at once, one per slot, and every slot
is a different set of GPUs. Pure logic: the GPU list comes from the caller (nvidia-smi).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bless.core.factors import GpuInfo
from bless.core.profile import HardwareSpec
from bless.errors import InsufficientGpuError

#: One completion as compared across devices: its text and token ids.
Output = tuple[str, tuple[int, ...]]


@dataclass(frozen=True)
class GpuSlot:
    """The GPUs one engine runs on. ``gpus`` is empty on a CPU profile (any number of CPU slots)."""

    index: int
    gpus: tuple[GpuInfo, ...] = ()

    @property
    def device_ids(self) -> tuple[str, ...]:
        """What the runtime hands the engine: UUIDs when known (CUDA's order may differ from nvidia-smi's)."""
        return tuple(gpu.uuid or str(gpu.index) for gpu in self.gpus)

    @property
    def label(self) -> str:
        """``GPU 1 (GPU-8f...)``, ``GPUs 2,3``, or ``cpu``: how tables and messages name the slot."""
        if not self.gpus:
            return "cpu"
        if len(self.gpus) == 1:
            return self.gpus[0].label
        return "GPUs " + ",".join(str(gpu.index) for gpu in self.gpus)

    @property
    def short(self) -> str:
        """``0`` / ``2,3`` / ``cpu``: the compact form for a live table column."""
        return ",".join(str(gpu.index) for gpu in self.gpus) if self.gpus else "cpu"

    def records(self) -> list[dict[str, Any]]:
        """The GPUs as manifest/trial records: index, UUID, name."""
        return [{"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name} for gpu in self.gpus]


def visible_gpus(gpus: Sequence[GpuInfo], cuda_visible_devices: str | None) -> list[GpuInfo]:
    """The GPUs an operator's ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs) leaves to bless; all when unset."""
    if cuda_visible_devices is None:
        return list(gpus)

    def names(gpu: GpuInfo, item: str) -> bool:
        # CUDA takes an index, a full UUID, or a unique UUID prefix ("GPU-8f2c").
        return item == str(gpu.index) or (item.startswith("GPU-") and gpu.uuid.startswith(item))

    chosen: list[GpuInfo] = []
    for item in (part.strip() for part in cuda_visible_devices.split(",")):
        match = next((gpu for gpu in gpus if item and names(gpu, item)), None)
        if match is not None and match not in chosen:
            chosen.append(match)
    return chosen


def trial_slots(
    spec: HardwareSpec, gpus: Sequence[GpuInfo], *, requested: int | None, trials: int
) -> tuple[GpuSlot, ...]:
    """The slots for a run of ``trials`` trials: ``requested`` of them, or as many as the GPUs fit.

    Only GPUs of the first GPU's model and compute capability are used (the hardware factor is
    theirs). Asking for more slots than fit is a refusal (52); more slots than trials are not made.
    CPU profiles get ``requested`` (default 1) slots without GPUs.
    """
    wanted_trials = max(trials, 1)
    if spec.accelerator != "cuda":
        return tuple(GpuSlot(index) for index in range(min(requested or 1, wanted_trials)))
    per_trial = spec.gpu_count or 1
    same = [g for g in gpus if gpus and (g.name, g.compute_capability) == (gpus[0].name, gpus[0].compute_capability)]
    fit = len(same) // per_trial
    if fit < 1:
        raise InsufficientGpuError(
            f"a trial needs {per_trial} GPU(s) (hardware.gpu_count); {len(same)} usable GPU(s) here",
            hint="run on a host with enough GPUs (nvidia-smi lists them; CUDA_VISIBLE_DEVICES may hide some)",
            details={"per_trial": per_trial, "usable_gpus": len(same)},
        )
    count = requested if requested is not None else fit
    if count > fit:
        raise InsufficientGpuError(
            f"--parallel {count} needs {count * per_trial} GPUs ({per_trial} per trial); "
            f"{len(same)} usable {gpus[0].name} GPU(s) here",
            hint=f"run {fit} parallel trials or fewer (the default fits the GPUs present)",
            details={"parallel": count, "per_trial": per_trial, "usable_gpus": len(same), "fit": fit},
            remedy="fewer_parallel",
        )
    count = min(count, wanted_trials)
    return tuple(GpuSlot(i, tuple(same[i * per_trial : (i + 1) * per_trial])) for i in range(count))


def required_free_mib(spec: HardwareSpec) -> float | None:
    """The free memory (MiB) each GPU must have now: ``hardware.min_gpu_memory_gib``; None when no rule applies
    (no CUDA, or no minimum). The one rule for trials (:func:`check_slot_memory`) and serving alike."""
    if spec.accelerator != "cuda" or spec.min_gpu_memory_gib is None:
        return None
    return spec.min_gpu_memory_gib * 1024


def has_free_memory(gpu: GpuInfo, need_mib: float) -> bool:
    """Whether ``gpu`` has ``need_mib`` (from :func:`required_free_mib`) free now."""
    return gpu.memory_free_mib >= need_mib


def check_slot_memory(spec: HardwareSpec, slots: Sequence[GpuSlot], gpus: Sequence[GpuInfo]) -> None:
    """Refuse (52) unless every GPU of every slot has ``hardware.min_gpu_memory_gib`` free now.

    ``gpus`` is a fresh probe (free memory changes); the message names each short GPU by index and UUID.
    """
    need_mib = required_free_mib(spec)
    if need_mib is None:
        return
    now = {gpu.uuid or str(gpu.index): gpu for gpu in gpus}
    short: list[tuple[GpuSlot, GpuInfo]] = []
    for slot in slots:
        for planned in slot.gpus:
            current = now.get(planned.uuid or str(planned.index), planned)
            if not has_free_memory(current, need_mib):
                short.append((slot, current))
    if not short:
        return
    listed = "; ".join(
        f"{gpu.label} (slot {slot.index}): {gpu.memory_free_mib / 1024:.1f} GiB free of "
        f"{gpu.memory_total_mib / 1024:.1f}"
        for slot, gpu in short
    )
    raise InsufficientGpuError(
        f"each trial GPU needs {spec.min_gpu_memory_gib:g} GiB free (hardware.min_gpu_memory_gib): {listed}",
        hint="stop what uses that GPU (nvidia-smi shows the processes), or run fewer parallel trials",
        remedy="fewer_parallel_for_memory",
        details={
            "min_gpu_memory_gib": spec.min_gpu_memory_gib,
            "short": [
                {"slot": slot.index, "index": gpu.index, "uuid": gpu.uuid, "free_mib": gpu.memory_free_mib}
                for slot, gpu in short
            ],
        },
    )


def cross_device_reasons(
    reference_label: str,
    reference: Mapping[str, Output],
    observed: Sequence[tuple[str, Mapping[str, set[Output]]]],
) -> list[str]:
    """Why the cache answers differently on some device than where it was compiled (empty: it agrees).

    ``reference`` is the bootstrap's output per prompt on ``reference_label``'s device; ``observed``
    is, per trial, its device label and every distinct output it saw per prompt. Serving hosts
    start a blessed cache on any of their GPUs: one that answers otherwise on GPU 1 than on GPU 0
    would fail there, even when each trial alone looks coherent.
    """
    by_device: dict[str, dict[str, set[Output]]] = {}
    for label, outputs in observed:
        merged = by_device.setdefault(label, {})
        for prompt, seen in outputs.items():
            merged.setdefault(prompt, set()).update(seen)
    reasons: list[str] = []
    for label, prompts in sorted(by_device.items()):
        if label == reference_label:
            continue
        differing = sorted(p for p, seen in prompts.items() if p in reference and seen != {reference[p]})
        if differing:
            reasons.append(
                f"cross-device: {label} answers {len(differing)} prompt(s) differently from {reference_label}, "
                f"where the cache was compiled (first: {differing[0]!r}); a cache whose output depends on the "
                "GPU would fail on a serving host"
            )
    return reasons
