"""A program's steady state as a repeating body: what lets the compiled timeline jump over repetition.

A pipeline schedule's program (simdist.analytic.program) is a max-plus linear system: each step starts at the
latest of its stage's previous step, its stage's streams and its input, and ends a duration later. In the
schedule's steady state the same steps recur every cycle of micro-batches (one micro-batch in 1F1B and ZB-H1, a
group of K in interleaved 1F1B, Megatron-LM's order), so once the timeline's transient is over its state (every
stage's previous end, stream-free times, last backward, and the outputs still to be received) after one more body
of steps is the state before it shifted by one time (Baccelli et al. 1992, "Synchronization and Linearity", sec. 3.7:
the periodic regime of a max-plus system, whose cyclicity may be more than one body). From there, r bodies later
every time is r shifts later, exactly (a max-plus map commutes with adding a constant to all its inputs), so the
compiled loop (simdist.analytic.timeline_jit.run) adds r shifts instead of running r bodies.

The program's own order (a sweep that merges the stages as far as each can run) interleaves the stages differently
from one cycle to the next, so its steps do not recur at a fixed distance. Any order in which each step comes after
its stage's previous step and its upstream step gives every step the same start, bitwise: each step reads only its
stage's state and its upstream step's output. `steady_form` reorders the program by wave (one more than the later of
the stage's previous step's and the upstream step's waves; ties by stage), an order that does recur, and finds the
body: the first run of steps that repeats at the cycle's length to the end of the steady state.

This module is structure only (which steps repeat); the compiled loop checks the times (the shift equal for every
state entry a body writes, to `SHIFT_TOLERANCE`) before it jumps, and runs every step where they never settle.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from simdist.analytic.program import program
from simdist.plan.fastforward import group_of

__all__ = ["MIN_BODIES", "SHIFT_TOLERANCE", "SteadyForm", "steady_form"]

SHIFT_TOLERANCE = 1e-12
"""How far (relative to the largest time compared) the state entries' shifts over a body may differ for the loop to
jump. A max-plus map does not expand differences (the largest change of its outputs is at most the largest change
of its inputs), so r bodies jumped at a shift that is uncertain by this much are within r x this of every step
time; the closed form's bound against the step-by-step timeline is 1e-9 (tests/test_timeline_kernel.py)."""

MIN_BODIES = 4
"""A program has a steady form only if its body repeats at least this often: the loop needs one or two bodies to
find the shift (two where the cyclicity is two bodies) and the rest to gain from it."""


class SteadyForm:
    """A program in wave order with its repeating body.

    ``steps``: the program's (7, n) steps (`Program.steps`) in wave order, upstream and held-send indices
    renumbered; ``body``: (4,) int64: the body's first step, its length in steps, how many times it repeats back to
    back from there, and the farthest any step from the body's start on reads back (its index minus its upstream's).
    """

    __slots__ = ("body", "steps")

    def __init__(self, steps: np.ndarray, body: np.ndarray) -> None:
        self.steps = steps
        self.body = body


NO_BODY = np.array([-1, 0, 0, 0], dtype=np.int64)
"""The body argument of a loop that runs every step (simdist.analytic.timeline_jit.run)."""
NO_BODY.flags.writeable = False


def _cycle_steps(schedule: str, num_stages: int, steps_per_microbatch: int) -> tuple[int, ...]:
    """Candidate body lengths in steps: one cycle of micro-batches (`group_of`: 1, or K interleaved) and two."""
    g = group_of(schedule, num_stages)
    return (g * steps_per_microbatch, 2 * g * steps_per_microbatch)


@lru_cache(maxsize=512)
def steady_form(schedule: str, num_stages: int, num_microbatches: int, vpp: int) -> SteadyForm | None:
    """`program`(schedule, K, M, V) in wave order with its body, or None: a program with held sends (DualPipe(V):
    a step's output leaves with a later step), or whose body does not repeat `MIN_BODIES` times."""
    from simdist.analytic.timeline_jit import waves  # numba: loaded with the compiled timeline

    prog = program(schedule, num_stages, num_microbatches, vpp)
    steps = prog.steps
    n = steps.shape[1]
    if n == 0 or num_microbatches <= 0 or (steps[4] != 0).any():
        return None
    wave = waves(steps[0], steps[2], num_stages)
    order = np.lexsort((steps[0], wave))  # by wave, then stage: each stage's steps keep their order
    renumber = np.empty(n, dtype=np.int64)
    renumber[order] = np.arange(n, dtype=np.int64)
    ordered = steps[:, order]
    for row in (2, 5, 6):  # indices into the program: renumbered (-1 stays)
        col = ordered[row]
        ordered[row] = np.where(col >= 0, renumber[np.maximum(col, 0)], -1)
    # relative form: a step's upstream and held sends as distances back, so that recurring steps compare equal
    index = np.arange(n, dtype=np.int64)
    relative = ordered.copy()
    for row in (2, 5, 6):
        relative[row] = np.where(ordered[row] >= 0, index - ordered[row], -1)
    best = None
    for length in _cycle_steps(schedule, num_stages, n // num_microbatches):
        if length <= 0 or MIN_BODIES * length > n:
            continue
        same = (relative[:, length:] == relative[:, :-length]).all(axis=0)  # step i recurs at i + length
        edges = np.flatnonzero(np.diff(np.concatenate(([0], same.astype(np.int8), [0]))))
        if not len(edges):
            continue
        starts, ends = edges[0::2], edges[1::2]
        j = int(np.argmax(ends - starts))
        first, repeats = int(starts[j]), int((ends[j] - starts[j]) // length) + 1  # steps [a, b) recur: b - a + length
        if repeats >= MIN_BODIES and (best is None or repeats * length > best[1] * best[2]):
            best = (first, length, repeats)
    if best is None:
        return None
    first, length, repeats = best
    tail = relative[2, first:]
    lookback = int(tail.max()) if len(tail) else 0
    if lookback > first:  # the loop shifts the outputs read back across a body's start: they must exist
        return None
    ordered.flags.writeable = False
    body = np.array([first, length, repeats, max(lookback, 0)], dtype=np.int64)
    body.flags.writeable = False
    return SteadyForm(ordered, body)
