"""How a step's mixture-of-experts layers are laid out and routed: the expert-parallel group and its dispatcher
(`ExpertParallel`, the step's ep / etp / moe_* settings), the layout rules an MoE layer's cost relies on
(`check_experts`), and the token counts one MoE layer moves and computes on one GPU (`routed_tokens`,
`expected_destination_ranks`). simdist.plan.moe_cost builds the layer's kernels and collectives from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simdist.errors import LayoutError, SpecError
from simdist.plan.kernel_work import LayerShape
from simdist.plan.model import Model
from simdist.plan.moe_padding import align_rows, router_pads

__all__ = ["DISPATCHERS", "ExpertParallel", "RoutedTokens", "check_experts", "expected_destination_ranks",
           "routed_tokens"]

DISPATCHERS = ("alltoall", "allgather", "flex")
"""Megatron-LM --moe-token-dispatcher-type."""


@dataclass(frozen=True, slots=True)
class ExpertParallel:
    """How a step's MoE layers run (simdist.plan.step_config.StepConfig.expert_parallel, from the scenario's
    parallel.ep / etp and training.moe_* fields)."""

    ep: int = 1
    etp: int = 1
    dispatcher: str = "alltoall"
    imbalance: float = 1.0
    capacity_factor: float | None = None
    grouped_gemm: bool = True
    domains: int = 1
    """NVLink domains the expert-parallel group spans (its ranks on that many nodes of NVLink-connected GPUs): where
    more than one, the flex dispatcher sends a token once per destination domain over the network."""
    kernel: str = "nccl"
    """What moves the all_to_alls: nccl (alltoall dispatcher), or the flex dispatcher's deepep / hybridep kernels
    (simdist.collectives.ep_kernels prices their share of NVLink)."""
    router_dtype: str | None = None
    """The router's logits and probabilities: fp32 | fp64 (training.moe_router_dtype); None: the hidden states'."""
    padding_for_quantization: bool = False
    """Under FP8 the router pads each expert's token count to the GEMMs' alignment (training.
    moe_router_padding_for_quantization; simdist.plan.moe_padding)."""
    router_fusion: bool = False
    """The router's top-k and auxiliary loss as Transformer Engine's fused kernels (training.moe_router_fusion;
    simdist.plan.moe_router)."""

    def prob_bytes(self, bpe: int) -> int:
        """Bytes of a routed row's probability, ``bpe`` those of the hidden states: Megatron-Core's TopKRouter.gating
        computes the logits in moe_router_dtype or the input's dtype, and the probabilities keep it (moe_utils.py
        topk_routing_with_score_function: ``.type_as(logits)``; Transformer Engine's fused router: the logits'
        dtype)."""
        return {"fp32": 4, "fp64": 8}.get(self.router_dtype or "", bpe)

    @property
    def busiest_share(self) -> float:
        """The busiest rank's routed tokens / a balanced rank's: min(imbalance, capacity factor)."""
        cap = math.inf if self.capacity_factor is None else self.capacity_factor
        return min(self.imbalance, cap)

    @property
    def kept_share(self) -> float:
        """Of a rank's own routed tokens, the share a balanced routing keeps: min(1, capacity factor)."""
        cap = math.inf if self.capacity_factor is None else self.capacity_factor
        return min(1.0, cap)

    @property
    def a2a_imbalance(self) -> float:
        """The busiest peer's all-to-all receive bytes / the mean peer's (CommWork.imbalance)."""
        return self.busiest_share / self.kept_share


@dataclass(frozen=True, slots=True)
class RoutedTokens:
    """Token counts of one MoE layer on one GPU for one micro-batch."""

    local: int
    """T: tokens this GPU routes (its TP peer's own tokens under sequence parallelism)."""
    num_local_experts: int
    balanced: float
    """Rows a balanced expert rank's experts process, before drops: T x topk x etp (after the expert-TP gather)."""
    per_expert: int
    """Rows each local expert of the busiest rank processes: ceil(balanced x busiest_share / num_local_experts)."""
    sent: float
    """Rows this GPU sends in the dispatch all-to-all: T x topk x kept_share (alltoall), T x D x kept_share (flex)."""

    @property
    def busiest(self) -> int:
        """Rows the busiest rank's experts process."""
        return self.per_expert * self.num_local_experts


