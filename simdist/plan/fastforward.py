"""Fast-forwarding a pipeline's repeating steady state: cost that grows with distinct work, not with repetition.

A training step's micro-batches cost the same, so once a schedule's warm-up is over its timeline repeats: every
``period`` micro-batches (1 for GPipe, 1F1B and ZB-H1; the stage count K for interleaved 1F1B, which runs
micro-batches in groups of K) every op of the steady state happens again, shifted by the same time, and the
cool-down that follows is the same whatever came before. A step of M micro-batches then equals a step of M1
micro-batches with (M - M1) / period periods inserted, and every additive quantity of it (step time, pipeline
phase, seconds per breakdown category, FLOPs, bytes, collective counts) is affine in M:
x(M) = x(M1) + (M - M1) / period * (x(M1 + period) - x(M1)).

`sample_counts` picks M1, M1 + period, M1 + 2 period (or None: simulate every micro-batch, when that is not much
dearer); a caller simulates those, and `extrapolate` checks that the three are collinear in every quantity
(within 1e-9 of the step time: the steady state was reached, with or without contention) before extending them
to M. When they are not, the caller doubles M1 (`next_counts`) or simulates every micro-batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["extrapolate", "next_counts", "period_of", "sample_counts"]

REL_TOLERANCE = 1e-9
"""Collinearity tolerance, relative to the largest step time sampled."""


def period_of(schedule: str, num_stages: int) -> int:
    """Micro-batches after which a schedule's steady state repeats (interleaved: groups of K, Megatron-LM)."""
    return num_stages if schedule == "interleaved_1f1b" else 1


def sample_counts(schedule: str, num_stages: int, num_microbatches: int, *, first: int | None = None,
                  saving: float = 1.25) -> tuple[int, int, int] | None:
    """(M1, M1 + p, M1 + 2p) to simulate instead of M, or None when simulating M costs less than ``saving`` x the
    samples. M1 defaults to just past every stage's warm-up: K + 2 for GPipe, 1F1B and ZB-H1 (stage s warms up
    with K - s - 1 forwards), 2K interleaved (2(K - s - 1) + (V - 1)K chunk-forwards, under 2K micro-batches)."""
    p = period_of(schedule, num_stages)
    m1 = first if first is not None else (2 * num_stages if p > 1 else num_stages + 2)
    m1 = p * math.ceil(m1 / p)
    counts = (m1, m1 + p, m1 + 2 * p)
    if num_microbatches < counts[-1] or saving * sum(counts) > num_microbatches:
        return None
    if (num_microbatches - m1) % p:
        return None
    return counts


def next_counts(schedule: str, num_stages: int, num_microbatches: int, counts: tuple[int, int, int]
                ) -> tuple[int, int, int] | None:
    """The next try after ``counts`` failed to be collinear: M1 doubled (None once that stops paying off)."""
    return sample_counts(schedule, num_stages, num_microbatches, first=2 * counts[0])


def extrapolate(samples: list[tuple[int, Mapping[str, float]]], num_microbatches: int,
                scale_key: str = "step_s") -> dict[str, float] | None:
    """Every quantity at ``num_microbatches`` from three equally spaced samples, or None if they are not
    collinear (within REL_TOLERANCE of the largest ``scale_key``) in some quantity."""
    (m1, a), (m2, b), (m3, c) = samples
    step = m2 - m1
    if step <= 0 or m3 - m2 != step:
        raise ValueError("extrapolate: samples must be equally spaced and increasing")
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
