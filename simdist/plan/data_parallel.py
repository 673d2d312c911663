"""The data-parallel side of the one step model (simdist.plan.recipe): the groups a chunk's parameters live over,
its gradient buckets, ZeRO-3's per-parameter fetches, the parameter gathers overlapped with a chunk's first forward,
and what a stage does after its last backwards (its `StageTail`).

The data-parallel collectives of the dense parameters (ZeRO gathers and scatters, the gradient reduction, the
distributed optimizer's gather) run over dp x cp ranks, the experts' over edp (`data_parallel_groups`).

Inside a step (simdist.plan.recipe.step_recipe places them): with ``zero3_fetch: per_parameter`` one blocking
all_gather or reduce_scatter per parameter tensor (DeepSpeed ZeRO-3 as of 2021: `_per_parameter`); with
``overlap_param_gather`` the chunk's first micro-batch (its *edge* forward, simdist.plan.recipe.is_edge) gathers the
updated parameters bucket by bucket on the dp stream, its forward compute cut into one slice per bucket, each slice
waiting for its bucket's gather (`_gathered_forward`); with ``grad_reduce: overlapped`` the chunk's last backward
(`overlaps_reduction`) sends its gradient buckets (`num_buckets`, in the order of `_bucket_order`) out as it runs.

After the stage's last backwards: its gradient reduction on the dp stream (all_reduce, or reduce_scatter under
ZeRO-1 = Megatron's distributed optimizer), per parameter or in buckets, unless overlapped; then the optimizer on
the compute stream and, under ZeRO-1/2, the all_gather of the updated parameters (`tail`; with
``overlap_param_gather`` it moves to the edge forwards instead).
"""

from __future__ import annotations

import math

from simdist.hardware.compute import kernels_time_s
from simdist.plan.chunk_cost import ChunkCost
from simdist.plan.fsdp import replica_reduce
from simdist.plan.interference import tax
from simdist.plan.layer_cost import bytes_per_element
from simdist.plan.optimizer import optimizer_step_kernels
from simdist.plan.pieces import DP_DONE, LAST_BACKWARDS, Builder, CommItem, Piece, StageTail
from simdist.plan.schedule import SPLIT_BACKWARD
from simdist.plan.step_config import StepConfig, grad_bytes_per_element

__all__ = ["MEGATRON_BUCKET_PARAMS", "MEGATRON_BUCKET_PARAMS_PER_DP_RANK", "data_parallel_groups",
           "dense_data_parallel_axis", "megatron_bucket_params", "num_buckets", "optimizer_params",
           "overlaps_reduction", "param_bytes_per_element", "tail"]


def dense_data_parallel_axis(cfg: StepConfig) -> str:
    """The group the dense parameters' gradients, ZeRO shards and distributed-optimizer state live over: the
    data-parallel group with context parallelism, dp x cp ranks (Megatron-Core: the cp ranks of a replica hold the
    same weights and reduce their gradients together; parallel_state.py ``get_data_parallel_group(
    with_context_parallel=True)``, the group of the dense grad buffers in distributed_data_parallel.py and of the
    distributed optimizer's shards, megatron/core/optimizer/__init__.py ``intra_dp_cp_group``; Megatron-FSDP shards
    over it too, megatron/core/distributed/fsdp/mcore_fsdp_adapter.py, so ZeRO-2/3 here as well). Named ``dp_cp``
    where cp > 1 and ``dp`` where cp = 1 (the same ranks): either way its collectives run on the dp stream and are
    charged to the breakdown's dp (simdist.plan.accounting)."""
    if cfg.mesh.dp_shard:
        # hybrid sharding: the shards live over a shard group (with cp), replicated across (simdist.plan.mesh)
        return "dps_cp" if cfg.mesh.cp > 1 else "dps"
    return "dp_cp" if cfg.mesh.cp > 1 else "dp"


