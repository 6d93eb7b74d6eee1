"""What the fused-MoE kernel of each rank of one engine sees: experts, top-k, N per rank, hidden size.

One engine's ranks run the same step, so one request of a token count drives every rank; what differs is the
shape each rank's kernel sees (vLLM 0.26 and 0.33 ``FusedMoEParallelConfig.make``, ``determine_expert_map``;
the lines are cited in :mod:`bless.engines.vllm.coverage_rules`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bless.engines.vllm.coverage.base import MOE_FIELDS, extra_flag


@dataclass(frozen=True)
class MoeShape:
    """What the fused-MoE kernel of one rank sees: experts, top-k, N per rank, hidden size K.

    ``experts`` is the rank's own expert count (the tuned file's E and the default rule's); with expert parallelism
    ``global_experts`` is the model's (``moe_align_block_size`` pads for every expert of the model) and the expert
    map rules out the naive block assignment.
    """

    experts: int
    top_k: int
    n_per_rank: int
    hidden: int
    global_experts: int | None = None

    @property
    def expert_map(self) -> bool:
        """Whether the rank holds a part of the experts only (vLLM passes an expert map)."""
        return self.global_experts is not None

    @property
    def padded_experts(self) -> int:
        """The expert count ``moe_align_block_size`` pads for: the model's."""
        return self.global_experts if self.global_experts is not None else self.experts


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _parallel_size(serve: Mapping[str, Any], key: str, flags: tuple[str, ...]) -> int | None:
    """A parallel size of the serve arguments (the key, else its flag in extra_args; 1 when unset), None if bad."""
    value: Any = serve.get(key)
    if value is None:
        value = next((v for v in (extra_flag(serve, flag) for flag in flags) if v is not None), None)
    if value is None:
        return 1
    try:
        size = int(value)
    except (TypeError, ValueError):
        return None
    return size if size > 0 and not isinstance(value, bool) else None


def _switch(serve: Mapping[str, Any], key: str, flags: tuple[str, ...]) -> bool:
    """A boolean serve argument, set as the key or as a bare flag in extra_args."""
    return serve.get(key) is True or any(extra_flag(serve, flag) == "" for flag in flags)


def moe_rank_shapes(config: Mapping[str, Any], serve: Mapping[str, Any]) -> tuple[tuple[MoeShape, ...], str]:
    """The distinct fused-MoE shapes the ranks of one engine see, or () and why they are not modeled.

    vLLM 0.26 (``FusedMoEParallelConfig.make``, ``determine_expert_map``): without expert parallelism every rank
    holds every expert and N / tensor_parallel_size of each; with ``enable_expert_parallel`` (one engine, no data
    parallelism) the MoE layer's tensor parallelism becomes expert parallelism of the same size: N whole, and rank r
    of EP holds E // EP experts, one more for the first E % EP ranks. Data parallelism (all-to-all kernels in the
    batched format) and EPLB's redundant experts are not modeled.
    """
    architectures = config.get("architectures") or []
    fields = next((MOE_FIELDS[a] for a in architectures if a in MOE_FIELDS), None)
    if fields is None:
        return (), f"no MoE field layout known for {', '.join(map(str, architectures)) or 'this model'}"
    experts, top_k, intermediate = (config.get(name) for name in fields)
    hidden = config.get("hidden_size")
    if not all(_positive(v) for v in (experts, top_k, intermediate, hidden)):
        return (), f"config.json lacks positive integers for {', '.join(fields)}, hidden_size"
    assert isinstance(experts, int) and isinstance(top_k, int) and isinstance(intermediate, int)
    assert isinstance(hidden, int)
    tensor_parallel = _parallel_size(serve, "tensor_parallel_size", ("--tensor-parallel-size", "-tp"))
    data_parallel = _parallel_size(serve, "data_parallel_size", ("--data-parallel-size", "-dp"))
    if tensor_parallel is None or data_parallel is None:
        return (), "serve.tensor_parallel_size and serve.data_parallel_size must be positive integers"
    if data_parallel > 1:
        return (), f"data_parallel_size {data_parallel}: MoE over data-parallel ranks (all-to-all) is not modeled"
    if _switch(serve, "enable_eplb", ("--enable-eplb",)):
        return (), "EPLB's redundant experts change each rank's expert count at run time: not modeled"
    if _switch(serve, "enable_expert_parallel", ("--enable-expert-parallel", "-ep")) and tensor_parallel > 1:
        if experts < tensor_parallel:
            return (), f"{experts} experts do not spread over expert_parallel_size {tensor_parallel}"
        base, remainder = divmod(experts, tensor_parallel)
        counts = sorted({base + 1, base} if remainder else {base})
        return tuple(MoeShape(count, top_k, intermediate, hidden, global_experts=experts) for count in counts), ""
    if intermediate % tensor_parallel:
        return (), f"{fields[2]} {intermediate} does not split over tensor_parallel_size {tensor_parallel}"
    return (MoeShape(experts, top_k, intermediate // tensor_parallel, hidden),), ""
