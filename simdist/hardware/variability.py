"""GPU-to-GPU speed variability, and the straggling it causes at scale: a synchronous step runs at the pace of the
slowest of the job's GPUs.

GPUs of one model (SKU) do not all sustain the same throughput: manufacturing variation leaves each chip its own
voltage-frequency curve, and power management turns it into a clock of its own under load. Sinha et al. 2022, "Not
All GPUs Are Created Equal: Characterizing Variability in Large-Scale, Accelerator-Rich Systems" (SC22,
arXiv:2208.11035v3), ran the same applications (SGEMM among them) on over 90 % of the GPUs of Summit, Vortex,
Frontera, Longhorn and Corona (NVIDIA and AMD GPUs, air and liquid cooled): on average 8 % (at most 22 %) performance
variation between GPUs of the same SKU on the same application, and outliers up to 1.5x slower than the median GPU.
These are kernel and benchmark measurements on one GPU at a time, not training runs. (The figures are v3's, over five
clusters; the SC22 proceedings' abstract, over four of them, states 32 % on average and at most 72 %.)

A synchronous training step waits for the slowest GPU: the tensor-parallel collectives of every layer, the
pipeline's sends and the data-parallel gradient reduction of every step make each rank wait for the others, so the
step's compute runs at the pace of the slowest of the job's N GPUs. With each GPU's time for the same work spread
normally with coefficient of variation ``cv`` around the median GPU's, the slowest of N takes

    1 + cv x z(N),    z(N) = E[max of N standard normals] ~ Phi^-1((N - 0.375) / (N + 0.25))

as long as the median GPU, z(N) by Blom's approximation of the expected normal order statistics (G. Blom 1958,
"Statistical Estimates and Transformed Beta-Variables", Wiley: alpha = 0.375; Royston 1982, "Algorithm AS
177: Expected Normal Order Statistics (Exact and Approximate)", Applied Statistics 31(2):161-165, which uses it as
the approximate form). z(1) = 0; z(2) = Phi^-1(1.625 / 2.25) = 0.589 (exact 1 / sqrt(pi) = 0.564); z(8) = 1.434
(exact 1.424); z(16,384) = 3.956.

simdist's compute constants (simdist.hardware.compute) describe a typical GPU, except where they were fitted on
runs of several GPUs that synchronize: the A100's reproduce Korthikanti et al. 2022's Table 4 layer times, measured
under TP 8 on one DGX A100, which already hold the slowest of 8 (``reference_gpus`` in compute_efficiency.csv). A
job of N GPUs therefore computes `variability_factor` = (1 + cv z(N)) / (1 + cv z(N_ref)) times as long as the
constants say, N_ref the constants' reference group (1 by default). Both fidelities apply it as one float per step
configuration (simdist.plan.step_config.StepConfig.paced_variability, with a pipeline's stage pace below) to every
compute piece of the step: no per-rank draw.

# Assumption: each GPU's time for the same work is normal around the median GPU's with coefficient of variation cv
# (a sustained throughput spread by cv gives times spread by cv to first order: 1 / (1 - cv z) ~ 1 + cv z), and the
# slowest GPU of the job is the expected maximum of N draws (a job's GPUs are a random draw from the cluster's).
# Heavy-tailed outliers (Sinha's 1.5x) are not normal: give them as faults.stragglers.
# Assumption: the slowest GPU is slower by the same factor in every kernel, compute-bound and memory-bound alike
# (its lower clock slows GEMMs and attention; element-wise kernels, whose HBM does not follow the SM clock, are
# taken as slowed too, as are the launch gaps and host-bound stretches inside a compute piece): the pieces a
# straggler slows (simdist.plan.pieces.SLOWED_KINDS), all by one factor.
# Assumption: every rank waits for the slowest once per step and the step is paced by it throughout (the
# tensor-parallel group meets every layer; the pipeline's stages and the data-parallel replicas meet at the
# gradient reduction); per-layer jitter around each GPU's own pace, which would cost more, is not modelled.

A pipeline of unequal stages is paced by its slowest stage, not by its slowest GPU: a 1F1B or interleaved schedule's
steady state runs at the pace of the stage with the most compute per micro-batch, so a slow GPU in a lighter stage
(the first, without the output layer) waits for the heavy one instead of delaying it. With stage s's compute per
micro-batch w_s, r_s = w_s / max w, and the n GPUs of each stage (its tensor, context and data-parallel peers: every
replica's copy of the stage, which meet at the gradient reduction) each spread by cv, the pace is

    E[max_s r_s (1 + cv M_s)],    M_s the largest of n standard normals, P(M_s <= m) = Phi(m)^n,

integrated numerically (`pace_ratio`: E[Y] = y0 + integral from y0 of (1 - P(Y <= y)) dy, P(Y <= y) the product over
the stages of Phi((y / r_s - 1) / cv)^n). Equal stages give the slowest of all pp n GPUs; `pace_ratio` is the
unequal pipeline's pace over that, 1 for equal stages, so the factor stays `variability_factor`'s there. A
straggler injected in a light stage shows the mechanism on the engine's own schedule (tests/test_gpu_variability.py).
# Assumption: the whole step scales with the steady state's pace (the fill and drain, paced stage by stage, are
# charged the same factor); the stage loads are their compute's seconds per micro-batch at the model's constants
# (forward, backward and recompute of every chunk: simdist.plan.stage_pace), communication left out.
# Assumption: Sinha et al.'s "performance variation" of a cluster is read as the spread between its fastest and
# slowest GPUs other than outliers, taken as 4 standard deviations (the central 95 % of a normal): 8 % -> cv 0.02,
# 22 % -> cv 0.055 (the SC22 abstract's 32 % and 72 %: cv 0.08 and 0.18). (Box-plot whiskers at 1.5 x the
# interquartile range would span 5.4 standard deviations: cv 0.015 and 0.04.)
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist
from typing import Any

import numpy as np

from simdist.hardware.compute import reference_gpus
from simdist.spec.gpu import GpuSpec

__all__ = ["BLOM_ALPHA", "expected_max_normal", "gpu_variability", "pace_ratio", "slowest_factor",
           "variability_factor", "variability_report"]

BLOM_ALPHA = 0.375
"""Blom's plotting-position constant: E[i-th of n standard normals] ~ Phi^-1((i - alpha) / (n - 2 alpha + 1))
(Blom 1958; Royston 1982, AS 177)."""

_NORMAL = NormalDist()


@lru_cache(maxsize=1024)
def expected_max_normal(n: int) -> float:
    """Blom's approximation of the expected largest of ``n`` independent standard normals (0 for n = 1)."""
    if n < 1:
        raise ValueError(f"the slowest of {n} GPUs: n must be at least 1")
    return _NORMAL.inv_cdf((n - BLOM_ALPHA) / (n - 2.0 * BLOM_ALPHA + 1.0))