def data_parallel_groups(cfg: StepConfig, params: float, expert_params: float) -> list[tuple[str, float]]:
    """(axis, parameters) of each data-parallel group whose gradients, ZeRO shards and distributed-optimizer state
    the ``params`` of a chunk (``expert_params`` of them routed experts) live over, groups of one rank left out:
    the dense parameters over dp x cp (`dense_data_parallel_axis`), the routed experts' over the
    expert-data-parallel group edp, whose generator has no cp, so it already spans the cp ranks: tp x cp x dp /
    (etp x ep) of them (simdist.plan.mesh; Megatron-Core
    DistributedDataParallel: expert parameters in their own buffers, reduced over the expert data-parallel group,
    megatron/core/distributed/distributed_data_parallel.py ``expert_parallel_buffers``; parallel_state.py
    ``EXPERT_DATA_PARALLEL_GROUP``)."""
    out = []
    dense = params - expert_params
    axis = dense_data_parallel_axis(cfg)
    if cfg.mesh.size(axis) >= 2 and dense > 0:
        out.append((axis, dense))
    if expert_params > 0 and cfg.mesh.size("edp") >= 2:
        out.append(("edp", expert_params))
    return out


def _label(axis: str, text: str) -> str:
    return f"expert {text}" if axis == "edp" else text


MEGATRON_BUCKET_PARAMS = 40_000_000
"""Megatron-Core's default gradient bucket: max(40,000,000, 1,000,000 x dp) parameters
(megatron/core/distributed/distributed_data_parallel.py, DistributedDataParallel.__init__, and the bucket_size
field of distributed_data_parallel_config.py: "larger DP sizes need larger buckets to ensure collectives do not
become latency-bound"); Megatron-LM's training loop sets it before building the model's DDP wrappers with the
data-and-context-parallel group's size, max(40M, 1M x dp x cp) (megatron/training/training.py,
resolve_ddp_bucket_size(ddp_config, pg_collection.dp_cp, ...))."""

MEGATRON_BUCKET_PARAMS_PER_DP_RANK = 1_000_000


def megatron_bucket_params(dp: int) -> int:
    """Parameters per gradient bucket Megatron-LM uses when ``--ddp-bucket-size`` is not given, on a data-parallel
    (x context-parallel) group of ``dp`` ranks."""
    return max(MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_DP_RANK * dp)


def param_bytes_per_element(cfg: StepConfig) -> int:
    """Bytes per parameter element of the data-parallel parameter all-gathers (ZeRO-3's fetch, the distributed
    optimizer's / ZeRO-1,2's gather of updated shards): the 16-bit copy, or 1 B with ``fp8_param_gather``
    (Megatron-LM --fp8-param-gather: parameters kept and gathered in fp8 under fp8 training). Activations, TP
    collectives and pipeline messages stay bf16 under fp8 (simdist.plan.layer_cost._BYTES)."""
    return 1 if cfg.fp8_param_gather and cfg.precision == "fp8" else bytes_per_element(cfg.precision)


def num_buckets(cfg: StepConfig, cost: ChunkCost, params: float | None = None) -> int:
    """Gradient buckets of a chunk (of ``params`` of its parameters: its dense or its expert ones, which
    Megatron-Core buckets separately with the same bucket size, distributed_data_parallel.py; None: all).

    ``grad_bucket_size`` given: the chunk's gradient bytes / the bucket size, on every chunk (as PyTorch DDP's
    bucket_cap_mb). Unset: Megatron-Core's defaults. Without overlap one bucket per chunk (its contiguous gradient
    buffer, reduced at once: bucket_size is set to None unless overlap_grad_reduce). With ``grad_reduce:
    overlapped`` buckets of `megatron_bucket_params` (of dp x cp) parameters on model part 0 only (pipeline rank
    0's first chunk), one bucket elsewhere: Megatron-Core turns bucketing off on pipeline ranks > 0, "since
    data-parallel communication on these stages is not on the critical path" (distributed_data_parallel.py), and on
    model chunks after the first (megatron/training/models/dist_utils.py: disable_bucketing = model_chunk_idx > 0).
    """
    n = cost.num_params if params is None else params
    b = cfg.grad_bucket_bytes
    if b is not None:
        return max(1, math.ceil(n * grad_bytes_per_element(cfg.precision, cfg.grad_reduce_in_fp32) / b))
    if cfg.grad_reduce == "overlapped" and cost.first_part:
        return max(1, math.ceil(n / megatron_bucket_params(cfg.mesh.dp * cfg.mesh.cp)))
    return 1


