"""Where a tensor-parallel module's input changes layout: how many collectives a framework's TP plan issues around a
module's column-parallel projections (training.tp_input_layouts).

Between two modules the activations are sequence-sharded (sequence parallelism) or replicated; a column-parallel
projection needs its whole input. Megatron-LM gathers it once per module (its column-parallel region: one all-gather
before the QKV or the fused gate-and-up GEMM, one reduce-scatter of the input gradient), and so does torchtitan's
plan (PrepareModuleInput on attention and feed_forward redistributes the module's input once; wq, wk, wv, w1, w3 then
take it replicated). A plan that gives each projection its own input layouts instead (DTensor
``ColwiseParallel(input_layouts=Shard(1))`` on each of q_proj, k_proj, v_proj and gate_proj, up_proj, as KempnerForge
plans its blocks: kempnerforge/distributed/tensor_parallel.py @ 5666d0d) redistributes the input once per
projection:

- backward: one reduce-scatter (all-reduce without sequence parallelism) of the input gradient per projection, each
  projection's autograd node reducing its own partial gradient before the three are summed;
- forward, eager: one all-gather per projection; under torch.compile one, AOTAutograd's common-subexpression
  elimination (torch/_functorch/compile_utils.py fx_graph_cse) merging the functional all-gathers of one input.

Measured (validation/tp_plan_check.py: a block planned as KempnerForge plans it, on two gloo ranks with torch 2.13,
collectives of one forward and backward counted by torch.profiler): eager 7 all-gathers and 7 reduce-scatters
(Megatron-LM's plan: 4 and 4), compiled 4 and 7; with full activation checkpointing, compiled, 6 and 8.
"""

from __future__ import annotations

from simdist.errors import SpecError

__all__ = ["TP_INPUT_LAYOUTS", "column_projections", "forward_gathers", "input_reductions"]

TP_INPUT_LAYOUTS = ("module", "per_projection")


def _check(tp_inputs: str) -> None:
    if tp_inputs not in TP_INPUT_LAYOUTS:
        raise SpecError(f"unknown tp_input_layouts {tp_inputs!r}", field="training.tp_input_layouts",
                        fix=f"write one of {', '.join(TP_INPUT_LAYOUTS)}")


def column_projections(module: str, *, swiglu: bool) -> int:
    """Column-parallel projections reading one module's input: attention's q, k and v; a SwiGLU MLP's gate and up,
    a GELU MLP's one up projection."""
    if module == "attention":
        return 3
    return 2 if swiglu else 1


def forward_gathers(tp_inputs: str, projections: int, *, compiled: bool) -> int:
    """All-gathers of a module's input in its forward under sequence parallelism."""
    _check(tp_inputs)
    return projections if tp_inputs == "per_projection" and not compiled else 1


def input_reductions(tp_inputs: str, projections: int) -> int:
    """Reduce-scatters (all-reduces without sequence parallelism) of a module's input gradient in its backward."""
    _check(tp_inputs)
    return projections if tp_inputs == "per_projection" else 1
