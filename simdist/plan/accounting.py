"""Where a step's time goes: the one definition of the pipeline bubble and of the step breakdown.

Every timeline is accounted for here, whether the engine simulated it (simdist.report.step_metrics reads a
trace) or the closed form computed it (simdist.analytic.step), and `simdist bubble`'s bare pipelines too, so
``bubble_fraction`` means the same in every command and report.

Each op of a stage's rank is an interval of a *category* (compute, recompute, optimizer, tp, cp, pp, dp). Some
of it is *pipeline work*: the forward, backward, weight-gradient and recompute compute of the schedule's steps,
and the collectives those steps issue per micro-batch (tensor/context-parallel, per-micro-batch ZeRO). A
pipeline send, a gradient bucket or reduction, the optimizer and a zero-length wait are not.

- The **pipeline phase** runs from the first pipeline work's start to the last one's end, over all stages.
- The **bubble** of a stage is the time inside the phase when its GPU neither computes (any compute-stream op,
  the optimizer included) nor runs a collective of its pipeline work: it waits for another stage (fill, drain,
  a late activation or gradient). A send or a gradient reduction running meanwhile does not fill it (it is
  hidden in the bubble).
- ``bubble_fraction`` = sum over stages of their bubble / (stages x phase length). With uniform stages and free
  communication it is (K-1)/(M+K-1) for GPipe and 1F1B (Huang et al. 2019; Narayanan et al. 2021 sec 2.2.1),
  (K-1)/(V M+K-1) interleaved (sec 2.2.2).
- The **breakdown** partitions each stage's [0, step end] by what runs, in priority order: inside the phase
  compute > recompute > optimizer > tp > cp > dp (pipeline work only) > bubble; outside it compute > recompute >
  optimizer > tp > cp > pp > dp > idle (idle: waiting for the slowest stage's gradient reduction and optimizer,
  or for the step to start). Its ``bubble_s`` (mean over stages) is ``bubble_fraction`` x phase length.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["CATEGORIES", "PIPELINE_KINDS", "Account", "Block", "Interval", "account", "category_of", "is_work",
           "partition_pieces"]

CATEGORIES = ("compute", "recompute", "optimizer", "tp", "cp", "pp", "dp")
PIPELINE_KINDS = ("forward", "backward", "weight_grad", "recompute")
_INSIDE = ("compute", "recompute", "optimizer", "tp", "cp", "dp")
_INDEX = {c: i for i, c in enumerate(CATEGORIES)}

Interval = tuple[float, float, str, bool]
"""(start, end, category, pipeline work)."""
Block = tuple[float, float, dict[str, float]]
"""(start, end, seconds per category): a stretch of a stage's time known to be fully covered by pipeline work of
the categories given (a closed-form step whose pieces follow each other without gaps). Nothing else a stage runs
takes precedence over pipeline work, so a block's seconds are charged as given, whatever overlaps it."""


def category_of(kind: str, axis: str | None) -> str:
    """Category of an op of ``kind`` (simdist.plan.opgraph.Op.kind); ``axis`` of its collective, if any."""
    if axis is not None:
        return axis
    if kind == "recompute":
        return "recompute"
    if kind == "optimizer":
        return "optimizer"
    return "compute"


def is_work(kind: str, axis: str | None, microbatch: int) -> bool:
    """Pipeline work: a scheduled step's compute, or a collective it issues per micro-batch (not a send)."""
    if microbatch < 0:
        return False
    if axis is None:
        return kind in PIPELINE_KINDS
    return axis != "pp"


@dataclass(frozen=True, slots=True)
class Account:
    step_s: float
    phase_start_s: float
    phase_end_s: float
    bubble_fraction: float
    stages: tuple[dict[str, float], ...]
    """Per stage: seconds per category, plus ``bubble`` and ``idle``; they add up to ``step_s``."""

    @property
    def phase_s(self) -> float:
        return max(self.phase_end_s - self.phase_start_s, 0.0)

    def mean(self) -> dict[str, float]:
        n = len(self.stages)
        keys = (*CATEGORIES, "bubble", "idle")
        return {k: sum(s[k] for s in self.stages) / n for k in keys} if n else dict.fromkeys(keys, 0.0)


