"""Many closed-form step times at once: one timeline pass over a batch of perturbed copies of one step.

The prediction band (simdist.predict.bands) times the same step under 32 sets of perturbed costs. Every copy runs
the same program (the same schedule, stages, recipes and dependencies); only the durations differ. So the
max-plus recurrence of simdist.analytic.timeline's `_compiled_timeline` is run once with a vector of times per
stream, one entry per copy: each step is the same few additions and maxima, done on the whole batch, which costs
about as much as timing one copy in Python (a chunk's first forward with its parameter gathers, which the closed
form runs piece by piece, is run piece by piece here too, on the batch). Only the step time is computed (no
intervals, no accounting).

The result equals `analytic_observables(copy)["step_s"]` of each copy (tests/test_step_batch.py): the same
operations in the same order, per copy; where the closed form fast-forwards a long step (simdist.plan.fastforward)
each copy is extended as it would be alone: its own cycle read off its own column of the batch's timelines, its
own three samples (usually the same counts for every copy: one batch pass each). Given the engine's fast-forward
plan (`simdist run`), every copy is sampled at its counts instead, as `analytic_observables` is with a plan: the
batch is then timed on those three counts only, not on a detection timeline and, where a copy would not have
paid for its own detection, not on every micro-batch (a copy whose samples are not collinear is still timed
whole). Where the batch cannot be timed
this way (a recipe that is not simple, copies whose recipes differ in shape, unequal replicas, DualPipe(V)'s held
sends), `perturbed_step_s`
times each copy alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from simdist.analytic.batch_tables import _Batch, _Mismatch
from simdist.analytic.pricing import NUM_CORE, Adjust, CommPricer
from simdist.analytic.program import KIND_INDEX, program, step_groups
from simdist.analytic.stages import _DP, _PP, _geometry, _Stage, _stages
from simdist.analytic.step import _num_microbatches, analytic_observables, fast_forward_plan
from simdist.analytic.timeline import _fast
from simdist.hardware.compute import ComputeEfficiency
from simdist.hardware.host import HostOverhead
from simdist.plan.comm_overlap import a2a_overlapped
from simdist.plan.fastforward import extrapolate
from simdist.plan.fastforward import plan as ff_plan
from simdist.plan.recipe import DP_DONE, LAST_BACKWARDS, PREV
from simdist.plan.schedule import SPLIT_BACKWARD
from simdist.plan.step_config import StepConfig

__all__ = ["Variant", "perturbed_step_s"]


@dataclasses.dataclass(frozen=True, slots=True)
class Variant:
    """One perturbed copy of a step: its compute constants, its collectives' times (``time_of(op, num_ranks,
    nbytes, t)`` where the step's pricer takes t) and its host costs (None: the step's own)."""

    compute_efficiency: ComputeEfficiency
    time_of: Adjust
    host: HostOverhead | None = None


@lru_cache(maxsize=64)
def _levels(schedule: str, num_stages: int, num_microbatches: int, vpp: int) -> np.ndarray:
    """Each step's wave: one more than the latest of its stage's previous step and its upstream step (0: neither).
    The steps of one wave are on distinct stages and read only earlier waves' results, so a wave is timed at once."""
    prog = program(schedule, num_stages, num_microbatches, vpp)
    level = [0] * len(prog)
    last = [-1] * num_stages
    for i, (s, up) in enumerate(zip(prog.stage, prog.upstream, strict=True)):
        w = last[s] + 1
        if up >= 0 and level[up] >= w:
            w = level[up] + 1
        level[i] = last[s] = w
    return np.array(level, dtype=np.int64)


