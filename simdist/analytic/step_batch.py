"""Many closed-form step times at once: one timeline pass over a batch of perturbed copies of one step.

The prediction band (simdist.predict.bands) times the same step under 32 sets of perturbed costs. Every copy runs
the same program (the same schedule, stages, recipes and dependencies); only the durations differ. So the
max-plus recurrence of simdist.analytic.step's `_timeline_fast` is run once with a vector of times per stream, one
entry per copy: each step is the same few additions and maxima, done on the whole batch, which costs about as much
as timing one copy in Python (a chunk's first forward with its parameter gathers, which the closed form runs piece by
piece, is run piece by piece here too, on the batch). Only the step time is computed (no intervals, no accounting).

The result equals `analytic_observables(copy)["step_s"]` of each copy (tests/test_step_batch.py): the same
operations in the same order, per copy; where the closed form fast-forwards a long step (simdist.plan.fastforward)
each copy is extended as it would be alone: its own cycle read off its own column of the batch's timelines, its
own three samples (usually the same counts for every copy: one batch pass each). Given the engine's fast-forward
plan (`simdist run`), every copy is sampled at its counts instead, as `analytic_observables` is with a plan: the
batch is then timed on those three counts only, not on a detection timeline and, where a copy would not have
paid for its own detection, not on every micro-batch (a copy whose samples are not collinear is still timed
whole). Where the batch cannot be timed
this way (a recipe that is not simple, copies whose recipes differ in shape, unequal replicas), `perturbed_step_s`
times each copy alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from simdist.analytic.pricing import NUM_CORE, Adjust, CommPricer
from simdist.analytic.program import KIND_INDEX, program
from simdist.analytic.step import (
    _DP,
    _PP,
    _fast,
    _geometry,
    _num_microbatches,
    _Stage,
    _stages,
    analytic_observables,
    fast_forward_plan,
)
from simdist.hardware.compute import ComputeEfficiency
from simdist.plan.fastforward import extrapolate
from simdist.plan.fastforward import plan as ff_plan
from simdist.plan.recipe import DP_DONE, LAST_BACKWARDS, PREV
from simdist.plan.step_config import StepConfig

__all__ = ["perturbed_step_s"]


class _Batch:
    """The stages of every copy, as arrays over the copies (one per priced quantity)."""

    def __init__(self, copies: list[list[_Stage]]) -> None:
        first = copies[0]
        self.num_stages = len(first)
        self.steps: list[list[tuple | None]] = []
        self.sends: list[list[np.ndarray]] = []
        self.tails: list[tuple] = []
        for s, st in enumerate(first):
            row: list[tuple | None] = []
            for code, sm in enumerate(st.simple):
                if sm is None:
                    r = st.recipes[code]
                    if r is None:
                        row.append(None)
                        continue
                    # a chunk's first forward run piece by piece (simdist.analytic.step._fast): its pieces' shape
                    # is every copy's, their durations one row per piece
                    rs = [c[s].recipes[code] for c in copies]
                    if any(x is None or x.streams != r.streams or x.deps != r.deps or x.needs_input != r.needs_input
                           or x.end != r.end for x in rs):
                        raise _Mismatch
                    row.append((r.streams, r.deps, r.needs_input, r.end,
                                np.array([x.durations for x in rs]).T.copy(), None))  # type: ignore[union-attr]
                    continue
                sms = [c[s].simple[code] for c in copies]
                if any(x is None or len(x.ahead) != len(sm.ahead) or len(x.behind) != len(sm.behind)
                       or [f < 0 for f in x.frees] != [f < 0 for f in sm.frees] for x in sms):
                    raise _Mismatch
                duration = np.array([x.duration_s for x in sms])  # type: ignore[union-attr]
                # (stream, when it is free again) of the core streams the recipe uses, in stream order, and apart
                # those free exactly at the step's end in every copy (t0 + free is then the end itself: no addition)
                frees_at = [(k, np.array([x.frees[k] for x in sms]))  # type: ignore[union-attr]
                            for k in range(NUM_CORE) if sm.frees[k] >= 0]
                at_end = tuple(k for k, v in frees_at if np.array_equal(v, duration))
                frees = tuple((k, v) for k, v in frees_at if k not in at_end)
                ahead = tuple(np.array([x.ahead[j][0] for x in sms]) for j in range(len(sm.ahead)))  # type: ignore
                behind = tuple((np.array([x.behind[j][0] for x in sms]), np.array([x.behind[j][1] for x in sms]))
                               for j in range(len(sm.behind)))  # type: ignore[union-attr]
                row.append((duration, frees, ahead, behind, at_end))
            self.steps.append(row)
            self.sends.append(list(np.array([c[s].sends for c in copies]).T.copy()))  # a vector per send
            tails = [c[s].tail for c in copies]
            t = st.tail
            if any(x.streams != t.streams or x.deps != t.deps for x in tails):
                raise _Mismatch
            self.tails.append((t.streams, t.deps, np.array([x.durations for x in tails]).T.copy()))


class _Mismatch(Exception):
    """The copies' recipes differ in shape: they cannot share one pass."""


