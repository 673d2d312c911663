"""Where a step's time goes: the one definition of the pipeline bubble and of the step breakdown.

Every timeline is accounted for here, whether the engine simulated it (simdist.report.step_metrics reads a
trace) or the closed form computed it (simdist.analytic.step), and `simdist bubble`'s bare pipelines too, so
``bubble_fraction`` means the same in every command and report.

Each op of a stage's rank is an interval of a *category* (compute, recompute, optimizer, tp, cp, ep, etp, pp, dp,
edp: a collective's category is its axis, the expert generator's ep / etp / edp included; dp covers the dense
parameters' data-parallel collectives, over the data-parallel group with context parallelism, dp x cp ranks, whose
axis is dp_cp where cp > 1: simdist.plan.data_parallel.dense_data_parallel_axis). Some
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
  compute > recompute > optimizer > tp > cp > ep > etp > dp > edp (pipeline work only) > bubble; outside it compute >
  recompute > optimizer > tp > cp > ep > etp > pp > dp > edp > idle (idle: waiting for the slowest stage's gradient
  reduction and optimizer,
  or for the step to start). Its ``bubble_s`` (mean over stages) is ``bubble_fraction`` x phase length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CATEGORIES", "PIPELINE_KINDS", "Account", "Block", "BlockSummary", "Interval", "account", "account_tables",
           "category_of", "interval_table", "is_work", "partition_pieces"]

CATEGORIES = ("compute", "recompute", "optimizer", "tp", "cp", "ep", "etp", "pp", "dp", "edp")
PIPELINE_KINDS = ("forward", "backward", "weight_grad", "recompute")
_INSIDE = tuple(c for c in CATEGORIES if c != "pp")
"""What counts inside the phase, in priority order: compute, recompute, optimizer, tp, cp, ep, etp, dp, edp."""
_INDEX = {c: i for i, c in enumerate(CATEGORIES)}

Interval = tuple[float, float, str, bool]
"""(start, end, category, pipeline work)."""
Block = tuple[float, float, dict[str, float]]
"""(start, end, seconds per category): a stretch of a stage's time known to be fully covered by pipeline work of
the categories given (a closed-form step whose pieces follow each other without gaps). Nothing else a stage runs
takes precedence over pipeline work, so a block's seconds are charged as given, whatever overlaps it."""


CATEGORY_OF_AXIS = {"dp_cp": "dp", "dps": "dp", "dps_cp": "dp", "dpr": "dp"}
"""Collective axes charged to another axis's category (the module docstring)."""


def category_of(kind: str, axis: str | None) -> str:
    """Category of an op of ``kind`` (simdist.plan.opgraph.Op.kind); ``axis`` of its collective, if any."""
    if axis is not None:
        return CATEGORY_OF_AXIS.get(axis, axis)
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


@dataclass(frozen=True, slots=True)
class BlockSummary:
    """A stage's blocks when nothing else it runs is pipeline work: only their total, span and parts matter
    (the accounting then needs no coverage: while a block runs no other interval could be charged)."""

    total_s: float
    start_s: float
    end_s: float
    parts: dict[str, float]
    starts: np.ndarray | None = None
    """Every block's start and end, in time order, where other pipeline work may overlap them (None: none may)."""
    ends: np.ndarray | None = None


_PP = _INDEX["pp"]