def _timeline(cfg: StepConfig, batch: _Batch, num_microbatches: int, n: int, starts: dict | None = None
              ) -> np.ndarray:
    """The step time of every copy for ``num_microbatches`` (`_compiled_timeline`'s recurrence, on vectors);
    ``starts``: filled with each step's start (micro-batch x copy), by (stage, kind, chunk), in micro-batch order.

    The steps are timed wave by wave (`_levels`): the simple steps without gathers ahead of a wave as one array
    (steps x copies), each by the same additions and maxima on the same operands as step by step (a quantity a step
    does not move is selected, not recomputed: exact); the others (a chunk's first forward piece by piece, a step
    with gathers issued ahead) one by one."""
    K = batch.num_stages
    prog = program(cfg.schedule, K, num_microbatches, cfg.vpp, a2a_overlapped(cfg))
    L = len(prog)
    if K == 0 or L == 0:
        step = np.zeros(n) if K == 0 else np.full(n, -1.0)
        return _tails(batch, step, *(np.zeros((NUM_CORE, K, n)), np.zeros((K, n)), np.zeros((K, n)),
                                     np.zeros((K, n))))
    tab = batch.tables()
    zb = cfg.schedule in SPLIT_BACKWARD
    stage = np.asarray(prog.stage, dtype=np.int64)
    code = np.asarray(prog.code, dtype=np.int64)
    send_at = code >> 1  # recipe_code // 2: chunk * 3 + kind index
    kind = send_at % 3
    level = _levels(cfg.schedule, K, num_microbatches, cfg.vpp)
    vector = tab.vector[stage, code]
    assert (vector | tab.other[stage, code]).all()  # every program step has a recipe
    down = np.asarray(prog.downstream_stage, dtype=np.int64) >= 0
    # the steps in wave order (program indices ``order``): in each wave the vectorised ones sending downstream, then
    # the other vectorised ones, then those timed alone (`_step_alone`); a step's results are kept by its position x
    # in this order (OUT, T0: a slice per wave)
    group = np.where(vector, np.where(down, 0, 1), 2)
    order = np.argsort(level * 3 + group, kind="stable")
    at = np.empty(L + 1, dtype=np.int64)
    at[order] = np.arange(L)
    at[L] = L  # no upstream step: the row of OUT that is -inf
    num_levels = int(level[order[-1]]) + 1
    key = level[order] * 3 + group[order]
    bounds = np.searchsorted(key, np.arange(num_levels * 3 + 1)).tolist()
    S_all = stage[order]
    C_all = code[order]
    up_all = at[np.asarray(prog.upstream, dtype=np.int64)[order]]  # -1 (none) -> L
    dur_all = tab.duration[S_all, C_all]
    send_all = tab.sends[S_all, send_at[order]]
    bwd = ((kind == KIND_INDEX["W"]) | ((kind == KIND_INDEX["B"]) & (not zb)))[order]
    # end + (-0.0) is end, end + (-inf) is -inf, and max(x, -inf) is x: a non-backward step leaves LB as it is
    bwd_add = np.where(bwd, -0.0, -np.inf)[:, None]
    vec = vector[order]
    streams = []
    for k in range(NUM_CORE):
        used = tab.used[k][S_all, C_all]
        if used.any():
            streams.append((k, tab.frees[k][S_all, C_all], None if used[vec].all() else used[:, None]))
    # a step without a j-th dp piece behind: ready at -inf, taking -0.0 s (max(-inf, x) + -0.0 is x: exact)
    behinds = []
    for j in range(len(tab.ready)):
        has = tab.has_behind[j][S_all, C_all][:, None]
        behinds.append((np.where(has, tab.ready[j][S_all, C_all], -np.inf),
                        np.where(has, tab.behind[j][S_all, C_all], -0.0)))
    F = np.zeros((NUM_CORE, K, n))  # when each stage's compute, tp, cp and ep streams are free
    F0 = F[0]
    FDP = np.zeros((K, n))
    FPP = np.zeros((K, n))
    PREV = np.full((K, n), -1.0)
    LB = np.zeros((K, n))
    OUT = np.empty((L + 1, n))  # each step's output arrival by position; the last row: none (-inf)
    OUT[L] = -np.inf
    T0 = np.empty((L, n)) if starts is not None else None
    maximum, where = np.maximum, np.where
    for w in range(num_levels):
        a, m, b, c = bounds[3 * w: 3 * w + 4]
        if b > a:
            S = S_all[a:b]
            t0 = maximum(maximum(PREV.take(S, axis=0), F0.take(S, axis=0)), OUT.take(up_all[a:b], axis=0))
            if T0 is not None:
                T0[a:b] = t0
            end = t0 + dur_all[a:b]
            for k, fr, used in streams:
                Fk = F[k]
                Fk[S] = t0 + fr[a:b] if used is None else where(used[a:b], t0 + fr[a:b], Fk.take(S, axis=0))
            for ready, d in behinds:
                FDP[S] = maximum(t0 + ready[a:b], FDP.take(S, axis=0)) + d[a:b]
            PREV[S] = end
            LB[S] = maximum(LB.take(S, axis=0), end + bwd_add[a:b])
            if m > a:  # the sends downstream, on the pp stream after the step
                Sd = S_all[a:m]
                OUT[a:m] = FPP[Sd] = maximum(FPP.take(Sd, axis=0), end[:m - a]) + send_all[a:m]
            OUT[m:b] = end[m - a:]
        for x in range(b, c):
            i = int(order[x])
            _step_alone(batch, x, int(S_all[x]), int(C_all[x]), int(up_all[x]), bool(down[i]), bool(bwd[x]),
                        int(send_at[i]), F, FDP, FPP, PREV, LB, OUT, T0)
    if starts is not None:
        assert T0 is not None
        for key, idx in step_groups(cfg.schedule, K, num_microbatches, cfg.vpp):
            starts[key] = T0[at[idx]]
    return _tails(batch, PREV.max(axis=0), F, FDP, FPP, LB)