def expected_destination_ranks(num_experts: int, topk: int, ep: int) -> float:
    """Distinct expert-parallel ranks among a token's topk experts, expected under uniform routing: topk experts
    drawn without replacement from num_experts, num_experts / ep on each rank, so a rank is missed with probability
    C(E - E/ep, k) / C(E, k), and D = ep (1 - that).

    # Assumption: uniform routing, without DeepSeek-V3's node-limited routing (at most M nodes per token, sec. 2.1.2),
    # which would lower D further on multi-node ep groups.
    """
    per_rank = num_experts // ep
    if topk > num_experts - per_rank:
        return float(ep)
    miss = math.comb(num_experts - per_rank, topk) / math.comb(num_experts, topk)
    return ep * (1.0 - miss)


def check_experts(model: Model, *, tp: int, sequence_parallel: bool, experts: ExpertParallel) -> None:
    """The layout rules an MoE layer's cost relies on (one clear line each; simdist.plan.layout.check_layout can call
    this so that search prunes what the cost would refuse)."""
    if experts.dispatcher not in DISPATCHERS:
        raise SpecError(f"unknown MoE token dispatcher {experts.dispatcher!r}",
                        field="training.moe_token_dispatcher_type", fix=f"write one of {', '.join(DISPATCHERS)}")
    if experts.ep < 1 or experts.etp < 1:
        raise LayoutError("ep and etp must be positive", field="parallel.ep", fix="use 1 or more")
    if model.num_experts % experts.ep:
        raise LayoutError(f"ep {experts.ep} does not divide num_experts {model.num_experts}", field="parallel.ep",
                          fix="choose an ep that divides the expert count")
    if model.moe_ffn_hidden_size % experts.etp:
        raise LayoutError(f"etp {experts.etp} does not divide moe_ffn_hidden_size {model.moe_ffn_hidden_size}",
                          field="parallel.etp", fix="choose an etp that divides the expert FFN width")
    if model.moe_shared_expert_intermediate_size % tp:
        raise LayoutError(f"tp {tp} does not divide moe_shared_expert_intermediate_size "
                          f"{model.moe_shared_expert_intermediate_size}", field="parallel.tp",
                          fix="choose a tp that divides the shared experts' width")
    if tp > 1 and not sequence_parallel:
        # Megatron-Core MoELayer.forward raises in training when tp > 1 without sequence parallelism.
        raise LayoutError("an MoE model with tp > 1 trains with sequence parallelism (Megatron-Core MoELayer)",
                          field="parallel.sequence_parallel", fix="set parallel.sequence_parallel: true, or tp 1")
    if experts.dispatcher == "flex" and (experts.domains < 1 or experts.ep % experts.domains):
        raise LayoutError(f"the expert-parallel group of {experts.ep} spreads unevenly over {experts.domains} NVLink "
                          "domains (DeepEP's internode kernels take the same number of ranks in each)",
                          field="parallel.ep", fix="choose an ep that fills whole nodes, or one inside a node")
    if experts.dispatcher == "flex" and experts.etp > 1:
        raise SpecError("the flex (DeepEP) dispatcher is modelled with etp 1 only",
                        field="training.moe_token_dispatcher_type", fix="use etp 1, or the alltoall dispatcher")


def routed_tokens(model: Model, shape: LayerShape, experts: ExpertParallel) -> RoutedTokens:
    """The token counts of one MoE layer (RoutedTokens).

    # Assumption: the busiest rank's rows are spread evenly over its local experts (one per-expert GEMM size);
    # routing skew inside a rank would make its grouped GEMM's largest expert slower still.

    Under FP8 grouped experts each local expert's rows are padded to the GEMMs' alignment (simdist.plan.moe_padding):
    (align - 1) / 2 rows more on average, or, padded in the router, ep x etp times that, and each rank sends
    num_experts x (align - 1) / 2 rows more. Balanced rows (model FLOPs) do not count the padding.
    """
    t = shape.local_tokens
    k = model.moe_router_topk
    num_local = model.num_experts // experts.ep
    balanced = float(t * k * experts.etp)
    half = (align_rows(shape.recipe) - 1) / 2.0 if experts.grouped_gemm else 0.0
    in_router = router_pads(shape.recipe, experts)
    pad = half * experts.ep * experts.etp if in_router else half
    per_expert = max(1, math.ceil(balanced * experts.busiest_share / num_local + pad - 1e-9))
    rows = expected_destination_ranks(model.num_experts, k, experts.ep) if experts.dispatcher == "flex" else k
    sent = t * rows * experts.kept_share + (model.num_experts * half if in_router else 0.0)
    return RoutedTokens(t, num_local, balanced, per_expert, sent)
