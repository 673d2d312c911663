"""The compiled loop of simdist.analytic.timeline_kernel (numba; imported on first use, so that a process that never
compiles a timeline never loads numba): the schedule's recurrence over a configuration's packed stages."""

from __future__ import annotations

import numpy as np
from numba import njit

from simdist import precompiled
from simdist.analytic.timeline_kernel import GENERIC, SIMPLE
from simdist.plan.accounting_kernel import account_stages
from simdist.plan.pieces import DP_DONE, LAST_BACKWARDS, PREV

__all__ = ["observe", "run", "timed"]

_DP = 4  # simdist.analytic.pricing.STREAMS: compute, tp, cp, ep, dp, pp
_PP = 5


@njit(cache=True)
def _pieces(r, recipe_ptr, recipe_needs, piece, dep_ptr, deps, free, prev_s, recv, last_bwd, tail, stage,
            intervals, count):  # pragma: no cover - compiled
    """Run recipe ``r``'s pieces one by one on the stream-free times ``free`` (advanced in place), appending their
    intervals; returns (the end piece's end, the new interval count). A step's pieces wait for the stage's previous
    step (PREV) and the input (the recipe's needs_input piece); a tail's for its stage's last backward
    (LAST_BACKWARDS) and the dp stream (DP_DONE)."""
    first = recipe_ptr[r]
    num = recipe_ptr[r + 1] - first
    ends = np.empty(num)
    for j in range(num):
        q = first + j
        sc = int(piece[q, 0])
        t = free[sc]
        for x in range(dep_ptr[q], dep_ptr[q + 1]):
            d = deps[x]
            if d >= 0:
                if ends[d] > t:
                    t = ends[d]
            elif not tail and d == PREV:
                if prev_s > t:
                    t = prev_s
            elif tail and d == LAST_BACKWARDS:
                if last_bwd > t:
                    t = last_bwd
            elif tail and d == DP_DONE and free[_DP] > t:
                t = free[_DP]
        if not tail and j == recipe_needs[r] and recv > t:
            t = recv
        e = t + piece[q, 1]
        free[sc] = e
        ends[j] = e
        count = _interval(intervals, count, t, e, piece[q, 2], piece[q, 3], stage)
    return ends, count


@njit(cache=True)
def _interval(intervals, count, start, end, category, work, stage):  # pragma: no cover - compiled
    """Write one interval (start, end, category, work, stage) at row ``count``; returns the next row."""
    intervals[count, 0] = start
    intervals[count, 1] = end
    intervals[count, 2] = category
    intervals[count, 3] = work
    intervals[count, 4] = stage
    return count + 1


@njit(cache=True)
def _entry(code_base, num_codes, u, code):  # pragma: no cover - compiled
    """Unit ``u``'s code entry of recipe code ``code`` in the arena (simdist.analytic.timeline_kernel.Packed); 0,
    the entry of no recipe, for a code the unit lacks."""
    return code_base[u] + code if code < num_codes[u] else 0


@njit(cache=True)
def _capacity(slot, code_base, num_codes, kind, recipe, ahead_ptr, behind_ptr, recipe_ptr, tail, counts
              ):  # pragma: no cover - compiled
    """Rows of intervals a program can write: every step's pieces run on their own (issued ahead, behind, or piece
    by piece) and the tails; ``counts`` (K, codes): the program's steps per stage and recipe code
    (simdist.analytic.program.Program.counts)."""
    total = 0
    for s in range(counts.shape[0]):
        u = slot[s]
        for code in range(counts.shape[1]):
            n = counts[s, code]
            if n == 0:
                continue
            g = _entry(code_base, num_codes, u, code)
            rows = ahead_ptr[g + 1] - ahead_ptr[g] + behind_ptr[g + 1] - behind_ptr[g]
            if kind[g] == GENERIC:
                r = recipe[g]
                rows += recipe_ptr[r + 1] - recipe_ptr[r]
            total += n * rows
    for s in range(slot.shape[0]):
        r = tail[slot[s]]
        total += recipe_ptr[r + 1] - recipe_ptr[r]
    return total


@njit(cache=True)
def _snapshot(row, prev, free, last_bwd, first_last, out, at, lookback):  # pragma: no cover - compiled
    """The timeline's state at program index ``at`` into ``row``: per stage its previous end, stream-free times,
    last backward and last simple end, then the outputs of the ``lookback`` steps before ``at``."""
    K = prev.shape[0]
    for s in range(K):
        row[s * 9] = prev[s]
        for k in range(6):
            row[s * 9 + 1 + k] = free[s, k]
        row[s * 9 + 7] = last_bwd[s]
        row[s * 9 + 8] = first_last[s, 1]
    for t in range(lookback):
        row[K * 9 + t] = out[at - lookback + t]


