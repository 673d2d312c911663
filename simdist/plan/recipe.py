"""The one step model: what each pipeline step of a model chunk emits.

Both fidelities read this module and its data-parallel side (simdist.plan.data_parallel: the groups, gradient
buckets and parameter gathers, and a stage's `tail` after its last step), nothing else about a training step's
structure: the op-graph builder (simdist.plan.step) instantiates a recipe once per scheduled step on every
simulated rank, and the closed form (simdist.analytic.step) times the same pieces without building a graph. A rule
(what ZeRO-3 gathers, where a gradient bucket goes, how many bytes cross a pipeline boundary, what the optimizer
updates) is decided once, in one of the two.

A `Recipe` is a small DAG of `Piece`s on the streams of one rank (compute, tp, cp, dp): compute pieces carry
their duration, communication pieces a `CommItem` (op, nbytes, axis: the group is resolved by the consumer, on
the real mesh or by shape). ``deps`` name earlier pieces of the same recipe, or `PREV` (the end of the stage's
previous step, i.e. program order through the step's chain). The piece marked ``needs_input`` also waits for the
activation (F) or gradient (B) from the neighbouring stage. ``end`` is the piece that ends the step: the next
step on the stage follows it, and the send to the neighbouring stage leaves after it (``send``).

Per representative rank, in program order (the rules, with their sources):
- F (forward of micro-batch m on chunk c): [ZeRO-3 all_gather of the chunk's parameters on the dp stream: issued
  ahead, with no dependency (prefetch, as PyTorch FSDP); or, ``zero3_fetch: per_parameter``, one blocking
  all_gather per parameter tensor (DeepSpeed ZeRO-3 as of 2021: data_parallel._per_parameter)] -> forward compute
  -> the forward's exposed TP/CP collectives (Megatron-LM runs them between the GEMMs, Shoeybi et al. 2019 sec 3;
  counted back to back here). With ``overlap_param_gather`` the chunk's first micro-batch (its *edge* forward,
  `is_edge`) gathers the updated parameters bucket by bucket on the dp stream, its forward compute cut into one
  slice per bucket, each slice waiting for its bucket's gather (data_parallel._gathered_forward).
- B: [ZeRO-3 all_gather] -> recompute (the recompute mode's forward, with its collectives) -> [per_parameter:
  the all_gathers again, as the recompute's forward released them] -> backward compute: the input gradients
  (dgrad), then the weight gradients (wgrad; cut into the chunk's gradient buckets on the last micro-batch when
  the reduction overlaps it) with the overlappable collectives (Megatron's asynchronous input-gradient
  all-reduce, launched after dgrad and hidden behind wgrad) on the tp stream beside it -> the exposed backward
  collectives -> [ZeRO-2/3 reduce_scatter of this micro-batch's gradients on the dp stream; per_parameter: one
  per tensor, blocking].
- W (split-backward schedules only: zb_h1, zb_v, dualpipe, dualpipev, simdist.plan.schedule.SPLIT_BACKWARD): the
  weight-gradient share of the backward; their B is the input-gradient share, with every backward collective
  exposed.
- after the stage's last backwards: gradient reduction, optimizer, parameter all_gather (data_parallel.tail).
- between stages: the activation (F) or its gradient (B) as a send_recv on the sender's pp stream (`send`).
"""

from __future__ import annotations

import dataclasses
import functools

from simdist.plan.chunk_cost import ChunkCost
from simdist.plan.comm_overlap import overlapped_comm
from simdist.plan.data_parallel import (
    _bucket_order,
    _gathered_forward,
    _label,
    _per_parameter,
    data_parallel_groups,
    overlaps_reduction,
    param_bytes_per_element,
)
from simdist.plan.fsdp import backward_first_gather, fsdp_backward, fsdp_forward, replica_reduce
from simdist.plan.interference import tax
from simdist.plan.layer_cost import bytes_per_element
from simdist.plan.mesh import Mesh
from simdist.plan.moe_pairing import step_pairing
from simdist.plan.pieces import (
    DP_DONE,
    LAST_BACKWARDS,
    PREV,
    Builder,
    CommItem,
    Piece,
    Recipe,
    StageTail,
)
from simdist.plan.schedule import SPLIT_BACKWARD, WEIGHT_GRAD_SHARE, chunk_microbatches
from simdist.plan.step_config import StepConfig, grad_bytes_per_element

