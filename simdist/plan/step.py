"""One training step as an op graph: the pipeline schedule of every simulated rank, each step's recipe
(simdist.plan.recipe: the one step model, which the closed form reads too) instantiated on its rank's streams.

The graph holds one *representative* rank per pipeline stage and simulated data-parallel replica (tp and
cp coordinate 0): the tensor- and context-parallel peers of a rank run the same ops at the same times, and
so do the data-parallel replicas of a homogeneous layout. Every communication op still names its whole
group (its ``Comm.ranks``), so pricing sees the real placement. Replicas are simulated one by one where
they differ (``StepConfig.dp_batch_split``: unequal local batches, the lecture's straggler example; and
``StepConfig.compute_slowdown``: a straggler GPU, whose compute pieces take its factor x as long).

What each step emits is simdist.plan.recipe's module docstring; this module wires it: a piece depending on
``PREV`` waits for the op that ended the stage's previous step; the piece that ``needs_input`` waits for the
neighbouring stage's send (simdist.plan.pipeline); a stage's tail waits for its last backwards and its last
data-parallel op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from simdist.plan.activations import in_flight_microbatches
from simdist.plan.chunk_cost import ChunkCost, chunk_cost
from simdist.plan.data_parallel import tail
from simdist.plan.layer_cost import Kernel
from simdist.plan.memory import MemoryBreakdown, stage_memory
from simdist.plan.opgraph import Comm, Op, OpGraph, OpRows
from simdist.plan.pieces import SLOWED_KINDS
from simdist.plan.pipeline import build_pipeline
from simdist.plan.recipe import (
    DP_DONE,
    LAST_BACKWARDS,
    PREV,
    Piece,
    Recipe,
    StageTail,
    edge_recipe,
    send,
)
from simdist.plan.recompute import full_layers
from simdist.plan.schedule import (
    SPLIT_BACKWARD,
    TWO_CHUNK_SCHEDULES,
    Step,
    chunk_microbatches,
    part_location,
    schedule_order,
)
from simdist.plan.step_config import (
    StepConfig,
    chunk_layers,
    grad_bytes_per_element,
    layer_kinds,
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


_Row = tuple[str, Comm | None, int, bool, float, float]
"""(kind, Comm, rank, in a micro-batch, model FLOPs, hardware FLOPs) of ops (`OpRows`)."""


class _RowLog:
    """The `OpRows` of a graph as its emitters add ops: the distinct rows, and per block of consecutive ops (a
    step's pieces, a send, a tail piece), in op order, which block of rows it repeats. An emitter registers a block
    right before it adds the block's first ops (rows in order of their first op, as OpRows says)."""

    def __init__(self) -> None:
        self.rows: list[_Row] = []
        self.block_first: list[int] = []  # per distinct block: its first row
        self.block_size: list[int] = []
        self.blocks: list[int] = []  # per block of ops, in op order: its distinct block

    def block(self, rows: list[_Row]) -> int:
        """Register a block of rows; its id."""
        self.block_first.append(len(self.rows))
        self.block_size.append(len(rows))
        self.rows.extend(rows)
        return len(self.block_first) - 1

    def table(self, num_ops: int) -> OpRows | None:
        """The graph's `OpRows` (None unless the blocks account for its ``num_ops`` ops)."""
        seq = np.asarray(self.blocks, dtype=np.int64)
        size = np.asarray(self.block_size, dtype=np.int64)[seq]
        if int(size.sum()) != num_ops or not self.rows:
            return None
        first_op = np.cumsum(size) - size  # each block's first op
        row = np.repeat(np.asarray(self.block_first, dtype=np.int64)[seq] - first_op, size) + np.arange(num_ops)
        kind, comm, rank, per_microbatch, model, hardware = zip(*self.rows, strict=True)
        return OpRows(row, kind, comm, tuple(None if c is None else c.axis for c in comm),
                      np.asarray(rank, dtype=np.int64), np.asarray(per_microbatch, dtype=bool),
                      np.asarray(model, dtype=float), np.asarray(hardware, dtype=float))


class _Emitter:
    """Instantiates each scheduled step's recipe for one data-parallel replica (a PipelineEmitter)."""

    def __init__(self, cfg: StepConfig, recipes: dict[tuple, Recipe], ranks: dict[int, int],
                 num_microbatches: int, factors: dict[int, float] | None = None, log: _RowLog | None = None) -> None:
        self.cfg, self.recipes, self.ranks = cfg, recipes, ranks
        self.log = log if log is not None else _RowLog()
        """Where the emitted ops' rows go (shared by the emitters of one graph)."""
        self.factors = factors or {}
        """stage -> time factor of its compute pieces (a straggler)."""
        self.num_microbatches = num_microbatches
        self.last: dict[int, int] = {}          # stage -> the op that ended its previous step
        self.last_backward: dict[tuple[int, int], int] = {}  # (stage, chunk) -> end of its last backward / W
        self.dp_last: dict[int, int] = {}       # stage -> its last data-parallel op so far
        self._groups: dict[tuple[str, int], tuple[int, ...]] = {}
        self._templates: dict[tuple, tuple[tuple, int, int, int, int]] = {}
        self._send = send(cfg)
        # (src, dst stage) -> (src rank, name, Comm, its block of rows)
        self._sends: dict[tuple[int, int], tuple[int, str, Comm, int]] = {}
        self._tagged: Step | None = None
        self._tag_text = ""
        self._chunked = cfg.chunks > 1  # a step's tag names its chunk (Step.label)
        # a B ends its chunk's backward (a split backward, zb_h1 and the two-chunk schedules: its W does)
        self._b_ends_backward = cfg.schedule not in SPLIT_BACKWARD
        # each chunk's edge micro-batches (simdist.plan.recipe.is_edge): (first F, last B or W) by chunk
        self._edges = [chunk_microbatches(cfg.schedule, c, num_microbatches) for c in range(cfg.chunks)]

    def _group(self, axis: str, stage: int) -> tuple[int, ...]:
        key = (axis, stage)
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = self.cfg.mesh.group(axis, self.ranks[stage])
        return g

    def _add(self, graph: OpGraph, stage: int, piece: Piece, name: str, deps: list[int], microbatch: int,
             chunk: int) -> int:
        c = piece.comm
        comm = None if c is None else Comm(c.op, self._group(c.axis, stage), c.nbytes, c.axis, c.count, c.host_s,
                                           c.imbalance)
        duration = math.nan if c is not None else piece.duration_s
        if c is None and piece.kind in SLOWED_KINDS:
            duration *= self.factors.get(stage, 1.0)
        i = graph.add(Op(name=name, rank=self.ranks[stage], stream=piece.stream, kind=piece.kind,
                         duration_s=duration, deps=deps, stage=stage,
                         microbatch=-1 if piece.per_step else microbatch, chunk=chunk, comm=comm,
                         model_flops=piece.model_flops, hardware_flops=piece.hardware_flops))
        log = self.log
        log.blocks.append(log.block([(piece.kind, comm, self.ranks[stage],
                                      not piece.per_step and microbatch >= 0, piece.model_flops,
                                      piece.hardware_flops)]))
        if piece.stream == "dp":
            self.dp_last[stage] = i
        return i

    def _template(self, stage: int, key: tuple) -> tuple[tuple, int, int, int, int]:
        """A recipe instantiated on ``stage`` once (its ops differ by name, micro-batch and chunk only): per piece
        (its fixed name or None, what follows the step's tag in its name, stream, kind, duration, deps inside the
        recipe: the first, the second (-1: none) and all where more than two, waits for the previous step, runs
        once per step, Comm, model and hardware FLOPs), the index of the piece that ends the step, of the one that
        takes the input (0 where none does) and of the last on the dp stream (-1: none), and its block of rows in the
        `_RowLog`; kept by ``key``."""
        got = self._templates.get(key)
        if got is None:
            recipe = self.recipes[key]
            factor = self.factors.get(stage, 1.0)
            rows = []
            taxes = []
            entry = last_dp = -1
            for j, p in enumerate(recipe.pieces):
                if p.tax_of:  # priced once its collectives are (OpGraph.apply_taxes)
                    taxes.append((j, p.tax_of, p.tax_share, p.duration_s * (factor if p.kind in SLOWED_KINDS else 1)))
                c = p.comm
                comm = None if c is None else Comm(c.op, self._group(c.axis, stage), c.nbytes, c.axis, c.count,
                                                   c.host_s, c.imbalance)
                duration = math.nan if c is not None else p.duration_s
                if c is None and p.kind in SLOWED_KINDS:
                    duration *= factor
                # the name: the piece's label once per step; else the step's tag, then "/label", " label" or nothing
                fixed = p.label if p.per_step else None
                suffix = p.label if p.label.startswith("/") else f" {p.label}" if p.label else ""
                inner = tuple(d for d in p.deps if d >= 0)
                # deps inside the recipe as up to two indices (-1: none) or, past two, the whole tuple (`compute`)
                first_dep = inner[0] if inner else -1
                second_dep = inner[1] if len(inner) > 1 else -1
                rows.append((fixed, suffix, p.stream, p.kind, duration, first_dep, second_dep,
                             inner if len(inner) > 2 else None, PREV in p.deps, p.per_step, comm, p.model_flops,
                             p.hardware_flops))
                if p.needs_input and entry < 0:
                    entry = j
                if p.stream == "dp":
                    last_dp = j
            # a scheduled step's micro-batch is one of 0..M-1 (simdist.plan.schedule.schedule_order): its pieces that
            # do not run once per step have microbatch >= 0 (OpRows.per_microbatch)
            rank = self.ranks[stage]
            block = self.log.block([(kind, comm, rank, not per_step, model_flops, hardware_flops)
                                    for _, _, _, kind, _, _, _, _, _, per_step, comm, model_flops, hardware_flops
                                    in rows])
            got = self._templates[key] = (tuple(rows), recipe.end, max(entry, 0), last_dp, block, tuple(taxes))
        return got

    def _tag(self, step: Step) -> str:
        """``step.label(vpp)``, kept for the step's transfer (asked for right after its compute)."""
        if step is not self._tagged:
            self._tagged, self._tag_text = step, step.label(self.cfg.chunks)
        return self._tag_text

    # -- PipelineEmitter
    def compute(self, graph: OpGraph, stage: int, step: Step) -> tuple[int, int]:
        kind, microbatch, chunk = step.kind, step.microbatch, step.chunk
        # the template of (stage, chunk, kind, is_edge(kind, microbatch, num_microbatches, schedule, chunk)), inline
        key = (stage, chunk, kind, microbatch == self._edges[chunk][kind != "F"])
        got = self._templates.get(key)
        rows, end_piece, entry_piece, dp_piece, block, taxes = got if got is not None else self._template(stage, key)
        self.log.blocks.append(block)
        # the step's tag, step.label(vpp) in one f-string; kept for its transfer (asked for right after)
        tag = f"{kind}{microbatch}.{chunk}" if self._chunked else f"{kind}{microbatch}"
        self._tagged, self._tag_text = step, tag
        rank = self.ranks[stage]
        previous = self.last.get(stage)
        ops = graph.ops
        first = len(ops)  # the step's pieces become ops first, first + 1, ... in order (OpGraph.add's ids)
        new = []
        append = new.append
        for (fixed, suffix, stream, op_kind, duration, d0, d1, many, prev, per_step, comm, model_flops,
             hardware_flops) in rows:
            # [first + d for d in the piece's deps inside the recipe], without a comprehension for one or two
            if many is not None:
                deps = [first + d for d in many]
            elif d1 >= 0:
                deps = [first + d0, first + d1]
            elif d0 >= 0:
                deps = [first + d0]
            else:
                deps = []
            if prev and previous is not None:
                deps.insert(0, previous)
            # Op's fields in order (name, rank, stream, kind, duration_s, deps, stage, microbatch, chunk, comm,
            # model_flops, hardware_flops): positional arguments cost a third of keywords, once per op of the graph
            append(Op(tag + suffix if fixed is None else fixed, rank, stream, op_kind, duration, deps, stage,
                      -1 if per_step else microbatch, chunk, comm, model_flops, hardware_flops))
        graph.extend(new)
        for j, of, share, cap in taxes:
            graph.taxes.append((first + j, tuple(first + k for k in of), share, cap))
        if dp_piece >= 0:
            self.dp_last[stage] = first + dp_piece
        end = first + end_piece
        self.last[stage] = end
        if kind == "W" or (kind == "B" and self._b_ends_backward):
            self.last_backward[(stage, chunk)] = end
        return first + entry_piece, end

    def transfer(self, graph: OpGraph, src_stage: int, dst_stage: int, step: Step) -> int | None:
        if src_stage == dst_stage:
            return None
        pair = self._sends.get((src_stage, dst_stage))
        if pair is None:  # one Comm per (src, dst) stages, shared by its sends (it is frozen, as a recipe piece's)
            c = self._send
            src, dst = self.ranks[src_stage], self.ranks[dst_stage]
            comm = Comm(c.op, (src, dst), c.nbytes, c.axis, c.count)
            pair = self._sends[(src_stage, dst_stage)] = (src, f" send to stage {dst_stage}", comm,
                                                          self.log.block([("comm", comm, src, True, 0.0, 0.0)]))
        src, suffix, comm, block = pair
        self.log.blocks.append(block)  # a send's micro-batch is its step's, >= 0 (as in `_template`)
        tag = self._tag_text if step is self._tagged else self._tag(step)
        # positional: Op(name, rank, stream, kind, duration_s, deps, stage, microbatch, chunk, comm), see compute
        return graph.add(Op(tag + suffix, src, "pp", "comm", math.nan, [], src_stage, step.microbatch, step.chunk,
                            comm))

    def finish(self, graph: OpGraph, stage: int, stage_tail: StageTail) -> None:
        """The stage's tail (simdist.plan.data_parallel.tail): gradient reduction, optimizer, parameter all_gather."""
        backwards = [v for (s, _), v in self.last_backward.items() if s == stage]
        ids: list[int] = []
        for p in stage_tail.pieces:
            deps = [ids[d] for d in p.deps if d >= 0]
            if DP_DONE in p.deps and stage in self.dp_last:
                deps.append(self.dp_last[stage])
            if LAST_BACKWARDS in p.deps:
                deps += backwards
            ids.append(self._add(graph, stage, p, p.label, deps, -1, -1))
            if p.tax_of:
                cap = p.duration_s * (self.factors.get(stage, 1.0) if p.kind in SLOWED_KINDS else 1.0)
                graph.taxes.append((ids[-1], tuple(ids[k] for k in p.tax_of), p.tax_share, cap))


def recipes_of(cfg: StepConfig, costs: dict[tuple[int, int], ChunkCost]) -> dict[tuple, Recipe]:
    """Every distinct step recipe: (stage, chunk, kind, edge micro-batch: simdist.plan.recipe.is_edge) -> Recipe."""
    kinds = ("F", "B", "W") if cfg.schedule in SPLIT_BACKWARD else ("F", "B")
    # chunks of one cost (the same object: `_parts_of` gives alike chunks one) share their recipes, each made once
    made: dict[tuple[int, str, bool], Recipe] = {}
    out: dict[tuple, Recipe] = {}
    for (s, c), cost in costs.items():
        for kind in kinds:
            for edge in (False, True):
                r = made.get((id(cost), kind, edge))
                if r is None:
                    r = made[(id(cost), kind, edge)] = edge_recipe(cfg, cost, kind, edge)
                out[(s, c, kind, edge)] = r
    return out


def chunk_costs_of(cfg: StepConfig) -> dict[tuple[int, int], ChunkCost]:
    """(stage, chunk) -> the cost of the layers it holds (+ embedding on the first model part, + head on the last)."""
    return dict(_parts_of(cfg)[0])


@lru_cache(maxsize=8)
def _parts_of(cfg: StepConfig) -> tuple[dict[tuple[int, int], ChunkCost], dict[tuple, Recipe], tuple[StageTail, ...]]:
    """(chunk costs, recipes, stage tails) of a configuration, computed once for its several op graphs (the
    fast-forward samples of one step; `collective_runs`). Read-only: callers copy what they keep."""
    K = cfg.mesh.pp
    num_parts = cfg.num_parts
    parts, firsts = cfg.model_parts(), cfg.part_first_layers()  # once: each is a pass over every part
    costs: dict[tuple[int, int], ChunkCost] = {}
    # `chunk_cost` reads the configuration and its arguments only: alike chunks (the same layer kinds, neither or
    # both the first and last model part) share one cost, computed once (Llama 3 405B's 112 chunks on 16 x 7: 4)
    alike: dict[tuple, ChunkCost] = {}
    for s in range(K):
        for c in range(len(cfg.stage_chunks(s))):
            part = cfg.part_of(s, c)  # Megatron's interleaved layout c*K + s, or the schedule's V / two copies
            # cfg.part_layers(part), from the parts and first layers computed once
            key = (layer_kinds(cfg.model, firsts[part], parts[part]), part == 0, part == num_parts - 1)
            cost = alike.get(key)
            if cost is None:
                cost = alike[key] = chunk_cost(cfg, *key)
            costs[(s, c)] = cost
    tails_of: dict[tuple[int, ...], StageTail] = {}  # by the stage's chunk costs (`tail` reads those and cfg only)
    tails = []
    for s in range(K):
        chunk_list = [costs[(s, c)] for c in range(cfg.chunks)]
        ids = tuple(map(id, chunk_list))
        t = tails_of.get(ids)
        if t is None:
            t = tails_of[ids] = tail(cfg, chunk_list)
        tails.append(t)
    return costs, recipes_of(cfg, costs), tuple(tails)


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
        unsharded="" if ex.reshard_after_forward else "params_grads" if ex.grad_sync == "step" else "params",
        shard_group=cfg.mesh.dp_shard or None, optimizer_bytes=cfg.optimizer_state_bytes)
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


