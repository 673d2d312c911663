"""What Megatron-Core's 1F1B A2A overlap leaves exposed, layer by layer: each all-to-all hides only behind the compute
it is paired with, not behind the whole step.

Under --overlap-moe-expert-parallel-comm one micro-batch's forward and another's backward run together, one layer
of each at a time, on a compute and a communication stream (Megatron-LM megatron/core/models/common/
model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run, @ d98e8a64):

    comm stream:  combine_bwd        | dispatch_fwd -> dispatch_bwd          | combine_fwd
    comp stream:  pre_dispatch_fwd   | mlp_bwd -> mlp_bwd_dw -> mlp_fwd      | pre_dispatch_bwd

with the data dependencies of the two passes: mlp_bwd needs combine_bwd's gradient, dispatch_fwd the router's output
(pre_dispatch_fwd), dispatch_bwd mlp_bwd's input gradient, mlp_fwd the dispatched tokens, combine_fwd mlp_fwd's
output and pre_dispatch_bwd dispatch_bwd's gradient. With a the time of one all-to-all of the layer (its four move
the same bytes: dispatch and combine, forward and backward adjoints) and pf, mf, mbd, mbw, pb the compute of
pre_dispatch_fwd (attention, router, shared experts), mlp_fwd (the routed experts), mlp_bwd's input gradients, its
weight gradients and pre_dispatch_bwd (with its weight gradients), the pair of layers takes

    L(a) = max(a, pf) + max(max(a, mbd) + a, max(mbd + mbw, a) + mf) + max(a, pb)

(the two streams' critical path: t1 = max(a, pf) when both dispatch_fwd and mlp_bwd can start; dispatch_bwd ends at
t1 + max(a, mbd) + a, mlp_fwd at t1 + max(mbd + mbw, a) + mf; combine_fwd and pre_dispatch_bwd start after both), so
the pair's exposed communication is L(a) - (pf + mf + mbd + mbw + pb) >= 0: 0 where every all-to-all is shorter than
its partner, 4a - compute where the all-to-alls are longer than everything.

That is with --delay-wgrad-compute (training.delay_wgrad_compute), which Megatron-Bridge's performance scripts set
with the overlap (scripts/performance/utils/overrides.py _set_moe_a2a_overlap_overrides). Without it (Megatron's
default) mlp_bwd_dw is a no-op and mlp_bwd computes the weight gradients with the input gradients before returning
(megatron/core/models/gpt/fine_grained_callables.py TransformerLayerNode.backward_dw @ 2edffadb), so dispatch_bwd
starts after both: the same L with the weight gradients counted in mbd and mbw = 0,

    L(a) = max(a, pf) + max(a, mbd + mbw) + max(a, mf) + max(a, pb)   (`segments` with delayed false).

A step's recipe (simdist.plan.recipe) runs its all-to-alls beside its own compute, max(compute, all-to-alls); the
exposure above is added to the step's tax piece (simdist.plan.interference) on top, split between the pair's forward
and backward in proportion to their compute, and priced once its all-to-alls are (both fidelities).
# Assumption: a chunk's MoE layers are alike (their per-layer means are used), and a = the step's priced all-to-all
# time / (2 x its MoE layers); the combine's unpermutation and residual add (on the comm stream in Megatron) count
# with pre_dispatch; dense layers and the chunk's other compute have no partner all-to-all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["MLP_PREFIXES", "exposure_s", "pair_time_s", "scaled", "segments", "step_pairing"]

MLP_PREFIXES = ("expert_", "moe_sort_chunks", "moe_unsort_chunks")
"""Kernel names (and their ``_grad`` variants) of Megatron's ``mlp`` node, between dispatch and combine: the routed
experts' grouped GEMMs and activation, and the dispatcher's local sort (megatron/core/models/gpt/
fine_grained_callables.py submodule_moe_forward: post dispatch -> experts -> combine preprocess)."""


def segments(parts: Iterable[tuple[object, int]], time_s: Callable[[list], float],
             delayed: bool = True) -> tuple[float, ...]:
    """(pf, mf, mbd, mbw, pb, n): the per-layer means of the five compute segments over the MoE layers of ``parts``
    ((Work, count), simdist.plan.chunk_cost.chunk_parts), and n their number; () without MoE layers. ``time_s``:
    seconds of a list of kernels on the chunk's GPU. ``delayed`` false (no --delay-wgrad-compute): the weight
    gradients are part of mlp_bwd, so mbd holds them and mbw is 0 (module doc)."""
    sums = [0.0] * 5
    layers = 0
    for w, n in parts:
        forward, backward = w.forward, w.backward  # type: ignore[attr-defined]
        if not any(k.name.startswith("expert_") for k in forward):
            continue
        mlp_f = [k for k in forward if k.name.startswith(MLP_PREFIXES)]
        mlp_b = [k for k in backward if k.name.startswith(MLP_PREFIXES)]
        dw = [k for k in mlp_b if k.name.endswith("_weight_grad")]
        pf = time_s([k for k in forward if not k.name.startswith(MLP_PREFIXES)])
        pb = time_s([k for k in backward if not k.name.startswith(MLP_PREFIXES)])
        mf, mbw = time_s(mlp_f), time_s(dw) if delayed else 0.0
        mbd = time_s(mlp_b) - mbw
        for i, t in enumerate((pf, mf, mbd, mbw, pb)):
            sums[i] += t * n
        layers += n
    if not layers:
        return ()
    return (*(s / layers for s in sums), float(layers))


def pair_time_s(a: float, pf: float, mf: float, mbd: float, mbw: float, pb: float) -> float:
    """L(a): one forward layer and one backward layer run together (module doc)."""
    return max(a, pf) + max(max(a, mbd) + a, max(mbd + mbw, a) + mf) + max(a, pb)


def step_pairing(seg: tuple[float, ...], kind: str) -> tuple[float, ...]:
    """The pairing a ``kind`` ("F" or "B") step's tax piece carries: the segments and the step's share of the pair's
    exposure, its compute's share of the pair's; () without MoE layers."""
    if not seg:
        return ()
    pf, mf, mbd, mbw, pb, _ = seg
    forward, backward = pf + mf, mbd + mbw + pb
    if forward + backward <= 0:
        return ()
    return (*seg, (forward if kind == "F" else backward) / (forward + backward))


def scaled(pairing: tuple[float, ...], factor: float) -> tuple[float, ...]:
    """``pairing`` on a GPU whose compute takes ``factor`` x as long (a straggler: simdist.plan.step_config)."""
    if not pairing or factor == 1.0:
        return pairing
    return (*(t * factor for t in pairing[:5]), *pairing[5:])


def exposure_s(comm_s: float, pairing: tuple[float, ...]) -> float:
    """Seconds a step's compute waits for its paired all-to-alls, given their priced time ``comm_s`` (all of the
    step's, 2 per MoE layer): its share of n x (L(a) - compute)."""
    if not pairing or comm_s <= 0:
        return 0.0
    pf, mf, mbd, mbw, pb, n, share = pairing
    a = comm_s / (2.0 * n)
    return share * n * max(0.0, pair_time_s(a, pf, mf, mbd, mbw, pb) - (pf + mf + mbd + mbw + pb))
