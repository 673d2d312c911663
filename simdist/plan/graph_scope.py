"""Megatron-Core's partial CUDA graphs: which of a layer's kernels Transformer Engine replays from a graph, and what a
replay costs instead of launching them one by one.

Megatron-Core with ``--cuda-graph-impl transformer_engine`` captures each layer's parts named by
``--cuda-graph-scope`` with Transformer Engine's make_graphed_callables, per layer and micro-batch, forward and
backward (megatron/core/transformer/transformer_layer.py ``_get_submodules_under_cudagraphs``,
``_te_cuda_graph_capture``; enums.py CudaGraphScope @ 2edffadb):

    scope            captured                                                         simdist's kernel tag
    attn             input norm, self-attention, its bias-dropout-add (residual)      attn
    mlp              a dense layer's pre-MLP norm, MLP and residual                   mlp
    moe              a drop-and-pad MoE layer's pre-MLP norm, whole MoE block         moe_router, moe_experts
    moe_router       the pre-MLP norm, the router, unoverlapped shared experts         moe_router
    moe_preprocess   the token dispatcher's metadata up to its device-to-host copy    (no kernels simdist prices)

Megatron-LM's own rules, kept (transformer_config.py __post_init__): ``moe_preprocess`` only with ``moe_router``;
``moe`` not with ``moe_router``; ``moe`` only for drop-and-pad layers (a capacity factor with padding: a dropless
layer's expert part has shapes the host learns at run time); MoE scopes only for a model with experts. ``full`` (the
whole layer) and ``full_iteration`` (Megatron's local implementation) replay every kernel: training.cuda_graphs.

A layer's captured parts are one graph (``_te_cuda_graph_capture`` runs the attention half and the captured MLP part
in one capture), replayed once a layer and direction: simdist replays each stretch of captured kernels once. A
replay costs the host one call (its graphed callable: the dispatch and the graph's launch, ``op_s``)
instead of a dispatch and launch per kernel, and its kernels the graph's smaller gap between them
(ComputeEfficiency.graph_launch_overhead_s). Before each replay, forward and backward, Transformer Engine copies the
replay's input (the hidden states; in backward the output's gradient) into the graph's static buffer, an eager copy
kernel (transformer_engine/pytorch/graph.py, Graphed.forward / backward: ``static_input_surface[i].copy_(...)`` where
the pointers differ, as a new micro-batch's do).
# Assumption: one copy of the layer's hidden states per replay and direction (the static inputs besides them are the
# parameters, which keep their pointers); recomputed kernels run eagerly (outside the replayed graphs); the
# synchronization of a dropless MoE layer stays (Megatron-Core's partial graphs stop at it).
"""

from __future__ import annotations

from collections.abc import Sequence

from simdist.errors import SpecError

__all__ = ["TAGS", "check_graph_scope", "graph_tags", "replayed", "replayed_run", "stretches",
           "whole_step"]

TAGS = {"attn": ("attn",), "mlp": ("mlp",), "moe": ("moe_router", "moe_experts"), "moe_router": ("moe_router",),
        "moe_preprocess": ()}
"""The kernel tags (simdist.plan.kernel_work.Work.forward_scopes) each scope replays."""


def graph_tags(scopes: Sequence[str] | None) -> frozenset[str]:
    """The kernel tags ``scopes`` replay (empty: none; full / full_iteration are training.cuda_graphs, not tags)."""
    return frozenset(tag for scope in scopes or () for tag in TAGS.get(scope, ()))


def whole_step(scopes: Sequence[str] | None) -> bool:
    """Whether ``scopes`` names the whole layer or iteration (every kernel replayed, as training.cuda_graphs)."""
    return bool(scopes) and any(s in ("full", "full_iteration") for s in scopes)


def check_graph_scope(scopes: Sequence[str] | None, *, has_experts: bool, drop_and_pad: bool) -> None:
    """Megatron-LM's rules for ``scopes`` (the module docstring), one line each (exit 2); ``drop_and_pad``: the layer
    has a capacity factor (simdist prices a capacity-limited layer at its capacity, padded)."""
    if not scopes:
        return
    field = "training.cuda_graph_scope"
    s = set(scopes)
    if s & {"full", "full_iteration"} and len(s) > 1:
        raise SpecError(f"cuda_graph_scope {sorted(s)}: full and full_iteration replay every kernel, no other scope "
                        "goes with them", field=field, fix="keep full alone, or list the parts")
    if "moe_preprocess" in s and "moe_router" not in s:
        raise SpecError("cuda_graph_scope moe_preprocess is captured with the router (Megatron-LM: 'moe_preprocess "
                        "cuda graph is only supported with moe_router cuda graph')", field=field,
                        fix="add moe_router")
    if {"moe", "moe_router"} <= s:
        raise SpecError("cuda_graph_scope moe captures the router already: it does not go with moe_router",
                        field=field, fix="keep one of moe and moe_router")
    if s & {"moe", "moe_router", "moe_preprocess"} and not has_experts:
        raise SpecError(f"cuda_graph_scope {sorted(s & {'moe', 'moe_router', 'moe_preprocess'})} on a model without "
                        "experts", field=field, fix="use attn and mlp")
    if "moe" in s and not drop_and_pad:
        raise SpecError("cuda_graph_scope moe replays a whole MoE block, which needs fixed shapes: drop-and-pad, a "
                        "capacity per expert (Megatron-LM --moe-expert-capacity-factor with "
                        "--moe-pad-expert-input-to-capacity)", field=field,
                        fix="set training.moe_expert_capacity_factor, or use moe_router (and moe_preprocess)")


def replayed(work: object, phase: str, tags: frozenset[str]) -> tuple[bool, ...]:
    """Whether each of ``work``'s ``phase`` kernels is replayed from a graph under the scopes' ``tags``; () where none
    is (no scopes, no tags, or the recompute: its kernels run eagerly)."""
    scopes = (getattr(work, "forward_scopes", ()) if phase == "forward"
              else getattr(work, "backward_scopes", ()) if phase == "backward" else ())
    if not tags or not scopes:
        return ()
    flags = tuple(tag in tags for tag in scopes)
    return flags if any(flags) else ()


def stretches(flags: Sequence[bool]) -> int:
    """How many replays ``flags`` make: maximal stretches of replayed kernels."""
    return sum(1 for i, hit in enumerate(flags) if hit and (i == 0 or not flags[i - 1]))


def replayed_run(kernel_s: Sequence[float], issue_s: Sequence[float], hits: Sequence[bool],
                 graphed_kernel_s: Sequence[float], call_s: float, copy_s: float, copy_issue_s: float
                 ) -> tuple[list[float], list[float]]:
    """(GPU seconds, host issue seconds) of a run of kernels, some replayed from a graph (``hits``): those take their
    ``graphed_kernel_s`` and no issue time of their own; each maximal replayed stretch starts with the copy of its
    input (``copy_s`` on the GPU, ``copy_issue_s`` on the host) and the call that replays it (``call_s`` on the
    host). Eager kernels keep ``kernel_s`` and ``issue_s``."""
    gpu, host = [], []
    for i, (eager_s, issue, graphed_s, hit) in enumerate(zip(kernel_s, issue_s, graphed_kernel_s, hits,
                                                              strict=True)):
        if not hit:
            gpu.append(eager_s)
            host.append(issue)
        elif i == 0 or not hits[i - 1]:
            gpu.append(copy_s + graphed_s)
            host.append(copy_issue_s + call_s)
        else:
            gpu.append(graphed_s)
            host.append(0.0)
    return gpu, host
