"""The closed form's stages: each pipeline stage's recipes priced into pieces (docs/architecture.md).

The closed-form step (simdist.analytic.step) reads the one step model (simdist.plan.recipe) the op-graph builder
reads. Here each stage's recipes (its chunks' steps and its tail) are priced, their collectives alone by group shape
(simdist.analytic.pricing.CommPricer), on the groups where the stage sits on the mesh (`_geometry`), its compute
slowed where its GPU is slower (`_slowed`); a recipe whose core pieces run as one gapless block gets its simple form
(`_Simple`), and alike stages share their priced recipes (`_stages`). simdist.analytic.timeline times them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from simdist.analytic.pricing import (
    NUM_CORE,
    CommPricer,
    PricedPieces,
    Shape,
    chunk_cost_entry,
    priced_by_durations,
    recipe_entry,
    recipe_key,
    tail_entry,
    token,
)
from simdist.analytic.program import KIND_INDEX, recipe_code
from simdist.plan.accounting import Interval, partition_pieces
from simdist.plan.chunk_cost import chunk_cost_key
from simdist.plan.comm_overlap import a2a_overlapped
from simdist.plan.interference import tax_terms, taxed_s
from simdist.plan.pieces import SLOWED_KINDS, Piece
from simdist.plan.recipe import GROUP_AXES, PREV, send
from simdist.plan.schedule import SPLIT_BACKWARD, TWO_CHUNK_SCHEDULES, part_location
from simdist.plan.step_config import LayerKinds, StepConfig

_PP = 5  # STREAMS indices of the pp and dp streams (simdist.analytic.pricing)
_DP = 4


@dataclass(frozen=True, slots=True)
class _Simple:
    """A recipe whose pieces on the compute, tp and cp streams, started with those streams free, follow each other
    without a gap from its first piece (the step's input) to its end: their timeline relative to its start is
    fixed, so the step costs one addition and is accounted as a `Block`. Pieces on the dp stream run around it:
    ``ahead`` ones the first piece waits for (ZeRO-3's prefetched parameter gathers, issued with nothing to wait
    for), ``behind`` ones that only wait for it (ZeRO-2/3 reduce-scatters, overlapped gradient buckets)."""

    duration_s: float
    frees: tuple[float, float, float, float]
    """When the compute, tp, cp and ep streams are free again, relative to the start (-1: not used)."""
    parts: dict[str, float]
    ahead: tuple[tuple[float, str, bool], ...]
    """dp pieces issued ahead: (duration, category, pipeline work), in program order."""
    behind: tuple[tuple[float, float, str, bool], ...]
    """dp pieces behind: (ready relative to the start, duration, category, pipeline work), in program order."""
    model_flops: float
    hardware_flops: float


def _simple(r: PricedPieces) -> _Simple | None:
    streams = r.streams
    dp = [j for j, code in enumerate(streams) if code >= NUM_CORE]
    if any(streams[j] != _DP for j in dp):
        return None
    ahead = [j for j in dp if not r.deps[j]]
    behind = [j for j in dp if r.deps[j]]
    core = [j for j, code in enumerate(streams) if code < NUM_CORE]
    if not core or r.needs_input != core[0] or r.end not in core:
        return None
    entry = core[0]
    if PREV not in r.deps[entry] or any(d >= 0 and d not in ahead for d in r.deps[entry]):
        return None  # the first piece waits for the previous step and (only) the gathers issued ahead
    if any(PREV in r.deps[j] or any(x < 0 or x not in core for x in r.deps[j]) for j in core[1:]):
        return None  # a later core piece waits for the previous step again, or for a dp piece
    if any(any(x < 0 or x not in core for x in r.deps[j]) for j in behind):
        return None  # a dp piece waits for another dp piece
    if any(j > entry for j in ahead) or any(j in r.deps[k] for j in ahead for k in core[1:]):
        return None
    free = [0.0] * NUM_CORE
    ends: dict[int, float] = {}
    used = [False] * NUM_CORE
    intervals: list[Interval] = []
    for j in core:
        code = streams[j]
        t = max([free[code], *(ends[d] for d in r.deps[j] if d >= 0 and d in ends)])
        e = t + r.durations[j]
        free[code] = e
        used[code] = True
        ends[j] = e
        intervals.append((t, e, r.categories[j], r.work[j]))
    duration = ends[r.end]
    if max(ends.values()) > duration:
        return None
    # gapless: the work pieces cover [0, duration]
    covered = 0.0
    for t, e, _, work in sorted(intervals):
        if work:
            if t > covered:
                return None
            covered = max(covered, e)
    if covered < duration:
        return None
    frees = tuple(free[k] if used[k] else -1.0 for k in range(NUM_CORE))
    return _Simple(duration, frees, partition_pieces(intervals, duration),  # type: ignore[arg-type]
                   tuple((r.durations[j], r.categories[j], r.work[j]) for j in ahead),
                   tuple((max(ends[d] for d in r.deps[j]), r.durations[j], r.categories[j], r.work[j])
                         for j in behind),
                   r.model_flops, r.hardware_flops)


@dataclass(frozen=True, slots=True)
class _Stage:
    """A stage's priced recipes (by simdist.analytic.program.recipe_code), send times and tail."""

    recipes: list[PricedPieces | None]
    simple: list[_Simple | None]
    sends: list[float]
    """By chunk * 3 + kind index: seconds of the send to the neighbouring stage."""
    tail: PricedPieces
    unit: list | None = None
    """A box shared by alike stages (with their priced recipes), filled by the first reader that needs it: [0]
    where ``recipes``, ``simple`` and ``tail`` as arrays sit in the compiled timeline's arena (its generation and the
    unit's index: simdist.analytic.timeline_kernel.pack_boxed), [1] what the search's lower
    bound sums of them (simdist.analytic.bound), [2] whether the compiled timeline can run them and whether they
    put pipeline work beside the blocks (simdist.analytic.timeline `_flags`)."""

    def box(self) -> list:
        """The stage's unit box, or a fresh one for a stage that shares none (its contents then are not kept)."""
        return self.unit if self.unit is not None else _empty_unit()


def _empty_unit() -> list:
    """A `_Stage.unit` box with nothing filled yet."""
    return [None, None, None]


def _slowed(r: PricedPieces, factor: float, pieces: tuple[Piece, ...]) -> tuple[float, ...]:
    """The durations of ``r`` (priced ``pieces``) on a slower GPU: its kernels ``factor`` x as long, the pieces
    simdist.plan.step_emitter slows (SLOWED_KINDS); a tax piece taxes the collectives beside the slowed compute, as
    the engine does (simdist.plan.interference.tax_terms)."""
    out = list(r.durations)
    for j, p in enumerate(pieces):
        if p.tax_of:
            share, cap, pairing = tax_terms(p, factor)
            out[j] = taxed_s(share, sum(out[k] for k in p.tax_of), cap, pairing)
        elif p.comm is None and p.kind in SLOWED_KINDS:
            out[j] *= factor
    return tuple(out)


def _stage(cfg: StepConfig, pricer: CommPricer, chunks: tuple[tuple[LayerKinds, bool, bool], ...],
           groups: dict[str, Shape], factor: float = 1.0, config: tuple[int, int] | None = None,
           shape: tuple | None = None) -> tuple[list, list, PricedPieces]:
    """(priced recipes by recipe_code, their simple forms, the priced tail) of a stage whose chunks hold
    ``chunks`` (layers as StepConfig.part_layers, first model part, last model part) on the mesh groups
    ``groups``; ``factor``: the time factor of its compute (a straggler, the spread of GPU speeds:
    StepConfig.compute_factor); ``config``:
    the `token` of `chunk_cost_key` and of `recipe_key` of ``cfg``, ``shape``: `CommPricer.shape_key` of
    ``groups``, if already computed."""
    kinds = ("F", "B", "W") if cfg.schedule in SPLIT_BACKWARD else ("F", "B")
    # the steps the 1F1B A2A overlap runs alone have codes of their own after the others (simdist.analytic.program)
    variants = (False, True) if a2a_overlapped(cfg) else (False,)
    cost_config, config_ = config if config is not None else (token(chunk_cost_key(cfg)), token(recipe_key(cfg)))
    # the groups' shape as one number for the priced-recipe lookups below (dozens per stage; hashing the shape's
    # nested tuples each time cost more than the lookups)
    shape = token(("shape", pricer.shape_key(groups) if shape is None else shape))
    costs = []
    cost_tokens = []
    V6 = len(chunks) * 6
    recipes: list[PricedPieces | None] = [None] * (V6 * len(variants))
    simple: list[_Simple | None] = [None] * (V6 * len(variants))
    seen: dict[tuple[LayerKinds, bool, bool], int] = {}
    for c, chunk in enumerate(chunks):
        n, first, last_part = chunk
        cost, cost_token = chunk_cost_entry(cfg, n, first, last_part, cost_config)
        costs.append(cost)
        cost_tokens.append(cost_token)
        same = seen.setdefault(chunk, c)
        if same != c:  # an interleaved stage's chunks of the same layers: the same priced recipes (same keys)
            for kind in kinds:
                for edge in (False, True):
                    for alone in variants:
                        code = recipe_code(c, kind, edge) + V6 * alone
                        code_ = recipe_code(same, kind, edge) + V6 * alone
                        recipes[code], simple[code] = recipes[code_], simple[code_]
            continue
        for kind, edge, alone in ((k, e, a) for k in kinds for e in (False, True) for a in variants):
            r, pieces_token = recipe_entry(cfg, cost, cost_token, kind, edge, config_, alone)
            # a recipe's simple form depends on its priced pieces only: made once per priced recipe
            code = recipe_code(c, kind, edge) + V6 * alone
            if factor == 1.0:
                recipes[code], simple[code] = pricer.priced(r.pieces, r.end, groups, compile=_simple,
                                                            shape=shape, pieces_token=pieces_token)
            else:  # slowed once per (recipe, shape, factor): a search's layouts share one job size's factor
                recipes[code], simple[code] = pricer.memo(
                    ("slowed", pieces_token, shape, factor),
                    lambda r=r, pieces_token=pieces_token: _slowed_pair(pricer, r.pieces, r.end, groups, shape,
                                                                        pieces_token, factor))
    t, pieces_token = tail_entry(cfg, tuple(costs), tuple(cost_tokens), config_)
    if factor == 1.0:
        return recipes, simple, pricer.priced(t.pieces, len(t.pieces) - 1, groups, shape=shape,
                                              pieces_token=pieces_token)[0]
    tail_key = ("slowed", pieces_token, shape, factor)
    return recipes, simple, pricer.memo(tail_key, lambda: _slowed_pair(
        pricer, t.pieces, len(t.pieces) - 1, groups, shape, pieces_token, factor, compile=False))[0]


def _slowed_pair(pricer: CommPricer, pieces: tuple[Piece, ...], end: int, groups: dict[str, Shape], shape: int,
                 pieces_token: int, factor: float, compile: bool = True) -> tuple[PricedPieces, _Simple | None]:
    """(``pieces`` priced on ``groups`` and `_slowed` by ``factor``, its simple form unless not ``compile``), shared
    by every shape and pricer that times them alike (simdist.analytic.pricing.priced_by_durations)."""
    slow = _slowed(pricer.priced(pieces, end, groups, shape=shape, pieces_token=pieces_token)[0], factor, pieces)
    return priced_by_durations(pieces, end, pieces_token, slow, _simple if compile else None)


@dataclass(frozen=True, slots=True)
class _Geometry:
    """Where a stage sits, as far as its prices go: what `_stages` reads off the mesh, the same for every copy of a
    step whose costs differ (simdist.analytic.step_batch)."""

    rank: int
    groups: dict[str, Shape]
    shape: tuple
    """`CommPricer.shape_key` of ``groups``."""
    chunks: tuple[tuple[LayerKinds, bool, bool], ...]
    sends: tuple[tuple[int, tuple | None], ...]
    """(chunk * 3 + kind index, `CommPricer.key` of the send) of each send to a neighbouring stage."""
    key: int
    """`token` of (``chunks``, ``shape``): what of the stage decides its priced recipes, for the memo's key."""


def _geometry(cfg: StepConfig, pricer: CommPricer) -> list[_Geometry]:
    """Where each stage sits (see `_Geometry`), memoised by what decides it: the mesh, the layer split and the
    send's bytes (a search's layouts share their mesh across micro-batch sizes, recompute and ZeRO stages). The
    placement part (groups, shapes, chunks, send pairs: `_find_geometry`) is memoised without the bytes, so the
    layouts of one mesh and split that send different bytes (micro-batch sizes) find it once."""
    p2p = send(cfg)
    key = ("geometry", cfg.mesh, cfg.model, cfg.layers_per_part, cfg.layers_per_stage, cfg.vpp, _placement(cfg),
           p2p.op, p2p.nbytes)
    return pricer.memo(key, lambda: _sized_geometry(cfg, pricer, p2p.op, p2p.nbytes))


def _sized_geometry(cfg: StepConfig, pricer: CommPricer, op: str, nbytes: float) -> list[_Geometry]:
    placed = pricer.memo(("geometry", cfg.mesh, cfg.model, cfg.layers_per_part, cfg.layers_per_stage, cfg.vpp,
                          _placement(cfg)), lambda: _find_geometry(cfg, pricer))
    return [dataclasses.replace(g, sends=tuple(
        (index, pricer.key(op, pair, nbytes) if nbytes > 0 else None)  # the key `CommPricer.time_s` prices
        for index, pair in g.sends)) for g in placed]


def _placement(cfg: StepConfig) -> str:
    """What places the model parts on the stages, for the geometry memo's key: Megatron's interleaving, or the
    schedule's own placement (simdist.plan.schedule.model_part)."""
    return cfg.schedule if cfg.schedule in TWO_CHUNK_SCHEDULES else ""


def _find_geometry(cfg: StepConfig, pricer: CommPricer) -> list[_Geometry]:
    """`_geometry` without the send's bytes: each send as its (index, pair of ranks)."""
    mesh, K, V = cfg.mesh, cfg.mesh.pp, cfg.chunks
    kinds = cfg.parts_layers()
    num_parts = cfg.num_parts
    # (size, stride or offsets) of every group axis: the same for every stage, whose groups differ in their first rank
    # (dp_cp, where cp and dp are not adjacent in the order, has no one stride: its peers' offsets instead)
    shapes = {axis: mesh.shape(axis) for axis in GROUP_AXES if axis != "pp"}
    stage_ranks = [mesh.rank(pp=s) for s in range(K)]
    out = []
    for s in range(K):
        rank = stage_ranks[s]
        # the stage's representative has coordinate 0 along tp, cp, dp, and so along etp, ep, edp (the pipeline groups
        # of the two generators agree: simdist.plan.layout.check_experts)
        groups = {axis: (rank, *shape) for axis, shape in shapes.items()}
        # chunk c of stage s is model part c*K + s (Megatron's interleaving), or the schedule's V / two copies
        # (StepConfig.part_of; simdist.plan.step.chunk_costs_of)
        chunks = tuple((kinds[part], part == 0, part == num_parts - 1)
                       for part in (cfg.part_of(s, c) for c in range(V)))
        sends = []
        for c in range(V):
            for kind, step in (("F", 1), ("B", -1)):
                part = cfg.part_of(s, c) + step
                if 0 <= part < num_parts:
                    # dualpipe's chunk c carries the micro-batches of direction c
                    dst = part_location(part, K, cfg.schedule, c if cfg.schedule == "dualpipe" else 0)[0]
                    if dst != s:
                        sends.append((c * 3 + KIND_INDEX[kind], (rank, stage_ranks[dst])))
        shape = pricer.shape_key(groups)
        out.append(_Geometry(rank, groups, shape, chunks, tuple(sends), token(("stage", chunks, shape))))
    return out


def _stages(cfg: StepConfig, pricer: CommPricer, dp_index: int = 0, geometry: list[_Geometry] | None = None
            ) -> list[_Stage]:
    """The stages of data-parallel replica ``dp_index`` (they differ only by a straggler's compute); ``geometry``:
    `_geometry` of ``cfg``'s mesh on ``pricer``'s cluster, if already found. Kept by ``pricer`` for what decides
    them (the recipes' and chunk costs' configuration, the geometry, the replica's compute factors): a search reads
    a layout's stages for its bounds and again for its closed form, and a benchmark again and again. Callers only
    read the list."""
    # by the identity of the configuration asked (kept in the box, so its id is no other's meanwhile): a search asks
    # for one layout's stages for its bound and again for its closed form, and the keys below hash it whole
    box = pricer.memo(("stages of", id(cfg), dp_index), lambda: [None, None]) if geometry is None else None
    if box is not None and box[0] is cfg:
        return box[1]
    p2p = send(cfg)
    config = (token(chunk_cost_key(cfg)), token(recipe_key(cfg)))
    geometry = geometry if geometry is not None else _geometry(cfg, pricer)
    # keyed by the geometry list's id, the list kept in the entry: alive while the entry is, its id no other's
    key = ("stages", config, id(geometry), dp_index, cfg.compute_slowdown, cfg.paced_variability, p2p.count)
    stages = pricer.memo(key, lambda: (geometry, _priced_stages(cfg, pricer, dp_index, geometry, config,
                                                                p2p.count)))[1]
    if box is not None:
        box[0], box[1] = cfg, stages
    return stages


class Stages(list):
    """A replica's priced stages as `_stages` keeps them, with ``flags``: what the closed form asks of all of them
    (simdist.analytic.timeline `_all_flags`: whether the compiled loop can time them, whether they put work beside
    the blocks), found on first use and kept with them. Callers only read the list."""

    __slots__ = ("distinct", "flags", "sends", "unit_of")

    def __init__(self) -> None:
        super().__init__()
        self.flags: tuple[bool, bool] | None = None
        self.sends: np.ndarray | None = None
        """(K, 3V): every stage's `_Stage.sends` as one array (what the compiled timeline reads), made with them."""
        self.distinct: list[_Stage] = []
        """`distinct_stages`: one stage of each set of alike stages; ``unit_of`` (K): each stage's among them."""
        self.unit_of: np.ndarray | None = None

    def seal(self, width: int) -> Stages:
        """Made once its stages are in (``width``: each stage's sends): the arrays above."""
        self.sends = np.array([st.sends for st in self], dtype=float).reshape(len(self), width)
        self.distinct, self.unit_of = distinct_stages(self)
        for a in (self.sends, self.unit_of):
            a.flags.writeable = False  # (read by every timeline of these stages)
        return self


def distinct_stages(stages: list[_Stage]) -> tuple[list[_Stage], np.ndarray]:
    """(one stage of each set of alike stages: those sharing a `_Stage.unit` box, whose recipes are the same objects;
    every stage without a box is its own, each stage's index among them)."""
    index: dict[int, int] = {}
    out: list[_Stage] = []
    unit_of = np.empty(len(stages), dtype=np.int64)
    for s, st in enumerate(stages):
        key = id(st.unit) if st.unit is not None else -1 - s
        j = index.get(key)
        if j is None:
            j = index[key] = len(out)
            out.append(st)
        unit_of[s] = j
    return out, unit_of


def _priced_stages(cfg: StepConfig, pricer: CommPricer, dp_index: int, geometry: list[_Geometry],
                   config: tuple[int, int], count: int) -> list[_Stage]:
    out = Stages()
    overlapped = a2a_overlapped(cfg)
    seen: dict[tuple, tuple] = {}  # the stages of this replica alike in what prices them (a deep pipeline's middle)
    for s, g in enumerate(geometry):
        factor = cfg.compute_factor(s, dp_index) if cfg.compute_slowdown else cfg.paced_variability
        hit = seen.get((g.key, factor))
        if hit is None:
            # alike stages (same layers, positions, group shapes and speed) share their priced recipes
            recipes, simple, stage_tail = pricer.memo(("stage", config, g.key, factor), lambda g=g, factor=factor:
                                                      _stage(cfg, pricer, g.chunks, g.groups, factor, config,
                                                             g.shape))
            # stages whose priced recipes, simple forms and tail are the same objects (the pricing shares what it
            # times alike, simdist.analytic.pricing), whatever their group shapes, share one box: the compiled
            # timeline packs them once, the bound sums them once (the entry holds the objects: their ids are no
            # other's meanwhile)
            content = (tuple(map(id, recipes)), tuple(map(id, simple)), id(stage_tail))
            unit = pricer.memo(("unit", config, content),
                               lambda r=recipes, sm=simple, t=stage_tail: (r, sm, t, _empty_unit()))[3]
            hit = seen[g.key, factor] = (recipes, simple, stage_tail, unit)
        recipes, simple, stage_tail, unit = hit
        sends = [0.0] * (cfg.chunks * 3)
        for index, key in g.sends:
            sends[index] = pricer.time_of_key(key) * count
        if overlapped:  # the codes of the steps run alone name the chunks' sends again (code >> 1: 3V + ...)
            sends = sends + sends
        out.append(_Stage(recipes, simple, sends, stage_tail, unit))
    return out.seal(cfg.chunks * 3 * (2 if overlapped else 1))
