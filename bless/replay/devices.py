"""Trial slots on the GPUs of one host, the GPUs a served engine is bound to, and whether a cache answers
the same on every device.

A *slot* is the GPU set one engine uses (``hardware.gpu_count`` GPUs, the tensor-parallel
size): ``bless run --parallel N`` runs up to N trials at once, one per slot, and every slot
is a different set of GPUs. Pure logic: the GPU list comes from the caller (nvidia-smi).

Ranks: a slot's GPUs are in rank order. The runtime presents them to the engine in that order
(``CUDA_VISIBLE_DEVICES`` set to their UUIDs, which CUDA enumerates in the order listed), and the
engine puts local rank r on ``cuda:r``: rank r runs on the slot's r-th GPU (:class:`GpuRank`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bless.core.factors import GpuInfo
from bless.core.profile import HardwareSpec
from bless.errors import GpuSelectionError, HardwareMismatchError, InsufficientGpuError

#: One completion as compared across devices: its text and token ids.
Output = tuple[str, tuple[int, ...]]


@dataclass(frozen=True)
class GpuRank:
    """Which physical GPU one rank of an engine runs on: rank ``rank`` is the engine's ``cuda:<rank>``.

    ``index`` is nvidia-smi's (PCI order), ``uuid`` names the GPU for good, ``name`` is its product.
    """

    rank: int
    index: int
    uuid: str
    name: str

    @property
    def line(self) -> str:
        """``rank 1 -> GPU 0 (GPU-91f9...)``: how serve-full's output names the binding, one line per rank."""
        return f"rank {self.rank} -> GPU {self.index}" + (f" ({self.uuid})" if self.uuid else "")

    def to_dict(self) -> dict[str, Any]:
        """``{"rank", "index", "uuid", "name"}``: the form of the serve plan's and readiness record's ``ranks``."""
        return {"rank": self.rank, "index": self.index, "uuid": self.uuid, "name": self.name}

    @classmethod
    def from_dict(cls, data: Any) -> GpuRank:
        """Read one back; a malformed one is a ValueError."""
        if not isinstance(data, Mapping):
            raise ValueError("a rank is not an object")
        rank, index, uuid, name = (data.get(key) for key in ("rank", "index", "uuid", "name"))
        if not (isinstance(rank, int) and isinstance(index, int) and isinstance(uuid, str) and isinstance(name, str)):
            raise ValueError("a rank is not {rank, index, uuid, name} with counts and strings")
        if not (_count(rank) and _count(index)):
            raise ValueError("a rank's rank and index are counts")
        return cls(rank=rank, index=index, uuid=uuid, name=name)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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

    @property
    def ranks(self) -> tuple[GpuRank, ...]:
        """The slot's GPUs as ranks: rank r runs on the r-th GPU (the order :attr:`device_ids` hands them over)."""
        return tuple(GpuRank(rank, gpu.index, gpu.uuid, gpu.name) for rank, gpu in enumerate(self.gpus))

    def records(self) -> list[dict[str, Any]]:
        """The GPUs as manifest/trial records, in rank order: rank, index, UUID, name."""
        return [rank.to_dict() for rank in self.ranks]


