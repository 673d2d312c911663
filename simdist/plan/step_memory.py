"""A training step's memory per GPU, for each pipeline stage: the inputs of the memory model
(simdist.plan.memory.stage_memory, which knows layers, parallel sizes and precisions, not a `StepConfig`) read off a
step's configuration for one stage (its layers and model parts, its in-flight micro-batches under the schedule, the
share of its layers a full recompute recomputes), with the stages' results cached for a search's many layouts; and
the peak over the stages.
"""

from __future__ import annotations

from simdist.plan.activations import in_flight_microbatches
from simdist.plan.memory import MemoryBreakdown, stage_memory
from simdist.plan.recompute import full_layers
from simdist.plan.schedule import TWO_CHUNK_SCHEDULES
from simdist.plan.step_config import StepConfig

__all__ = ["peak_memory_bytes", "step_memory"]


def _stage_memory(cfg: StepConfig, s: int) -> MemoryBreakdown:
    mesh, K, ex = cfg.mesh, cfg.mesh.pp, cfg.execution
    replicas = range(mesh.dp) if cfg.dp_batch_split is not None else (0,)
    most = max(cfg.microbatches(d) for d in replicas)
    # the stage's model parts: the embedding is on part 0, the output layer and loss on the last (the V puts both on
    # stage 0; dualpipe's two copies put both on stages 0 and K-1)
    held = {cfg.part_of(s, c) for c in range(cfg.chunks)}
    args = dict(
        layers_on_stage=cfg.layers_per_stage[s], first_stage=0 in held, last_stage=cfg.num_parts - 1 in held,
        tp=mesh.tp, pp=K, dp=mesh.dp, cp=mesh.cp, vpp=cfg.vpp, sequence_parallel=cfg.sequence_parallel,
        zero_stage=cfg.zero_stage, micro_batch_size=cfg.micro_batch_size, recompute=cfg.recompute,
        precision=cfg.precision,
        in_flight_microbatches=in_flight_microbatches(cfg.schedule, num_stages=K, num_microbatches=most, vpp=cfg.vpp,
                                                      stage=s, extra_warmup=1 if cfg.moe_overlap and K > 1 else 0),
        capacity_bytes=cfg.capacity_bytes, attention=cfg.attention, layers=cfg.stage_layers(s),
        experts=cfg.expert_parallel, grad_reduce_in_fp32=cfg.grad_reduce_in_fp32,
        modules=ex.recompute_modules, style=ex.style, full_share=_full_share(cfg, s),
        # under PyTorch pipelining each backward leaves its units gathered until the next forward's end: the
        # parameters are whole at the backward's end whether or not the forward reshards (simdist.plan.recipe)
        unsharded=_unsharded(ex.reshard_after_forward and ex.grad_sync != "step",
                             ex.grad_sync == "step" or cfg.no_sync_accumulates),
        shard_group=cfg.mesh.dp_shard or None, optimizer_bytes=cfg.optimizer_state_bytes,
        fp8_attention=ex.fp8_attention, master_copy=ex.master_copy, master_dtype=ex.master_dtype,
        loss_parallel=ex.loss_parallel,
        op_keeps_attention=cfg.op_keeps_attention)
    # a search asks for the memory of thousands of layouts, three times each (pruning, screening, ranking), and
    # many share a stage's every input (they differ in the schedule or the placement): cached by all of them
    key = (cfg.model, *args.values())
    hit = _MEMORY.get(key)
    if hit is None:
        if len(_MEMORY) >= 65536:
            _MEMORY.clear()
        hit = _MEMORY[key] = stage_memory(cfg.model, **args)
    return hit


_MEMORY: dict[tuple, MemoryBreakdown] = {}


def _unsharded(reshard_after_forward: bool, grads: bool) -> str:
    """What ZeRO-3 keeps unsharded through the step (simdist.plan.memory.stage_memory): the gathered parameters where
    they are not resharded after forward, the gradients where they accumulate before one reduce-scatter (``grads``:
    PyTorch pipelining's once per step, or no_sync over more than one micro-batch)."""
    if reshard_after_forward:
        return "grads" if grads else ""
    return "params_grads" if grads else "params"


def _full_share(cfg: StepConfig, stage: int) -> float:
    """Under recompute full, the share of ``stage``'s layers recomputed (simdist.plan.recompute.full_layers, per
    model chunk)."""
    ex = cfg.execution
    if cfg.recompute != "full" or ex.recompute_method in (None, "uniform"):
        return 1.0
    chunks = cfg.stage_chunks(stage)
    total = sum(chunks)
    return sum(full_layers(ex.recompute_method, ex.recompute_num_layers, n) for n in chunks) / total if total else 1.0


def step_memory(cfg: StepConfig) -> list[MemoryBreakdown]:
    """Memory per GPU of each pipeline stage at its activation peak (simdist.plan.memory.stage_memory)."""
    return [_stage_memory(cfg, s) for s in range(cfg.mesh.pp)]


def peak_memory_bytes(cfg: StepConfig) -> float:
    """The largest `step_memory` total over the stages, computing only the stages that can hold it: the first and
    the last, and for each other layer count the earliest stage with it (a schedule's in-flight micro-batches
    never grow with the stage index, simdist.plan.activations.in_flight_microbatches)."""
    K = cfg.mesh.pp
    if cfg.schedule in TWO_CHUNK_SCHEDULES:  # (each stage's parts and in-flight count differ: every stage)
        return max(_stage_memory(cfg, s).total_bytes for s in range(K))
    wanted = {0, K - 1}
    seen: set[int] = set()
    for s in range(1, K - 1):
        if cfg.layers_per_stage[s] not in seen:
            seen.add(cfg.layers_per_stage[s])
            wanted.add(s)
    return max(_stage_memory(cfg, s).total_bytes for s in sorted(wanted))