@njit(cache=True)
def _shift(newer, older, tolerance):  # pragma: no cover - compiled
    """The one time by which every state entry that moved between two snapshots moved (within ``tolerance`` of the
    largest time), or -1.0: none (an entry moved by another time, or nothing moved). An entry that did not move at
    all is one the body never writes (a stream it does not use)."""
    shift = 0.0
    scale = 0.0
    for x in range(newer.shape[0]):
        d = newer[x] - older[x]
        if d > shift:
            shift = d
        if abs(newer[x]) > scale:
            scale = abs(newer[x])
    if shift <= 0.0:
        return -1.0
    tol = tolerance * scale
    for x in range(newer.shape[0]):
        d = newer[x] - older[x]
        if d != 0.0 and abs(d - shift) > tol:
            return -1.0
    return shift


@njit(cache=True)
def _jump(newer, older, times, prev, free, last_bwd, first_last, out, at, to, lookback):  # pragma: no cover
    """Move the state from program index ``at`` to ``to``, ``times`` shifts later: every entry that moved between the
    snapshots ``older`` and ``newer`` (the state at ``at``) by that many of its moves; the outputs read back from
    ``to`` on are those before ``at``, shifted."""
    K = prev.shape[0]
    for s in range(K):
        b = s * 9
        prev[s] += times * (newer[b] - older[b])
        for k in range(6):
            free[s, k] += times * (newer[b + 1 + k] - older[b + 1 + k])
        last_bwd[s] += times * (newer[b + 7] - older[b + 7])
        first_last[s, 1] += times * (newer[b + 8] - older[b + 8])
    for t in range(lookback):
        x = K * 9 + t
        out[to - lookback + t] = newer[x] + times * (newer[x] - older[x])