__all__ = ["DP_DONE", "GROUP_AXES", "LAST_BACKWARDS", "PREV", "CommItem", "Piece", "Recipe", "StageTail",
           "edge_recipe", "is_edge", "p2p_bytes", "send", "step_recipe"]

GROUP_AXES = ("tp", "cp", "dp", "pp", "ep", "etp", "edp", "dp_cp", "dps", "dpr", "dps_cp")
"""The axes a recipe's collectives run along (simdist.plan.mesh: the dense and the expert generators' groups, and
the data-parallel group with context parallelism)."""


def _groups(cfg: StepConfig) -> dict[str, int]:
    """Ranks per group of every axis a recipe's collectives run along (a copy: the callers' own)."""
    return dict(_group_sizes(cfg.mesh))


@functools.lru_cache(maxsize=4096)
def _group_sizes(mesh: Mesh) -> dict[str, int]:
    """`_groups` of a mesh, computed once per mesh (every recipe of a search's layouts asks)."""
    return {a: mesh.size(a) for a in GROUP_AXES}


def is_edge(kind: str, microbatch: int, num_microbatches: int, schedule: str = "1f1b", chunk: int = 0) -> bool:
    """Whether a step is its chunk's *edge* micro-batch, the one whose recipe differs from the others': a forward's
    first (where overlapped parameter gathers come in), a backward's or W's last (where overlapped gradient buckets
    go out); dualpipe's chunks run half the micro-batches each (simdist.plan.schedule.chunk_microbatches). Recipes
    are keyed (stage, chunk, kind, edge)."""
    first, last = chunk_microbatches(schedule, chunk, num_microbatches)
    return microbatch == (first if kind == "F" else last)


def edge_recipe(cfg: StepConfig, cost: ChunkCost, kind: str, edge: bool, alone: bool = False) -> Recipe:
    """`step_recipe` of a ``kind`` step that is (``edge``) or is not its chunk's edge micro-batch (`is_edge`);
    ``alone``: one the 1F1B A2A overlap runs without a partner (simdist.plan.comm_overlap.unpaired)."""
    return step_recipe(cfg, cost, kind, first=edge and kind == "F", last=edge and kind != "F", alone=alone)


def _ring(b: Builder, after: int, ring_s: float, items: tuple, groups: dict[str, int], interference: float = 0.0
          ) -> int:
    """The context-parallel ring steps (cp_comm_type p2p, simdist.plan.context_parallel): ``ring_s`` of attention on
    the compute stream beside the KV exchanges on the cp stream, both after ``after``; returns the piece that ends
    when both are done (per layer a_l + max(r_l, c_l), summed over alike layers: A + max(R, C))."""
    if ring_s <= 0 and not items:
        return after
    kind = b.pieces[after].kind if b.pieces[after].kind in ("forward", "backward", "recompute") else "forward"
    r = b.add(Piece("compute", kind, "/ring attention", ring_s, deps=(after,)))
    chain = b.chain(items, (after,), "ring", groups)
    if not chain:
        return r
    r = tax(b, r, chain, ring_s, interference, kind)  # the exchanges run beside the ring's attention
    return b.add(Piece("compute", "wait", "wait", 0.0, deps=(r, chain[-1])))


def _expert_comm(b: Builder, pieces: list[int]) -> list[int]:
    """Of collectives run beside a step's compute, the expert-parallel all_to_alls (Megatron-Core's 1F1B A2A overlap):
    the ones simdist.plan.interference taxes (the tensor-parallel ones of TP overlap price their SMs themselves)."""
    return [i for i in pieces if b.pieces[i].comm is not None and b.pieces[i].comm.axis == "ep"]


