"""Closed-form step time: the "analytic" fidelity of a training step (docs/architecture.md).

It reads the one step model (simdist.plan.recipe) the op-graph builder reads, prices each recipe's collectives
alone by group shape (simdist.analytic.pricing.CommPricer), and times the schedule step by step without building
a graph or running SimPy: every piece of a step starts when its stream is free, when the pieces it depends on
have ended, when the stage's previous step has ended and (its first compute) when the neighbouring stage's send
has arrived; a send leaves on the pp stream after its step. That is the engine's execution rule with nothing
contending, so the closed form equals the engine wherever no collective shares a link with another (tests, to
1e-9; `simdist run --fidelity closed_form` reports it in the engine's JSON). The pipeline composition is exact
for uneven stages and chunks, the LM-head stage and per-micro-batch collectives, where formulas over per-stage
sums were not (Narayanan et al. 2021 sec 2.2's (M + K - 1)(t_f + t_b) is its uniform special case).

Cost grows with the schedule's distinct work: a large micro-batch count is fast-forwarded
(simdist.plan.fastforward): three short schedules are timed and their repeating steady state extended.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from simdist.analytic.pricing import (
    NUM_CORE,
    STREAMS,
    CommPricer,
    PricedPieces,
    Shape,
    cached_chunk_cost,
    chunk_cost_entry,
    chunk_cost_key,
    recipe_entry,
    recipe_key,
    tail_entry,
    token,
)
from simdist.analytic.program import KIND_INDEX, program, recipe_code, step_groups
from simdist.analytic.timeline_kernel import GENERIC, SIMPLE, Packed, pack, pack_stage, run_program
from simdist.plan.accounting import CATEGORIES, Block, Interval, account, partition_pieces
from simdist.plan.fastforward import FastForward, extrapolate
from simdist.plan.fastforward import plan as ff_plan
from simdist.plan.pieces import SLOWED_KINDS, Piece
from simdist.plan.recipe import DP_DONE, GROUP_AXES, LAST_BACKWARDS, PREV, send
from simdist.plan.schedule import SPLIT_BACKWARD, TWO_CHUNK_SCHEDULES, part_location
from simdist.plan.step_config import LayerKinds, StepConfig, layer_kinds

__all__ = ["AnalyticStep", "CommPricer", "analytic_observables", "analytic_step", "cached_chunk_cost",
           "fast_forward_plan"]

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
    ``recipes``, ``simple`` and ``tail`` as arrays (`Unit`: the compiled timeline), [1] what the search's lower
    bound sums of them (simdist.analytic.bound)."""


def _slowed(r: PricedPieces, factor: float, pieces: tuple[Piece, ...]) -> PricedPieces:
    """``r`` (priced ``pieces``) on a slower GPU: its kernels ``factor`` x as long, the pieces simdist.plan.step slows
    (SLOWED_KINDS); a tax piece (simdist.plan.interference) taxes the collectives beside the slowed compute, up to it:
    share x min(their time, factor x its compute), as simdist.plan.step caps it."""
    out = list(r.durations)
    for j, p in enumerate(pieces):
        slowed = p.comm is None and p.kind in SLOWED_KINDS
        if p.tax_of:
            out[j] = p.tax_share * min(sum(out[k] for k in p.tax_of), p.duration_s * (factor if slowed else 1.0))
        elif slowed:
            out[j] *= factor
    return dataclasses.replace(r, durations=tuple(out))


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
    cost_config, config_ = config if config is not None else (token(chunk_cost_key(cfg)), token(recipe_key(cfg)))
    # the groups' shape as one number for the priced-recipe lookups below (dozens per stage; hashing the shape's
    # nested tuples each time cost more than the lookups)
    shape = token(("shape", pricer.shape_key(groups) if shape is None else shape))
    costs = []
    cost_tokens = []
    recipes: list[PricedPieces | None] = [None] * (len(chunks) * 6)
    simple: list[_Simple | None] = [None] * (len(chunks) * 6)
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
                    code, code_ = recipe_code(c, kind, edge), recipe_code(same, kind, edge)
                    recipes[code], simple[code] = recipes[code_], simple[code_]
            continue
        for kind in kinds:
            for edge in (False, True):
                r, pieces_token = recipe_entry(cfg, cost, cost_token, kind, edge, config_)
                # a recipe's simple form depends on its priced pieces only: made once per priced recipe
                code = recipe_code(c, kind, edge)
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
    """(``pieces`` priced on ``groups`` and `_slowed` by ``factor``, its simple form unless not ``compile``)."""
    slow = _slowed(pricer.priced(pieces, end, groups, shape=shape, pieces_token=pieces_token)[0], factor, pieces)
    return slow, _simple(slow) if compile else None


