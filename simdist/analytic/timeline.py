"""The closed form's timeline: the priced stages (simdist.analytic.stages) timed over a schedule (docs/architecture.md).

The schedule is timed step by step without building a graph or running SimPy: every piece of a step starts when its
stream is free, when the pieces it depends on have ended, when the stage's previous step has ended and (its first
compute) when the neighbouring stage's send has arrived; a send leaves on the pp stream after its step. That is the
engine's execution rule with nothing contending, so the closed form equals the engine wherever no collective shares a
link with another (tests, to 1e-9). The pipeline composition is exact for uneven stages and chunks, the LM-head stage
and per-micro-batch collectives, where formulas over per-stage sums were not (Narayanan et al. 2021 sec 2.2's
(M + K - 1)(t_f + t_b) is its uniform special case).

Piece by piece in Python (`_timeline`, the oracle), or, where every step's core streams are free when it starts
(`_fast`), by the compiled recurrence of simdist.analytic.timeline_kernel over the stages as arrays (`_pack`);
`COMPILE_STEPS` decides which. The breakdown is simdist.plan.accounting's; `_Timelines` gives the fast-forward plan
its timelines.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np

from simdist.analytic.pricing import NUM_CORE, STREAMS, PricedPieces
from simdist.analytic.program import KIND_INDEX, Program, program, step_groups
from simdist.analytic.stages import _DP, _PP, Stages, _Stage, distinct_stages
from simdist.analytic.steady import NO_BODY, SHIFT_TOLERANCE, steady_form
from simdist.analytic.timeline_kernel import Packed, Unit, pack_boxed, pack_stage, run_program
from simdist.plan.accounting import CATEGORIES, Block, Interval, account
from simdist.plan.comm_overlap import a2a_overlapped
from simdist.plan.recipe import DP_DONE, LAST_BACKWARDS, PREV
from simdist.plan.schedule import SPLIT_BACKWARD
from simdist.plan.step_config import StepConfig


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
    ``starts``: filled with each step's start, by (stage, kind, chunk), in micro-batch order (an array each)."""
    K = cfg.mesh.pp
    prog = program(cfg.schedule, K, num_microbatches, cfg.vpp, a2a_overlapped(cfg))
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
    the step leaves those streams free when it ends, as `_compiled_timeline` takes them at every step's start."""
    seen, todo = {r.end}, [r.end]
    while todo:
        for d in r.deps[todo.pop()]:
            if d >= 0 and d not in seen:
                seen.add(d)
                todo.append(d)
    return all(j in seen for j, code in enumerate(r.streams) if code < NUM_CORE)


def _fast(stages: list[_Stage]) -> bool:
    """Every recipe is simple, or is a chunk's first forward (its parameter gathers: simdist.plan.data_parallel
    ._gathered_forward) that leaves the core streams free when it ends, which `_compiled_timeline` runs piece by
    piece."""
    return _all_flags(stages)[0]


def _overlapping_work(stages: list[_Stage]) -> bool:
    """Some simple recipe issues pipeline work on the dp stream, which may overlap blocks (ZeRO-2/3), or some recipe
    is not simple (its pieces are intervals beside the blocks)."""
    return _all_flags(stages)[1]


def _jumps(cfg: StepConfig, stages: list[_Stage], num_microbatches: int) -> bool:
    """Whether the compiled observables of ``num_microbatches`` jump over the steady state (`_compiled_timeline`):
    the recipes allow the compiled loop (`_fast`), no work beside the blocks asks for spans (`_overlapping_work`)
    and the program has a steady form (simdist.analytic.steady)."""
    fast, overlapping = _all_flags(stages)
    return fast and not overlapping and steady_form(cfg.schedule, cfg.mesh.pp, num_microbatches, cfg.vpp,
                                                        a2a_overlapped(cfg)) is not None


def _all_flags(stages: list[_Stage]) -> tuple[bool, bool]:
    """(`_fast`, `_overlapping_work`) of ``stages``, from each distinct stage's `_flags`; kept with the stages where
    they are the priced replica `_stages` keeps (simdist.analytic.stages.Stages), so that a step reads them once."""
    hit = getattr(stages, "flags", None)
    if hit is None:
        flags = [_flags(st) for st in _distinct(stages)]
        hit = (all(fast for fast, _ in flags), any(overlapping for _, overlapping in flags))
        if isinstance(stages, Stages):
            stages.flags = hit
    return hit


def _distinct(stages: list[_Stage]) -> list[_Stage]:
    """One stage of each set of alike stages (simdist.analytic.stages.distinct_stages; kept with the stages where
    they are the priced replica `_stages` keeps)."""
    return stages.distinct if isinstance(stages, Stages) else distinct_stages(stages)[0]


def _flags(st: _Stage) -> tuple[bool, bool]:
    """(`_fast` of the stage alone, `_overlapping_work` of it), kept in its unit box ([2]) for the alike stages."""
    box = st.box()
    if box[2] is None:
        pairs = list(zip(st.recipes, st.simple, strict=True))
        fast = all(r is None or sm is not None or (_edge_forward(code) and _closed(r))
                   for code, (r, sm) in enumerate(pairs))
        overlapping = any((sm is None and r is not None)
                          or (sm is not None and (any(w for _, _, w in sm.ahead) or any(w for _, _, _, w in sm.behind)))
                          for r, sm in pairs)
        box[2] = (fast, overlapping)
    return box[2]


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