def step_recipe(cfg: StepConfig, cost: ChunkCost, kind: str, *, last: bool = False, first: bool = False,
                alone: bool = False) -> Recipe:
    """The pieces of one ``kind`` ("F", "B", "W") step of a chunk of cost ``cost``; ``last``: its last
    micro-batch (where an overlapped gradient reduction goes out); ``first``: its first (where overlapped parameter
    gathers come in); ``alone``: a step the 1F1B A2A overlap runs without a partner (its all_to_alls in its path:
    simdist.plan.comm_overlap.overlapped_comm)."""
    groups = _groups(cfg)
    ring = (cost.ring_forward_s, cost.ring_forward_comm) if kind == "F" else \
        (cost.ring_backward_s, cost.ring_backward_comm) if kind == "B" else (0.0, ())
    if ring[0] > 0 or ring[1]:
        # the ring steps are timed beside their exchanges after the rest of the step's compute (`_ring`)
        cost = dataclasses.replace(cost, forward_s=cost.forward_s - cost.ring_forward_s,
                                   backward_s=cost.backward_s - cost.ring_backward_s)
    if cfg.zero_stage == 3 and cfg.zero3_fetch == "per_layer" and kind in ("F", "B"):
        return _fsdp_step(cfg, cost, kind, first, last, groups, ring, alone)
    b = Builder()
    per_parameter = cfg.zero_stage == 3 and cfg.zero3_fetch == "per_parameter"
    shards = data_parallel_groups(cfg, cost.num_params, cost.expert_params)
    pbpe = param_bytes_per_element(cfg)
    prev: tuple[int, ...] = (PREV,)
    if cfg.zero_stage == 3 and kind in ("F", "B"):
        # ZeRO-3: gather the chunk's parameters before using them (Rajbhandari et al. 2020 sec 5.3); the
        # nccl-tests size of an all_gather is the gathered output, the chunk's full (tp-sharded) parameters.
        for axis, n in shards:
            if per_parameter:
                # blocking, tensor by tensor, after the previous step (no prefetch)
                prev = (b.add(_per_parameter(cfg, cost, "all_gather", n * pbpe, prev, "params all_gather", axis)),)
            else:
                # the dp stream runs ahead: the gather of the next step prefetches behind this step's compute
                prev = (*prev, b.add(Piece("dp", "comm", _label(axis, "params all_gather"),
                                           comm=CommItem("all_gather", n * pbpe, axis))))
    # Megatron-Core synchronizes the device after each pipeline send/recv: a step of a stage with neighbours starts
    # on an empty GPU queue, idle until the host's first kernel arrives (simdist.hardware.host). Charged to the
    # step's first compute piece (zb_h1's W follows its B without a send).
    gap = cfg.host_overhead.step_gap_s if groups["pp"] >= 2 and kind != "W" else 0.0
    split = cfg.schedule in SPLIT_BACKWARD
    if kind == "F":
        hidden_items, items = overlapped_comm(cfg, cost.forward_comm, groups, alone)
        gathered = first and cfg.overlap_param_gather and cfg.zero_stage == 1 and bool(shards)
        entry = -1
        if hidden_items or (gathered and cfg.vpp == 1):
            # (without interleaving the first bucket's gather is launched once the forward starts, after its input)
            entry = b.add(Piece("compute", "wait", "a2a overlap" if hidden_items else "params gather", 0.0,
                                deps=prev, needs_input=True))
        start = prev if entry < 0 else (entry,)
        if gathered:
            c = _gathered_forward(cfg, cost, b, shards, start, gap, entry < 0)[-1]
        else:
            c = b.add(Piece("compute", "forward", "", cost.forward_s + gap, deps=start,
                            needs_input=entry < 0, model_flops=cost.model_flops_forward,
                            hardware_flops=cost.model_flops_forward))
        return _forward_tail(b, cfg, cost, c, entry, hidden_items, items, groups, ring)
    chain: list[int] = []
    deps = prev
    needs_input = True
    if cost.recompute_s > 0 and kind == "B":
        r = b.add(Piece("compute", "recompute", "recompute", cost.recompute_s + gap, deps=deps, needs_input=True,
                        hardware_flops=cost.recompute_flops))
        needs_input, gap = False, 0.0
        chain += [r, *b.chain(cost.recompute_comm, (r,), "recompute", groups)]
        deps = (chain[-1],)
        for axis, n in shards if per_parameter and cfg.zero_stage == 3 else ():
            # DeepSpeed releases a module's gathered parameters after its forward, so the backward gathers them
            # again after the recompute's forward used them.
            again = b.add(_per_parameter(cfg, cost, "all_gather", n * pbpe, deps, "params all_gather again", axis))
            chain.append(again)
            deps = (again,)
    if kind == "W":
        b_s, flops = cost.backward_s * WEIGHT_GRAD_SHARE, cost.model_flops_backward * WEIGHT_GRAD_SHARE
    elif split:
        b_s, flops = cost.backward_s * (1 - WEIGHT_GRAD_SHARE), cost.model_flops_backward * (1 - WEIGHT_GRAD_SHARE)
    else:
        b_s, flops = cost.backward_s, cost.model_flops_backward
    compute_kind = "weight_grad" if kind == "W" else "backward"
    overlapped: list[int] = []
    comm_items: tuple = ()
    hidden: list[int] = []
    if kind == "B":
        comm_items = cost.backward_comm + (cost.backward_overlapped_comm if split else ())
        hidden_items, comm_items = overlapped_comm(cfg, comm_items, groups, alone) \
            if not split else ((), comm_items)
        if hidden_items:
            entry = b.add(Piece("compute", "wait", "a2a overlap", 0.0, deps=deps, needs_input=needs_input))
            hidden = b.chain(hidden_items, (entry,), "overlapped", groups)
            deps, needs_input = (entry,), False
        if not split and any(groups.get(item[2], 1) >= 2 for item in cost.backward_overlapped_comm):
            # Megatron's asynchronous input-gradient all-reduce (Shoeybi et al. 2019 sec 3; megatron/core/
            # tensor_parallel/layers.py, LinearWithGradAccumulationAndAsyncCommunication): each layer's input
            # gradient (dgrad) is computed first, its all-reduce launched, and the weight gradient (wgrad) computed
            # while it runs. Per chunk: dgrad, then the collectives beside wgrad (summed over identical layers,
            # sum_l dgrad + max(wgrad, comm) = dgrad + max(sum wgrad, sum comm)).
            dgrad = b.add(Piece("compute", "backward", "dgrad", b_s * (1 - WEIGHT_GRAD_SHARE) + gap, deps=deps,
                                needs_input=needs_input, model_flops=flops * (1 - WEIGHT_GRAD_SHARE),
                                hardware_flops=flops * (1 - WEIGHT_GRAD_SHARE)))
            chain.append(dgrad)
            overlapped = b.chain(cost.backward_overlapped_comm, (dgrad,), "overlapped", groups)
            deps, needs_input, gap = (dgrad,), False, 0.0
            b_s, flops = b_s * WEIGHT_GRAD_SHARE, flops * WEIGHT_GRAD_SHARE
    overlapping = overlaps_reduction(cfg, kind, last)
    reduce_op = "reduce_scatter" if cfg.zero_stage == 1 else "all_reduce"
    gbpe = grad_bytes_per_element(cfg.precision, cfg.grad_reduce_in_fp32)
    # the buckets of each group in the order their gradients are ready (`_bucket_order`)
    order = _bucket_order(cfg, cost, shards) if overlapping else []
    buckets = max(1, len(order))
    last_compute = -1
    label = "wgrad" if overlapped else ""
    bucket_comms: list[int] = []
    for k in range(buckets):
        last_compute = b.add(Piece("compute", compute_kind, label if buckets == 1 else f"{label}/{k}",
                                   b_s / buckets + (gap if k == 0 else 0.0),
                                   deps=deps if last_compute < 0 else (last_compute,),
                                   needs_input=needs_input and last_compute < 0,
                                   model_flops=flops / buckets, hardware_flops=flops / buckets))
        chain.append(last_compute)
        if order:
            # Megatron-LM --overlap-grad-reduce: a bucket's reduction starts once its gradients are ready.
            axis, j, n = order[k]
            bucket_comms.append(b.add(Piece("dp", "comm", _label(axis, f"grads bucket {j} {reduce_op}"),
                                            comm=CommItem(reduce_op, n * gbpe, axis), deps=(last_compute,),
                                            per_step=True)))
    if len(bucket_comms) > 1:
        # every bucket's reduction but the last runs beside the rest of the backward (simdist.plan.interference)
        last_compute = tax(b, last_compute, bucket_comms[:-1], b_s * (buckets - 1) / buckets, cfg.interference,
                           compute_kind)
        chain.append(last_compute)
    if hidden:
        last_compute = tax(b, last_compute, _expert_comm(b, hidden), b_s, cfg.expert_interference, compute_kind,
                           step_pairing(cost.moe_pairing, "B"))
        chain.append(last_compute)
    if kind == "B" and (ring[0] > 0 or ring[1]):
        last_compute = _ring(b, last_compute, *ring, groups, cfg.interference)
        chain.append(last_compute)
    chain += overlapped
    # the step waits for its hidden all-to-alls, but where they are paired layer by layer with another micro-batch's
    # compute: their exposure is then the tax piece's (simdist.plan.moe_pairing)
    awaited = [] if cost.moe_pairing else hidden
    if kind == "B":
        exposed = b.chain(comm_items, (last_compute, *overlapped[-1:]), "", groups)
        if (overlapped or awaited) and not exposed:
            # The step ends when both its compute and its overlapped collectives are done (Megatron waits on
            # the asynchronous handle before leaving the layer's backward).
            exposed = [b.add(Piece("compute", "wait", "wait", 0.0,
                                   deps=(last_compute, *overlapped[-1:], *awaited[-1:])))]
        elif awaited:
            exposed.append(b.add(Piece("compute", "wait", "wait", 0.0, deps=(exposed[-1], awaited[-1]))))
        chain += exposed
    for axis, n in shards if cfg.zero_stage >= 2 and (kind == "W" or not split) else ():
        # ZeRO-2/3 reduce-scatter each micro-batch's gradients (Rajbhandari et al. 2020 sec 5.2); the nccl-tests
        # size of a reduce_scatter is the full input, every gradient of the chunk.
        if per_parameter:
            chain.append(b.add(_per_parameter(cfg, cost, "reduce_scatter", n * gbpe, (chain[-1],),
                                              "grads reduce_scatter", axis)))  # blocking: the next step waits
        else:
            rs = b.add(Piece("dp", "comm", _label(axis, "grads reduce_scatter"),
                             comm=CommItem("reduce_scatter", n * gbpe, axis), deps=(last_compute,)))
            replica_reduce(b, cfg, axis, n * gbpe, (rs,))
    return Recipe(tuple(b.pieces), chain[-1])