def phase_of(stages: Iterable[Iterable[Interval]], blocks: Iterable[Iterable[Block]] = ()) -> tuple[float, float]:
    """(start, end) of the pipeline phase: the first and last pipeline work over all stages."""
    lo, hi = float("inf"), float("-inf")
    for intervals in stages:
        for s, e, _, work in intervals:
            if work:
                lo = min(lo, s)
                hi = max(hi, e)
    for bl in blocks:
        for s, e, _ in bl:
            lo = min(lo, s)
            hi = max(hi, e)
    return (lo, hi) if hi >= lo else (0.0, 0.0)


class _Coverage:
    """How much of [a, b] a stage's blocks (disjoint, in time order) cover, by bisection on their prefix sums."""

    def __init__(self, blocks: list[Block]) -> None:
        self.starts = [s for s, _, _ in blocks]
        self.ends = [e for _, e, _ in blocks]
        self.before = [0.0]
        for s, e, _ in blocks:
            self.before.append(self.before[-1] + (e - s))

    def covered(self, a: float, b: float) -> float:
        if not self.starts or b <= a:
            return 0.0
        i = bisect_right(self.ends, a)  # first block ending after a
        j = bisect_left(self.starts, b)  # blocks i..j-1 start before b
        if j <= i:
            return 0.0
        total = self.before[j] - self.before[i]
        total -= max(0.0, a - self.starts[i])
        total -= max(0.0, self.ends[j - 1] - b)
        return max(total, 0.0)


def _partition(intervals: list[Interval], lo: float, hi: float, step_s: float,
               blocks: list[Block] | None = None) -> dict[str, float]:
    """Seconds per category, bubble and idle of one stage (the module docstring's rules); blocks are charged by
    their own parts, and what overlaps them by nothing."""
    events: list[tuple[float, int, int, bool]] = []
    for s, e, cat, work in intervals:
        if e > s:
            c = _INDEX[cat]
            inside = work or cat == "optimizer"
            events.append((s, 1, c, inside))
            events.append((e, -1, c, inside))
    events.sort(key=lambda x: (x[0], x[1]))
    any_active = [0] * len(CATEGORIES)
    in_active = [0] * len(CATEGORIES)
    out = dict.fromkeys((*CATEGORIES, "bubble", "idle"), 0.0)
    inside_order = [_INDEX[c] for c in _INSIDE]
    outside_order = range(len(CATEGORIES))
    bounds = [t for t in (lo, hi) if 0.0 < t < step_s]
    cover = _Coverage(blocks) if blocks else None

    def charge(t0: float, t1: float) -> None:
        if t1 <= t0:
            return
        length = t1 - t0 - (cover.covered(t0, t1) if cover is not None else 0.0)
        if length <= 0:
            return
        if lo <= t0 and t1 <= hi and hi > lo:
            top = next((CATEGORIES[c] for c in inside_order if in_active[c]), "bubble")
        else:
            top = next((CATEGORIES[c] for c in outside_order if any_active[c]), "idle")
        out[top] += length

    t = 0.0
    b = 0
    for time, delta, c, inside in events:
        while b < len(bounds) and bounds[b] < time:
            charge(t, bounds[b])
            t = max(t, bounds[b])
            b += 1
        if time > t:
            charge(t, time)
            t = time
        any_active[c] += delta
        if inside:
            in_active[c] += delta
    while b < len(bounds):
        charge(t, bounds[b])
        t = max(t, bounds[b])
        b += 1
    if step_s > t:
        charge(t, step_s)
    for _, _, parts in blocks or ():
        for cat, seconds in parts.items():
            out[cat] += seconds
    return out


def account(stages: list[list[Interval]], step_s: float, blocks: list[list[Block]] | None = None) -> Account:
    """The bubble and breakdown of a step whose stages ran ``stages`` (one interval list per stage; ``blocks``:
    per stage, stretches of pipeline work already partitioned) and which ended at ``step_s`` (see the module
    docstring)."""
    blocks = blocks if blocks is not None else [[] for _ in stages]
    lo, hi = phase_of(stages, blocks)
    parts = tuple(_partition(iv, lo, hi, step_s, bl) for iv, bl in zip(stages, blocks, strict=True))
    phase = hi - lo
    fraction = sum(p["bubble"] for p in parts) / (len(parts) * phase) if parts and phase > 0 else 0.0
    return Account(step_s, lo, hi, max(fraction, 0.0), parts)


def partition_pieces(intervals: list[Interval], duration_s: float) -> dict[str, float]:
    """Seconds per category of pieces that cover [0, duration_s] without a gap (a `Block`'s parts)."""
    out = _partition(intervals, 0.0, duration_s, duration_s)
    return {c: out[c] for c in CATEGORIES if out[c] > 0}
