"""What a pipeline step runs beside its compute rather than after it (simdist.plan.recipe reads it for every step
recipe): the expert-parallel token all-to-alls under Megatron-Core's 1F1B A2A overlap (`a2a_overlapped`; of each,
the share training.moe_a2a_overlap_share, the rest after the compute), the tensor-parallel collectives under
Transformer Engine's communication overlap and torchtitan's async TP.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from simdist.hardware.tp_overlap import exposed_share
from simdist.plan.schedule import STEP_KINDS, chunks_per_stage, stage_steps
from simdist.plan.step_config import StepConfig

__all__ = ["a2a_overlapped", "overlapped_comm", "unpaired", "unpaired_steps"]


def overlapped_comm(cfg: StepConfig, items: tuple, groups: dict[str, int], alone: bool = False
                 ) -> tuple[tuple, tuple]:
    """(the token all_to_alls a step runs beside its compute, the collectives it still runs after it); ``alone``:
    a step Megatron runs without a partner (`unpaired`), whose all_to_alls stay in its path.

    Megatron-Core's 1F1B A2A overlap (--overlap-moe-expert-parallel-comm; megatron/core/pipeline_parallel/
    combined_1f1b.py): the forward of one micro-batch and the backward of another are scheduled layer by layer
    together, "EP A2A in forward step is hidden by the attention/mlp computation in the backward step, and vice
    versa", on separate communication streams. Here each step's expert-parallel all_to_alls run on the ep stream
    from the step's start, beside its compute, and what they leave exposed is Megatron's own per-layer pairing
    (megatron/core/models/common/model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run: combine_bwd beside
    pre_dispatch_fwd, dispatch_fwd and dispatch_bwd beside mlp_bwd and its weight gradients, combine_fwd beside
    pre_dispatch_bwd): the step's tax piece adds its share of the pair's exposure (simdist.plan.moe_pairing), and the
    step does not wait for the all_to_alls themselves. Where training.moe_a2a_overlap_share < 1 (a share measured in
    the user's own profile) the step waits for them instead (max(compute, all_to_alls)) and the share says how much
    runs beside.
    # The steps Megatron runs alone (each stage's warm-up forwards and cool-down backwards: without stages the
    # step's first forward and last backward) keep their all_to_alls in their path (``alone``: the program gives
    # them recipes of their own, `unpaired`). The expert-TP collectives stay in the layer's
    # path.
    # The one extra warm-up forward Megatron's combined 1F1B runs first (schedules.py get_pp_rank_microbatches) is
    # held in memory (simdist.plan.activations.in_flight_microbatches); the schedule's order keeps the plain
    # interleaved warm-up and then alternates, whose forwards before each stage's first backward are as many as
    # the combined warm-up's, (K - s - 1) x 2 + (V - 1) x K + 1, and its backwards after the last forward as many
    # as the combined cool-down's (tests/test_moe_comm.py): the unpaired steps are Megatron's in number and place.
    """
    a2a = a2a_overlapped(cfg) and not alone
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

    def exposed(x: tuple) -> float | None:
        """Of a hidden collective, the share of its bytes that stays in the step's path after the compute (None:
        it all runs beside). A tp collective: its exposed chunk (simdist.hardware.tp_overlap). An ep all_to_all:
        1 - training.moe_a2a_overlap_share. Assumption: the two pieces are priced as two collectives of those
        bytes (one more latency term)."""
        if x[2] == "tp":
            return 1.0 / groups["tp"] if async_tp else exposed_share(x[0], cfg.precision, groups["tp"])
        return 1.0 - cfg.moe_overlap_share if cfg.moe_overlap_share < 1.0 else None

    if not (a2a or tp):
        return (), items
    hidden = [x for x in items if hide(x)]
    kept = [x for x in items if not hide(x)]
    for i, x in enumerate(hidden):
        share = exposed(x)
        if share is not None:
            hidden[i] = (x[0], x[1] * (1 - share), *x[2:])
            kept.append((x[0], x[1] * share, *x[2:]))
    return tuple(hidden), tuple(kept)


def a2a_overlapped(cfg: StepConfig) -> bool:
    """Whether Megatron-Core's 1F1B A2A overlap hides this step's expert-parallel all_to_alls (then the steps it runs
    alone have recipes of their own: `unpaired`)."""
    return cfg.moe_overlap and cfg.mesh.ep >= 2


def unpaired(kind: np.ndarray, lengths: list[int]) -> np.ndarray:
    """Of every stage's steps in its order (``kind``: their kind indices, stage after stage, ``lengths`` of them),
    those Megatron-Core's 1F1B A2A overlap runs alone: the forwards before the stage's first backward (its warm-up)
    and the backwards after its last forward (its cool-down). Megatron runs every other forward beside a backward
    and vice versa (megatron/core/pipeline_parallel/combined_1f1b.py: without stages the first micro-batch's forward
    and the last one's backward "executed alone, no a2a overlapping"; schedules.py forward_backward_helper_wrapper
    with interleaving calls the combined step with only a forward in the warm-up and only a backward in the
    cool-down)."""
    out = np.zeros(len(kind), dtype=bool)
    start = 0
    for n in lengths:
        own = kind[start:start + n]
        backward = np.flatnonzero(own == 1)
        forward = np.flatnonzero(own == 0)
        first_b = int(backward[0]) if len(backward) else n
        last_f = int(forward[-1]) if len(forward) else -1
        at = np.arange(n)
        out[start:start + n] = ((own == 0) & (at < first_b)) | ((own == 1) & (at > last_f))
        start += n
    return out


@lru_cache(maxsize=64)
def unpaired_steps(schedule: str, num_stages: int, num_microbatches: int, vpp: int
                   ) -> frozenset[tuple[int, str, int, int]]:
    """The (stage, kind, micro-batch, chunk) of the steps `unpaired` marks in the schedule's per-stage orders
    (simdist.plan.schedule.stage_steps, whose step numbers are (kind index x M + micro-batch) x V + chunk), for a
    reader that meets the steps one by one (the engine's step emitter; the closed form's program marks the same)."""
    M, v = num_microbatches, chunks_per_stage(schedule, vpp)
    rows = stage_steps(schedule, num_stages=num_stages, num_microbatches=M, vpp=vpp)
    steps = np.concatenate(rows)
    chunk, q = steps % v, steps // v
    stage = np.repeat(np.arange(num_stages), [len(row) for row in rows])
    alone = np.flatnonzero(unpaired(q // M, [len(row) for row in rows]))
    return frozenset((int(stage[i]), STEP_KINDS[int(q[i] // M)], int(q[i] % M), int(chunk[i])) for i in alone.tolist())