def slowest_factor(cv: float, n: int) -> float:
    """Time of the slowest of ``n`` GPUs / the median GPU's, per-GPU times spread with coefficient of variation
    ``cv``: 1 + cv z(n)."""
    return 1.0 + cv * expected_max_normal(n)


def variability_factor(cv: float, n: int, n_ref: int = 1) -> float:
    """Time factor of a job of ``n`` GPUs' compute against constants measured on the slowest of ``n_ref`` GPUs:
    (1 + cv z(n)) / (1 + cv z(n_ref)); exactly 1 with ``cv`` 0."""
    if cv == 0.0:
        return 1.0
    return slowest_factor(cv, n) / slowest_factor(cv, n_ref)


def gpu_variability(gpu: GpuSpec, cv: float, num_gpus: int) -> float:
    """`variability_factor` of a job of ``num_gpus`` GPUs of ``gpu`` against its compute constants
    (their reference group: simdist.hardware.compute.reference_gpus)."""
    return variability_factor(cv, num_gpus, reference_gpus(gpu)) if cv else 1.0


_GRID_POINTS = 321
"""Points of `pace_ratio`'s integration grid over t = (y - 1) / cv: 8 standard deviations below the heaviest stage's
median to 8 above the slowest of all the GPUs, steps of about 0.05 (trapezoid: within 1e-5 of a Monte Carlo of a
million draws on the pace, tests/test_gpu_variability.py)."""


