"""ZeRO-3 / FSDP as PyTorch FSDP, FSDP2 and DeepSpeed ZeRO-3 run it: one unit per transformer block, each gathered one
unit ahead of its compute and its gradients reduce-scattered while the next unit's backward runs
(``training.zero3_fetch: per_layer``).

The units of a model chunk: its decoder layers, one each (torchtitan: fully_shard per TransformerBlock; FSDP1's
transformer auto-wrap policy; llm-foundry's MPTBlock), the embedding a unit of its own on the first model part and the
final norm with the output layer one on the last (torchtitan since v0.2.0,
torchtitan/models/llama3/infra/parallelize.py; PyTorch FSDP2 never reshards that root unit after forward, so its
backward needs no gather).

Forward of a micro-batch (FSDP2: each unit's all-gather issued in its pre-forward while the host runs ahead; FSDP1's
implicit forward prefetch): the first unit's gather, then unit k's compute beside unit k+1's gather. Backward with
``backward_prefetch: pre`` (FSDP1 BACKWARD_PRE, FSDP2's only behaviour): unit k's gather issued before unit k+1's
gradient computation, beside it; unit k's reduce-scatter once its gradients are ready, beside unit k-1's backward (one
reduce-scatter in flight, FSDP2 post_backward); the last unit's reduce-scatter after the backward. ``post``
(BACKWARD_POST, Composer's default): each unit's gather issued after the previous unit's gradient computation, so the
backward waits for it, and the reduce-scatter hides instead. ``reshard_after_forward: false`` (SHARD_GRAD_OP) keeps the
gathered parameters for the backward: no backward gathers.

The per-unit pipeline of U equal units is represented by three compute pieces (the first unit, the middle ones, the
last) and merged collectives (the first unit's gather, the others' gathers, the others' reduce-scatters, the last
reduce-scatter): with gather time a and compute time c per unit the forward ends at a_1 + (U - 1) max(a, c) + c, as
the unit-by-unit timeline does (tests/test_fsdp.py checks both against a hand count).
# Assumption: a chunk's compute splits evenly over its units (the embedding's and the head's units carry a layer's
# share); the gathers' bytes are each unit's own.

The copies around the collectives (FSDP2, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): each gathered unit
is copied out of the all-gather buffer into its parameters (split_with_sizes_copy, on the compute stream: read + write
of the unit's 16-bit parameters), and each unit's gradients are copied into the reduce-scatter buffer (chunk_cat, cast
to the reduce dtype). FSDP1's flat parameters need neither but the cast of a flat gradient to a wider reduce dtype.
# Assumption: both are charged to the compute stream (the reduce-scatter's copy-in runs on its own stream, beside the
# compute, sharing HBM: an upper bound).
"""

from __future__ import annotations

from dataclasses import dataclass

from simdist.hardware.compute import kernels_time_s
from simdist.plan.interference import tax
from simdist.plan.kernel_work import elementwise
from simdist.plan.pieces import Builder, CommItem, Piece

__all__ = ["Units", "backward_first_gather", "fsdp_backward", "fsdp_forward", "replica_reduce", "units_of"]


@dataclass(frozen=True, slots=True)
class Units:
    count: int
    """Units the chunk's parameters are in."""
    first: float
    """Share of the chunk's parameters in the unit gathered first in forward (the embedding's on the first part)."""
    backward_first: float
    """Share in the unit gathered first in backward (the last layer's; the head unit is not resharded)."""
    backward_gathered: float
    """Share of the chunk's parameters gathered again in backward (all but the never-resharded head unit)."""
    backward_units: int


def units_of(cost) -> Units:
    """The FSDP units of a chunk of cost ``cost`` (simdist.plan.chunk_cost.ChunkCost)."""
    layers, emb, head = cost.num_layers, cost.embedding_params, cost.head_params
    units = layers + (1 if emb else 0) + (1 if head else 0)
    if units <= 1 or cost.num_params <= 0:
        return Units(1, 1.0, 1.0, 1.0, 1)
    per_layer = max(cost.num_params - emb - head, 0.0) / max(layers, 1) / cost.num_params
    first = emb / cost.num_params if emb else per_layer if layers else head / cost.num_params
    gathered = 1.0 - head / cost.num_params
    return Units(units, first, per_layer if layers else gathered, gathered, max(1, units - (1 if head else 0)))