def _timeline(cfg: StepConfig, batch: _Batch, num_microbatches: int, n: int, starts: dict | None = None
              ) -> np.ndarray:
    """The step time of every copy for ``num_microbatches`` (`_timeline_fast`'s recurrence, on vectors);
    ``starts``: filled with each step's start (a vector), by (stage, kind, chunk), in micro-batch order."""
    K = batch.num_stages
    prog = program(cfg.schedule, K, num_microbatches, cfg.vpp)
    zero = np.zeros(n)
    core = [[zero] * K for _ in range(NUM_CORE)]  # when each stage's compute, tp, cp and ep streams are free
    f0 = core[0]
    fdp = [zero] * K
    fpp = [zero] * K
    prev = [np.full(n, -1.0)] * K
    last_bwd = [zero] * K
    out: list[np.ndarray] = [zero] * len(prog)  # each step's output arrival (a vector, never written in place)
    zb = cfg.schedule == "zb_h1"
    steps, sends = batch.steps, batch.sends
    maximum = np.maximum
    p_stage, p_kind, p_chunk, p_up, p_down, p_code = (prog.stage, prog.kind, prog.chunk, prog.upstream,
                                                      prog.downstream_stage, prog.code)
    for i in range(len(prog)):
        s = p_stage[i]
        entry = steps[s][p_code[i]]
        # max(x, x) = x: after a simple step that frees the compute stream at its end, the two are one vector
        t0 = prev[s] if f0[s] is prev[s] else maximum(prev[s], f0[s])
        up = p_up[i]
        if up >= 0:
            t0 = maximum(t0, out[up])
        if len(entry) == 6:  # type: ignore[arg-type]  # piece by piece (simdist.analytic.step._run_pieces)
            if starts is not None:
                starts.setdefault((s, p_kind[i], p_chunk[i]), []).append(t0)
            streams, deps, needs_input, last, durations, _ = entry  # type: ignore[misc]
            free = [*(c[s] for c in core), fdp[s], fpp[s]]
            ends = _run_streams(streams, deps, durations, free, prev=prev[s],
                                needs_input=needs_input if up >= 0 else -1, recv=out[up] if up >= 0 else None)
            for k in range(NUM_CORE):
                core[k][s] = free[k]
            fdp[s], fpp[s] = free[_DP], free[_PP]
            end = ends[last]
        else:
            duration, frees, ahead, behind, at_end = entry  # type: ignore[misc]
            if ahead:  # the gathers issued ahead queue on the dp stream; the step waits for them
                t = fdp[s]
                for d in ahead:
                    t = t + d
                fdp[s] = t
                t0 = maximum(t0, t)
            if starts is not None:
                starts.setdefault((s, p_kind[i], p_chunk[i]), []).append(t0)
            end = t0 + duration
            for k in at_end:
                core[k][s] = end
            for k, free_at in frees:
                core[k][s] = t0 + free_at
            for ready, d in behind:
                fdp[s] = maximum(t0 + ready, fdp[s]) + d
        prev[s] = end
        kind = p_kind[i]
        if kind == "W" or (kind == "B" and not zb):
            last_bwd[s] = maximum(last_bwd[s], end)
        if p_down[i] >= 0:
            t = maximum(fpp[s], end) + sends[s][p_chunk[i] * 3 + KIND_INDEX[kind]]
            fpp[s] = t
            out[i] = t
        else:
            out[i] = end
    step = np.full(n, 0.0) if K == 0 else np.max(np.array(prev), axis=0)
    for s in range(K):
        streams, deps, durations = batch.tails[s]
        free = [*(c[s] for c in core), fdp[s], fpp[s]]  # in STREAMS order: the core streams, dp, pp
        assert len(free) == _PP + 1
        _run_streams(streams, deps, durations, free, last_backward=last_bwd[s])  # simdist.analytic.step._run_tail
        step = maximum(step, np.max(np.array(free), axis=0))
    return step


def _run_streams(streams: Sequence[int], deps: Sequence[Sequence[int]], durations: Sequence[np.ndarray],
                 free: list[np.ndarray], *, prev: np.ndarray | None = None, needs_input: int = -1,
                 recv: np.ndarray | None = None, last_backward: np.ndarray | None = None) -> list[np.ndarray]:
    """Run pieces one by one on vectors (one entry per copy): each when its stream is free (``free``, advanced in
    place) and its dependencies are done: earlier pieces, and the special ones of simdist.plan.recipe: the stage's
    previous step (PREV: ``prev``), its last backwards (LAST_BACKWARDS) and the dp stream (DP_DONE); piece
    ``needs_input`` also waits for the input (``recv``). A step's pieces (simdist.analytic.step._run_pieces) and a
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


def perturbed_step_s(cfg: StepConfig, pricer: CommPricer,
                     variants: list[tuple[ComputeEfficiency, Adjust]],
                     plan: tuple[int, int, int, int] | bool | None = False) -> tuple[float, np.ndarray]:
    """(the closed-form step time of ``cfg``, that of each variant): ``cfg`` with the compute efficiency given and
    every collective taking ``time_of(op, num_ranks, nbytes, t)`` where ``pricer`` takes t (CommPricer.perturbed;
    a time factor by size: ``lambda op, n, nbytes, t: t * factor(nbytes)``). One pass where the copies share their
    shape (see the module docstring), else each copy's closed form alone (simdist.analytic.step) on ``plan``'s
    fast-forward samples (a (cycle, M1, M2, M3) tuple; None: none; False: the engine's plan of ``cfg``). A tuple
    ``plan`` is the one pass's samples too; else each copy finds its own."""
    nominal = _stages(cfg, pricer)  # first: the scaled pricers start from the prices it makes
    copies = [(dataclasses.replace(cfg, compute_efficiency=eff), pricer.perturbed(time_of))
              for eff, time_of in variants]
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
    if cfg.compute_slowdown or cfg.dp_batch_split is not None:
        return None
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
            hit = runs[m] = ({key: np.array(seq) for key, seq in starts.items()} if starts is not None else None,
                             step)
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