_KINDS_CACHE: dict[tuple, tuple[LayerKinds, ...]] = {}


def _part_kinds(cfg: StepConfig) -> tuple[LayerKinds, ...]:
    """`StepConfig.part_layers` of every model part, in model order, cached by what decides them (a search and the
    step bands time many configurations of one split)."""
    key = (cfg.model, cfg.layers_per_part, cfg.layers_per_stage, cfg.mesh.pp, cfg.vpp, cfg.schedule)
    hit = _KINDS_CACHE.get(key)
    if hit is None:
        if len(_KINDS_CACHE) >= 4096:
            _KINDS_CACHE.clear()
        firsts, counts = cfg.part_first_layers(), cfg.model_parts()
        hit = _KINDS_CACHE[key] = tuple(layer_kinds(cfg.model, f, n) for f, n in zip(firsts, counts, strict=True))
    return hit


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
    kinds = _part_kinds(cfg)
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
    `_geometry` of ``cfg``'s mesh on ``pricer``'s cluster, if already found."""
    p2p = send(cfg)
    config = (token(chunk_cost_key(cfg)), token(recipe_key(cfg)))
    out: list[_Stage] = []
    for s, g in enumerate(geometry if geometry is not None else _geometry(cfg, pricer)):
        factor = cfg.compute_factor(s, dp_index) if cfg.compute_slowdown else cfg.gpu_variability
        # alike stages (same layers, positions, group shapes and speed) share their priced recipes
        recipes, simple, stage_tail, unit = pricer.memo(("stage", config, g.key, factor), lambda g=g, factor=factor: (
            *_stage(cfg, pricer, g.chunks, g.groups, factor, config, g.shape), [None, None]))
        sends = [0.0] * (cfg.chunks * 3)
        for index, key in g.sends:
            sends[index] = pricer.time_of_key(key) * p2p.count
        out.append(_Stage(recipes, simple, sends, stage_tail, unit))
    return out


def _run_tail(r: PricedPieces, free: list[float], last_backward_s: float, intervals: list[Interval]) -> None:
    """Run a stage's tail (gradient reduction, optimizer) after its pipeline work: each piece starts when its
    stream is free and its dependencies (earlier pieces, the stage's last backwards, the dp stream) are done;
    ``free`` (per stream) is advanced in place and the pieces are appended to ``intervals``."""
    ends: list[float] = []
    for j, sc in enumerate(r.streams):
        t = free[sc]
        for d in r.deps[j]:
            if d >= 0:
                t = max(t, ends[d])
            elif d == LAST_BACKWARDS:
                t = max(t, last_backward_s)
            elif d == DP_DONE:
                t = max(t, free[_DP])
        e = t + r.durations[j]
        free[sc] = e
        ends.append(e)
        intervals.append((t, e, r.categories[j], r.work[j]))


def _timeline(cfg: StepConfig, stages: list[_Stage], num_microbatches: int, starts: dict | None = None
              ) -> tuple[float, list[list[Interval]], list[list[Block]], float, float]:
    """(step end, per-stage intervals and blocks, model and hardware FLOPs per GPU) of ``num_microbatches``;
    ``starts``: filled with each step's start, by (stage, kind, chunk), in micro-batch order."""
    K = cfg.mesh.pp
    prog = program(cfg.schedule, K, num_microbatches, cfg.vpp)
    n = len(prog)
    free = [[0.0] * len(STREAMS) for _ in range(K)]
    prev = [-1.0] * K  # end of the stage's previous step (-1: none yet)
    out = [0.0] * n  # when the step's output reaches the neighbouring stage
    last_bwd = [0.0] * K
    intervals: list[list[Interval]] = [[] for _ in range(K)]
    blocks: list[list[Block]] = [[] for _ in range(K)]
    model = hardware = 0.0
    zb = cfg.schedule in SPLIT_BACKWARD
    p_stage, p_kind, p_chunk, p_up, p_down, p_code = (prog.stage, prog.kind, prog.chunk, prog.upstream,
                                                      prog.downstream_stage, prog.code)
    p_late, p_held, p_next = (prog.steps[4].tolist(), prog.steps[5].tolist(), prog.steps[6].tolist())
    for i in range(n):
        s = p_stage[i]
        st = stages[s]
        code = p_code[i]
        up = p_up[i]
        recv = out[up] if up >= 0 else 0.0
        f = free[s]
        t0 = prev[s] if prev[s] > f[0] else f[0]
        if recv > t0:
            t0 = recv
        simple = st.simple[code]
        if simple is not None:
            if simple.ahead:  # the gathers issued ahead queue on the dp stream; the step waits for them
                t_dp = f[_DP]
                ahead = []
                for duration, category, work in simple.ahead:
                    ahead.append((t_dp, t_dp + duration, category, work))
                    t_dp += duration
                start = t_dp if t_dp > t0 else t0
                if f[1] <= start and f[2] <= start and f[3] <= start:
                    f[_DP] = t_dp
                    intervals[s].extend(ahead)
                    t0 = start
                else:
                    simple = None
            elif f[1] > t0 or f[2] > t0 or f[3] > t0:
                simple = None
        if starts is not None:
            starts.setdefault((s, p_kind[i], p_chunk[i]), []).append(t0)
        if simple is not None:
            end = t0 + simple.duration_s
            fr = simple.frees
            if fr[0] >= 0:
                f[0] = t0 + fr[0]
            if fr[1] >= 0:
                f[1] = t0 + fr[1]
            if fr[2] >= 0:
                f[2] = t0 + fr[2]
            if fr[3] >= 0:
                f[3] = t0 + fr[3]
            blocks[s].append((t0, end, simple.parts))
            for ready, duration, category, work in simple.behind:
                t = t0 + ready
                if f[_DP] > t:
                    t = f[_DP]
                f[_DP] = t + duration
                intervals[s].append((t, f[_DP], category, work))
            model += simple.model_flops
            hardware += simple.hardware_flops
        else:
            r = st.recipes[code]
            assert r is not None
            end = _run_pieces(r, f, prev[s], recv, intervals[s])
            model += r.model_flops
            hardware += r.hardware_flops
        prev[s] = end
        kind = p_kind[i]
        if kind == "W" or (kind == "B" and not zb):
            last_bwd[s] = max(last_bwd[s], end)
        j = i if not p_late[i] else p_held[i]  # the sends this step's end makes: its own (unless held), the held
        while j >= 0:
            if p_down[j] >= 0:
                t = f[_PP] if f[_PP] > end else end
                e = t + st.sends[p_chunk[j] * 3 + KIND_INDEX[p_kind[j]]]
                f[_PP] = e  # a send ends before its receiver's work starts: inside the phase, it is never charged
                out[j] = e
            else:
                out[j] = end
            j = p_held[i] if j == i else p_next[j]
    step = max(prev, default=0.0)
    for s in range(K):
        r = stages[s].tail
        f = free[s]
        _run_tail(r, f, last_bwd[s], intervals[s])
        model += r.model_flops
        hardware += r.hardware_flops
        step = max(step, *f)
    return step, intervals, blocks, model / K, hardware / K


def _edge_forward(code: int) -> bool:
    """`recipe_code` of a chunk's first forward (simdist.plan.recipe.is_edge): run once per chunk and step."""
    return code % 6 == 1


def _closed(r: PricedPieces) -> bool:
    """Every piece of ``r`` on the compute, tp, cp or ep stream is ``r``'s end or one it waits for (transitively):
    the step leaves those streams free when it ends, as `_timeline_fast` takes them at every step's start."""
    seen, todo = {r.end}, [r.end]
    while todo:
        for d in r.deps[todo.pop()]:
            if d >= 0 and d not in seen:
                seen.add(d)
                todo.append(d)
    return all(j in seen for j, code in enumerate(r.streams) if code < NUM_CORE)


def _fast(stages: list[_Stage]) -> bool:
    """Every recipe is simple, or is a chunk's first forward (its parameter gathers: simdist.plan.recipe
    ._gathered_forward) that leaves the core streams free when it ends, which `_timeline_fast` runs piece by
    piece."""
    return all(r is None or sm is not None or (_edge_forward(code) and _closed(r))
               for st in stages for code, (r, sm) in enumerate(zip(st.recipes, st.simple, strict=True)))


def _overlapping_work(stages: list[_Stage]) -> bool:
    """Some simple recipe issues pipeline work on the dp stream, which may overlap blocks (ZeRO-2/3), or some recipe
    is not simple (its pieces are intervals beside the blocks)."""
    return any((sm is None and r is not None)
               or (sm is not None and (any(w for _, _, w in sm.ahead) or any(w for _, _, _, w in sm.behind)))
               for st in stages for r, sm in zip(st.recipes, st.simple, strict=True))


def _run_pieces(r: PricedPieces, free: list[float], prev_s: float, recv: float, intervals: list[Interval]) -> float:
    """Run one step's pieces one by one (the engine's rule: each when its stream is free, its dependencies, the
    stage's previous step (``prev_s``) and, for the piece that needs it, the input (``recv``) are done); ``free``
    (per stream) is advanced in place and the pieces appended to ``intervals``. Returns the step's end."""
    ends: list[float] = []
    for j, sc in enumerate(r.streams):
        t = free[sc]
        for d in r.deps[j]:
            if d >= 0:
                if ends[d] > t:
                    t = ends[d]
            elif d == PREV and prev_s > t:
                t = prev_s
        if j == r.needs_input and recv > t:
            t = recv
        e = t + r.durations[j]
        free[sc] = e
        ends.append(e)
        intervals.append((t, e, r.categories[j], r.work[j]))
    return ends[r.end]


def _backward_codes(num_codes: int, zb: bool) -> np.ndarray:
    """Per recipe code: whether the step counts as its stage's backward work (its last one ends the pipeline
    work): a W, or a B where B does not leave its weight gradients for a W (ZB-H1)."""
    kind = (np.arange(max(num_codes, 1)) >> 1) % 3
    return (kind == KIND_INDEX["W"]) | ((kind == KIND_INDEX["B"]) & (not zb))


def _compiled_timeline(cfg: StepConfig, packed: Packed, num_microbatches: int, starts: dict | None = None,
                       spans: bool = False) -> tuple:
    """`run_program` over the schedule's program of ``num_microbatches``: where `_fast` holds, each step's core
    streams are free when it starts, so a simple step costs one addition (simdist.analytic.timeline_kernel);
    ``starts``: filled with each step's start, by (stage, kind, chunk), in micro-batch order."""
    K = cfg.mesh.pp
    prog = program(cfg.schedule, K, num_microbatches, cfg.vpp)
    result = run_program(packed, prog.steps, _backward_codes(packed.kind.shape[1], cfg.schedule in SPLIT_BACKWARD),
                         starts is not None, spans)
    if starts is not None:
        at = result[5]
        for key, idx in step_groups(cfg.schedule, K, num_microbatches, cfg.vpp):
            starts.setdefault(key, []).extend(at[idx].tolist())
    return result


def _compiled_observables(cfg: StepConfig, stages: list[_Stage], packed: Packed, num_microbatches: int
                          ) -> dict[str, float]:
    """`_observables` where `_fast` holds: the compiled timeline and the compiled breakdown sweep
    (simdist.plan.accounting_kernel); the simple steps are blocks whose parts are charged as they are."""
    from simdist.plan.accounting_kernel import account_stages  # numba: loaded with the compiled timeline

    K = cfg.mesh.pp
    cover = _overlapping_work(stages)
    step, intervals, used, first_last, spans, _ = _compiled_timeline(cfg, packed, num_microbatches, spans=cover)
    kind = packed.kind[packed.slot]  # (K, C): each stage's recipe kinds
    used = used[:, :kind.shape[1]]
    simple = np.where(kind == SIMPLE, used, 0)
    totals = (simple * packed.duration[packed.slot]).sum(axis=1)
    lo, hi, seconds = account_stages(intervals, K, step, first_last, totals, spans, cover)
    seconds[:, :len(CATEGORIES)] += np.einsum("kc,kcn->kn", simple, packed.parts[packed.slot])
    generic = kind == GENERIC
    flops = (np.einsum("kc,kcf->f", simple, packed.simple_flops[packed.slot])
             + (used[generic][:, None] * packed.recipe_flops[packed.recipe[packed.slot][generic]]).sum(axis=0)
             + packed.recipe_flops[packed.tail[packed.slot]].sum(axis=0))
    mean = seconds.mean(axis=0) if K else np.zeros(seconds.shape[1])
    return {"step_s": step, "phase_s": max(hi - lo, 0.0), "model_flops": flops[0] / K, "hardware_flops": flops[1] / K,
            **{f"{c}_s": float(mean[j]) for j, c in enumerate((*CATEGORIES, "bubble", "idle"))}}


def _pack(stages: list[_Stage]) -> Packed:
    """``stages`` as arrays for the compiled timeline; each distinct stage packed once (`_Stage.unit`)."""
    units = []
    for st in stages:
        box = st.unit if st.unit is not None else [None, None]
        if box[0] is None:
            box[0] = pack_stage(st.recipes, st.simple, st.tail)
        units.append(box[0])
    return pack(units, [st.sends for st in stages])


COMPILE_STEPS = 50_000
"""A program at least this long is timed compiled unless the caller says (``compiled``): numba's start-up (about
0.4 s, once per process) is paid where timing is the work (a search asks for it: simdist.search.evaluate), not by a
`simdist run` of a short step. Either path gives the same figures to 1e-9 (tests/test_timeline_kernel.py), and a
given input always takes the same path (its JSON byte-identical run after run)."""


def _compiled(cfg: StepConfig, stages: list[_Stage], num_microbatches: int, compiled: bool | None) -> bool:
    """Whether to time this program compiled: its recipes allow it (`_fast`) and the caller asks (``compiled``
    True), or, the caller leaving it to the size (None), it is `COMPILE_STEPS` long."""
    if compiled is None:
        compiled = len(program(cfg.schedule, cfg.mesh.pp, num_microbatches, cfg.vpp)) >= COMPILE_STEPS
    return compiled and _fast(stages)


def _observables(cfg: StepConfig, stages: list[_Stage], num_microbatches: int,
                 packed: Packed | None = None, compiled: bool | None = None) -> dict[str, float]:
    """The step's additive quantities timed over ``num_microbatches``; ``packed``: the stages as arrays, to time
    it compiled (else `_compiled` decides, with ``compiled``)."""
    if packed is not None or _compiled(cfg, stages, num_microbatches, compiled):
        return _compiled_observables(cfg, stages, packed if packed is not None else _pack(stages), num_microbatches)
    step, intervals, blocks, model, hardware = _timeline(cfg, stages, num_microbatches)
    acct = account(intervals, step, blocks)
    mean = acct.mean()
    return {"step_s": step, "phase_s": acct.phase_s, "model_flops": model, "hardware_flops": hardware,
            **{f"{k}_s": v for k, v in mean.items()}}


class _Timelines:
    """The closed form's timelines of one replica for `simdist.plan.fastforward.plan`: ``timeline(m)`` (each step's
    start and the step time) and ``step_of(m)`` (the step time alone: no starts recorded). ``stages``: the
    replica's stages, or a callable that makes them, called on the first timeline only (a step too short to
    fast-forward is never timed, so its stages need not be priced here)."""

    def __init__(self, cfg: StepConfig, stages: list[_Stage] | Callable[[], list[_Stage]],
                 compiled: bool | None = None) -> None:
        self._cfg = cfg
        self._stages = stages
        self._packed: Packed | None = None
        self._compiled = compiled

    def _run(self, m: int, starts: dict | None) -> float:
        if callable(self._stages):
            self._stages = self._stages()
        if self._packed is None and _compiled(self._cfg, self._stages, m, self._compiled):
            self._packed = _pack(self._stages)
        if self._packed is not None:
            return _compiled_timeline(self._cfg, self._packed, m, starts)[0]
        return _timeline(self._cfg, self._stages, m, starts)[0]

    def timeline(self, m: int) -> tuple[dict[tuple, list[float]], float]:
        starts: dict[tuple, list[float]] = {}
        step = self._run(m, starts)
        return starts, step

    def step_of(self, m: int) -> float:
        return self._run(m, None)


def fast_forward_plan(cfg: StepConfig, pricer: CommPricer, *, for_engine: bool = False, beside: bool = False
                      ) -> tuple[int, int, int, int] | None:
    """(cycle, M1, M2, M3) to sample instead of every micro-batch (simdist.plan.fastforward.plan), the cycle read
    off the closed form's timeline; None: time every micro-batch. The stages are priced only where a timeline is
    read (a short step is not fast-forwarded: nothing to price). ``beside`` (the engine's): its smaller samples run
    in a second process beside the largest (simdist.plan.fastforward.samples_cost)."""
    return _plan(cfg, lambda: _stages(cfg, pricer), for_engine, beside)


def _plan(cfg: StepConfig, stages: list[_Stage] | Callable[[], list[_Stage]], for_engine: bool, beside: bool = False,
          compiled: bool | None = None) -> tuple[int, int, int, int] | None:
    if cfg.dp_batch_split is not None or (for_engine and cfg.compute_slowdown):
        return None  # the engine simulates unequal replicas whole
    timelines = _Timelines(cfg, stages, compiled)
    return ff_plan(cfg.schedule, cfg.mesh.pp, cfg.microbatches(0), timelines.timeline, vpp=cfg.vpp,
                   count_detection=not for_engine, step_of=timelines.step_of, beside=beside and for_engine)


def _num_microbatches(cfg: StepConfig) -> int:
    return max(cfg.microbatches(d) for d in (range(cfg.mesh.dp) if cfg.dp_batch_split is not None else (0,)))


def analytic_observables(cfg: StepConfig, pricer: CommPricer, *,
                         fast_forward: bool | tuple[int, int, int, int] = True, compiled: bool | None = None
                         ) -> tuple[dict[str, float], FastForward | None]:
    """The step's additive quantities (as simdist.report.step_metrics.observables measures them on a trace) and
    how its micro-batches were fast-forwarded (None: every one was timed). ``fast_forward``: a (cycle, M1, M2,
    M3) of `fast_forward_plan` samples those counts instead of detecting its own (a caller timing many variants
    of one step, simdist.predict.bands); they are extended only where collinear, as the detected ones.

    With a straggler (``cfg.compute_slowdown``) each distinct replica is timed and the slowest one's answer
    returned: the data-parallel collectives at the step's end wait for it.
    # Assumption: the closed form of a step with a straggler is its slowest replica's timeline, exact where one
    # replica is slowed and the data-parallel collectives run after the backward (the default bucketed
    # reduction); where replicas meet mid-step (overlapped buckets, ZeRO-2/3's per-micro-batch collectives) or
    # stragglers sit in several replicas at different stages, only the engine sees the waits compound.
    """
    if cfg.compute_slowdown:
        replicas = sorted({cfg.mesh.coords(r)["dp"] for r, _ in cfg.compute_slowdown})
        if len(replicas) < cfg.mesh.dp:
            replicas.append(next(d for d in range(cfg.mesh.dp) if d not in replicas))  # a healthy one
        timed = [_replica_observables(cfg, pricer, d, fast_forward, compiled) for d in replicas]
        return max(timed, key=lambda t: t[0]["step_s"])
    return _replica_observables(cfg, pricer, 0, fast_forward, compiled)


def _replica_observables(cfg: StepConfig, pricer: CommPricer, dp_index: int,
                         fast_forward: bool | tuple[int, int, int, int], compiled: bool | None = None
                         ) -> tuple[dict[str, float], FastForward | None]:
    stages = _stages(cfg, pricer, dp_index)
    M = _num_microbatches(cfg)
    found = (fast_forward if isinstance(fast_forward, tuple) else _plan(cfg, stages, False, compiled=compiled)) \
        if fast_forward else None
    if found is not None:
        cycle, *counts = found
        packed = _pack(stages) if _compiled(cfg, stages, sum(counts), compiled) else None
        obs = extrapolate([(m, _observables(cfg, stages, m, packed)) for m in counts], M)
        if obs is not None:
            return obs, FastForward(cycle, tuple(counts), M)  # type: ignore[arg-type]
    return _observables(cfg, stages, M, compiled=compiled), None


@dataclass(frozen=True, slots=True)
class AnalyticStep:
    """A closed-form step: the figures search ranks by (simdist.report.step_metrics.metrics's names)."""

    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    mfu: float
    bubble_fraction: float
    pipeline_phase_s: float
    compute_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    pp_comm_s: float
    dp_exposed_s: float
    ep_comm_s: float
    """Exposed expert-parallel token all_to_all (dispatch and combine)."""
    etp_comm_s: float
    edp_exposed_s: float
    """Exposed expert-gradient reduction over the expert-data-parallel group."""
    optimizer_s: float
    bubble_s: float
    idle_s: float
    num_microbatches: int

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.__slots__}