def _copies_s(cfg, params: float, units: int, gather: bool, reduce_bytes: int, accumulate_bytes: int = 0) -> float:
    """Seconds of FSDP's copies on the compute stream for ``params`` parameters in ``units`` units (and, under
    no_sync, the additions of each micro-batch's gradients into the unsharded accumulated ones)."""
    if params <= 0:
        return 0.0
    kernels = []
    if gather and cfg.execution.fsdp_version == 2:
        kernels += [elementwise("fsdp_all_gather_copy_out", params / units, 4.0, 0.0)] * units
    if reduce_bytes:
        kernels += [elementwise("fsdp_reduce_scatter_copy_in", params / units, reduce_bytes, 0.0)] * units
    if accumulate_bytes:
        kernels += [elementwise("fsdp_grad_accumulate", params / units, accumulate_bytes, 1.0)] * units
    return kernels_time_s(cfg.gpu, kernels, cfg.precision, cfg.compute_efficiency) if kernels else 0.0


def _gathers(b: Builder, shards, share: float, pbpe: int, label: str, deps: tuple[int, ...]) -> list[int]:
    return [b.add(Piece("dp", "comm", f"{'expert ' if axis == 'edp' else ''}{label}",
                        comm=CommItem("all_gather", n * share * pbpe, axis), deps=deps))
            for axis, n in shards if n * share > 0]


def _reduces(b: Builder, shards, share: float, gbpe: int, label: str, deps: tuple[int, ...], cfg=None) -> list[int]:
    out = []
    for axis, n in shards:
        if n * share > 0:
            out.append(b.add(Piece("dp", "comm", f"{'expert ' if axis == 'edp' else ''}{label}",
                                   comm=CommItem("reduce_scatter", n * share * gbpe, axis), deps=deps)))
            if cfg is not None:
                out += replica_reduce(b, cfg, axis, n * share * gbpe, (out[-1],))
    return out


def replica_reduce(b: Builder, cfg, axis: str, nbytes: float, deps: tuple[int, ...]) -> list[int]:
    """Hybrid sharding (HSDP, simdist.plan.mesh's dps / dpr): after a reduce-scatter of ``nbytes`` over a shard group
    ``axis``, each rank's reduced shard is all-reduced over the shard's replicas (FSDP1 _post_backward_hook's
    all-reduce over the inter-node group, FSDP2 foreach_reduce's all_reduce, torch/distributed/fsdp).
    # Assumption: on the dp stream after the reduce-scatter (FSDP2 gives it a stream of its own, beside the next
    # reduce-scatter: an upper bound where both are busy)."""
    if axis not in ("dps", "dps_cp") or cfg.mesh.size("dpr") < 2:
        return []
    return [b.add(Piece("dp", "comm", "grads shard all_reduce over replicas",
                        comm=CommItem("all_reduce", nbytes / cfg.mesh.size(axis), "dpr"), deps=deps))]


def fsdp_forward(b: Builder, cfg, cost, shards, pbpe: int, start: tuple[int, ...], gap: float, needs_input: bool,
                 gather: bool) -> int:
    """The forward compute of a chunk's micro-batch with its units' gathers (``gather``: this step gathers); returns
    the last compute piece."""
    u = units_of(cost)
    fwd = cost.forward_s + (_copies_s(cfg, cost.num_params, u.count, True, 0) if gather else 0.0)
    flops = cost.model_flops_forward
    if not gather or u.count == 1:
        deps = (*start, *(_gathers(b, shards, 1.0, pbpe, "params all_gather", ()) if gather else ()))
        return b.add(Piece("compute", "forward", "", fwd + gap, deps=deps, needs_input=needs_input,
                           model_flops=flops, hardware_flops=flops))
    g1 = _gathers(b, shards, u.first, pbpe, "unit 1 params all_gather", ())
    rest = _gathers(b, shards, 1.0 - u.first, pbpe, f"units 2-{u.count} params all_gather", ())
    n = u.count
    first = b.add(Piece("compute", "forward", "/unit 1", fwd / n + gap, deps=(*start, *g1), needs_input=needs_input,
                        model_flops=flops / n, hardware_flops=flops / n))
    last = first
    if n > 2:
        last = b.add(Piece("compute", "forward", f"/units 2-{n - 1}", fwd * (n - 2) / n, deps=(first,),
                           model_flops=flops * (n - 2) / n, hardware_flops=flops * (n - 2) / n))
    end = b.add(Piece("compute", "forward", f"/unit {n}", fwd / n, deps=(last, *rest),
                      model_flops=flops / n, hardware_flops=flops / n))
    # the other units' gathers run beside the forward's compute (simdist.plan.interference)
    return tax(b, end, rest, fwd, cfg.interference, "forward")