@lru_cache(maxsize=1)
def _log_phi_table() -> tuple[np.ndarray, np.ndarray]:
    """log Phi(x) on x in [-12, 9] every 0.005 (math.erfc, exact to double precision), read by linear interpolation
    (error below 4e-6); beyond its ends the end values: Phi(-12)^n < e^-76 is 0 and Phi(9) 1 to double precision."""
    x = np.linspace(-12.0, 9.0, 4_201)
    return x, np.array([math.log(0.5 * math.erfc(-v / math.sqrt(2.0))) for v in x])


@lru_cache(maxsize=1024)
def _grid(t_hi: float) -> np.ndarray:
    return np.linspace(-8.0, t_hi, _GRID_POINTS)


def _expected_max(cv: float, shares: tuple[tuple[float, int], ...], n: int, t_hi: float) -> float:
    """E[max over stages of r (1 + cv M)], M the largest of ``n`` standard normals, for ``shares``: (r, number of
    stages at r). A stage that stays below the grid's lowest value even at 9 standard deviations (Phi = 1 to double
    precision) is left out of the product."""
    x_tab, log_tab = _log_phi_table()
    t = _grid(t_hi)
    r = np.array([share[0] for share in shares])
    weight = np.array([share[1] * n for share in shares], dtype=float)
    y = 1.0 + cv * t
    keep = (y[0] / r - 1.0) / cv < x_tab[-1]
    x = (y[None, :] / r[keep, None] - 1.0) / cv  # np.interp holds the table's end values beyond its ends
    log_cdf = weight[keep] @ np.interp(x.ravel(), x_tab, log_tab).reshape(x.shape)
    tail = 1.0 - np.exp(log_cdf)
    dt = t[1] - t[0]
    return 1.0 + cv * (t[0] + dt * (float(tail.sum()) - 0.5 * float(tail[0] + tail[-1])))


@lru_cache(maxsize=1024)
def _equal_stages(cv: float, stages: int, n: int) -> tuple[float, float]:
    """(the grid's top t, E[max of stages x n GPUs' 1 + cv M]) of as many equal stages."""
    t_hi = expected_max_normal(stages * n) + 8.0
    return t_hi, _expected_max(cv, ((1.0, stages),), n, t_hi)


@lru_cache(maxsize=4096)
def _pace_ratio(cv: float, shares: tuple[tuple[float, int], ...], n: int, stages: int) -> float:
    t_hi, equal = _equal_stages(cv, stages, n)
    return _expected_max(cv, shares, n, t_hi) / equal


def pace_ratio(cv: float, loads: tuple[float, ...], gpus_per_stage: int) -> float:
    """The pace of a pipeline whose stages take ``loads`` (compute seconds per micro-batch), each on
    ``gpus_per_stage`` GPUs spread by ``cv``, over the pace of as many equal stages: E[max_s r_s (1 + cv M_s)] /
    E[max_s (1 + cv M_s)] (the module docstring). 1 for equal stages or identical GPUs; at most 1."""
    top = max(loads)
    if cv == 0.0 or top <= 0.0 or min(loads) == top:
        return 1.0
    shares: dict[float, int] = {}
    for w in loads:
        # alike stages (a deep pipeline's middle) share one factor of the product; loads to 1e-4 of the heaviest (the
        # pace moves by less than cv x 1e-4), so that layouts of one depth find the pace already integrated
        r = round(w / top, 4)
        if r > 0.0:  # a stage of (next to) no compute never sets the pace: its factor of the product is 1
            shares[r] = shares.get(r, 0) + 1
    return min(1.0, _pace_ratio(cv, tuple(sorted(shares.items())), gpus_per_stage, len(loads)))


def variability_report(gpu: GpuSpec, cv: float, num_gpus: int, pace: float = 1.0) -> dict[str, Any] | None:
    """What a run reports of the spread (the run JSON's ``gpu_variability``), None for identical GPUs (cv 0);
    ``pace``: `pace_ratio` of the step's pipeline (1 without one, or with equal stages)."""
    if not cv:
        return None
    ref = reference_gpus(gpu)
    return {"factor": variability_factor(cv, num_gpus, ref) * pace, "gpu_speed_cv": cv, "num_gpus": num_gpus,
            "reference_gpus": ref, "slowest_of_job": slowest_factor(cv, num_gpus),
            "slowest_of_reference": slowest_factor(cv, ref), "stage_pace": pace}
