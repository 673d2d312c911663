"""Lower bounds of a layout's step, O(stages x chunks): what `simdist search` screens layouts with before it times
the survivors with the exact closed form (simdist.analytic.step, simdist.search.sweep's branch and bound).

`lower_bound_s` reads the same priced stages (recipes, sends, tails) as the closed form, so it can never exceed it.
`compute_bound_s` reads only the chunks' compute seconds (no recipe, no collective priced): a looser bound, about
5x cheaper cold, that the search screens every layout with first. tests/test_analytic_step.py checks compute bound
<= schedule bound <= exact on random layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from simdist.analytic.pricing import STREAMS, CommPricer, PricedPieces, chunk_cost_entry, token
from simdist.analytic.program import KIND_INDEX, recipe_code
from simdist.analytic.stages import _DP, _Stage, _stages
from simdist.analytic.step import _num_microbatches
from simdist.plan.chunk_cost import chunk_cost_key
from simdist.plan.recipe import is_edge
from simdist.plan.schedule import SPLIT_BACKWARD, chunk_microbatches, schedule_order
from simdist.plan.step_config import StepConfig

__all__ = ["compute_bound_s", "lower_bound_s"]


def _span(r: PricedPieces) -> float:
    """The least time from a step's first compute (its input) to its end: the recipe alone, every stream free, the
    dp pieces issued ahead (with nothing to wait for: they may run any time before) taken as done."""
    ends: list[float] = []
    free = [0.0] * len(STREAMS)
    for j, sc in enumerate(r.streams):
        t = max([free[sc], *(ends[d] for d in r.deps[j] if d >= 0)])
        ends.append(t + (0.0 if sc == _DP and not r.deps[j] else r.durations[j]))
        free[sc] = ends[-1]
    entry = r.needs_input if r.needs_input >= 0 else 0
    return ends[r.end] - (ends[entry] - r.durations[entry])


@lru_cache(maxsize=512)
def _after_last_backward(schedule: str, num_stages: int, num_microbatches: int, vpp: int) -> tuple[tuple, ...]:
    """Per stage, the (kind, chunk, edge) of the steps its order runs after its last chunk-0 backward (a split
    backward's deferred weight gradients, and the two-chunk schedules' chunk-1 steps; none for the others, whose
    last step it is)."""
    if schedule not in SPLIT_BACKWARD:  # every other schedule ends each stage with its last chunk-0 backward
        return ((),) * num_stages
    out = []
    for order in schedule_order(schedule, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp):
        i = max(j for j, st in enumerate(order) if st.kind == "B" and st.chunk == 0)
        out.append(tuple((st.kind, st.chunk, is_edge(st.kind, st.microbatch, num_microbatches, schedule, st.chunk))
                         for st in order[i + 1:]))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class _Sums:
    """What the bound reads of a stage's priced recipes, summed once per distinct stage: per chunk and kind the
    span (`_span`) and dp-stream seconds of its edge and of its other steps, the optimizer's seconds and the tail's
    dp-stream seconds."""

    span: dict[tuple[int, str, bool], float]
    dp: dict[tuple[int, str, bool], float]
    optimizer_s: float
    tail_dp_s: float


def _sums(st: _Stage, V: int, kinds: tuple[str, ...]) -> _Sums:
    box = st.box()
    if box[1] is None:
        span: dict[tuple[int, str, bool], float] = {}
        dp: dict[tuple[int, str, bool], float] = {}
        for c in range(V):
            for kind in kinds:
                for last in (False, True):
                    code = recipe_code(c, kind, last)
                    if code >= len(st.simple):
                        continue
                    sm, r = st.simple[code], st.recipes[code]
                    span[c, kind, last] = sm.duration_s if sm is not None else (_span(r) if r is not None else 0.0)
                    dp[c, kind, last] = sum(d for d, sc in zip(r.durations, r.streams, strict=True)
                                            if sc == _DP) if r is not None else 0.0
        t = st.tail
        box[1] = _Sums(span, dp, sum(d for d, cat in zip(t.durations, t.categories, strict=True) if cat == "optimizer"),
                       sum(d for d, sc in zip(t.durations, t.streams, strict=True) if sc == _DP))
    return box[1]


def compute_bound_s(cfg: StepConfig) -> float:
    """A lower bound of `lower_bound_s` (and so of the closed-form and engine steps) from compute alone: its terms
    with each step recipe's span replaced by the compute seconds of its chunk (simdist.plan.chunk_cost, cached as
    the closed form caches it), its sends, optimizer and dp stream left out.

    Every step recipe runs its chunk's compute on the one compute stream, from its first piece to its last, each
    piece at least its share of these seconds times the GPUs' spread factor (StepConfig.paced_variability; host gaps,
    interference taxes and a straggler's larger factor only add to them; a split backward (zb_h1, zb_v, dualpipe,
    dualpipev) puts B and W both in the work), so a recipe's span is at least that factor times its chunk's forward
    (F) or recompute + backward (B) seconds. Stage s then runs after micro-batch 0's
    chunk-0 forwards of the stages before it (fill), M steps of each of its chunks (work; dualpipe's run M/2 each),
    and, but for a split backward, before the chunk-0 backwards of the stages before it drain (Narayanan et al.
    2021 sec 2.2.1's (M + K - 1)(t_f + t_b))."""
    M = _num_microbatches(cfg)
    K = cfg.mesh.pp
    kinds = cfg.parts_layers()
    config = token(chunk_cost_key(cfg))
    # a split backward's last chunk-0 backward may be followed by deferred W steps (and chunk-1 steps)
    drains = cfg.schedule not in SPLIT_BACKWARD
    best = fill = drain = 0.0
    seconds: dict[tuple, tuple[float, float]] = {}  # (forward, backward + recompute) by chunk (stages share them)
    for s in range(K):
        work = first_f = first_b = 0.0
        for c in range(len(cfg.stage_chunks(s))):
            part = cfg.part_of(s, c)
            chunk = (kinds[part], part == 0, part == cfg.num_parts - 1)
            f_b = seconds.get(chunk)
            if f_b is None:
                cost = chunk_cost_entry(cfg, *chunk, config)[0]
                slow = cfg.paced_variability  # every stage's compute pieces at least this x (StepConfig.compute_factor)
                f_b = seconds[chunk] = (cost.forward_s * slow, (cost.backward_s + cost.recompute_s) * slow)
            first, last = chunk_microbatches(cfg.schedule, c, M)  # (dualpipe's chunks run M/2 each)
            work += (last - first + 1) * (f_b[0] + f_b[1])
            if c == 0:
                first_f, first_b = f_b
        best = max(best, fill + work + (drain if drains else 0.0))
        if cfg.schedule == "dualpipe":  # its far end starts at once, with the other direction's micro-batches
            continue
        fill += first_f
        drain += first_b
    return best


def lower_bound_s(cfg: StepConfig, pricer: CommPricer) -> float:
    """A lower bound of the closed-form step (and so of the engine's), O(stages x chunks): search ranks by the
    exact closed form only the layouts this bound cannot rule out (simdist.search.sweep).

    Stage s starts no earlier than micro-batch 0's first forward reaches it (each stage before it ran its chunk-0
    forward, each send crossed); it runs its steps one after the other, each at least its recipe's span alone;
    after its last chunk-0 backward the gradient still has to cross every stage below it, each running its own
    last chunk-0 backward; then stage 0's optimizer runs (and stage s's own after its steps); and a stage's dp
    stream runs its collectives one at a time. For uniform 1F1B
    stages this is (M + K - 1)(t_f + t_b) (Narayanan et al. 2021 sec 2.2.1) plus the optimizer. The sums over a
    stage's recipes are made once per distinct stage (`_Sums`), the same sums in the same order each time."""
    M = _num_microbatches(cfg)
    K, V = cfg.mesh.pp, cfg.chunks
    kinds = ("F", "B", "W") if cfg.schedule in SPLIT_BACKWARD else ("F", "B")
    stages = _stages(cfg, pricer)
    sums = [_sums(st, V, kinds) for st in stages]
    after = _after_last_backward(cfg.schedule, K, M, cfg.vpp)
    runs = [chunk_microbatches(cfg.schedule, c, M) for c in range(V)]  # (first, last) micro-batch of each chunk
    last_b = [x.span[0, "B", True] for x in sums]
    fill = drain = 0.0
    best = 0.0
    totals: dict[int, tuple[float, float]] = {}  # (work, dp) of each distinct stage's sums (alike stages share one)
    for s, st in enumerate(stages):
        x = sums[s]
        hit = totals.get(id(x))
        if hit is None:
            work = dp = 0.0
            for c in range(V):
                for kind in kinds:
                    for last, count in ((False, runs[c][1] - runs[c][0]), (True, 1)):
                        if count and (c, kind, last) in x.span:
                            work += count * x.span[c, kind, last]
                            dp += count * x.dp[c, kind, last]
            hit = totals[id(x)] = (work, dp + x.tail_dp_s)
        work, dp = hit
        tail = sum(x.span[c, kind, last] for kind, c, last in after[s])
        # the dp stream runs its collectives one after the other too (ZeRO-3's gathers, ZeRO-2/3's scatters)
        if cfg.schedule == "dualpipe":  # both ends start at once (two directions): no fill, and no one drain path
            best = max(best, work + x.optimizer_s, dp)
            continue
        best = max(best, fill + work + x.optimizer_s, fill + work - tail + drain + sums[0].optimizer_s, dp)
        # micro-batch 0's chunk-0 forward, then its send, before stage s + 1 can start
        fill += x.span[0, "F", True] + st.sends[KIND_INDEX["F"]]  # micro-batch 0: the edge forward
        # the last chunk-0 backward of stage s + 1 reaches stage 0 through stage s
        drain += last_b[s] + (stages[s + 1].sends[KIND_INDEX["B"]] if s + 1 < K else 0.0)
    return best