def backward_first_gather(b: Builder, shards, cost, pbpe: int) -> list[int]:
    """The gather of the first unit the backward needs (issued ahead: prefetched behind the previous step)."""
    return _gathers(b, shards, units_of(cost).backward_first, pbpe, "unit params all_gather", ())


def fsdp_backward(b: Builder, cfg, cost, shards, pbpe: int, gbpe: int, deps: tuple[int, ...], gap: float,
                  needs_input: bool, gather: bool, reduce: bool, backward_s: float, flops: float,
                  accumulate: bool = False) -> list[int]:
    """The backward compute of a chunk's micro-batch, after ``deps`` (its recompute, which waited for
    `backward_first_gather` where ``gather``), with the other units' gathers (``gather``) and every unit's
    reduce-scatter (``reduce``); ``accumulate``: under no_sync, each unit's gradients added into the unsharded ones
    accumulated in the reduction's dtype; returns the compute pieces in order."""
    u = units_of(cost)
    n = u.count
    reduce_bytes = 0
    if reduce:
        wider = gbpe > pbpe
        reduce_bytes = (pbpe + gbpe) if cfg.execution.fsdp_version == 2 else (pbpe + gbpe if wider else 0)
    # no_sync: the new gradient (compute dtype) read, the accumulated one (reduction dtype) read and written: FSDP2's
    # FSDPParam.accumulate_unsharded_grad_if_needed (unsharded_accumulated_grad += unsharded_param.grad)
    # Assumption: every micro-batch pays the addition (the first only casts into the accumulator: the same bytes less
    # one read)
    accumulate_bytes = pbpe + 2 * gbpe if accumulate else 0
    bwd = backward_s + _copies_s(cfg, cost.num_params * u.backward_gathered, u.backward_units, gather, 0) \
        + _copies_s(cfg, cost.num_params, n, False, reduce_bytes, accumulate_bytes)
    if n == 1:
        c = b.add(Piece("compute", "backward", "", bwd + gap, deps=deps, needs_input=needs_input,
                        model_flops=flops, hardware_flops=flops))
        if reduce:
            _reduces(b, shards, 1.0, gbpe, "grads reduce_scatter", (c,), cfg)
        return [c]
    post = cfg.execution.backward_prefetch == "post"
    others = u.backward_gathered - u.backward_first
    rest: list[int] = []
    if gather and not post:
        rest = _gathers(b, shards, others, pbpe, "units params all_gather", ())
    first = b.add(Piece("compute", "backward", "/unit 1", bwd / n + gap, deps=deps, needs_input=needs_input,
                        model_flops=flops / n, hardware_flops=flops / n))
    pieces = [first]
    if gather and post:
        # BACKWARD_POST: each unit's gather is issued after the previous unit's gradients: the backward waits for it
        rest = _gathers(b, shards, others, pbpe, "units params all_gather (after each unit)", (first,))
        pieces.append(b.add(Piece("compute", "backward", f"/units 2-{n}", bwd * (n - 1) / n, deps=(first, *rest),
                                  model_flops=flops * (n - 1) / n, hardware_flops=flops * (n - 1) / n)))
    else:
        if n > 2:
            pieces.append(b.add(Piece("compute", "backward", f"/units 2-{n - 1}", bwd * (n - 2) / n, deps=(first,),
                                      model_flops=flops * (n - 2) / n, hardware_flops=flops * (n - 2) / n)))
        pieces.append(b.add(Piece("compute", "backward", f"/unit {n}", bwd / n, deps=(pieces[-1], *rest),
                                  model_flops=flops / n, hardware_flops=flops / n)))
    beside = [] if post else list(rest)  # (BACKWARD_POST's gathers run between the computes, not beside them)
    if reduce:
        beside += _reduces(b, shards, (n - 1) / n, gbpe, f"units 1-{n - 1} grads reduce_scatter", (first,), cfg)
        _reduces(b, shards, 1.0 / n, gbpe, f"unit {n} grads reduce_scatter", (pieces[-1],), cfg)
    # the other units' gathers and reduce-scatters run beside the backward's compute (simdist.plan.interference)
    end = tax(b, pieces[-1], beside, bwd, cfg.interference, "backward")
    if end != pieces[-1]:
        pieces.append(end)
    return pieces
