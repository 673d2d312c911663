"""simdist.plan.accounting's breakdown sweep, compiled (numba), for the closed form's timelines.

The rules are simdist.plan.accounting's (its module docstring): the phase runs from the first pipeline work's
start to the last one's end; inside it a stage's time goes to the first category running by priority among its
pipeline work and the optimizer, else to the bubble; outside it to the first category running, else to idle. A
closed-form stage's simple steps are *blocks* (stretches fully covered by pipeline work whose seconds per
category are known): their own parts are charged by the caller, and the sweep charges what overlaps them nothing
(where other pipeline work may overlap them, their spans are subtracted from every stretch; else the sweep saw
nothing counting during them and their total is taken off the bubble). The same arithmetic as
`accounting._partition`, per stretch, in a loop instead of numpy's per-call overheads: a closed-form step has
hundreds of intervals per stage, and a search times thousands of steps (tests/test_timeline_kernel.py checks the
two against each other).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simdist import precompiled
from simdist.plan.accounting import CATEGORIES

__all__ = ["account_stages"]

_NUM = len(CATEGORIES)
_PP = CATEGORIES.index("pp")
_OPTIMIZER = CATEGORIES.index("optimizer")
BUBBLE, IDLE = _NUM, _NUM + 1
"""Columns of `account_stages`' result after the categories."""


@njit(cache=True)
def account_stages(intervals, num_stages, step_s, first_last, totals, spans, covered):  # pragma: no cover
    """(phase start, phase end, seconds (K, categories + bubble + idle)) of a closed-form step: ``intervals``
    (n, 5: start, end, category index, work, stage), the blocks' ``first_last`` (K, 2: first start, last end) and
    ``totals`` (K), their ``spans`` (m, 3: start, end, stage; in time order within a stage) where ``covered``."""
    K = num_stages
    n = intervals.shape[0]
    lo, hi = np.inf, -np.inf
    counts = np.zeros(K + 1, dtype=np.int64)
    for i in range(n):
        if intervals[i, 1] > intervals[i, 0]:
            counts[int(intervals[i, 4]) + 1] += 1
            if intervals[i, 3] > 0.5:
                if intervals[i, 0] < lo:
                    lo = intervals[i, 0]
                if intervals[i, 1] > hi:
                    hi = intervals[i, 1]
    for s in range(K):
        if totals[s] > 0:
            if first_last[s, 0] < lo:
                lo = first_last[s, 0]
            if first_last[s, 1] > hi:
                hi = first_last[s, 1]
    if hi < lo:
        lo = hi = 0.0
    ptr = np.cumsum(counts)
    order = np.empty(ptr[K], dtype=np.int64)
    fill = ptr[:K].copy()
    for i in range(n):
        if intervals[i, 1] > intervals[i, 0]:
            s = int(intervals[i, 4])
            order[fill[s]] = i
            fill[s] += 1
    span_counts = np.zeros(K + 1, dtype=np.int64)
    for i in range(spans.shape[0]):
        span_counts[int(spans[i, 2]) + 1] += 1
    span_ptr = np.cumsum(span_counts)
    by_stage = np.empty((spans.shape[0], 2))  # each stage's spans together, in their (time) order
    fill = span_ptr[:K].copy()
    for i in range(spans.shape[0]):
        s = int(spans[i, 2])
        by_stage[fill[s], 0] = spans[i, 0]
        by_stage[fill[s], 1] = spans[i, 1]
        fill[s] += 1
    out = np.zeros((K, _NUM + 2))
    for s in range(K):
        rows = order[ptr[s]:ptr[s + 1]]
        _partition(intervals, rows, lo, hi, step_s, by_stage[span_ptr[s]:span_ptr[s + 1]],
                   covered and totals[s] > 0, out[s])
        if not covered:
            out[s, BUBBLE] -= totals[s]
    return lo, hi, out