def _step_alone(batch: _Batch, i: int, s: int, code: int, up: int, down: bool, bwd: bool, send_at: int,
                F: np.ndarray, FDP: np.ndarray, FPP: np.ndarray, PREV: np.ndarray, LB: np.ndarray, OUT: np.ndarray,
                T0: np.ndarray | None) -> None:
    """Time the step at position ``i`` (stage ``s``, recipe ``code``, upstream step at ``up``: that of OUT's last
    row, -inf, for none) on its own: a chunk's first forward piece by piece,
    or a simple step with gathers issued ahead on the dp stream; the state arrays advanced in place."""
    entry = batch.steps[s][code]
    assert entry is not None
    maximum = np.maximum
    t0 = maximum(PREV[s], F[0, s])
    recv = OUT[up].copy() if up < len(OUT) - 1 else None
    if recv is not None:
        t0 = maximum(t0, recv)
    if len(entry) == 6:  # piece by piece (simdist.analytic.timeline._run_pieces)
        if T0 is not None:
            T0[i] = t0
        streams, deps, needs_input, last, durations, _ = entry
        free = [*(F[k, s].copy() for k in range(NUM_CORE)), FDP[s].copy(), FPP[s].copy()]
        ends = _run_streams(streams, deps, durations, free, prev=PREV[s].copy(),
                            needs_input=needs_input if recv is not None else -1, recv=recv)
        for k in range(NUM_CORE):
            F[k, s] = free[k]
        FDP[s], FPP[s] = free[_DP], free[_PP]
        end = ends[last]
    else:
        duration, frees, ahead, behind, at_end = entry
        if ahead:  # the gathers issued ahead queue on the dp stream; the step waits for them
            t = FDP[s].copy()
            for d in ahead:
                t = t + d
            FDP[s] = t
            t0 = maximum(t0, t)
        if T0 is not None:
            T0[i] = t0
        end = t0 + duration
        for k in at_end:
            F[k, s] = end
        for k, free_at in frees:
            F[k, s] = t0 + free_at
        for ready, d in behind:
            FDP[s] = maximum(t0 + ready, FDP[s]) + d
    PREV[s] = end
    if bwd:
        LB[s] = maximum(LB[s], end)
    if down:
        t = maximum(FPP[s], end) + batch.sends[s][send_at]
        FPP[s] = t
        OUT[i] = t
    else:
        OUT[i] = end


def _tails(batch: _Batch, step: np.ndarray, F: np.ndarray, FDP: np.ndarray, FPP: np.ndarray, LB: np.ndarray
           ) -> np.ndarray:
    """``step`` (the latest step end) extended by each stage's tail (simdist.analytic.timeline._run_tail)."""
    maximum = np.maximum
    for s in range(batch.num_stages):
        streams, deps, durations = batch.tails[s]
        free = [*(F[k, s].copy() for k in range(NUM_CORE)), FDP[s].copy(), FPP[s].copy()]  # in STREAMS order
        assert len(free) == _PP + 1
        _run_streams(streams, deps, durations, free, last_backward=LB[s].copy())
        step = maximum(step, np.max(np.array(free), axis=0))
    return step


def _run_streams(streams: Sequence[int], deps: Sequence[Sequence[int]], durations: Sequence[np.ndarray],
                 free: list[np.ndarray], *, prev: np.ndarray | None = None, needs_input: int = -1,
                 recv: np.ndarray | None = None, last_backward: np.ndarray | None = None) -> list[np.ndarray]:
    """Run pieces one by one on vectors (one entry per copy): each when its stream is free (``free``, advanced in
    place) and its dependencies are done: earlier pieces, and the special ones of simdist.plan.recipe: the stage's
    previous step (PREV: ``prev``), its last backwards (LAST_BACKWARDS) and the dp stream (DP_DONE); piece
    ``needs_input`` also waits for the input (``recv``). A step's pieces (simdist.analytic.timeline._run_pieces) and a
    stage's tail (``_run_tail``) alike. Returns each piece's end."""
    maximum = np.maximum
    ends: list[np.ndarray] = []
    for j, sc in enumerate(streams):
        t = free[sc]
        for d in deps[j]:
            if d >= 0:
                t = maximum(t, ends[d])
            elif d == PREV:
                t = maximum(t, prev)
            elif d == LAST_BACKWARDS:
                t = maximum(t, last_backward)
            elif d == DP_DONE:
                t = maximum(t, free[_DP])
        if j == needs_input:
            t = maximum(t, recv)
        e = t + durations[j]
        free[sc] = e
        ends.append(e)
    return ends


