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

**The copies around DTensor's sequence-parallel collectives** (`layout_copy`). A DTensor plan keeps the activations
batch-first, [b, s, h], sequence-sharded as Shard(1); NCCL gathers and scatters along dim 0, so DTensor's functional
collectives move the sequence chunks around them (torch/distributed/_functional_collectives.py, torch 2.13):

- reduce_scatter_single chunks its input along dim 1 and concatenates the chunks along dim 0 before the reduce-scatter
  (torch._utils._chunk_or_narrow_cat: a copy of the whole input, whatever the batch);
- all_gather_single concatenates the gathered chunks back along dim 1 (torch._utils._maybe_view_chunk_cat): a view
  where the local batch is 1 (pytorch/pytorch PR #169404), a copy of the whole output otherwise.

Counted (validation/tp_plan_check.py's copies column: the same block at micro-batch 2, and 1 with --batch 1): eager,
one aten::cat per reduce-scatter and one per all-gather at micro-batch 2, none after the all-gathers at micro-batch
1; compiled, Inductor's cat kernels in the same places. On H200 (KempnerForge's profile,
validation/reference/kempner_h200_profiled_kernels.csv) the eager copy before a reduce-scatter of micro-batch 2
(ATen's CatArrayBatchedCopy on non-contiguous chunks, element by element) took 171 us for 80 MiB, a fifth of a
streaming copy's bandwidth (`Kernel.strided_copy`); at micro-batch 1 the chunks are contiguous and it streams, as
the compiled copies do. Megatron-LM's activations are sequence-first, [s, b, h], gathered and scattered along dim 0:
no copies (the fused style). Nor under torchtitan's async TP: Inductor's micro-pipeline pass replaces the
all-gather, its concatenation and the GEMM by fused_all_gather_matmul (and the GEMM, the concatenation and the
reduce-scatter by fused_matmul_reduce_scatter), which move each shard into place through symmetric memory
(torch/_inductor/fx_passes/micro_pipeline_tp.py; what they cost: simdist.plan.chunk_cost).
# Assumption: the model's ends (the output layer's input gather, the embedding's scatter) and an MoE layer's
# shared-expert collectives take no copies here: a few a micro-batch against 7 to 14 in every layer.
"""

from __future__ import annotations

from simdist.errors import SpecError
from simdist.plan.kernel_work import Kernel, LayerShape, elementwise

__all__ = ["TP_INPUT_LAYOUTS", "column_projections", "forward_gathers", "input_reductions", "layout_copy"]

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


def layout_copy(op: str, shape: LayerShape, nbytes: float) -> list[Kernel]:
    """The copy DTensor makes around a sequence-parallel ``op`` (all_gather: after it, of its ``nbytes`` output;
    reduce_scatter: before it, of its ``nbytes`` input) of a layer of ``shape`` (module doc): read and written once;
    none in the fused style (Megatron-LM's sequence-first activations), under async TP, or after an all-gather of a
    local batch of 1.
    The eager copy before a reduce-scatter of a batch above 1 reads strided views (`Kernel.strided_copy`)."""
    if shape.style == "fused" or not shape.sequence_parallel or shape.tp == 1 or shape.async_tp:
        return []
    if op == "all_gather":
        return [] if shape.micro_batch_size == 1 else [elementwise("tp_gather_copy", nbytes, 2.0, 0.0)]
    if op == "reduce_scatter":
        strided = shape.style == "eager" and shape.micro_batch_size > 1
        return [elementwise("tp_scatter_copy", nbytes, 2.0, 0.0, strided_copy=strided)]
    raise ValueError(f"no layout copy for {op!r}")