def build_step(cfg: StepConfig, *, full: bool = False, num_microbatches: int | None = None) -> StepPlan:
    """The op graph of one step (see the module docstring).

    By default one representative rank per pipeline stage (tp and cp coordinate 0) and per simulated
    data-parallel replica (only replica 0 unless ``dp_batch_split`` makes them differ); ``full`` simulates
    every rank (for checking the reduction: simdist.predict accounts for the ranks a reduced graph leaves out).
    ``num_microbatches``: run this many micro-batches instead of the configuration's (the steady state of a
    schedule repeats: simdist.predict fast-forwards it); memory stays the configuration's.
    Ops of different simulated ranks that are the same collective share a ``sync`` id.
    """
    mesh = cfg.mesh
    K = mesh.pp
    if num_microbatches is not None and cfg.replicas_differ:
        raise ValueError("build_step: num_microbatches with unequal replicas")
    dp_indices = tuple(range(mesh.dp)) if (full or cfg.replicas_differ) else (0,)
    peers = [(t, c) for t in range(mesh.tp) for c in range(mesh.cp)] if full else [(0, 0)]
    shared_costs, recipes, tails = _parts_of(cfg)
    costs = dict(shared_costs)
    graph = OpGraph()
    stage_ranks: dict[tuple[int, int], int] = {}
    emitters: list[_Emitter] = []
    log = _RowLog()
    for d in dp_indices:
        for t, c in peers:
            ranks = {s: mesh.rank(pp=s, dp=d, tp=t, cp=c) for s in range(K)}
            if (t, c) == (0, 0):
                stage_ranks.update({(s, d): r for s, r in ranks.items()})
            m = num_microbatches if num_microbatches is not None else cfg.microbatches(d)
            order = schedule_order(cfg.schedule, num_stages=K, num_microbatches=m, vpp=cfg.vpp)
            factors = {s: (cfg.rank_factor(r) if full else cfg.compute_factor(s, d)) for s, r in ranks.items()}
            em = _Emitter(cfg, recipes, ranks, m, {s: f for s, f in factors.items() if f != 1.0}, log)
            build_pipeline(graph, order, em, vpp=cfg.vpp, schedule=cfg.schedule)
            emitters.append(em)
    for s in range(K):
        for em in emitters:
            em.finish(graph, s, tails[s])
    graph.rows = log.table(len(graph.ops))
    if len(emitters) > 1:  # one emitter puts a stage's ops on one rank: no collective spans two simulated ranks
        _link_instances(graph)
    simulated = {"tp": full, "cp": full, "dp": len(dp_indices) > 1 or mesh.dp == 1}
    reduced = tuple(a for a in ("tp", "cp", "dp") if not simulated[a] and mesh.size(a) > 1)
    return StepPlan(cfg, graph, stage_ranks, step_memory(cfg), costs, reduced_axes=reduced)


