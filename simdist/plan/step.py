"""One training step as an op graph: the pipeline schedule of every simulated rank, with the tensor-,
context- and data-parallel communication each step needs, and the optimizer.

The graph holds one *representative* rank per pipeline stage and simulated data-parallel replica (tp and
cp coordinate 0): the tensor- and context-parallel peers of a rank run the same ops at the same times, and
so do the data-parallel replicas of a homogeneous layout. Every communication op still names its whole
group (its ``Comm.ranks``), so pricing sees the real placement. Replicas are simulated one by one where
they differ (``StepConfig.dp_batch_split``: unequal local batches, the lecture's straggler example).

What each step emits (per representative rank, in program order):
- F (forward of micro-batch m on model chunk c): [ZeRO-3 all_gather of the chunk's parameters on the dp
  stream, prefetched; or, with ``zero3_fetch: per_parameter``, one blocking all_gather per parameter tensor
  (DeepSpeed ZeRO-3 as of 2021: `_Emitter._per_parameter`)] -> compute -> the forward's exposed TP/CP
  collectives (Megatron-LM runs them on the compute stream between the GEMMs, Shoeybi et al. 2019 sec 3;
  counted back to back here).
- B: [ZeRO-3 all_gather] -> recompute (the recompute mode's forward work, with its collectives) ->
  [per_parameter: the all_gathers again, as the recompute's forward released them] ->
  backward compute, with the overlappable collectives (Megatron's asynchronous input-gradient all-reduce,
  hidden behind the weight-gradient GEMM) on the tp stream concurrently -> the exposed backward collectives
  -> [ZeRO-2/3 reduce_scatter of this micro-batch's gradients on the dp stream; per_parameter: one per
  tensor, blocking].
- W (zb_h1 only): the weight-gradient share of the backward.
- after a chunk's last backward: its gradient reduction on the dp stream (all_reduce, or reduce_scatter
  under ZeRO-1 = Megatron's distributed optimizer), per parameter / in buckets / overlapped with the last
  backward as ``grad_reduce`` says; then the optimizer on the compute stream and, under ZeRO-1/2, the
  all_gather of the updated parameters.
- between stages: the activation (F) or its gradient (B) as a send_recv on the sender's pp stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from simdist.hardware.compute import kernels_time_s
from simdist.plan.layer_cost import Kernel, bytes_per_element
from simdist.plan.layer_cost import optimizer_kernels as adam_kernels
from simdist.plan.memory import MemoryBreakdown, in_flight_microbatches, stage_memory
from simdist.plan.opgraph import Comm, Op, OpGraph
from simdist.plan.pipeline import build_pipeline
from simdist.plan.schedule import Step, schedule_order
from simdist.plan.step_config import (
    ChunkCost,
    StepConfig,
    chunk_cost,
    chunk_layers,
    grad_bytes_per_element,
    split_layers,
)


@dataclass(slots=True)
class StepPlan:
    config: StepConfig
    graph: OpGraph
    stage_ranks: dict[tuple[int, int], int]
    """(stage, dp index) -> representative global rank."""
    memory: list[MemoryBreakdown]
    """Per stage."""
    chunk_costs: dict[tuple[int, int], ChunkCost] = field(default_factory=dict)
    """(stage, chunk) -> cost."""
    reduced_axes: tuple[str, ...] = ()
    """Axes whose ranks the graph leaves out (each simulated rank stands for its peers along them)."""

    @property
    def representative_ranks(self) -> list[int]:
        return sorted(set(self.stage_ranks.values()))


# ----------------------------------------------------------------------------- graph
class _Emitter:
    """Adds each schedule step's ops for one data-parallel replica (simdist.plan.pipeline.PipelineEmitter)."""

    def __init__(self, cfg: StepConfig, dp_index: int, costs: dict[tuple[int, int], ChunkCost],
                 ranks: dict[int, int], num_microbatches: int) -> None:
        self.cfg, self.dp_index, self.costs, self.ranks = cfg, dp_index, costs, ranks
        self.num_microbatches = num_microbatches
        self.last: dict[int, int] = {}          # stage -> last op of the previous step's chain
        self.last_backward: dict[tuple[int, int], int] = {}  # (stage, chunk) -> last backward/W op
        self.dp_ops: dict[int, list[int]] = {}   # stage -> its gradient-reduction ops
        self._groups: dict[tuple[str, int], tuple[int, ...]] = {}

    # -- helpers
    def _group(self, axis: str, stage: int) -> tuple[int, ...]:
        key = (axis, stage)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = self.cfg.mesh.group(axis, self.ranks[stage])
        return g

    def _op(self, graph: OpGraph, stage: int, stream: str, kind: str, name: str, step: Step | None,
            duration_s: float = math.nan, deps: tuple[int, ...] = (), comm: Comm | None = None,
            model_flops: float = 0.0, hardware_flops: float = 0.0) -> int:
        return graph.add(Op(
            name=name, rank=self.ranks[stage], stream=stream, kind=kind, duration_s=duration_s, deps=list(deps),
            stage=stage, microbatch=step.microbatch if step else -1, chunk=step.chunk if step else -1,
            comm=comm, model_flops=model_flops, hardware_flops=hardware_flops))

    def _comm_chain(self, graph: OpGraph, stage: int, step: Step, items: tuple, after: tuple[int, ...],
                    label: str) -> list[int]:
        ids: list[int] = []
        deps = after
        for op, nbytes, axis, count in items:
            group = self._group(axis, stage)
            if len(group) < 2:
                continue
            i = self._op(graph, stage, axis, "comm", f"{label} {op} x{count}", step, deps=deps,
                         comm=Comm(op, group, nbytes, axis, count))
            ids.append(i)
            deps = (i,)
        return ids

    def _dp_comm(self, graph: OpGraph, stage: int, step: Step | None, op: str, nbytes: float, count: int,
                 deps: tuple[int, ...], label: str, host_s: float = 0.0) -> int | None:
        group = self._group("dp", stage)
        if len(group) < 2 or nbytes <= 0:
            return None
        i = self._op(graph, stage, "dp", "comm", label, step, deps=deps,
                     comm=Comm(op, group, nbytes, "dp", count, host_s))
        return i

    def _per_parameter(self, graph: OpGraph, stage: int, step: Step, op: str, nbytes: float,
                       deps: tuple[int, ...], label: str) -> int | None:
        """ZeRO-3 ``per_parameter``: one blocking ``op`` per parameter tensor of the chunk (``nbytes`` in all).

        DeepSpeed's ZeRO-3 of 2021 gathered each parameter with ``torch.distributed.all_gather`` into a list of
        dp views, one per rank, and reduce-scattered each gradient from such a list (deepspeed/runtime/zero/
        partition_parameters.py, ``_allgather_param`` and ``_reduce_scatter_gradient``, v0.3); the fetch of a
        module waits for its gathers before the module runs, and the gradient hook waits for its scatters.
        PyTorch's list collectives copy every rank's view to (from) one flat buffer, one eager op per rank
        (ProcessGroupNCCL::allgather / reduce_scatter with tensor lists), so each run also costs dp host ops.
        """
        # Assumption: equal-sized tensors (the chunk's bytes / its tensors); small tensors are latency-bound
        # either way, and above a few MB a collective's time is linear in its size.
        n = self.costs[(stage, step.chunk)].num_tensors
        host_s = self.cfg.mesh.dp * self.cfg.host_op_s
        return self._dp_comm(graph, stage, step, op, nbytes / n, n, deps, f"{label} per parameter x{n}", host_s)

    # -- PipelineEmitter
    def compute(self, graph: OpGraph, stage: int, step: Step) -> tuple[int, int]:
        cfg = self.cfg
        cost = self.costs[(stage, step.chunk)]
        prev = (self.last[stage],) if stage in self.last else ()
        tag = f"{step.kind}{step.microbatch}" + (f".{step.chunk}" if cfg.vpp > 1 else "")
        pbytes = cost.num_params * bytes_per_element(cfg.precision)
        first: int | None = None
        per_parameter = cfg.zero_stage == 3 and cfg.zero3_fetch == "per_parameter"
        if cfg.zero_stage == 3 and step.kind in ("F", "B"):
            # ZeRO-3: gather the chunk's parameters before using them (Rajbhandari et al. 2020 sec 5.3).
            # nccl-tests size of an all_gather: the gathered output, the chunk's full (tp-sharded) parameters.
            if per_parameter:
                # blocking, tensor by tensor, after the previous compute (no prefetch)
                ag = self._per_parameter(graph, stage, step, "all_gather", pbytes, prev, f"{tag} params all_gather")
                if ag is not None:
                    prev = (ag,)
            else:
                # the dp stream runs ahead, so the gather of the next step prefetches behind this compute
                ag = self._dp_comm(graph, stage, step, "all_gather", pbytes, 1, (), f"{tag} params all_gather")
                if ag is not None:
                    prev = (*prev, ag)
            first = ag
        if step.kind == "F":
            c = self._op(graph, stage, "compute", "forward", tag, step, cost.forward_s, prev,
                         model_flops=cost.model_flops_forward, hardware_flops=cost.model_flops_forward)
            chain = [c, *self._comm_chain(graph, stage, step, cost.forward_comm, (c,), tag)]
        else:
            chain = []
            deps = prev
            if cost.recompute_s > 0 and step.kind == "B":
                r = self._op(graph, stage, "compute", "recompute", f"{tag} recompute", step, cost.recompute_s, deps,
                             hardware_flops=cost.recompute_flops)
                chain += [r, *self._comm_chain(graph, stage, step, cost.recompute_comm, (r,), f"{tag} recompute")]
                deps = (chain[-1],)
                if per_parameter:
                    # DeepSpeed releases a module's gathered parameters after its forward, so the backward
                    # gathers them again after the recompute's forward used them.
                    again = self._per_parameter(graph, stage, step, "all_gather", pbytes, deps,
                                                f"{tag} params all_gather again")
                    if again is not None:
                        chain.append(again)
                        deps = (again,)
            split = cfg.schedule == "zb_h1"
            share = 0.5  # Assumption: input and weight gradients cost half the backward each (2 of the 4 GEMM passes).
            if step.kind == "W":
                b_s, flops = cost.backward_s * share, cost.model_flops_backward * share
            elif split:
                b_s, flops = cost.backward_s * (1 - share), cost.model_flops_backward * (1 - share)
            else:
                b_s, flops = cost.backward_s, cost.model_flops_backward
            kind = "weight_grad" if step.kind == "W" else "backward"
            overlapped: list[int] = []
            if step.kind == "B":
                comm_items = cost.backward_comm + (cost.backward_overlapped_comm if split else ())
                if not split:
                    overlapped = self._comm_chain(graph, stage, step, cost.backward_overlapped_comm, deps,
                                                  f"{tag} overlapped")
            pieces = self._grad_pieces(stage, step)
            last_compute: int | None = None
            for k in range(pieces):
                last_compute = self._op(graph, stage, "compute", kind, tag if pieces == 1 else f"{tag}/{k}", step,
                                        b_s / pieces, deps if last_compute is None else (last_compute,),
                                        model_flops=flops / pieces, hardware_flops=flops / pieces)
                chain.append(last_compute)
                if self._overlaps_reduction(step):
                    self._reduce_bucket(graph, stage, step, k, pieces, (last_compute,))
            assert last_compute is not None
            chain += overlapped
            if step.kind == "B":
                exposed = self._comm_chain(graph, stage, step, comm_items, (last_compute, *overlapped[-1:]), tag)
                if overlapped and not exposed:
                    # The step ends when both its compute and its overlapped collectives are done (Megatron
                    # waits on the asynchronous handle before leaving the layer's backward).
                    exposed = [self._op(graph, stage, "compute", "wait", f"{tag} wait", step, 0.0,
                                        (last_compute, overlapped[-1]))]
                chain += exposed
            if cfg.zero_stage >= 2 and (step.kind == "W" or not split):
                # ZeRO-2/3 reduce-scatter each micro-batch's gradients (Rajbhandari et al. 2020 sec 5.2).
                # nccl-tests size of a reduce_scatter: the full input, every gradient of the chunk.
                gb = cost.num_params * grad_bytes_per_element(cfg.precision)
                if per_parameter:
                    rs = self._per_parameter(graph, stage, step, "reduce_scatter", gb, (chain[-1],),
                                             f"{tag} grads reduce_scatter")
                    if rs is not None:
                        chain.append(rs)  # blocking: the next compute waits for it
                else:
                    rs = self._dp_comm(graph, stage, step, "reduce_scatter", gb, 1, (last_compute,),
                                       f"{tag} grads reduce_scatter")
                if rs is not None:
                    self.dp_ops.setdefault(stage, []).append(rs)
            if step.kind == "W" or not split:
                self.last_backward[(stage, step.chunk)] = chain[-1]
        if first is not None and (not chain or chain[0] != first):
            chain.insert(0, first)
        self.last[stage] = chain[-1]
        return chain[0], chain[-1]

    def transfer(self, graph: OpGraph, src_stage: int, dst_stage: int, step: Step) -> int | None:
        cfg, m = self.cfg, self.cfg.model
        if src_stage == dst_stage:
            return None
        # One micro-batch's activation (or its gradient): b x s x h elements (Narayanan et al. 2021 sec 3.2:
        # "bsh" per micro-batch between stages), 1/tp of it per peer with scatter/gather or sequence parallelism.
        nbytes = cfg.micro_batch_size * m.seq_length / cfg.mesh.cp * m.hidden_size * bytes_per_element(cfg.precision)
        if cfg.scatter_gather or cfg.sequence_parallel:
            nbytes /= cfg.mesh.tp
        src, dst = self.ranks[src_stage], self.ranks[dst_stage]
        tag = f"{step.kind}{step.microbatch}" + (f".{step.chunk}" if cfg.vpp > 1 else "")
        return self._op(graph, src_stage, "pp", "comm", f"{tag} send to stage {dst_stage}", step,
                        comm=Comm("send_recv", (src, dst), nbytes, "pp", 1))

    # -- gradient reduction
    def _overlaps_reduction(self, step: Step) -> bool:
        """The chunk's last backward, with overlapped gradient reduction: its buckets go out as it runs."""
        cfg = self.cfg
        last = step.microbatch == self.num_microbatches - 1 and (step.kind == "W" or cfg.schedule != "zb_h1")
        return cfg.grad_reduce == "overlapped" and last and cfg.zero_stage < 2 and step.kind != "F"

    def _grad_pieces(self, stage: int, step: Step) -> int:
        return self._num_buckets(stage, step.chunk) if self._overlaps_reduction(step) else 1

    def _grad_bytes(self, stage: int, chunk: int) -> float:
        return self.costs[(stage, chunk)].num_params * grad_bytes_per_element(self.cfg.precision)

    def _num_buckets(self, stage: int, chunk: int) -> int:
        b = self.cfg.grad_bucket_bytes
        return 1 if b is None else max(1, math.ceil(self._grad_bytes(stage, chunk) / b))

    def _reduce_bucket(self, graph: OpGraph, stage: int, step: Step, k: int, pieces: int,
                       deps: tuple[int, ...]) -> None:
        op = "reduce_scatter" if self.cfg.zero_stage == 1 else "all_reduce"
        nbytes = self._grad_bytes(stage, step.chunk) / pieces
        i = self._dp_comm(graph, stage, Step(step.kind, -1, step.chunk), op, nbytes, 1,
                          deps, f"grads bucket {k} {op}")
        if i is not None:
            self.dp_ops.setdefault(stage, []).append(i)

    def _reduce_chunk(self, graph: OpGraph, stage: int, step: Step, deps: tuple[int, ...]) -> None:
        cfg = self.cfg
        if cfg.zero_stage >= 2:
            return
        total = self._grad_bytes(stage, step.chunk)
        op = "reduce_scatter" if cfg.zero_stage == 1 else "all_reduce"
        # all_reduce and reduce_scatter both take the whole gradient buffer as their nccl-tests size (for a
        # reduce_scatter, the full input each rank contributes; each keeps 1/dp of the reduced result).
        if cfg.grad_reduce == "per_parameter":
            # The lecture's data parallelism: one all_reduce per parameter tensor after the backward.
            n = self.costs[(stage, step.chunk)].num_tensors
            i = self._dp_comm(graph, stage, step, op, total / n, n, deps, f"grads {op} per parameter x{n}")
        else:
            n = self._num_buckets(stage, step.chunk)
            i = self._dp_comm(graph, stage, step, op, total / n, n, deps, f"grads {op} x{n}")
        if i is not None:
            self.dp_ops.setdefault(stage, []).append(i)

    def reduce_grads(self, graph: OpGraph, stage: int) -> None:
        """Gradient reduction after the backward (per parameter or in buckets), unless overlapped.

        As Megatron-LM without --overlap-grad-reduce (and the lecture's data parallelism): the reduction
        starts once the stage's whole backward is done (Korthikanti et al. 2022 sec 6.3 ran 530B this way).
        """
        if self.cfg.grad_reduce == "overlapped" or self.cfg.zero_stage >= 2:
            return
        done = tuple(v for (s, _), v in self.last_backward.items() if s == stage)
        for c in range(self.cfg.vpp):
            # microbatch -1: the reduction belongs to the step, not to a micro-batch (replicas with unequal
            # batches then still meet in the same collective).
            self._reduce_chunk(graph, stage, Step("B", -1, c), done)

    def finish(self, graph: OpGraph, stage: int) -> None:
        """The optimizer after every gradient reduction of the stage (collectives end together on all members)."""
        cfg = self.cfg
        params = sum(c.num_params for (s, _), c in self.costs.items() if s == stage)
        shard = params / cfg.mesh.dp if cfg.zero_stage >= 1 else params
        t = kernels_time_s(cfg.gpu, adam_kernels(shard, precision=cfg.precision), cfg.precision,
                           cfg.compute_efficiency)
        deps = tuple(self.dp_ops.get(stage, [])) + tuple(v for (s, _), v in self.last_backward.items() if s == stage)
        opt = self._op(graph, stage, "compute", "optimizer", "optimizer", None, t, deps)
        if cfg.zero_stage in (1, 2):
            # Gather the updated parameter shards (Megatron distributed optimizer / ZeRO-1,2).
            self._dp_comm(graph, stage, None, "all_gather", params * bytes_per_element(cfg.precision), 1, (opt,),
                          "params all_gather")