def _forward_tail(b: Builder, cfg: StepConfig, cost: ChunkCost, c: int, entry: int, hidden_items: list,
                  items: list, groups: dict[str, int], ring: tuple) -> Recipe:
    """A forward's end after its compute piece ``c``: the all-to-alls hidden behind it (from ``entry``) with the
    compute they slow down, the context-parallel ring, the exposed collectives, and a wait for the hidden ones (none
    where they are paired layer by layer: simdist.plan.moe_pairing)."""
    hidden = b.chain(hidden_items, (entry,), "overlapped", groups) if hidden_items else []
    c = tax(b, c, _expert_comm(b, hidden), cost.forward_s, cfg.expert_interference, "forward",
            step_pairing(cost.moe_pairing, "F"))
    c = _ring(b, c, *ring, groups, cfg.interference)
    chain = [c, *b.chain(items, (c,), "", groups)]
    if hidden and not cost.moe_pairing:  # paired, they are the tax piece's (simdist.plan.moe_pairing)
        chain.append(b.add(Piece("compute", "wait", "wait", 0.0, deps=(chain[-1], hidden[-1]))))
    return Recipe(tuple(b.pieces), chain[-1])


def _fsdp_step(cfg: StepConfig, cost: ChunkCost, kind: str, first: bool, last: bool, groups: dict[str, int],
               ring: tuple = (0.0, ()), alone: bool = False) -> Recipe:
    """A forward or backward of ZeRO-3 run as FSDP runs it (``zero3_fetch: per_layer``, simdist.plan.fsdp): the
    chunk's units gathered one ahead of their compute, their gradients reduce-scattered behind it (under no_sync only
    in the ``last`` micro-batch, the others' accumulated unsharded); the step's tensor- and context-parallel
    collectives after its compute, as `step_recipe`'s (the overlapped ones hidden likewise)."""
    b = Builder()
    ex = cfg.execution
    shards = data_parallel_groups(cfg, cost.num_params, cost.expert_params)
    pbpe = param_bytes_per_element(cfg)
    gbpe = grad_bytes_per_element(cfg.precision, cfg.grad_reduce_in_fp32)
    per_microbatch = ex.grad_sync != "step"  # the parameters resharded and gathered again every micro-batch
    reduce = ex.grad_sync == "microbatch" or (ex.grad_sync == "last" and last)
    gap = cfg.host_overhead.step_gap_s if groups["pp"] >= 2 else 0.0
    if kind == "F":
        hidden_items, items = overlapped_comm(cfg, cost.forward_comm, groups, alone)
        entry = b.add(Piece("compute", "wait", "a2a overlap", 0.0, deps=(PREV,), needs_input=True)) \
            if hidden_items else -1
        start = (PREV,) if entry < 0 else (entry,)
        # Gradient sync once per step (PyTorch pipelining): the parameters stay gathered after the first forward.
        c = fsdp_forward(b, cfg, cost, shards, pbpe, start, gap, entry < 0, gather=per_microbatch or first)
        return _forward_tail(b, cfg, cost, c, entry, hidden_items, items, groups, ring)
    # Resharded after forward, a unit is gathered again for every backward; under PyTorch pipelining too, where the
    # backward leaves it gathered (stage.py backward_maybe_with_nosync: set_reshard_after_backward(False)) so that
    # only the first forward gathers (fsdp_forward's ``gather`` above) and each forward's end frees it again.
    gather = ex.reshard_after_forward
    deps: tuple[int, ...] = (PREV, *(backward_first_gather(b, shards, cost, pbpe) if gather else ()))
    needs_input = True
    chain: list[int] = []
    if cost.recompute_s > 0:
        r = b.add(Piece("compute", "recompute", "recompute", cost.recompute_s + gap, deps=deps, needs_input=True,
                        hardware_flops=cost.recompute_flops))
        needs_input, gap = False, 0.0
        chain += [r, *b.chain(cost.recompute_comm, (r,), "recompute", groups)]
        deps = (chain[-1],)
    hidden_items, items = overlapped_comm(cfg, cost.backward_comm + cost.backward_overlapped_comm, groups,
                                       alone)
    hidden: list[int] = []
    if hidden_items:
        entry = b.add(Piece("compute", "wait", "a2a overlap", 0.0, deps=deps, needs_input=needs_input))
        hidden = b.chain(hidden_items, (entry,), "overlapped", groups)
        deps, needs_input = (entry,), False
    # Assumption: the tensor-parallel input-gradient collectives Megatron overlaps with the weight gradients run after
    # the backward here (torchtitan and FSDP's tensor parallelism issue them synchronously).
    computes = fsdp_backward(b, cfg, cost, shards, pbpe, gbpe, deps, gap, needs_input, gather, reduce,
                             cost.backward_s, cost.model_flops_backward,
                             accumulate=cfg.no_sync_accumulates)
    computes.append(tax(b, computes[-1], _expert_comm(b, hidden), cost.backward_s, cfg.expert_interference, "backward",
                        step_pairing(cost.moe_pairing, "B")))
    computes.append(_ring(b, computes[-1], *ring, groups, cfg.interference))
    chain += computes
    exposed = b.chain(items, (computes[-1],), "", groups)
    if hidden and not cost.moe_pairing:  # paired, they are the tax piece's (simdist.plan.moe_pairing)
        exposed.append(b.add(Piece("compute", "wait", "wait", 0.0, deps=((exposed or computes)[-1], hidden[-1]))))
    chain += exposed
    return Recipe(tuple(b.pieces), chain[-1])


def p2p_bytes(cfg: StepConfig) -> float:
    """Bytes one rank sends across a pipeline boundary per micro-batch (activation forward, its gradient back).

    One micro-batch's boundary activation is b x s x h elements (Narayanan et al. 2021 sec 3.2: "bsh" per
    micro-batch between stages), s / cp of the sequence per context-parallel rank; with Megatron's scatter/gather
    (sec 4.1) or sequence parallelism (Korthikanti et al. 2022 sec 4.2.2) each of the tp peers sends 1/tp of it.
    """
    m = cfg.model
    seq = m.seq_length if m.kind == "decoder" else 1
    nbytes = cfg.micro_batch_size * seq / cfg.mesh.cp * m.hidden_size * bytes_per_element(cfg.precision)
    if cfg.scatter_gather or cfg.sequence_parallel:
        nbytes /= cfg.mesh.tp
    return nbytes


def send(cfg: StepConfig) -> CommItem:
    """The send_recv a pipeline step's output crosses to the neighbouring stage with (sender's pp stream)."""
    return CommItem("send_recv", p2p_bytes(cfg), "pp")