def _bucket_order(cfg: StepConfig, cost: ChunkCost, shards: list[tuple[str, float]]) -> list[tuple[str, int, float]]:
    """(axis, bucket index, parameters) of the chunk's gradient buckets in the order the backward fills them: one
    compute slice per bucket, the groups' buckets interleaved in proportion (Megatron-Core fills the dense and the
    expert buffers as the backward runs through each layer's MLP and attention)."""
    return [(axis, k, n) for _, axis, k, n in sorted(((k + 1) / m, axis, k, n / m) for axis, n in shards
                                                      for m in (num_buckets(cfg, cost, n),) for k in range(m))]


def overlaps_reduction(cfg: StepConfig, kind: str, last: bool) -> bool:
    """The chunk's last backward (a split backward, zb_h1 and the two-chunk schedules: its last W), with overlapped
    reduction: its buckets go out as it runs."""
    final = last and (kind == "W" or cfg.schedule not in SPLIT_BACKWARD)
    return cfg.grad_reduce == "overlapped" and final and cfg.zero_stage < 2 and kind != "F"


def _per_parameter(cfg: StepConfig, cost: ChunkCost, op: str, nbytes: float, deps: tuple[int, ...], label: str,
                   axis: str = "dp") -> Piece:
    """ZeRO-3 ``per_parameter``: one blocking ``op`` per parameter tensor of the chunk (``nbytes`` in all).

    DeepSpeed's ZeRO-3 of 2021 gathered each parameter with ``torch.distributed.all_gather`` into a list of dp
    views, one per rank, and reduce-scattered each gradient from such a list (deepspeed/runtime/zero/
    partition_parameters.py, ``_allgather_param`` and ``_reduce_scatter_gradient``, v0.3); the fetch of a module
    waits for its gathers before the module runs, and the gradient hook waits for its scatters. PyTorch's list
    collectives copy every rank's view to (from) one flat buffer, one copy per rank issued from C++ (ProcessGroupNCCL::
    allgather / reduce_scatter with tensor lists), so each run also costs dp launches on the host
    (`StepConfig.copy_launch_s`).
    # Assumption: equal-sized tensors (the chunk's bytes / its tensors); small tensors are latency-bound either
    # way, and above a few MB a collective's time is linear in its size.
    """
    n = cost.num_tensors
    if axis == "edp" or cost.expert_params:
        # Assumption: the dense and the expert parameters' tensors in proportion to their parameters
        share = (cost.expert_params if axis == "edp" else cost.num_params - cost.expert_params) / cost.num_params
        n = max(1, round(n * share))
    prefix = "expert " if axis == "edp" else ""
    return Piece("dp", "comm", f"{prefix}{label} per parameter x{n}",
                 comm=CommItem(op, nbytes / n, axis, n, cfg.mesh.size(axis) * cfg.copy_launch_s), deps=deps)