def build_step(cfg: StepConfig, *, full: bool = False) -> StepPlan:
    """The op graph of one step (see the module docstring).

    By default one representative rank per pipeline stage (tp and cp coordinate 0) and per simulated
    data-parallel replica (only replica 0 unless ``dp_batch_split`` makes them differ); ``full`` simulates
    every rank (for checking the reduction: simdist.predict accounts for the ranks a reduced graph leaves out).
    Ops of different simulated ranks that are the same collective share a ``sync`` id.
    """
    mesh, model = cfg.mesh, cfg.model
    K = mesh.pp
    cfg.check()
    dp_indices = tuple(range(mesh.dp)) if (full or cfg.dp_batch_split is not None) else (0,)
    peers = [(t, c) for t in range(mesh.tp) for c in range(mesh.cp)] if full else [(0, 0)]
    costs: dict[tuple[int, int], ChunkCost] = {}
    num_parts = K * cfg.vpp
    for s in range(K):
        for c, n in enumerate(chunk_layers(cfg.layers_per_stage[s], cfg.vpp)):
            part = c * K + s  # Megatron's interleaved layout: chunk c of stage s is model part c*K + s
            costs[(s, c)] = chunk_cost(cfg, n, part == 0, part == num_parts - 1)
    graph = OpGraph()
    stage_ranks: dict[tuple[int, int], int] = {}
    emitters: list[_Emitter] = []
    for d in dp_indices:
        for t, c in peers:
            ranks = {s: mesh.rank(pp=s, dp=d, tp=t, cp=c) for s in range(K)}
            if (t, c) == (0, 0):
                stage_ranks.update({(s, d): r for s, r in ranks.items()})
            m = cfg.microbatches(d)
            order = schedule_order(cfg.schedule, num_stages=K, num_microbatches=m, vpp=cfg.vpp)
            em = _Emitter(cfg, d, costs, ranks, m)
            build_pipeline(graph, order, em, vpp=cfg.vpp)
            emitters.append(em)
    for s in range(K):
        for em in emitters:
            em.reduce_grads(graph, s)
        for em in emitters:
            em.finish(graph, s)
    _link_instances(graph)
    simulated = {"tp": full, "cp": full, "dp": len(dp_indices) > 1 or mesh.dp == 1}
    memory = [
        stage_memory(
            model, layers_on_stage=cfg.layers_per_stage[s], first_stage=s == 0, last_stage=s == K - 1,
            tp=mesh.tp, pp=K, dp=mesh.dp, cp=mesh.cp, vpp=cfg.vpp, sequence_parallel=cfg.sequence_parallel,
            zero_stage=cfg.zero_stage, micro_batch_size=cfg.micro_batch_size, recompute=cfg.recompute,
            precision=cfg.precision,
            in_flight_microbatches=in_flight_microbatches(cfg.schedule, num_stages=K,
                                                          num_microbatches=max(cfg.microbatches(d)
                                                                               for d in dp_indices),
                                                          vpp=cfg.vpp, stage=s),
            capacity_bytes=cfg.capacity_bytes, attention=cfg.attention)
        for s in range(K)
    ]
    reduced = tuple(a for a in ("tp", "cp", "dp") if not simulated[a] and mesh.size(a) > 1)
    return StepPlan(cfg, graph, stage_ranks, memory, costs, reduced_axes=reduced)


def _link_instances(graph: OpGraph) -> None:
    """Give the member ops of one collective (same group, op, size, step) on different ranks one sync id."""
    by_key: dict[tuple, list[int]] = {}
    for i, op in enumerate(graph.ops):
        c = op.comm
        if c is not None and c.op != "send_recv":
            by_key.setdefault((c.op, c.ranks, c.nbytes, c.count, op.name, op.microbatch, op.chunk, op.stage),
                              []).append(i)
    next_id = 0
    for members in by_key.values():
        if len({graph.ops[i].rank for i in members}) > 1:
            for i in members:
                graph.ops[i].sync = next_id
            next_id += 1


# Re-exported: what callers (simdist.predict, simdist.analytic.step, the tests) import from here.
__all__ = ["ChunkCost", "Kernel", "StepConfig", "StepPlan", "build_step", "chunk_cost",
           "chunk_layers", "grad_bytes_per_element", "split_layers"]