@njit(cache=True)
def _boundary(snaps, snap_count, count, bodies, repeats, first, length, lookback, tolerance, prev, free, last_bwd,
              first_last, out, i, n, skipped):  # pragma: no cover - compiled
    """At the start of body ``bodies`` (program index ``i``): keep the state, and where the last body (or two)
    moved every entry it writes by one time and wrote no interval, jump over the remaining whole bodies. Returns
    (the index to go on from, bodies run, the next boundary: ``n`` once jumped or past the last, steps skipped)."""
    row = bodies % 3
    _snapshot(snaps[row], prev, free, last_bwd, first_last, out, i, lookback)
    snap_count[row] = count
    for q in range(1, 3):
        left = ((repeats - bodies) // q) * q
        if bodies < q or left <= 0 or snap_count[(bodies - q) % 3] != count:
            continue
        older = snaps[(bodies - q) % 3]
        if _shift(snaps[row], older, tolerance) > 0.0:
            to = i + left * length
            _jump(snaps[row], older, left // q, prev, free, last_bwd, first_last, out, i, to, lookback)
            return to, repeats, n, skipped + to - i
    if bodies < repeats:
        return i, bodies + 1, first + (bodies + 1) * length, skipped
    return i, bodies, n, skipped


@njit(cache=True)
def run(slot, code_base, num_codes, kind, recipe, duration, frees, plain, ahead_ptr, ahead, behind_ptr, behind,
        recipe_ptr, recipe_needs, recipe_end, piece, dep_ptr, deps, tail, sends, steps, counts, backward, record,
        spans, body, tolerance):  # pragma: no cover
    # The loop indexes free[s, k] rather than taking a row view per step: a view is a new array whose reference
    # count numba raises and drops (two atomic operations), which cost more than the rest of a simple step
    # (tests/test_timeline_kernel.py holds the results to the step-by-step timeline; benchmarks/search.py the time).
    # ``body`` (simdist.analytic.steady.SteadyForm.body: first step, length, repeats, lookback; first -1: none):
    # at each body's start the state is kept; once a body (or two: the steady state's cyclicity) moved every entry
    # it writes by one time, and wrote no interval, the remaining whole bodies are jumped (simdist.analytic.steady).
    K = slot.shape[0]
    n = steps.shape[1]
    capacity = _capacity(slot, code_base, num_codes, kind, recipe, ahead_ptr, behind_ptr, recipe_ptr, tail, counts)
    free = np.zeros((K, 6))
    prev = np.full(K, -1.0)
    last_bwd = np.zeros(K)
    first_last = np.full((K, 2), -1.0)
    out = np.zeros(n)
    intervals = np.empty((capacity, 5))
    # Counters and flags handed to the helpers start as np.int64 / np.bool_, never bare literals: numba compiles a
    # helper anew for each literal it is first called with (Literal[int](0), Literal[bool](False), ...), and a cold
    # cache then compiles each helper's tree two or three times
    count = np.int64(0)
    span = np.empty((n if spans else 0, 3))
    num_spans = 0
    starts = np.empty(n if record else 0)
    first, length, repeats, lookback = body[0], body[1], body[2], body[3]
    jumping = first >= 0 and not record and not spans
    snaps = np.empty((3 if jumping else 0, K * 9 + lookback))
    snap_count = np.zeros(3, dtype=np.int64)
    bodies = np.int64(0)  # whole bodies run before the next boundary
    skipped = np.int64(0)
    boundary = first if jumping else n
    # the plain steps (a simple recipe with no dp piece ahead or behind: the arena's ``plain``, where neither starts
    # nor spans are kept) take the short path below: the general one's arithmetic without its branches (99.98 % of a
    # search's steps)
    short = not record and not spans
    i = np.int64(0)
    while i < n:
        if i == boundary:
            i, bodies, boundary, skipped = _boundary(snaps, snap_count, count, bodies, repeats, first, length,
                                                     lookback, tolerance, prev, free, last_bwd, first_last, out, i,
                                                     n, skipped)
            if i == n:
                break
        s = steps[0, i]
        code = steps[1, i]
        up = steps[2, i]
        t0 = prev[s]
        if free[s, 0] > t0:
            t0 = free[s, 0]
        recv = out[up] if up >= 0 else 0.0
        if up >= 0 and recv > t0:
            t0 = recv
        g = _entry(code_base, num_codes, slot[s], code)
        if short and plain[g] and steps[4, i] == 0 and steps[5, i] < 0:  # the general path's, nothing skipped
            end = t0 + duration[g]
            if first_last[s, 0] < 0:
                first_last[s, 0] = t0
            first_last[s, 1] = end
            for k2 in range(4):
                fr = frees[g, k2]
                if fr >= 0:
                    free[s, k2] = t0 + fr
            prev[s] = end
            if backward[code] and end > last_bwd[s]:
                last_bwd[s] = end
            if steps[3, i] >= 0:
                t = free[s, _PP] if free[s, _PP] > end else end
                free[s, _PP] = t + sends[s, code >> 1]
                out[i] = free[s, _PP]
            else:
                out[i] = end
            i += 1
            continue
        if kind[g] == GENERIC:  # piece by piece
            if record:
                starts[i] = t0
            r = recipe[g]
            ends, count = _pieces(r, recipe_ptr, recipe_needs, piece, dep_ptr, deps, free[s], prev[s], recv, 0.0,
                                  np.bool_(False), s, intervals, count)
            end = ends[recipe_end[r]]
        else:
            a0, a1 = ahead_ptr[g], ahead_ptr[g + 1]
            if a1 > a0:  # the gathers issued ahead queue on the dp stream; the step waits for them
                for x in range(a0, a1):
                    t = free[s, _DP]
                    free[s, _DP] = t + ahead[x, 0]
                    count = _interval(intervals, count, t, free[s, _DP], ahead[x, 1], ahead[x, 2], s)
                if free[s, _DP] > t0:
                    t0 = free[s, _DP]
            if first_last[s, 0] < 0:
                first_last[s, 0] = t0
            if record:
                starts[i] = t0
            end = t0 + duration[g]
            first_last[s, 1] = end
            if spans:
                span[num_spans, 0] = t0
                span[num_spans, 1] = end
                span[num_spans, 2] = s
                num_spans += 1
            for k2 in range(4):
                if frees[g, k2] >= 0:
                    free[s, k2] = t0 + frees[g, k2]
            for x in range(behind_ptr[g], behind_ptr[g + 1]):
                t = t0 + behind[x, 0]
                if free[s, _DP] > t:
                    t = free[s, _DP]
                free[s, _DP] = t + behind[x, 1]
                count = _interval(intervals, count, t, free[s, _DP], behind[x, 2], behind[x, 3], s)
        prev[s] = end
        if backward[code] and end > last_bwd[s]:
            last_bwd[s] = end
        # the sends this step's end makes: its own (unless DualPipe holds it for a later step), then the held ones
        j = i if steps[4, i] == 0 else steps[5, i]
        while j >= 0:
            if steps[3, j] >= 0:
                t = free[s, _PP] if free[s, _PP] > end else end
                free[s, _PP] = t + sends[s, steps[1, j] >> 1]
                out[j] = free[s, _PP]
            else:
                out[j] = end
            j = steps[5, i] if j == i else steps[6, j]
        i += 1
    step = 0.0
    for s in range(K):
        if s == 0 or prev[s] > step:
            step = prev[s]
    for s in range(K):
        ends, count = _pieces(tail[slot[s]], recipe_ptr, recipe_needs, piece, dep_ptr, deps, free[s], -1.0, 0.0,
                              last_bwd[s], np.bool_(True), s, intervals, count)
        for k2 in range(6):
            if free[s, k2] > step:
                step = free[s, k2]
    return step, intervals[:count], first_last, span[:num_spans], starts, n - skipped


@njit(cache=True)
def observe(intervals, step_s, used, first_last, spans, covered, slot, code_base, num_codes, kind, duration, parts,
            simple_flops, recipe, recipe_flops, tail):  # pragma: no cover - compiled
    """The additive quantities of a timeline `run` timed: (phase start, phase end, seconds per category + bubble +
    idle averaged over the stages, model and hardware FLOPs summed over them). A stage's simple steps are blocks
    charged their parts as they are (``used``, the program's steps per stage and recipe code: Program.counts, x
    each recipe's parts and FLOPs); the sweep of simdist.plan.accounting_kernel charges the rest; the piece-by-piece
    recipes and the tails add their FLOPs."""
    K = slot.shape[0]
    C = used.shape[1]
    totals = np.zeros(K)
    for s in range(K):
        u = slot[s]
        for c in range(C):
            g = _entry(code_base, num_codes, u, c)
            if kind[g] == SIMPLE:
                totals[s] += used[s, c] * duration[g]
    lo, hi, seconds = account_stages(intervals, K, step_s, first_last, totals, spans, covered)
    flops = np.zeros(2)
    for s in range(K):
        u = slot[s]
        for c in range(C):
            n = used[s, c]
            g = _entry(code_base, num_codes, u, c)
            if kind[g] == SIMPLE:
                for j in range(parts.shape[1]):
                    seconds[s, j] += n * parts[g, j]
                flops[0] += n * simple_flops[g, 0]
                flops[1] += n * simple_flops[g, 1]
            elif kind[g] == GENERIC:
                r = recipe[g]
                flops[0] += n * recipe_flops[r, 0]
                flops[1] += n * recipe_flops[r, 1]
        r = tail[u]
        flops[0] += recipe_flops[r, 0]
        flops[1] += recipe_flops[r, 1]
    mean = np.zeros(seconds.shape[1])
    if K:
        for s in range(K):
            for j in range(seconds.shape[1]):
                mean[j] += seconds[s, j]
        mean /= K
    return lo, hi, mean, flops


@njit(cache=True)
def timed(slot, code_base, num_codes, kind, recipe, duration, frees, plain, ahead_ptr, ahead, behind_ptr, behind,
          recipe_ptr, recipe_needs, recipe_end, piece, dep_ptr, deps, tail, recipe_flops, simple_flops, parts, sends,
          steps, counts, backward, spans, body, tolerance):  # pragma: no cover - compiled
    """`run` (no starts recorded) then `observe` of what it timed, in one call: (step end, phase start, phase
    end, seconds per category + bubble + idle averaged over the stages, FLOPs), what a search's closed form reads
    of a configuration, without handing the intervals back and forth."""
    step, intervals, first_last, span, _, _ = run(slot, code_base, num_codes, kind, recipe, duration, frees, plain,
                                                  ahead_ptr, ahead, behind_ptr, behind, recipe_ptr, recipe_needs,
                                                  recipe_end, piece, dep_ptr, deps, tail, sends, steps, counts,
                                                  backward, np.bool_(False), spans, body, tolerance)
    lo, hi, mean, flops = observe(intervals, step, counts, first_last, span, spans, slot, code_base, num_codes,
                                  kind, duration, parts, simple_flops, recipe, recipe_flops, tail)
    return step, lo, hi, mean, flops


precompiled.attach(globals())  # the shipped cache of these kernels (simdist.precompiled)