def _gathered_forward(cfg: StepConfig, cost: ChunkCost, b: Builder, shards: list[tuple[str, float]],
                      start: tuple[int, ...], gap: float, needs_input: bool) -> list[int]:
    """The forward compute of a chunk's first micro-batch under ``overlap_param_gather``: one slice per parameter
    bucket, each waiting for its bucket's all_gather on the dp stream (returns the slices' ids).

    Megatron-Core (megatron/core/distributed/distributed_data_parallel.py, param_and_grad_buffer.py): with
    --overlap-param-gather the distributed optimizer's step does not gather the updated parameters; each bucket
    group's all_gather is launched asynchronously and a forward pre-hook on every module waits for the gather of
    the buckets its parameters live in (``_make_forward_pre_hook`` -> ``finish_param_sync``), so the gathers hide
    behind the first micro-batch's forward but for the first bucket's. The buckets are the gradient buckets
    (`num_buckets`), gathered in reverse order of the backward's (``next_param_gather_bucket_group``): the first
    layers' first. Without interleaving (align_param_gather is off: megatron/training/arguments.py) the first
    bucket's gather is launched by the first module's pre-hook, i.e. when the chunk's forward starts, after its
    input; each pre-hook that waited for bucket k launches bucket k+1's. With interleaving (vpp > 1,
    align_param_gather on by default) the schedule launches every bucket of a chunk at once, chunks 0 and 1 at the
    step's start, chunk c + 1 at chunk c's first micro-batch (megatron/core/pipeline_parallel/schedules.py,
    ``param_sync_func``), and the pre-hooks only wait.
    # Assumption: the host runs ahead of the GPU, so each pre-hook's launch of the next bucket reaches the dp stream
    # before the previous gather ends: a chunk's gathers run back to back from the first one's launch (the code's
    # one gather in flight gives the same timeline where the buckets are alike: bucket k+1's gather overlaps
    # bucket k's forward either way). Under interleaving every chunk's gathers are issued at the step's start,
    # queued on the dp stream in chunk order (Megatron launches chunk c + 1's at chunk c's first micro-batch: the
    # same timeline wherever the dp stream is still busy with the earlier chunks' gathers then, an earlier start
    # here otherwise).
    # Assumption: simdist times one steady-state step, so the gather that belongs to the next step's first forward
    # is modelled as this step's (the same thing in steady state): the gathers wait for no optimizer (the previous
    # step's ran before this one started).
    # Assumption: the forward's compute splits evenly over the buckets (the buckets hold equal parameters: the
    # chunk's / their number, as the backward's slices), and the gathers are pipeline work (collectives the
    # forward waits for, as ZeRO-3's): exposed, they are charged to dp, not to the bubble.
    """
    order = list(reversed(_bucket_order(cfg, cost, shards)))  # forward order: the backward's last bucket first
    pbpe = param_bytes_per_element(cfg)
    ahead = cfg.vpp > 1
    gates = [b.add(Piece("dp", "comm", _label(axis, f"params bucket {j} all_gather"),
                         comm=CommItem("all_gather", n * pbpe, axis), deps=() if ahead else start))
             for axis, j, n in order]
    slices: list[int] = []
    m = len(gates)
    for k in range(m):
        deps = (*(start if k == 0 else (slices[-1],)), gates[k])
        slices.append(b.add(Piece("compute", "forward", f"/{k}" if m > 1 else "",
                                  cost.forward_s / m + (gap if k == 0 else 0.0), deps=deps,
                                  needs_input=needs_input and k == 0, model_flops=cost.model_flops_forward / m,
                                  hardware_flops=cost.model_flops_forward / m)))
    if m > 1:  # every gather but the first runs beside the slices before it (simdist.plan.interference)
        end = tax(b, slices[-1], gates[1:], cost.forward_s * (m - 1) / m, cfg.interference, "forward")
        if end != slices[-1]:
            slices.append(end)
    return slices


def optimizer_params(cfg: StepConfig, params: float, expert_params: float = 0.0) -> float:
    """Parameters one GPU's optimizer updates: its shard of the stage's ``params`` under ZeRO-1+
    (Rajbhandari et al. 2020 sec 5.1: each data-parallel rank updates 1/N_d of the states), the dense ones sharded
    over dp x cp, the routed experts' ``expert_params`` of them over the expert-data-parallel group (Megatron-Core's
    distributed optimizer shards each buffer over its own data-parallel group: `data_parallel_groups`)."""
    if cfg.zero_stage < 1:
        return params
    dense = cfg.mesh.size(dense_data_parallel_axis(cfg))
    return (params - expert_params) / dense + expert_params / cfg.mesh.size("edp")