def visible_gpus(gpus: Sequence[GpuInfo], cuda_visible_devices: str | None) -> list[GpuInfo]:
    """The GPUs an operator's ``CUDA_VISIBLE_DEVICES`` leaves to bless, in its order; all when unset.

    Each entry is an nvidia-smi index, a full UUID, or a unique UUID prefix (``GPU-8f2c``), as CUDA takes
    them; an empty value leaves none. An entry that names no GPU of this host (a typo, a GPU of another
    host), names several (an ambiguous prefix) or names a GPU already named is refused (53): CUDA would stop
    at it or read it otherwise, and silently skipping it shifts every later GPU to another rank.
    """
    if cuda_visible_devices is None:
        return list(gpus)
    if not cuda_visible_devices.strip():
        return []

    def names(gpu: GpuInfo, item: str) -> bool:
        return item == str(gpu.index) or (item.startswith("GPU-") and gpu.uuid.startswith(item))

    known = ", ".join(f"{gpu.index} ({gpu.uuid})" if gpu.uuid else str(gpu.index) for gpu in gpus) or "none"
    chosen: list[GpuInfo] = []
    for position, item in enumerate(part.strip() for part in cuda_visible_devices.split(",")):
        matches = [gpu for gpu in gpus if item and names(gpu, item)]
        problem = None
        if len(matches) != 1:
            problem = "names no GPU of this host" if not matches else f"names {len(matches)} GPUs (an ambiguous prefix)"
        elif matches[0] in chosen:
            problem = f"names GPU {matches[0].index} again"
        if problem is not None:
            raise GpuSelectionError(
                f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}: entry {position} ({item!r}) {problem}; "
                f"this host's GPUs (nvidia-smi): {known}",
                hint="set CUDA_VISIBLE_DEVICES to distinct nvidia-smi indices or GPU UUIDs (or prefixes) of this "
                "host, in the order the engine's ranks should use them, or unset it to use the GPUs in nvidia-smi's "
                "order",
                details={
                    "cuda_visible_devices": cuda_visible_devices,
                    "entry": position,
                    "item": item,
                    "gpus": [{"index": gpu.index, "uuid": gpu.uuid} for gpu in gpus],
                },
            )
        chosen.append(matches[0])
    return chosen


def serving_slot(spec: HardwareSpec, gpus: Sequence[GpuInfo], cuda_visible_devices: str | None) -> GpuSlot:
    """The GPUs one served engine runs on, in rank order (rank r on the r-th); no GPUs for a CPU profile.

    ``gpus``: the host's GPUs as nvidia-smi lists them; ``cuda_visible_devices``: the operator's selection and
    order of them (None: nvidia-smi's order). The first ``hardware.gpu_count`` of what it leaves are bound.
    A blessing records logical ranks, so any GPUs of the declared product serve it, in any order. Refused:
    an entry naming no GPU or one twice (53, :func:`visible_gpus`), fewer GPUs left than the count (52), bound
    GPUs of mixed products, or of another product or compute capability than ``[hardware]`` declares (32).
    """
    if spec.accelerator != "cuda":
        return GpuSlot(0)
    count = spec.gpu_count or 1
    left = visible_gpus(gpus, cuda_visible_devices)
    restricted = "" if cuda_visible_devices is None else f" (CUDA_VISIBLE_DEVICES={cuda_visible_devices!r})"
    if len(left) < count:
        raise InsufficientGpuError(
            f"the profile needs {count} GPU(s) (hardware.gpu_count); {len(left)} here{restricted}",
            hint="run on a host with enough GPUs (nvidia-smi lists them), or let CUDA_VISIBLE_DEVICES name enough",
            details={"needed_gpus": count, "found_gpus": len(left), "cuda_visible_devices": cuda_visible_devices},
        )
    slot = GpuSlot(0, tuple(left[:count]))
    listed = "; ".join(
        f"rank {rank}: GPU {gpu.index} {gpu.name} (compute capability {gpu.compute_capability})"
        for rank, gpu in enumerate(slot.gpus)
    )
    details = {"ranks": slot.records(), "cuda_visible_devices": cuda_visible_devices}
    if len({(gpu.name, gpu.compute_capability) for gpu in slot.gpus}) > 1:
        raise HardwareMismatchError(
            f"the {count} GPUs the engine would run on{restricted} are of mixed products: {listed}",
            hint="let CUDA_VISIBLE_DEVICES name GPUs of one product (the profile's hardware.gpu_name)",
            details=details,
        )
    first = slot.gpus[0]
    for key, declared, found in (
        ("gpu_name", spec.gpu_name, first.name),
        ("compute_capability", spec.compute_capability, first.compute_capability),
    ):
        if declared is not None and declared != found:
            raise HardwareMismatchError(
                f"the profile declares hardware.{key}={declared!r}; the GPUs the engine would run on{restricted} "
                f"are not: {listed}",
                hint="let CUDA_VISIBLE_DEVICES name GPUs of the declared product, or serve on matching hardware",
                details={**details, "key": key, "declared": declared, "found": found},
            )
    return slot


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