def analytic_step(cfg: StepConfig, pricer: CommPricer, *, fast_forward: bool = True, compiled: bool | None = None
                  ) -> AnalyticStep:
    """Closed-form step of ``cfg`` on ``pricer``'s cluster (see the module docstring); ``compiled``: time it with
    the compiled recurrence (True: a caller timing many steps), step by step (False), or by its size (None:
    `COMPILE_STEPS`)."""
    obs, _ = analytic_observables(cfg, pricer, fast_forward=fast_forward, compiled=compiled)
    step = obs["step_s"]
    tokens = cfg.global_batch_size * (cfg.model.seq_length if cfg.model.kind == "decoder" else 1)
    per_gpu = obs["model_flops"] / step if step > 0 else 0.0
    phase = obs["phase_s"]
    return AnalyticStep(
        step_time_s=step, tokens_per_s=tokens / step if step > 0 else 0.0, model_tflops_per_gpu=per_gpu / 1e12,
        mfu=per_gpu / cfg.gpu.peak_flops(cfg.precision),
        bubble_fraction=max(obs["bubble_s"] / phase, 0.0) if phase > 0 else 0.0, pipeline_phase_s=phase,
        compute_s=obs["compute_s"], recompute_s=obs["recompute_s"], tp_comm_s=obs["tp_s"], cp_comm_s=obs["cp_s"],
        pp_comm_s=obs["pp_s"], dp_exposed_s=obs["dp_s"], ep_comm_s=obs["ep_s"], etp_comm_s=obs["etp_s"],
        edp_exposed_s=obs["edp_s"], optimizer_s=obs["optimizer_s"], bubble_s=obs["bubble_s"],
        idle_s=obs["idle_s"], num_microbatches=cfg.microbatches(0))
