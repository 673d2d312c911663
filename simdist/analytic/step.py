"""Closed-form step time: the "analytic" fidelity of a training step (DESIGN.md, "Fidelity and speed").

Same inputs as the engine path (a `StepConfig` and priced collectives), no op graph and no SimPy. Per pipeline
stage and model chunk it sums, per micro-batch, the chunk's forward and backward times with their exposed
tensor/context-parallel collectives (as simdist.plan.step emits them), then composes the pipeline:

- one stage: M x (f + b) (plus ZeRO-3's per-micro-batch gather/scatter, see `_stage_times`);
- GPipe / 1F1B (Narayanan et al. 2021, arXiv:2104.04473 sec 2.2.1): with uniform stages the step is
  (M + K - 1) (t_f + t_b); with stages that differ this generalises to sum_s T_s + (M - 1) max_s T_s (fill and
  drain through every stage, the slowest stage sets the steady-state period);
- interleaved 1F1B (sec 2.2.2, eq. (1) bubble (K-1)/(V M)): the same at chunk granularity,
  sum_s T_s / V + (V M - 1) max_s T_s / V;
- ZB-H1 (Qi et al. 2023, arXiv:2401.10241 sec 3.1): (M + K - 1)(T_F + T_B) + max(M - K + 1, 1) T_W
  (simdist.plan.schedule.bubble_formula's makespan), with per-stage sums and maxima as above;
- pipeline p2p sends: 2 (K - 1) sends (activation down, gradient back) on the fill/drain path, plus 2 per
  micro-batch in the steady state when K > 1 (each 1F1B cycle waits for a gradient round trip);
- after a stage's last backward: its data-parallel gradient reduction (all-reduce, or reduce-scatter under
  ZeRO-1), the optimizer and ZeRO-1/2's parameter all-gather; the step is the latest stage's end.

Collective prices are cached across configurations by a key that captures what decides them (op, group size,
stride between peers, the first peer's position inside its node, bytes): the group is re-placed on the
cluster's first node(s) to price it (`CommPricer`). Chunk costs are cached by everything `chunk_cost` reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from simdist.analytic.select import rank_choices
from simdist.collectives.group import Group
from simdist.collectives.request import Request
from simdist.hardware.compute import kernels_time_s
from simdist.hardware.topology import Topology
from simdist.plan.layer_cost import bytes_per_element
from simdist.plan.layer_cost import optimizer_kernels as adam_kernels
from simdist.plan.step import ChunkCost, StepConfig, chunk_cost, chunk_layers, grad_bytes_per_element

__all__ = ["AnalyticStep", "CommPricer", "analytic_step", "cached_chunk_cost"]

Adjust = Callable[[str, int, float, float], float]


class CommPricer:
    """Seconds of one collective on a group, cached by (op, group size, stride, position in node, bytes).

    # Assumption: a collective's time depends on its group's shape (size, rank stride, where its first
    # peer sits inside its node), not on which nodes it lands on: the group is priced re-placed on the first
    # node(s) of the cluster. On the bundled presets every node has the same NICs and leaf switch links, so
    # only groups that straddle leaf boundaries differently can differ (the engine path prices the real group).
    """

    def __init__(self, topology: Topology, adjust: Adjust | None = None) -> None:
        self.topology = topology
        self.adjust = adjust
        self._cache: dict[tuple, float] = {}
        self.misses = 0

    def key(self, op: str, ranks: tuple[int, ...], nbytes: float) -> tuple:
        n = len(ranks)
        stride = ranks[1] - ranks[0] if n > 1 else 0
        regular = all(ranks[i + 1] - ranks[i] == stride for i in range(n - 1)) and stride > 0
        if not regular:
            return (op, ranks, float(nbytes))
        return (op, ranks[0] % self.topology.gpus_per_node, n, stride, float(nbytes))

    def time_s(self, op: str, ranks: tuple[int, ...], nbytes: float) -> float:
        if len(ranks) < 2 or nbytes <= 0:
            return 0.0
        return self._price(self.key(op, ranks, nbytes))

    def shape_time_s(self, op: str, first: int, size: int, stride: int, nbytes: float) -> float:
        """The group ``first + i * stride`` for i < size (a mesh axis group), without listing its ranks."""
        if size < 2 or nbytes <= 0:
            return 0.0
        key = (op, first % self.topology.gpus_per_node, size, stride, float(nbytes))
        hit = self._cache.get(key)
        return hit if hit is not None else self._price(key)

    def _price(self, key: tuple) -> float:
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        self.misses += 1
        op, nbytes = key[0], key[-1]
        placed = key[1] if len(key) == 3 else tuple(key[1] + i * key[3] for i in range(key[2]))
        t = rank_choices(Request(op, Group(self.topology, placed), nbytes))[0].predicted_s
        if self.adjust is not None:
            t = self.adjust(op, len(placed), nbytes, t)
        self._cache[key] = t
        return t


_CHUNK_CACHE: dict[tuple, ChunkCost] = {}
_CHUNK_CACHE_MAX = 200_000


def cached_chunk_cost(cfg: StepConfig, num_layers: int, first_part: bool, last_part: bool) -> ChunkCost:
    """`simdist.plan.step.chunk_cost`, cached by every field it reads."""
    key = (cfg.model, cfg.gpu, cfg.mesh.tp, cfg.mesh.cp, cfg.sequence_parallel, cfg.micro_batch_size, cfg.recompute,
           cfg.attention, cfg.precision, cfg.tp_style, cfg.compute_efficiency, num_layers, first_part, last_part)
    hit = _CHUNK_CACHE.get(key)
    if hit is None:
        if len(_CHUNK_CACHE) >= _CHUNK_CACHE_MAX:
            _CHUNK_CACHE.clear()
        hit = _CHUNK_CACHE[key] = chunk_cost(cfg, num_layers, first_part, last_part)
    return hit


@dataclass(frozen=True, slots=True)
class AnalyticStep:
    """A closed-form step: times in seconds, averaged over the pipeline stages where a per-GPU share is meant."""

    step_time_s: float
    pipeline_s: float
    """First forward to the last stage's last backward (the engine's pipeline phase)."""
    compute_s: float
    recompute_s: float
    tp_comm_s: float
    """Exposed tensor- and context-parallel collectives per GPU (mean over stages)."""
    pp_comm_s: float
    """p2p sends on the critical path."""
    dp_exposed_s: float
    """Data-parallel traffic (gradient reduction, ZeRO gathers/scatters) not hidden behind compute."""
    optimizer_s: float
    bubble_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    mfu: float
    num_microbatches: int

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class _Chunk:
    f: float
    """Forward with its exposed collectives."""
    b: float
    """Recompute + backward with its exposed collectives (zb_h1: the input-gradient half)."""
    w: float
    """zb_h1 weight-gradient half; 0 otherwise."""
    gather_s: float
    """ZeRO-3 all_gather of the chunk's parameters."""
    scatter_s: float
    """ZeRO-2/3 reduce_scatter of the chunk's gradients (per micro-batch)."""
    reduce_s: float
    """ZeRO-0/1 gradient reduction after the backward (all buckets)."""
    bucket_s: float
    """One bucket of an overlapped reduction; 0 when not overlapped."""
    buckets: int
    tail_s: float
    """Part of b after the backward compute ends (exposed collectives): a ZeRO-2/3 scatter starts at its start."""
    compute_s: float
    recompute_s: float
    comm_s: float
    flops: float
    params: float