@lru_cache(maxsize=64)
def _backward_codes(num_codes: int, zb: bool) -> np.ndarray:
    """Per recipe code: whether the step counts as its stage's backward work (its last one ends the pipeline
    work): a W, or a B where B does not leave its weight gradients for a W (ZB-H1). Cached (read-only)."""
    kind = (np.arange(max(num_codes, 1)) >> 1) % 3
    out = (kind == KIND_INDEX["W"]) | ((kind == KIND_INDEX["B"]) & (not zb))
    out.flags.writeable = False
    return out


def _program_steps(cfg: StepConfig, num_microbatches: int, steady: bool) -> tuple[Program, np.ndarray, np.ndarray]:
    """(the schedule's program of ``num_microbatches``, the steps the compiled loop runs, their repeating body):
    with ``steady``, its steady form where it has one (simdist.analytic.steady: the loop jumps its repeating bodies),
    else the program's own steps and `NO_BODY`. The steps the 1F1B A2A overlap runs alone have recipe codes of their
    own (simdist.plan.comm_overlap.unpaired)."""
    alone = a2a_overlapped(cfg)
    prog = program(cfg.schedule, cfg.mesh.pp, num_microbatches, cfg.vpp, alone)
    form = steady_form(cfg.schedule, cfg.mesh.pp, num_microbatches, cfg.vpp, alone) if steady else None
    return (prog, prog.steps, NO_BODY) if form is None else (prog, form.steps, form.body)


def _compiled_timeline(cfg: StepConfig, packed: Packed, num_microbatches: int, starts: dict | None = None,
                       spans: bool = False) -> tuple:
    """`run_program` over the schedule's program of ``num_microbatches``: where `_fast` holds, each step's core
    streams are free when it starts, so a simple step costs one addition (simdist.analytic.timeline_kernel);
    ``starts``: filled with each step's start, by (stage, kind, chunk), in micro-batch order (an array each).
    Where neither starts nor ``spans`` are asked for, the program runs in its steady form (simdist.analytic.steady:
    the loop jumps over the steady state's repeating bodies once their times repeat).
    Returns run_program's answer with, third, the program's steps per stage and recipe code (Program.counts)."""
    K = cfg.mesh.pp
    prog, steps, body = _program_steps(cfg, num_microbatches, starts is None and not spans)
    step, intervals, first_last, spans_out, at, _ = run_program(
        packed, steps, prog.counts, _backward_codes(prog.counts.shape[1], cfg.schedule in SPLIT_BACKWARD),
        starts is not None, spans, body)
    if starts is not None:
        for key, idx in step_groups(cfg.schedule, K, num_microbatches, cfg.vpp):
            starts[key] = at[idx]
    return step, intervals, prog.counts, first_last, spans_out, at


def _compiled_observables(cfg: StepConfig, stages: list[_Stage], packed: Packed, num_microbatches: int
                          ) -> dict[str, float]:
    """`_observables` where `_fast` holds: the compiled timeline and the compiled breakdown sweep
    (simdist.plan.accounting_kernel) in one compiled call (simdist.analytic.timeline_jit.timed); the simple steps
    are blocks whose parts are charged as they are. The program runs in its steady form where no spans are asked for
    (as `_compiled_timeline` runs it)."""
    from simdist.analytic.timeline_jit import timed  # numba: loaded with the compiled timeline

    K = cfg.mesh.pp
    cover = _overlapping_work(stages)
    prog, steps, body = _program_steps(cfg, num_microbatches, not cover)
    p = packed
    step, lo, hi, mean, flops = timed(
        p.slot, p.code_base, p.num_codes, p.kind, p.recipe, p.duration, p.frees, p.plain, p.ahead_ptr, p.ahead,
        p.behind_ptr, p.behind, p.recipe_ptr, p.recipe_needs, p.recipe_end, p.piece, p.dep_ptr, p.deps, p.tail,
        p.recipe_flops, p.simple_flops, p.parts, p.sends, steps, prog.counts,
        _backward_codes(prog.counts.shape[1], cfg.schedule in SPLIT_BACKWARD), cover, body, SHIFT_TOLERANCE)
    out = {"step_s": step, "phase_s": max(hi - lo, 0.0), "model_flops": flops[0] / K, "hardware_flops": flops[1] / K}
    out.update(zip(_MEAN_KEYS, mean.tolist(), strict=True))
    return out


_MEAN_KEYS = tuple(f"{c}_s" for c in (*CATEGORIES, "bubble", "idle"))
"""The observables' names of `observe`'s mean seconds, in its order."""


def _pack(stages: list[_Stage]) -> Packed:
    """``stages`` as arrays for the compiled timeline; each distinct stage packed once (`_Stage.unit`)."""
    if isinstance(stages, Stages):  # its distinct stages and which each stage is, found when they were priced
        distinct, unit_of, sends = stages.distinct, stages.unit_of, stages.sends
    else:
        (distinct, unit_of), sends = distinct_stages(stages), [st.sends for st in stages]
    def make(i: int) -> Unit:
        st = distinct[i]
        return pack_stage(st.recipes, st.simple, st.tail)

    return pack_boxed([st.box() for st in distinct], make, unit_of, sends)


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