def _covered(blocks: list[Block] | BlockSummary, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How much of each [a, b] a stage's blocks (disjoint, in time order) cover (prefix sums and bisection)."""
    if isinstance(blocks, BlockSummary):
        starts, ends = blocks.starts, blocks.ends
        assert starts is not None and ends is not None
    else:
        starts = np.fromiter((x[0] for x in blocks), dtype=float, count=len(blocks))
        ends = np.fromiter((x[1] for x in blocks), dtype=float, count=len(blocks))
    before = np.concatenate(([0.0], np.cumsum(ends - starts)))
    i = np.searchsorted(ends, a, side="right")  # first block ending after a
    j = np.searchsorted(starts, b, side="left")  # blocks i..j-1 start before b
    some = j > i
    total = np.zeros(len(a))
    ii, jj = i[some], j[some]
    total[some] = (before[jj] - before[ii] - np.maximum(0.0, a[some] - starts[ii])
                   - np.maximum(0.0, ends[jj - 1] - b[some]))
    return np.maximum(total, 0.0)


_OPTIMIZER = _INDEX["optimizer"]


def interval_table(start_s: np.ndarray, end_s: np.ndarray, category: np.ndarray, work: np.ndarray) -> np.ndarray:
    """A stage's intervals given as columns (start, end, category: index into CATEGORIES, pipeline work: bool), as
    `account_tables` takes them: (start, end, category index, counts inside the phase, pipeline work) of those
    that last."""
    live = end_s > start_s
    category, work = category[live], work[live]
    table = np.empty((len(category), 5))
    table[:, 0] = start_s[live]
    table[:, 1] = end_s[live]
    table[:, 2] = category
    table[:, 3] = work | (category == _OPTIMIZER)
    table[:, 4] = work
    return table


def _partition(table: np.ndarray, lo: float, hi: float, step_s: float,
               blocks: list[Block] | BlockSummary | None = None) -> dict[str, float]:
    """Seconds per category, bubble and idle of one stage (the module docstring's rules); blocks are charged by
    their own parts, and what overlaps them by nothing. A sweep over the stage's interval ends, in numpy."""
    out = dict.fromkeys((*CATEGORIES, "bubble", "idle"), 0.0)
    n = len(table)
    marks = np.array(sorted({0.0, step_s, *(t for t in (lo, hi) if 0.0 < t < step_s)}), dtype=float)
    if n:  # the events ends (-1), marks (0), starts (+1), in that order
        times = np.concatenate((table[:, 1], marks, table[:, 0]))
        delta = np.concatenate((-np.ones(n), np.zeros(len(marks)), np.ones(n)))
        cat = np.concatenate((table[:, 2], np.zeros(len(marks)), table[:, 2])).astype(np.int64)
        inside_flag = np.concatenate((table[:, 3], np.zeros(len(marks)), table[:, 3]))
    else:
        times, delta, cat, inside_flag = marks, np.zeros(len(marks)), np.zeros(len(marks), dtype=np.int64), \
            np.zeros(len(marks))
    # by time; at one instant ends before marks before starts (a stable sort of the events listed in that order:
    # np.lexsort((delta, times)), in one sort)
    order = np.argsort(times, kind="stable")
    times, delta, cat, inside_flag = times[order], delta[order], cat[order], inside_flag[order]
    # A column per category the intervals have (ascending index: the priority order, both inside the phase, where pp
    # does not count, and outside it), its count of running intervals after each event, in integers (exact)
    present = np.flatnonzero(np.bincount(cat[delta != 0], minlength=len(CATEGORIES)))  # np.unique of small codes
    if not len(present):
        present = np.zeros(1, dtype=np.int64)  # no interval: one column that never runs
    change = np.zeros((len(times), len(present)), dtype=np.int32)
    change[np.arange(len(times)), np.searchsorted(present, cat)] = delta.astype(np.int32)
    any_active = np.cumsum(change, axis=0, dtype=np.int32)[:-1] > 0
    change[inside_flag == 0] = 0  # what does not count inside the phase
    in_active = np.cumsum(change, axis=0, dtype=np.int32)[:-1] > 0
    t0, t1 = times[:-1], times[1:]
    length = t1 - t0
    summary = blocks if isinstance(blocks, BlockSummary) else None
    covered = summary is None or summary.starts is not None
    if blocks and covered and (summary is None or summary.total_s > 0):
        length = length - _covered(blocks, t0, t1)
    use = length > 0
    if use.any():
        t0, t1, length, any_active, in_active = t0[use], t1[use], length[use], any_active[use], in_active[use]
        inside = (lo <= t0) & (t1 <= hi) & (hi > lo)
        counted = present != _PP  # inside the phase: the categories of _INSIDE
        top_in = in_active[:, counted]
        busy_in = top_in.any(axis=1)
        busy_out = any_active.any(axis=1)
        first_in = present[counted][np.argmax(top_in, axis=1)] if counted.any() else np.zeros(len(t0), np.int64)
        which = np.where(inside, first_in, present[np.argmax(any_active, axis=1)])
        busy = np.where(inside, busy_in, busy_out)
        sums = np.bincount(which[busy], weights=length[busy], minlength=len(CATEGORIES))
        for k, c in enumerate(CATEGORIES):
            out[c] += float(sums[k])
        out["bubble"] += float(length[inside & ~busy].sum())
        out["idle"] += float(length[~inside & ~busy].sum())
    if summary is not None:
        if not covered:
            # the sweep saw nothing running during the blocks (no other pipeline work, the optimizer after them),
            # so it charged their whole time to the bubble: it is the blocks' own
            out["bubble"] -= summary.total_s
        for c, seconds in summary.parts.items():
            out[c] += seconds
    elif blocks:
        counts: dict[int, list] = {}
        for _, _, parts in blocks:
            entry = counts.get(id(parts))
            if entry is None:
                counts[id(parts)] = [parts, 1]
            else:
                entry[1] += 1
        for parts, k in counts.values():
            for c, seconds in parts.items():
                out[c] += seconds * k
    return out


def account(stages: list[list[Interval]], step_s: float,
            blocks: list[list[Block] | BlockSummary] | None = None) -> Account:
    """The bubble and breakdown of a step whose stages ran ``stages`` (one interval list per stage; ``blocks``:
    per stage, stretches of pipeline work already partitioned) and which ended at ``step_s`` (see the module
    docstring)."""
    return account_tables([_table(iv) for iv in stages], step_s, blocks)


def _table(intervals: list[Interval]) -> np.ndarray:
    """`interval_table` of an `Interval` list."""
    start, end, category, work = zip(*intervals, strict=True) if intervals else ((), (), (), ())
    return interval_table(np.array(start, dtype=float), np.array(end, dtype=float),
                          np.array([_INDEX[c] for c in category], dtype=np.int64), np.array(work, dtype=bool))


def account_tables(tables: list[np.ndarray], step_s: float,
                   blocks: list[list[Block] | BlockSummary] | None = None) -> Account:
    """`account` of stages given as `interval_table`s."""
    blocks = blocks if blocks is not None else [[] for _ in tables]
    lo, hi = float("inf"), float("-inf")
    for t in tables:
        work = t[t[:, 4] > 0.5]
        if len(work):
            lo, hi = min(lo, float(work[:, 0].min())), max(hi, float(work[:, 1].max()))
    for bl in blocks:
        if isinstance(bl, BlockSummary):
            if bl.total_s > 0:
                lo, hi = min(lo, bl.start_s), max(hi, bl.end_s)
        elif bl:  # a stage's blocks are in time order
            lo, hi = min(lo, bl[0][0]), max(hi, bl[-1][1])
    if hi < lo:
        lo = hi = 0.0
    parts = tuple(_partition(t, lo, hi, step_s, bl) for t, bl in zip(tables, blocks, strict=True))
    phase = hi - lo
    fraction = sum(p["bubble"] for p in parts) / (len(parts) * phase) if parts and phase > 0 else 0.0
    return Account(step_s, lo, hi, max(fraction, 0.0), parts)


def _partition_small(intervals: list[Interval], duration_s: float) -> dict[str, float]:
    """`_partition` of a few pieces inside [0, duration_s] taken as the phase (no blocks), in plain Python: a
    recipe's pieces number a handful, where numpy's per-call cost would dominate."""
    events: list[tuple[float, int, int, bool]] = []
    for s, e, cat, work in intervals:
        if e > s:
            events.append((s, 1, _INDEX[cat], work or cat == "optimizer"))
            events.append((e, -1, _INDEX[cat], work or cat == "optimizer"))
    events.sort(key=lambda x: (x[0], x[1]))
    active = [0] * len(CATEGORIES)
    out = dict.fromkeys((*CATEGORIES, "bubble", "idle"), 0.0)
    inside = [_INDEX[c] for c in _INSIDE]
    t = 0.0
    for time, delta, c, counts in events:
        if time > t:
            top = next((CATEGORIES[k] for k in inside if active[k]), "bubble")
            out[top] += time - t
            t = time
        if counts:
            active[c] += delta
    if duration_s > t:
        out["bubble"] += duration_s - t
    return out


def partition_pieces(intervals: list[Interval], duration_s: float) -> dict[str, float]:
    """Seconds per category of pieces that cover [0, duration_s] without a gap (a `Block`'s parts)."""
    out = _partition_small(intervals, duration_s)
    return {c: out[c] for c in CATEGORIES if out[c] > 0}