@njit(cache=True)
def _partition(intervals, rows, lo, hi, step_s, spans, subtract, out):  # pragma: no cover - compiled
    m = rows.shape[0]
    marks = np.empty(4)
    num_marks = np.int64(0)  # (np.int64, not a literal 0: see simdist.analytic.timeline_jit.run)
    for t in (0.0, step_s, lo, hi):
        if (t == 0.0 or t == step_s) or (0.0 < t < step_s):
            dup = False
            for x in range(num_marks):
                if marks[x] == t:
                    dup = True
            if not dup:
                marks[num_marks] = t
                num_marks += 1
    # at most four marks, in order by insertion (not np.sort: numba's sort would compile a quicksort for them)
    for x in range(1, num_marks):
        t = marks[x]
        y = x - 1
        while y >= 0 and marks[y] > t:
            marks[y + 1] = marks[y]
            y -= 1
        marks[y + 1] = t
    marks = marks[:num_marks]
    # events: ends (-1), marks (0), starts (+1), in that order, sorted stably by time
    E = 2 * m + num_marks
    times = np.empty(E)
    delta = np.empty(E, dtype=np.int64)
    cat = np.empty(E, dtype=np.int64)
    inside_flag = np.empty(E, dtype=np.bool_)
    for j in range(m):
        i = rows[j]
        c = int(intervals[i, 2])
        flag = intervals[i, 3] > 0.5 or c == _OPTIMIZER
        times[j] = intervals[i, 1]
        delta[j] = -1
        cat[j] = c
        inside_flag[j] = flag
        times[m + num_marks + j] = intervals[i, 0]
        delta[m + num_marks + j] = 1
        cat[m + num_marks + j] = c
        inside_flag[m + num_marks + j] = flag
    for j in range(num_marks):
        times[m + j] = marks[j]
        delta[m + j] = 0
        cat[m + j] = 0
        inside_flag[m + j] = False
    order = _event_order(times, m, num_marks)
    # the blocks' prefix sums, for how much of each stretch they cover
    num_spans = spans.shape[0]
    before = np.zeros(num_spans + 1)
    for b in range(num_spans):
        before[b + 1] = before[b] + (spans[b, 1] - spans[b, 0])
    lo_span = 0  # the first span ending after the stretch's start, and the first starting at or after its end:
    hi_span = 0  # both only move forward, as the stretches do
    any_count = np.zeros(_NUM, dtype=np.int64)
    in_count = np.zeros(_NUM, dtype=np.int64)
    for k in range(E - 1):
        e = order[k]
        if delta[e] != 0:
            any_count[cat[e]] += delta[e]
            if inside_flag[e]:
                in_count[cat[e]] += delta[e]
        t0 = times[e]
        t1 = times[order[k + 1]]
        length = t1 - t0
        if subtract:
            while lo_span < num_spans and spans[lo_span, 1] <= t0:
                lo_span += 1
            while hi_span < num_spans and spans[hi_span, 0] < t1:
                hi_span += 1
            length = length - _covered(spans, before, lo_span, hi_span, t0, t1)
        if not length > 0:
            continue
        inside = lo <= t0 and t1 <= hi and hi > lo
        # inside the phase: what counts there (pipeline work, the optimizer; not pp), else the bubble; outside:
        # anything running, else idle
        which = _first_running(in_count, np.int64(_PP)) if inside else _first_running(any_count, np.int64(-1))
        out[which if which >= 0 else (BUBBLE if inside else IDLE)] += length


@njit(cache=True)
def _first_running(counts, skip):  # pragma: no cover - compiled
    """The first category (priority order) with something running, ``skip`` left out; -1: none."""
    for c in range(counts.shape[0]):
        if c != skip and counts[c] > 0:
            return c
    return -1


@njit(cache=True)
def _covered(spans, before, i, j, a, b):  # pragma: no cover - compiled
    """How much of [a, b] the disjoint, time-ordered ``spans`` cover (accounting._covered): spans i..j-1 are those
    ending after a and starting before b."""
    if j <= i:
        return 0.0
    total = (before[j] - before[i] - max(0.0, a - spans[i, 0]) - max(0.0, spans[j - 1, 1] - b))
    return max(total, 0.0)


@njit(cache=True)
def _sorted_stably(times, first, count):  # pragma: no cover - compiled
    """Indices first..first+count-1 ordered stably by ``times``: an insertion sort, linear on the nearly sorted
    lists a stage's intervals are (each stream's pieces follow each other in time)."""
    idx = np.arange(first, first + count)
    for k in range(1, count):
        x = idx[k]
        t = times[x]
        j = k - 1
        while j >= 0 and times[idx[j]] > t:
            idx[j + 1] = idx[j]
            j -= 1
        idx[j + 1] = x
    return idx


@njit(cache=True)
def _event_order(times, m, num_marks):  # pragma: no cover - compiled
    """The events (ends 0..m-1, marks m..m+num_marks-1, starts after) by time; at one instant ends before marks
    before starts, each in its list's order (what a stable sort of the three lists laid end to end gives)."""
    lists = (_sorted_stably(times, np.int64(0), m), _sorted_stably(times, m, num_marks),
             _sorted_stably(times, m + num_marks, m))
    out = np.empty(2 * m + num_marks, dtype=np.int64)
    pos = np.zeros(3, dtype=np.int64)
    sizes = np.array([m, num_marks, m])
    for k in range(out.shape[0]):
        best = -1
        best_t = 0.0
        for x in range(3):  # the earliest head; on a tie the earlier list
            if pos[x] < sizes[x]:
                t = times[lists[x][pos[x]]]
                if best < 0 or t < best_t:
                    best = x
                    best_t = t
        out[k] = lists[best][pos[best]]
        pos[best] += 1
    return out


precompiled.attach(globals())  # the shipped cache of these kernels (simdist.precompiled)
