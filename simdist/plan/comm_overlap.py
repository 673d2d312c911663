"""What a pipeline step runs beside its compute rather than after it (simdist.plan.recipe reads it for every step
recipe): the expert-parallel token all-to-alls under Megatron-Core's 1F1B A2A overlap, the tensor-parallel
collectives under Transformer Engine's communication overlap and torchtitan's async TP; and which steps Megatron runs
without a partner for the all-to-alls to hide behind (`unpaired`).
"""

from __future__ import annotations

from simdist.hardware.tp_overlap import exposed_share
from simdist.plan.step_config import StepConfig

__all__ = ["overlapped_comm", "unpaired"]


def overlapped_comm(cfg: StepConfig, items: tuple, groups: dict[str, int], alone: bool = False
                 ) -> tuple[tuple, tuple]:
    """(the token all_to_alls a step runs beside its compute, the collectives it still runs after it); ``alone``:
    a step Megatron runs without a partner (`unpaired`), whose all_to_alls stay in its path.

    Megatron-Core's 1F1B A2A overlap (--overlap-moe-expert-parallel-comm; megatron/core/pipeline_parallel/
    combined_1f1b.py): the forward of one micro-batch and the backward of another are scheduled layer by layer
    together, "EP A2A in forward step is hidden by the attention/mlp computation in the backward step, and vice
    versa", on separate communication streams. Here each step's expert-parallel all_to_alls run on the ep stream
    from the step's start, beside its compute; the step ends when both are done.
    # Assumption: a step's all_to_alls hide behind its own compute, where Megatron hides them behind the paired
    # step's: per 1F1B pair max(F, a_B) + max(B, a_F) against max(F, a_F) + max(B, a_B) here, the same where the
    # forward and backward all_to_alls move the same bytes (they do: adjoints, same imbalance). Megatron's own
    # per-layer order (megatron/core/models/common/model_chunk_schedule_plan.py, schedule_layer_1f1b: combine_bwd
    # beside pre_dispatch_fwd, dispatch_fwd beside mlp_bwd, dispatch_bwd beside mlp_fwd, combine_fwd beside
    # pre_dispatch_bwd) hides them all wherever each all_to_all is shorter than the compute it is paired with.
    # Without pipeline stages the step's first forward and last backward run alone (`unpaired`), their
    # all_to_alls in their path; with stages (interleaved 1F1B) each stage's warm-up forwards and cool-down
    # backwards, which Megatron also runs unpaired, are overlapped here (optimistic by their all_to_alls where
    # they are exposed). The expert-TP collectives stay in the layer's path.
    # Assumption: the one extra warm-up forward Megatron's combined 1F1B runs first (schedules.py
    # get_pp_rank_microbatches) is held in memory (simdist.plan.activations.in_flight_microbatches) but not timed:
    # the schedule's order keeps the plain interleaved warm-up (one chunk forward earlier, about one chunk's
    # forward on the step).
    """
    a2a = cfg.moe_overlap and groups.get("ep", 1) >= 2 and not alone
    # Megatron-LM --tp-comm-overlap (Transformer Engine userbuffers): the sequence-parallel all-gathers and
    # reduce-scatters of the layers run chunk by chunk beside the GEMMs they feed or drain, on their own stream.
    # Assumption: per step they hide behind its compute as a whole (max(compute, tp comm)) but for each one's
    # exposed chunk (its first or last: simdist.hardware.tp_overlap.exposed_share), which stays in the path; the
    # GEMMs' lost SMs are charged too (simdist.plan.chunk_cost.chunk_cost).
    # torchtitan's async TP (micro-pipelined all-gather-matmul / matmul-reduce-scatter, torch/_inductor
    # micro_pipeline_tp): the same hiding, each collective in tp pieces, so one piece of tp stays exposed.
    async_tp = cfg.execution.async_tp and groups.get("tp", 1) >= 2
    tp = (cfg.tp_comm_overlap or async_tp) and groups.get("tp", 1) >= 2

    def hide(x: tuple) -> bool:
        return (a2a and x[0] == "all_to_all" and x[2] == "ep") or (tp and x[2] == "tp"
                                                                  and x[0] in ("all_gather", "reduce_scatter"))

    if not (a2a or tp):
        return (), items
    hidden = [x for x in items if hide(x)]
    kept = [x for x in items if not hide(x)]
    if tp:
        # each overlapped tp collective leaves one chunk exposed, in the step's path (simdist.hardware.tp_overlap)
        for i, x in enumerate(hidden):
            if x[2] == "tp":
                share = 1.0 / groups["tp"] if async_tp else exposed_share(x[0], cfg.precision, groups["tp"])
                hidden[i] = (x[0], x[1] * (1 - share), *x[2:])
                kept.append((x[0], x[1] * share, *x[2:]))
    return tuple(hidden), tuple(kept)


def unpaired(groups: dict[str, int], kind: str, first: bool, last: bool) -> bool:
    """Whether Megatron-Core's 1F1B A2A overlap runs this step alone: without pipeline stages its combined 1F1B
    (megatron/core/pipeline_parallel/combined_1f1b.py, combined_1f1b_schedule_for_no_pipelining) runs the first
    micro-batch's forward before any backward and the last one's backward after every forward, each without a
    partner; every other forward runs beside the previous micro-batch's backward. ``first`` / ``last``: the
    step is its chunk's first forward / last backward (`is_edge`: with one stage and one chunk, the step's)."""
    return groups.get("pp", 1) < 2 and ((kind == "F" and first) or (kind == "B" and last))
