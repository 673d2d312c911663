"""One training step as an op graph: the pipeline schedule of every simulated rank, each step's recipe
(simdist.plan.recipe: the one step model, which the closed form reads too) instantiated on its rank's streams
(simdist.plan.step_emitter), with each stage's memory (simdist.plan.step_memory).

The graph holds one *representative* rank per pipeline stage and simulated data-parallel replica (tp and
cp coordinate 0): the tensor- and context-parallel peers of a rank run the same ops at the same times, and
so do the data-parallel replicas of a homogeneous layout. Every communication op still names its whole
group (its ``Comm.ranks``), so pricing sees the real placement. Replicas are simulated one by one where
they differ (``StepConfig.dp_batch_split``: unequal local batches, the lecture's straggler example; and
``StepConfig.compute_slowdown``: a straggler GPU, whose compute pieces take its factor x as long).

How the graph wires what each step emits (the previous step, the neighbouring stage's send, a stage's tail) is
simdist.plan.step_emitter's module docstring. A configuration's chunk costs, recipes and stage tails are computed
once for its several graphs (`_parts_of`), and `collective_runs` counts the collectives a graph would hold from
them, without building it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from simdist.plan.chunk_cost import ChunkCost, chunk_cost, memo_chunk_cost
from simdist.plan.comm_overlap import a2a_overlapped
from simdist.plan.data_parallel import tail
from simdist.plan.layer_cost import Kernel
from simdist.plan.memory import MemoryBreakdown
from simdist.plan.opgraph import OpGraph
from simdist.plan.pipeline import build_pipeline
from simdist.plan.recipe import Piece, Recipe, StageTail, edge_recipe, send
from simdist.plan.schedule import SPLIT_BACKWARD, chunk_microbatches, part_location, schedule_order
from simdist.plan.step_config import (
    StepConfig,
    chunk_layers,
    grad_bytes_per_element,
    split_layers,
)
from simdist.plan.step_emitter import RowLog, StepEmitter
from simdist.plan.step_memory import step_memory


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


def recipes_of(cfg: StepConfig, costs: dict[tuple[int, int], ChunkCost]) -> dict[tuple, Recipe]:
    """Every distinct step recipe: (stage, chunk, kind, edge micro-batch: simdist.plan.recipe.is_edge, run alone by
    the 1F1B A2A overlap: simdist.plan.comm_overlap.unpaired) -> Recipe."""
    kinds = ("F", "B", "W") if cfg.schedule in SPLIT_BACKWARD else ("F", "B")
    variants = (False, True) if a2a_overlapped(cfg) else (False,)
    # chunks of one cost (the same object: `_parts_of` gives alike chunks one) share their recipes, each made once
    made: dict[tuple[int, str, bool, bool], Recipe] = {}
    out: dict[tuple, Recipe] = {}
    for (s, c), cost in costs.items():
        for kind in kinds:
            for edge in (False, True):
                for alone in variants:
                    r = made.get((id(cost), kind, edge, alone))
                    if r is None:
                        r = made[(id(cost), kind, edge, alone)] = edge_recipe(cfg, cost, kind, edge, alone)
                    out[(s, c, kind, edge, alone)] = r
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
    kinds = cfg.parts_layers()  # every part's layers, cached by what decides them
    costs: dict[tuple[int, int], ChunkCost] = {}
    # `chunk_cost` reads the configuration and its arguments only: alike chunks (the same layer kinds, neither or
    # both the first and last model part) share one cost, computed once (Llama 3 405B's 112 chunks on 16 x 7: 4), and
    # kept with the closed form's and a pipeline's stage pace's (memo_chunk_cost)
    alike: dict[tuple, ChunkCost] = {}
    for s in range(K):
        for c in range(len(cfg.stage_chunks(s))):
            part = cfg.part_of(s, c)  # Megatron's interleaved layout c*K + s, or the schedule's V / two copies
            key = (kinds[part], part == 0, part == num_parts - 1)
            cost = alike.get(key)
            if cost is None:
                cost = alike[key] = memo_chunk_cost(cfg, *key)
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
    emitters: list[StepEmitter] = []
    log = RowLog()
    for d in dp_indices:
        for t, c in peers:
            ranks = {s: mesh.rank(pp=s, dp=d, tp=t, cp=c) for s in range(K)}
            if (t, c) == (0, 0):
                stage_ranks.update({(s, d): r for s, r in ranks.items()})
            m = num_microbatches if num_microbatches is not None else cfg.microbatches(d)
            order = schedule_order(cfg.schedule, num_stages=K, num_microbatches=m, vpp=cfg.vpp)
            factors = {s: (cfg.rank_factor(r) if full else cfg.compute_factor(s, d)) for s, r in ranks.items()}
            em = StepEmitter(cfg, recipes, ranks, m, {s: f for s, f in factors.items() if f != 1.0}, log)
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
            key = (c.op, c.ranks, c.nbytes, c.imbalance, c.kernel, c.count, op.name, op.microbatch, op.chunk, op.stage)
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
    """(op, ranks, nbytes, axis, imbalance, kernel) -> runs of that collective in one step by the representative
    ranks of data-parallel replica ``dp_index`` (tp and cp coordinate 0), counted from the recipes over the whole
    micro-batch count (the same runs the op graph holds, without building it)."""
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
                    add((c.op, group, c.nbytes, c.axis, c.imbalance, c.kernel), c.count * times)

    for s in range(K):
        rank = mesh.rank(pp=s, dp=dp_index)
        for c in range(cfg.chunks):
            first, last = chunk_microbatches(cfg.schedule, c, M)
            runs_c = last - first + 1  # micro-batches the chunk runs (dualpipe: half, one direction)
            for kind in kinds:  # (the recipes of the steps run alone hold the same collectives, in the path)
                pieces(s, recipes[(s, c, kind, False, False)].pieces, runs_c - 1)
                pieces(s, recipes[(s, c, kind, True, False)].pieces, 1)
            for step in (1, -1):  # F sends down, B back
                part = cfg.part_of(s, c) + step
                if 0 <= part < cfg.num_parts:
                    dst = part_location(part, K, cfg.schedule, c if cfg.schedule == "dualpipe" else 0)[0]
                    if dst != s:
                        add((p2p.op, (rank, mesh.rank(pp=dst, dp=dp_index)), p2p.nbytes, p2p.axis, p2p.imbalance,
                             p2p.kernel),
                            runs_c * p2p.count)
        pieces(s, tails[s].pieces, 1)
    return runs


# Re-exported: what callers (simdist.predict, simdist.analytic.step, the tests) import from here.
__all__ = ["ChunkCost", "Kernel", "StepConfig", "StepPlan", "build_step", "chunk_cost", "chunk_costs_of",
           "chunk_layers", "collective_runs", "grad_bytes_per_element", "recipes_of", "split_layers"]