Shape = tuple[int, int, int]
"""A mesh group: (first rank, size, stride)."""


def _comm_sum(pricer: CommPricer, items: tuple, groups: dict[str, Shape]) -> float:
    # simdist.plan.step._Emitter._comm_chain: one op per item (count runs back to back), groups of 1 skipped.
    total = 0.0
    for op, nbytes, axis, count in items:
        first, size, stride = groups[axis]
        if size >= 2:
            total += pricer.shape_time_s(op, first, size, stride, nbytes) * count
    return total


def _chunk(cfg: StepConfig, pricer: CommPricer, cost: ChunkCost, groups: dict[str, Shape]) -> _Chunk:
    fwd_comm = _comm_sum(pricer, cost.forward_comm, groups)
    rec_comm = _comm_sum(pricer, cost.recompute_comm, groups) if cost.recompute_s > 0 else 0.0
    ovl = _comm_sum(pricer, cost.backward_overlapped_comm, groups)
    exposed = _comm_sum(pricer, cost.backward_comm, groups)
    f = cost.forward_s + fwd_comm
    if cfg.schedule == "zb_h1":
        # simdist.plan.step: B is the input-gradient half with every backward collective exposed, W the rest.
        share = 0.5
        b = cost.recompute_s + rec_comm + cost.backward_s * (1 - share) + exposed + ovl
        w = cost.backward_s * share
    else:
        # The asynchronous input-gradient all-reduce runs beside the backward GEMMs (Shoeybi et al. 2019 sec 3).
        b = cost.recompute_s + rec_comm + max(cost.backward_s, ovl) + exposed
        w = 0.0
    dp = groups["dp"]
    pbytes = cost.num_params * bytes_per_element(cfg.precision)
    gbytes = cost.num_params * grad_bytes_per_element(cfg.precision)
    if cfg.zero_stage == 3 and cfg.zero3_fetch == "per_parameter" and dp[1] >= 2:
        # simdist.plan.step._Emitter._per_parameter: one collective per tensor, each with dp host copies.
        n, host = cost.num_tensors, dp[1] * cfg.host_op_s
        gather = n * (pricer.shape_time_s("all_gather", *dp, pbytes / n) + host)
        scatter = n * (pricer.shape_time_s("reduce_scatter", *dp, gbytes / n) + host)
    else:
        gather = pricer.shape_time_s("all_gather", *dp, pbytes) if cfg.zero_stage == 3 else 0.0
        scatter = pricer.shape_time_s("reduce_scatter", *dp, gbytes) if cfg.zero_stage >= 2 else 0.0
    reduce_s = bucket_s = 0.0
    buckets = 1
    if cfg.zero_stage <= 1 and dp[1] >= 2:
        op = "reduce_scatter" if cfg.zero_stage == 1 else "all_reduce"
        if cfg.grad_reduce == "per_parameter":
            n = cost.num_tensors
        else:
            n = 1 if cfg.grad_bucket_bytes is None else max(1, math.ceil(gbytes / cfg.grad_bucket_bytes))
        per = pricer.shape_time_s(op, *dp, gbytes / n)
        if cfg.grad_reduce == "overlapped":
            # simdist.plan.step: the chunk's last backward is cut into n pieces, each followed by its bucket.
            buckets, bucket_s = n, per
        else:
            reduce_s = per * n
    tail = exposed + (max(0.0, ovl - cost.backward_s) if cfg.schedule != "zb_h1" else 0.0)
    return _Chunk(f, b, w, gather, scatter, reduce_s, bucket_s, buckets, tail_s=tail,
                  compute_s=cost.forward_s + cost.backward_s, recompute_s=cost.recompute_s,
                  comm_s=fwd_comm + rec_comm + exposed + (0.0 if cfg.schedule != "zb_h1" else ovl)
                  + max(0.0, ovl - cost.backward_s) * (cfg.schedule != "zb_h1"),
                  flops=cost.model_flops_forward + cost.model_flops_backward, params=cost.num_params)