def _link_instances(graph: OpGraph) -> None:
    """Give the member ops of one collective (same group, op, size, step) on different ranks one sync id.

    One step may hold two alike collectives on a rank (a full recompute's forward all-reduces and the backward's,
    both ``B0 all_reduce x4`` under zb_h1): the k-th of them on one rank pairs with the k-th on another (an ordinal in
    the key), never with its own rank's other one, which would wait for itself."""
    by_key: dict[tuple, list[int]] = {}
    seen: dict[tuple, int] = {}
    for i, op in enumerate(graph.ops):
        c = op.comm
        if c is not None and c.op != "send_recv":
            key = (c.op, c.ranks, c.nbytes, c.imbalance, c.count, op.name, op.microbatch, op.chunk, op.stage)
            ordinal = seen.get((key, op.rank), 0)
            seen[(key, op.rank)] = ordinal + 1
            by_key.setdefault((*key, ordinal), []).append(i)
    next_id = 0
    for members in by_key.values():
        if len({graph.ops[i].rank for i in members}) > 1:
            for i in members:
                graph.ops[i].sync = next_id
            next_id += 1




def collective_runs(cfg: StepConfig, dp_index: int = 0) -> dict[tuple, int]:
    """(op, ranks, nbytes, axis, imbalance) -> runs of that collective in one step by the representative ranks of
    data-parallel replica ``dp_index`` (tp and cp coordinate 0), counted from the recipes over the whole micro-batch
    count (the same runs the op graph holds, without building it)."""
    mesh, K = cfg.mesh, cfg.mesh.pp
    M = cfg.microbatches(dp_index)
    _, recipes, tails = _parts_of(cfg)
    kinds = ("F", "B", "W") if cfg.schedule in SPLIT_BACKWARD else ("F", "B")
    p2p = send(cfg)
    runs: dict[tuple, int] = {}

    def add(key: tuple, n: int) -> None:
        if n:
            runs[key] = runs.get(key, 0) + n

    groups: dict[tuple[str, int], tuple[int, ...]] = {}  # (axis, stage) -> the stage's group along it

    def pieces(stage: int, items: tuple[Piece, ...], times: int) -> None:
        for p in items:
            c = p.comm
            if c is not None:
                group = groups.get((c.axis, stage))
                if group is None:
                    group = groups[(c.axis, stage)] = mesh.group(c.axis, mesh.rank(pp=stage, dp=dp_index))
                if len(group) >= 2 and c.nbytes > 0:
                    add((c.op, group, c.nbytes, c.axis, c.imbalance), c.count * times)

    for s in range(K):
        rank = mesh.rank(pp=s, dp=dp_index)
        for c in range(cfg.chunks):
            first, last = chunk_microbatches(cfg.schedule, c, M)
            runs_c = last - first + 1  # micro-batches the chunk runs (dualpipe: half, one direction)
            for kind in kinds:
                pieces(s, recipes[(s, c, kind, False)].pieces, runs_c - 1)
                pieces(s, recipes[(s, c, kind, True)].pieces, 1)
            for step in (1, -1):  # F sends down, B back
                part = cfg.part_of(s, c) + step
                if 0 <= part < cfg.num_parts:
                    dst = part_location(part, K, cfg.schedule, c if cfg.schedule == "dualpipe" else 0)[0]
                    if dst != s:
                        add((p2p.op, (rank, mesh.rank(pp=dst, dp=dp_index)), p2p.nbytes, p2p.axis, p2p.imbalance),
                            runs_c * p2p.count)
        pieces(s, tails[s].pieces, 1)
    return runs


# Re-exported: what callers (simdist.predict, simdist.analytic.step, the tests) import from here.
__all__ = ["ChunkCost", "Kernel", "StepConfig", "StepPlan", "build_step", "chunk_cost", "chunk_costs_of",
           "chunk_layers", "collective_runs", "grad_bytes_per_element", "peak_memory_bytes", "recipes_of",
           "split_layers", "step_memory"]