def perturbed_step_s(cfg: StepConfig, pricer: CommPricer, variants: list[Variant],
                     plan: tuple[int, int, int, int] | bool | None = False) -> tuple[float, np.ndarray]:
    """(the closed-form step time of ``cfg``, that of each `Variant`): ``cfg`` with the compute efficiency and host
    costs given and every collective taking ``time_of(op, num_ranks, nbytes, t)`` where ``pricer`` takes t
    (CommPricer.perturbed; a time factor by size: ``lambda op, n, nbytes, t: t * factor(nbytes)``). One pass
    where the copies share their shape (see the module docstring), else each copy's closed form alone
    (simdist.analytic.step) on ``plan``'s fast-forward samples (a (cycle, M1, M2, M3) tuple; None: none; False: the
    engine's plan of ``cfg``). A tuple ``plan`` is the one pass's samples too; else each copy finds its own."""
    nominal = _stages(cfg, pricer)  # first: the scaled pricers start from the prices it makes
    copies = [(dataclasses.replace(cfg, compute_efficiency=v.compute_efficiency,
                                   host=cfg.host if v.host is None else v.host), pricer.perturbed(v.time_of))
              for v in variants]
    steps = _batch_step_s(cfg, nominal, copies, plan[1:] if isinstance(plan, tuple) else None)
    if steps is None:
        if plan is False:
            plan = fast_forward_plan(cfg, pricer, for_engine=True)
        ff: tuple[int, int, int, int] | bool = plan if isinstance(plan, tuple) else True
        return (analytic_observables(cfg, pricer, fast_forward=ff)[0]["step_s"],
                np.array([analytic_observables(c, p, fast_forward=ff)[0]["step_s"] for c, p in copies]))
    return float(steps[0]), steps[1:]


def _batch_step_s(cfg: StepConfig, nominal: list[_Stage], copies: list[tuple[StepConfig, CommPricer]],
                  counts: tuple[int, int, int] | None = None) -> np.ndarray | None:
    """The step time of ``cfg`` (its stages ``nominal``) and of each copy, or None where they cannot share a pass;
    ``counts``: the micro-batch counts to sample (the engine's fast-forward plan), else each copy finds its own."""
    if cfg.compute_slowdown or cfg.dp_batch_split is not None or cfg.schedule in ("dualpipe", "dualpipev"):
        return None  # (DualPipe(V)'s held sends leave after a later step: not in the waves' recurrence)
    geometry = _geometry(cfg, copies[0][1]) if copies else None  # the copies' mesh and cluster are cfg's
    staged = [nominal, *(_stages(c, p, geometry=geometry) for c, p in copies)]
    if not all(_fast(st) for st in staged):
        return None
    try:
        batch = _Batch(staged)
    except _Mismatch:
        return None
    n = len(staged)
    M = _num_microbatches(cfg)
    runs: dict[int, tuple[dict | None, np.ndarray]] = {}

    def run(m: int, with_starts: bool = True) -> tuple[dict | None, np.ndarray]:
        """The batch timed over m micro-batches (once per m): each step's starts (micro-batch x copy; recorded
        only where asked for: None), the steps."""
        hit = runs.get(m)
        if hit is None or (with_starts and hit[0] is None):
            starts: dict | None = {} if with_starts else None
            step = _timeline(cfg, batch, m, n, starts)
            hit = runs[m] = (starts, step)
        return hit

    # Each copy fast-forwarded as the closed form would fast-forward it alone (simdist.analytic.step
    # _replica_observables): on ``counts`` where given (every copy the same samples, as `analytic_observables` with
    # a plan), else along its own cycle, read off its own column of the batch's timelines. Either way extended only
    # where its samples are collinear, else timed whole.
    out = np.empty(n)
    for j in range(n):
        def timeline(m: int, j: int = j) -> tuple[dict, float]:
            starts, step = run(m)
            assert starts is not None
            return {key: seq[:, j].tolist() for key, seq in starts.items()}, float(step[j])

        def step_of(m: int, j: int = j) -> float:
            return float(run(m, False)[1][j])

        sampled = counts
        if sampled is None:
            found = ff_plan(cfg.schedule, cfg.mesh.pp, M, timeline, vpp=cfg.vpp, count_detection=True,
                            step_of=step_of)
            sampled = None if found is None else found[1:]
        value = None
        if sampled is not None:
            value = extrapolate([(m, {"step_s": step_of(m)}) for m in sampled], M)
        out[j] = value["step_s"] if value is not None else run(M, False)[1][j]
    return out