def _gathers(c: _Chunk) -> int:
    """per_parameter ZeRO-3 gathers per micro-batch: forward, backward, and again after a recompute."""
    return 3 if c.recompute_s > 0 else 2


def _stage_period(chunks: list[_Chunk], zero_stage: int, per_parameter: bool = False) -> tuple[float, float]:
    """(per-micro-batch time of a stage through all its chunks, its zb_h1 W share).

    ZeRO-3 (simdist.plan.step): the dp stream runs, per chunk and micro-batch, the forward's gather, the
    backward's gather and the gradient scatter; the next forward's gather queues behind that scatter, so per
    micro-batch a chunk takes gather + max(f, gather) + b + scatter. ``per_parameter``: every gather and
    scatter blocks the compute, so they add up.
    """
    if zero_stage == 3 and per_parameter:
        return sum(c.f + c.b + c.w + _gathers(c) * c.gather_s + c.scatter_s for c in chunks), 0.0
    if zero_stage == 3:
        t = sum(c.gather_s + max(c.f, c.gather_s) + c.b + c.w + c.scatter_s for c in chunks)
        return t, 0.0
    return sum(c.f + c.b for c in chunks), sum(c.w for c in chunks)


def analytic_step(cfg: StepConfig, pricer: CommPricer) -> AnalyticStep:
    """Closed-form step time of ``cfg`` on ``pricer``'s cluster (see the module docstring)."""
    mesh, K, V = cfg.mesh, cfg.mesh.pp, cfg.vpp
    M = cfg.microbatches(0)
    stages: list[list[_Chunk]] = []
    params: list[float] = []
    gpn = pricer.topology.gpus_per_node
    seen: dict[tuple, list[_Chunk]] = {}
    for s in range(K):
        rank = mesh.rank(pp=s)
        layers = chunk_layers(cfg.layers_per_stage[s], V)
        # Stages alike (same layers, no embedding/head, same position in their node) cost alike: the groups
        # are priced by shape (CommPricer), so one evaluation serves them all.
        same = (tuple(layers), s == 0, s == K - 1, rank % gpn)
        row = seen.get(same)
        if row is None:
            groups = {axis: (rank, mesh.size(axis), mesh.stride(axis)) for axis in ("tp", "cp", "dp")}
            row = []
            for c, n in enumerate(layers):
                part = c * K + s  # Megatron's interleaved layout (simdist.plan.step.build_step)
                cost = cached_chunk_cost(cfg, n, part == 0, part == K * V - 1)
                row.append(_chunk(cfg, pricer, cost, groups))
            seen[same] = row
        stages.append(row)
        params.append(sum(c.params for c in row))
    per_parameter = cfg.zero_stage == 3 and cfg.zero3_fetch == "per_parameter"
    periods = [_stage_period(row, cfg.zero_stage, per_parameter) for row in stages]
    T = [p for p, _ in periods]
    W = [w for _, w in periods]
    # p2p: one micro-batch's activation, b s/cp h elements, 1/tp per peer with scatter/gather or SP
    # (simdist.plan.step._Emitter.transfer; Narayanan et al. 2021 sec 4.1).
    p2p = 0.0
    if K > 1:
        nbytes = cfg.micro_batch_size * cfg.model.seq_length / mesh.cp * cfg.model.hidden_size
        nbytes *= bytes_per_element(cfg.precision)
        if cfg.scatter_gather or cfg.sequence_parallel:
            nbytes /= mesh.tp
        p2p = pricer.shape_time_s("send_recv", 0, 2, mesh.stride("pp"), nbytes)
    if K == 1:
        pipeline = M * T[0] + M * W[0]
        pp_comm = 0.0
    elif cfg.schedule == "zb_h1":
        # Qi et al. 2023 sec 3.1 (bubble_formula's makespan) with per-stage sums and the slowest stage's period.
        fb = max(T)
        pipeline = sum(T) + (M - 1) * fb + max(M - K + 1, 1) * max(W)
        pp_comm = 2 * (K - 1) * p2p + 2 * (M - 1) * p2p
        pipeline += pp_comm
    else:
        # Narayanan et al. 2021 sec 2.2: (M V + K - 1) chunk periods for uniform stages (V = 1: GPipe, 1F1B).
        pipeline = sum(T) / V + (M * V - 1) * max(T) / V
        pp_comm = 2 * (K - 1) * p2p + 2 * (M - 1) * p2p
        pipeline += pp_comm
    ends: list[float] = []
    dp_exposed: list[float] = []
    opt_times: list[float] = []
    opt_cache: dict[float, float] = {}
    drained = 0.0
    for s in range(K):
        row = stages[s]
        # The last backward reaches stage s after the stages above it drained theirs (chunk 0 runs last).
        end = pipeline - drained
        drained += row[0].b + row[0].w + (p2p if K > 1 else 0.0)
        exposed = 0.0
        if cfg.zero_stage == 2:
            # Per-micro-batch reduce_scatters on the dp stream behind the compute: the last is exposed, all of
            # them when they outlast the compute (exact with one stage: max((f+b) + M r, M (f+b) + r)).
            r = sum(c.scatter_s for c in row)
            lead = row[0].tail_s  # the last scatter starts when the backward compute ends, before these
            exposed = max(row[0].scatter_s - lead, M * r - (M - 1) * T[s] - lead, 0.0) if r > 0 else 0.0
        elif cfg.zero_stage <= 1:
            exposed = sum(c.reduce_s for c in row)
            for c in row:
                if c.buckets > 1 and c.bucket_s > 0:
                    # Overlapped buckets run behind the last backward's pieces; what outlasts them is exposed.
                    piece = c.compute_s / c.buckets
                    exposed += max(c.bucket_s, c.buckets * c.bucket_s - (c.buckets - 1) * piece)
        shard = params[s] / mesh.dp if cfg.zero_stage >= 1 else params[s]
        opt = opt_cache.get(shard)
        if opt is None:
            opt = opt_cache[shard] = kernels_time_s(cfg.gpu, adam_kernels(shard, precision=cfg.precision),
                                                    cfg.precision, cfg.compute_efficiency)
        gather = 0.0
        if cfg.zero_stage in (1, 2):
            gather = pricer.shape_time_s("all_gather", mesh.rank(pp=s), mesh.dp, mesh.stride("dp"),
                                         params[s] * bytes_per_element(cfg.precision))
        if per_parameter:
            exposed = sum(M * (_gathers(c) * c.gather_s + c.scatter_s) for c in row)
        elif cfg.zero_stage == 3:
            exposed = sum(M * (c.gather_s + max(c.gather_s - c.f, 0.0) + c.scatter_s) for c in row)
        ends.append(end + (exposed if cfg.zero_stage != 3 else 0.0) + opt + gather)
        dp_exposed.append(exposed + gather)
        opt_times.append(opt)
    step = max(ends)
    compute = sum(M * sum(c.compute_s for c in row) for row in stages) / K
    recompute = sum(M * sum(c.recompute_s for c in row) for row in stages) / K
    tp_comm = sum(M * sum(c.comm_s for c in row) for row in stages) / K
    flops = sum(M * sum(c.flops for c in row) for row in stages) / K
    opt_mean = sum(opt_times) / K
    dp_mean = sum(dp_exposed) / K
    bubble = max(step - compute - recompute - tp_comm - opt_mean - dp_mean - pp_comm, 0.0)
    tokens = cfg.global_batch_size * (cfg.model.seq_length if cfg.model.kind == "decoder" else 1)
    per_gpu = flops / step if step > 0 else 0.0
    return AnalyticStep(
        step_time_s=step, pipeline_s=pipeline, compute_s=compute, recompute_s=recompute, tp_comm_s=tp_comm,
        pp_comm_s=pp_comm, dp_exposed_s=dp_mean, optimizer_s=opt_mean, bubble_s=bubble,
        tokens_per_s=tokens / step if step > 0 else 0.0, model_tflops_per_gpu=per_gpu / 1e12,
        mfu=per_gpu / cfg.gpu.peak_flops(cfg.precision), num_microbatches=M)
