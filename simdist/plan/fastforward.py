"""Fast-forwarding a pipeline's repeating steady state: cost that grows with distinct work, not with repetition.

A training step's micro-batches cost the same, so once a schedule's warm-up is over its timeline repeats: every
``c`` micro-batches every step of the steady state happens again, shifted by the same time, and the cool-down
that follows is the same whatever came before. (A pipeline is a max-plus linear system; ``c`` is the cyclicity of
its critical circuits, Baccelli et al. 1992, "Synchronization and Linearity", sec 3.7: 1 for uniform stages, but
e.g. K - 1 for 1F1B on K stages whose end stages are a layer lighter, and a multiple of K for interleaved 1F1B,
which runs micro-batches in groups of K.) A step of M micro-batches then equals a step of M1 micro-batches with
(M - M1) / c periods inserted (M1 = M mod c), so every additive quantity of it (step time, pipeline phase,
seconds per breakdown category, FLOPs) is affine in M along that residue:
x(M) = x(M1) + (M - M1) / c * (x(M1 + c) - x(M1)).

`plan` reads ``c`` off a timeline (the start of every step, per stage, kind and chunk, against its micro-batch:
`find_cycle`) and picks M1, M1 + c, M1 + 2c: the earliest M1 past the warm-up at which four timed step times a
period apart lie on one line (`steady_counts`), at the latest past the transient and a cool-down margin
(`sample_counts`, a bound that is often several periods late); `extrapolate` checks that the three samples are
collinear in every quantity (within 1e-9 of the step time) before extending them to M. The engine, whose
transient contention can lengthen, slides its samples on by a period while they are not collinear
(simdist.predict.engine_step); from its fifth sample on it also accepts a steady state that repeats only on
average, its increments per period jittering within `JITTER_TOLERANCE` (links shared by max-min fairness among
transfers that start a little earlier or later each period), extended by their mean (`extrapolate_mean`). When no
cycle is found, when no samples are collinear, or when M is too small to gain, every micro-batch is simulated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

import numpy as np

from simdist.plan.schedule import TWO_CHUNK_SCHEDULES

__all__ = ["FastForward", "detection_microbatches", "extrapolate", "extrapolate_mean", "find_cycle", "group_of", "plan",
           "sample_counts", "samples_cost", "steady_counts", "warmup_of"]

REL_TOLERANCE = 1e-9
"""Collinearity and periodicity tolerance, relative to the largest step time sampled."""
SAVING = 1.25
"""Fast-forward only when simulating every micro-batch would cost at least this many times the samples."""
JITTER_TOLERANCE = 0.01
"""How far apart the per-period increments of a contended steady state may lie (max - min, relative to the step
time's mean increment per period) for `extrapolate_mean` to extend them. The samples' mean increment then lies
within that share of every increment they show, so the extended periods' time is off by at most 1 % of itself
where the jitter keeps its range (Qwen3-235B on 256 H100: -0.013 % of the step against every micro-batch).
# Assumption: 1 %: past it, increments that drift (a transient still settling) rather than jitter are not told apart
# from the jitter by five samples; the engine then simulates every micro-batch."""
JITTER_SAMPLES = 5
"""Samples `extrapolate_mean` reads: the exact test's three and two more a period apart (four increments)."""


def samples_cost(counts: Sequence[int], beside: bool = False) -> int:
    """What simulating samples of ``counts`` micro-batches costs, in micro-batches: their sum, or, ``beside`` (the
    smaller ones simulated in a second process while the largest runs: simdist.predict.beside), the longer of the
    largest and the smaller ones together."""
    return max(counts[-1], sum(counts[:-1])) if beside else sum(counts)


@dataclass(frozen=True, slots=True)
class FastForward:
    """How a step's micro-batches were simulated: ``counts`` sampled, ``cycle`` apart, extended to ``total``."""

    cycle: int
    counts: tuple[int, int, int]
    total: int

    def describe(self, verb: str = "simulated") -> str:
        return (f"fast-forward: the steady state repeats every {self.cycle} micro-batch(es); {verb} "
                f"{self.counts[0]}, {self.counts[1]}, {self.counts[2]} and extended to {self.total}")


def group_of(schedule: str, num_stages: int) -> int:
    """Micro-batch counts a schedule accepts are multiples of this (interleaved: groups of K, Megatron-LM)."""
    return num_stages if schedule == "interleaved_1f1b" else 1


def warmup_of(schedule: str, num_stages: int, vpp: int = 1) -> int:
    """Micro-batches past every stage's warm-up: K + 2 (stage s warms up with K - s - 1 forwards in 1F1B and
    ZB-H1; GPipe fills in K); interleaved, stage 0's 2(K - 1) + (V - 1)K chunk-forwards of V chunks each, + 2."""
    if schedule == "interleaved_1f1b":
        return math.ceil((2 * (num_stages - 1) + (vpp - 1) * num_stages) / vpp) + 2
    return num_stages + 2


def _max_cycle(schedule: str, num_stages: int) -> int:
    return 2 * num_stages if schedule == "interleaved_1f1b" else num_stages


def _cooldown_margin(schedule: str, num_stages: int, vpp: int) -> int:
    """Micro-batches at a timeline's end that the cool-down may shift: the backwards after the last forward, K - 1
    in 1F1B; interleaved, the last 2(K - 1) + (V - 1)K chunk-backwards, among which chunk 0's lag its forward
    position by another (V - 1)K chunk-steps."""
    if schedule == "interleaved_1f1b":
        return math.ceil((2 * (num_stages - 1) + 2 * (vpp - 1) * num_stages) / vpp) + 2
    return num_stages + 2


def detection_microbatches(schedule: str, num_stages: int, vpp: int = 1) -> int:
    """Micro-batches of the first timeline `find_cycle` reads: warm-up, two of the longest cycles looked for, and a
    cool-down margin that is not read."""
    g = group_of(schedule, num_stages)
    m = (warmup_of(schedule, num_stages, vpp) + 2 * _max_cycle(schedule, num_stages)
         + _cooldown_margin(schedule, num_stages, vpp))
    return g * math.ceil(m / g)


def find_cycle(schedule: str, num_stages: int, starts: Mapping[tuple, Sequence[float]], step_s: float,
               total: int, vpp: int = 1) -> tuple[int, int] | None:
    """(c, a): the smallest c (a multiple of `group_of`, at most K, 2K interleaved) such that each sequence of
    ``starts`` (a step's start time against its micro-batch, one per stage, kind and chunk, from a timeline of
    ``total`` micro-batches) advances by a constant time every c micro-batches over a window before the cool-down
    margin (two of the longest cycles looked for, whatever c), and from micro-batch a on; None if there is none.
    A max-plus system's transient can be long where two circuits have nearly the same mean (ZB-H1 on uneven
    stages: tens of micro-batches), so the caller looks again on a longer timeline; `extrapolate` then checks the
    samples are collinear."""
    g = group_of(schedule, num_stages)
    end = total - _cooldown_margin(schedule, num_stages, vpp)
    tol = REL_TOLERANCE * max(step_s, 1e-300)
    longest = _max_cycle(schedule, num_stages)
    a = end - 2 * longest  # every candidate is checked over the same window: two of the longest cycles
    if a < 0:
        return None
    seqs = list(starts.values())
    if any(len(seq) < end for seq in seqs):
        return None
    # every sequence as a row (its first `end` starts): each check below is the same subtraction per element as a
    # loop over the sequences would make, for all of them at once
    rows = np.array([np.asarray(seq, dtype=float)[:end] for seq in seqs]).reshape(len(seqs), end)
    for c in range(g, longest + 1, g):
        shifts = rows[:, a + c] - rows[:, a]  # each its own: GPipe's stages run their forwards at their own pace
        window = rows[:, a + 1 + c:end] - rows[:, a + 1:end - c]
        if window.size and (np.abs(window - shifts[:, None]) > tol).any():
            continue
        # back to where the cycle began: the earliest micro-batch from which every sequence keeps its shift
        back = np.abs(rows[:, c:a + c] - rows[:, :a] - shifts[:, None]) <= tol  # column m: micro-batch m
        kept = back.all(axis=0)
        start = a
        while start > 0 and kept[start - 1]:
            start -= 1
        return c, start
    return None


def plan(schedule: str, num_stages: int, num_microbatches: int,
         timeline: Callable[[int], tuple[Mapping[tuple, Sequence[float]], float]], *, vpp: int = 1,
         count_detection: bool = True, step_of: Callable[[int], float] | None = None, beside: bool = False
         ) -> tuple[int, int, int, int] | None:
    """(cycle, M1, M1 + c, M1 + 2c) to sample, or None (simulate every micro-batch). ``timeline(m)`` times m
    micro-batches and returns each step's start (see `find_cycle`) and the step time; it is called on longer
    schedules (by two of the longest cycles looked for at a time) while that stays cheaper than M, then on the
    candidate samples (`steady_counts`). ``count_detection``: those timelines cost as much as the samples (the
    closed form detecting its own cycle), else nothing (the closed form detecting the engine's). ``step_of(m)``:
    ``timeline(m)``'s step time alone, where that is cheaper (no starts recorded), for the candidate samples.
    ``beside``: the samples' cost is `samples_cost`'s beside (the engine's, with a CPU to spare).

    # Assumption: zb_v, dualpipe and dualpipev are not fast-forwarded (every micro-batch simulated): their orders
    # are built per micro-batch count (DualPipe's phases from M, ZB-V's greedy order: simdist.plan.schedule_v),
    # their steady state's cycle has not been checked as the other schedules' has, and dualpipe runs even counts
    # >= 2 pp only, which the samples M1, M1 + c, M1 + 2c would have to keep.
    """
    if schedule in TWO_CHUNK_SCHEDULES:
        return None
    g, total, least, checks = _first_look(schedule, num_stages, vpp, beside)
    spent = [0]

    def read(m: int) -> tuple[Mapping[tuple, Sequence[float]], float]:
        spent[0] += m
        return timeline(m)

    def read_step(m: int) -> float:
        if step_of is None:
            return read(m)[1]
        spent[0] += m
        return step_of(m)

    while SAVING * (least + ((spent[0] + total + checks) if count_detection else 0)) < num_microbatches:
        starts, step_s = read(total)
        found = find_cycle(schedule, num_stages, starts, step_s, total, vpp)
        if found is not None:
            cycle, start = found
            # the timelines read so far are spent: the samples only have to cost less than the rest
            counts = steady_counts(schedule, num_stages, num_microbatches, cycle, read_step,
                                   start=start, vpp=vpp, beside=beside)
            return None if counts is None else (cycle, *counts)
        total = g * math.ceil((total + 2 * _max_cycle(schedule, num_stages)) / g)
    return None


@lru_cache(maxsize=1024)
def _first_look(schedule: str, num_stages: int, vpp: int, beside: bool) -> tuple[int, int, int, int]:
    """What `plan` weighs before timing anything, by schedule shape: (the micro-batch group, the first detection
    timeline's micro-batches, the cheapest samples there can be: the shortest cycle, the earliest steady state, and
    the four step times `steady_counts` checks the earliest samples with, in micro-batches). The
    detection timelines and the checks are counted where the closed form times its own samples (count_detection),
    each as long as a timeline of its micro-batches."""
    g = group_of(schedule, num_stages)
    first = _first_sample(schedule, num_stages, vpp)
    least = samples_cost((first, first + g, first + 2 * g), beside)
    checks = sum(first + j * g for j in range(4))
    return g, detection_microbatches(schedule, num_stages, vpp), least, checks


def _first_sample(schedule: str, num_stages: int, vpp: int) -> int:
    """The fewest micro-batches a sample may have: past every stage's warm-up, in whole groups."""
    g = group_of(schedule, num_stages)
    return g * math.ceil(warmup_of(schedule, num_stages, vpp) / g)


def steady_counts(schedule: str, num_stages: int, num_microbatches: int, cycle: int,
                  step_of: Callable[[int], float], *, start: int = 0, vpp: int = 1, beside: bool = False
                  ) -> tuple[int, int, int] | None:
    """(M1, M1 + c, M1 + 2c), M1 = M (mod c): the earliest M1 past the warm-up whose step times ``step_of`` at M1,
    M1 + c, M1 + 2c and M1 + 3c lie on one line (within REL_TOLERANCE of the largest), so that inserting a period
    adds the same time there; at the latest `sample_counts`' M1, which reaches past where the cycle was seen
    (``start``) by a cycle and a cool-down margin. None when the samples would cost more than M / SAVING.

    The margin is a bound: a schedule's timeline usually reaches its repeating state micro-batches earlier (the
    interleaved 1F1B of Llama 3 405B on 16 stages of 7 chunks, from M = 32; the bound: 80). Four collinear step
    times, one more than the samples, check it; `extrapolate` then checks every quantity of the samples."""
    latest = _latest_m1(schedule, num_stages, num_microbatches, cycle, start, vpp)
    first = _first_sample(schedule, num_stages, vpp)
    m1 = first + (num_microbatches - first) % cycle
    steps: dict[int, float] = {}
    while m1 < latest and SAVING * samples_cost((m1, m1 + cycle, m1 + 2 * cycle), beside) <= num_microbatches:
        points = [m1 + j * cycle for j in range(4)]
        for m in points:
            if m not in steps:
                steps[m] = step_of(m)
        xs = [steps[m] for m in points]
        tol = REL_TOLERANCE * max(max(abs(x) for x in xs), 1e-300)
        if all(abs((xs[j + 1] - xs[j]) - (xs[1] - xs[0])) <= tol for j in (1, 2)):
            return points[0], points[1], points[2]
        m1 += cycle
    return sample_counts(schedule, num_stages, num_microbatches, cycle, start=start, vpp=vpp, beside=beside)


def _latest_m1(schedule: str, num_stages: int, num_microbatches: int, cycle: int, start: int, vpp: int) -> int:
    """`sample_counts`' M1: past the warm-up and ``start`` by a cool-down margin and a cycle, on M's residue."""
    m1 = max(warmup_of(schedule, num_stages, vpp), start) + _cooldown_margin(schedule, num_stages, vpp) + cycle
    g = group_of(schedule, num_stages)
    m1 = g * math.ceil(m1 / g)
    return m1 + (num_microbatches - m1) % cycle


def sample_counts(schedule: str, num_stages: int, num_microbatches: int, cycle: int, *, start: int = 0,
                  overhead: int = 0, vpp: int = 1, beside: bool = False) -> tuple[int, int, int] | None:
    """(M1, M1 + c, M1 + 2c) whose steady states reach past micro-batch ``start`` (where the cycle was seen) by a
    cycle, with M1 = M (mod c), or None when simulating all M micro-batches costs less than SAVING x the samples
    (plus ``overhead`` micro-batches already spent)."""
    m1 = _latest_m1(schedule, num_stages, num_microbatches, cycle, start, vpp)
    counts = (m1, m1 + cycle, m1 + 2 * cycle)
    if num_microbatches < counts[-1] or SAVING * (samples_cost(counts, beside) + overhead) > num_microbatches:
        return None
    return counts


def extrapolate(samples: list[tuple[int, Mapping[str, float]]], num_microbatches: int,
                scale_key: str = "step_s") -> dict[str, float] | None:
    """Every quantity at ``num_microbatches`` from three equally spaced samples, or None if they are not
    collinear (within REL_TOLERANCE of the largest ``scale_key``) in some quantity."""
    (m1, a), (m2, b), (m3, c) = samples
    step = m2 - m1
    if step <= 0 or m3 - m2 != step or (num_microbatches - m1) % step:
        raise ValueError("extrapolate: samples must be equally spaced, increasing, and on M's residue")
    scale = max(abs(a.get(scale_key, 0.0)), abs(b.get(scale_key, 0.0)), abs(c.get(scale_key, 0.0)), 1e-300)
    out: dict[str, float] = {}
    k = (num_microbatches - m1) / step
    for key in a:
        x1, x2, x3 = a[key], b[key], c[key]
        tol = REL_TOLERANCE * max(scale, abs(x1), abs(x2), abs(x3))
        if abs((x3 - x2) - (x2 - x1)) > tol:
            return None
        out[key] = x1 + k * (x2 - x1)
    return out


def extrapolate_mean(samples: list[tuple[int, Mapping[str, float]]], num_microbatches: int,
                     scale_key: str = "step_s") -> tuple[dict[str, float], float] | None:
    """(every quantity at ``num_microbatches``, the widest spread of a quantity's increments relative to the step's
    mean increment) from equally spaced samples a period apart whose per-period increments agree within
    `JITTER_TOLERANCE` of the step's mean increment, though not exactly (`extrapolate`'s test); None where they
    spread wider.

    The engine's contended steady state need not repeat exactly: transfers that share links by max-min fairness
    start a little earlier or later from period to period, so each period's increment jitters around a stable mean
    (Qwen3-235B on 256 H100, 16-72 micro-batches a period of 8 apart: increments 1.1850-1.1904 s, step 76.79 s over
    all 512). Each quantity is extended from the last sample by the samples' mean increment (their chord, last minus
    first over the periods between), so its error is the samples' deviation from their mean line, not a period's
    jitter times the periods skipped.
    # Assumption: past the samples the steady state keeps their mean increment (the jitter does not drift)."""
    counts = [m for m, _ in samples]
    n = len(counts)
    step = counts[1] - counts[0]
    if n < 3 or step <= 0 or any(b - a != step for a, b in pairwise(counts)) or \
            (num_microbatches - counts[0]) % step:
        raise ValueError("extrapolate_mean: samples must be equally spaced, increasing, and on M's residue")
    first, last = samples[0][1], samples[-1][1]
    scale = (last.get(scale_key, 0.0) - first.get(scale_key, 0.0)) / (n - 1)
    if not scale > 0:
        return None
    k = (num_microbatches - counts[-1]) / step
    out: dict[str, float] = {}
    widest = 0.0
    for key in last:
        xs = np.array([obs[key] for _, obs in samples], dtype=float)
        increments = np.diff(xs)
        spread = float(increments.max() - increments.min())
        if spread > max(JITTER_TOLERANCE * scale, REL_TOLERANCE * float(np.abs(xs).max())):
            return None
        widest = max(widest, spread / scale)
        out[key] = float(xs[-1] + k * (xs[-1] - xs[0]) / (n - 1))
    return out, widest
