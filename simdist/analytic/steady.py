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
body: the longest run of steps that repeats at one or two cycles' length.

This module is structure only (which steps repeat); the compiled loop checks the times (the shift equal for every
state entry a body writes, to `SHIFT_TOLERANCE`) before it jumps, and runs every step where they never settle.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from simdist.analytic.program import program
from simdist.plan.fastforward import group_of

__all__ = ["MIN_BODIES", "NO_BODY", "SHIFT_TOLERANCE", "SteadyForm", "steady_form"]

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

    ``steps``: the program's (7, n) steps (`Program.steps`) in wave order, upstream indices renumbered (a program
    with held sends has no steady form); ``body``: (4,) int64: the body's first step, its length in steps, how many
    times it repeats back to back from there, and the farthest any step from the body's start on reads back (its
    index minus its upstream's).
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
def steady_form(schedule: str, num_stages: int, num_microbatches: int, vpp: int, alone: bool = False
                ) -> SteadyForm | None:
    """`program`(schedule, K, M, V, alone) in wave order with its body, or None: a program with held sends
    (DualPipe(V): a step's output leaves with a later step), or whose body does not repeat `MIN_BODIES` times."""
    from simdist.analytic.steady_jit import steady_order  # numba: loaded with the compiled timeline

    steps = program(schedule, num_stages, num_microbatches, vpp, alone).steps
    n = steps.shape[1]
    if n == 0 or num_microbatches <= 0 or steps[4].any():
        return None
    lengths = np.array(_cycle_steps(schedule, num_stages, n // num_microbatches), dtype=np.int64)
    ordered, body = steady_order(steps, num_stages, lengths, MIN_BODIES)
    if body[0] < 0:
        return None
    ordered.flags.writeable = body.flags.writeable = False
    return SteadyForm(ordered, body)