def tail(cfg: StepConfig, chunk_costs: list[ChunkCost]) -> StageTail:
    """What a stage with these chunks runs after its last backwards.

    Gradient reduction (unless overlapped or ZeRO-2/3, which reduce as they go): as Megatron-LM without
    --overlap-grad-reduce (and the lecture's data parallelism), it starts once the stage's whole backward is done
    (Korthikanti et al. 2022 sec 6.3 ran 530B this way); per parameter (the lecture: one all_reduce per tensor) or
    per bucket. all_reduce and reduce_scatter both take the whole gradient buffer as their nccl-tests size (for a
    reduce_scatter, the full input each rank contributes; each keeps 1/(dp x cp) of the reduced result). Then the
    optimizer after every data-parallel collective of the stage (collectives end together on all members), and
    under ZeRO-1/2 the all_gather of the updated parameter shards (Megatron's distributed optimizer / ZeRO-1,2).
    """
    b = Builder()
    op = "reduce_scatter" if cfg.zero_stage == 1 else "all_reduce"
    if cfg.zero_stage == 3 and cfg.zero3_fetch == "per_layer" and cfg.execution.grad_sync == "step":
        # FSDP under PyTorch pipelining: every micro-batch's backward runs without gradient sync, and each stage
        # reduce-scatters its accumulated gradients once after its last backward (torch/distributed/pipelining/
        # stage.py, perform_reduce_grad), not overlapped with the pipeline.
        for c, cost in enumerate(chunk_costs):
            for axis, params in data_parallel_groups(cfg, cost.num_params, cost.expert_params):
                total = params * grad_bytes_per_element(cfg.precision, cfg.grad_reduce_in_fp32)
                rs = b.add(Piece("dp", "comm", _label(axis, "grads reduce_scatter") + (f" chunk {c}" if len(
                    chunk_costs) > 1 else ""), comm=CommItem("reduce_scatter", total, axis), deps=(LAST_BACKWARDS,),
                    per_step=True))
                replica_reduce(b, cfg, axis, total, (rs,))
    if cfg.grad_reduce != "overlapped" and cfg.zero_stage < 2:
        for c, cost in enumerate(chunk_costs):
            for axis, params in data_parallel_groups(cfg, cost.num_params, cost.expert_params):
                total = params * grad_bytes_per_element(cfg.precision, cfg.grad_reduce_in_fp32)
                if cfg.grad_reduce == "per_parameter":
                    n = _per_parameter(cfg, cost, op, total, (), "", axis).comm.count  # type: ignore[union-attr]
                    label = f"grads {op} per parameter x{n}"
                else:
                    n = num_buckets(cfg, cost, params)
                    label = f"grads {op} x{n}"
                b.add(Piece("dp", "comm", _label(axis, label) + (f" chunk {c}" if len(chunk_costs) > 1 else ""),
                            comm=CommItem(op, total / n, axis, n), deps=(LAST_BACKWARDS,), per_step=True))
    params = sum(c.num_params for c in chunk_costs)
    experts = sum(c.expert_params for c in chunk_costs)
    shard = optimizer_params(cfg, params, experts)
    ex = cfg.execution
    tensors = sum(c.num_tensors for c in chunk_costs)
    kernels = optimizer_step_kernels(shard, precision=cfg.precision, implementation=ex.optimizer, num_tensors=tensors,
                                     master_copy=ex.master_copy, clip=ex.clip_grad)
    # the host issues each of them (CUDA graphs do not cover the optimizer: Megatron-LM's full_iteration graph
    # leaves it out)
    t = cfg.host_overhead.run_time_s(kernels_time_s(cfg.gpu, kernels, cfg.precision, cfg.compute_efficiency), kernels)
    opt = b.add(Piece("compute", "optimizer", "optimizer", t, deps=(DP_DONE, LAST_BACKWARDS), per_step=True))
    if cfg.zero_stage in (1, 2) and not (cfg.overlap_param_gather and cfg.zero_stage == 1):
        # (overlap_param_gather: gathered bucket by bucket in each chunk's first forward instead, `_gathered_forward`)
        for axis, n in data_parallel_groups(cfg, params, experts):
            b.add(Piece("dp", "comm", _label(axis, "params all_gather"),
                        comm=CommItem("all_gather", n * param_bytes_per_element(cfg), axis), deps=(opt,),
                        per_step=True))
    return StageTail(tuple(b.pieces))
