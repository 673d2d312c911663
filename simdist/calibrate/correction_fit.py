"""Fit one collective's correction of simdist's prediction to measured times, regularised (`fit_correction`).

The correction (simdist.calibrate.calibration.Correction) is, inside the measured sizes,

    t = L + t_model / (f x e(S)),     e(S) in (0, 1], linear in log2 S between knots,

and above the largest measured size t = L + t_model / F (the physical model: `above_range_factor`). Each
parameter is fitted only from the points that identify it:

- **L >= 0**, the per-call latency the model misses (host launch, proxy threads, a slower kernel start): the
  lower quartile of t - t_model over the points where the model is latency-bound (its bytes under `LATENCY_SHARE` of
  its time: share = beta S / t_model, simdist.calibrate.points.predict_details); 0 where the sweep has none.
  One per measured rank count (``latency_by_ranks``): the per-call cost of a group grows with its size where
  the ranks are processes sharing cores (gloo on a CPU host: 0.3 ms on 2 ranks, 4-8 ms on 4 ranks of this
  project's 2-core machine), and one latency for all would fit neither; other rank counts take the median over
  all of the op's latency-bound points. Latency-bound points say nothing about bandwidth: their knots keep
  r = 1 (the model's own latency terms, plus L).
- **r(S) = t_model / (t - L)**, the model-relative rate, at k = min(MAX_KNOTS, sizes // POINTS_PER_KNOT)
  knots (at least 1: then one constant factor), each the median over a run of consecutive sizes with an equal
  share of them: at least two sizes behind every knot, never one knot per point.
- **Physics bounds it** through the achieved fraction of the plateau rate, g = share x r = beta S / (t - L):
  a collective never moves bytes faster than its plateau, g <= F ("efficiency <= 1"); and on GPU
  interconnects (NVLink, PCIe, network) g never falls with size, since larger messages amortise a pipeline's
  fill and per-chunk costs and NCCL's tuner takes the fastest of per-algorithm times that each grow with size;
  so g is fitted isotonic there (pool adjacent violators, Barlow et al. 1972, "Statistical Inference under
  Order Restrictions", ch. 1). On a CPU host it may fall (buffers leave the caches: gloo's busbw peaks near
  1 MiB on this project's machine), so it is not forced monotone there.
- **F, the plateau factor**, is measured only where the model is bandwidth-bound (share >= PLATEAU_SHARE):
  the median r there. A sweep that stops before its plateau cannot know it, so F is then 1: the physical
  model's bandwidth, which is what predicts sizes above the sweep.
- f = the largest knot value of r, e = r / f <= 1. Below the smallest size the first knot's value holds
  (latency dominates there); above the largest, t = L + t_model / F.

Confidence intervals: percentiles of a seeded bootstrap over points of (L, f) (Efron & Tibshirani 1993,
ch. 13), each resample fitted the same way: finite by construction (L a quantile of differences, f a median
of ratios).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simdist.calibrate.points import PLATEAU_SHARE

__all__ = ["LATENCY_QUANTILE", "LATENCY_SHARE", "MAX_KNOTS", "MIN_SIZES", "POINTS_PER_KNOT", "CorrectionFit",
           "fit_correction", "isotonic"]

MAX_KNOTS = 8
# At least two sizes behind every knot, never one knot per point (which interpolates every point and predicts
# nothing); 2 held out better than 3 on the bundled sweeps (docs/validation-history.md).
POINTS_PER_KNOT = 2
MIN_SIZES = 4  # fewer distinct sizes than this cannot tell a latency from a bandwidth and a knee: warn
LATENCY_SHARE = 0.1  # the model's bytes under 10 % of its time: the point measures latency
LATENCY_QUANTILE = 25.0
_BANDWIDTH_PART = 0.1  # a point whose time is over 90 % latency says nothing about bandwidth
_RESAMPLES = 200


@dataclass(frozen=True, slots=True)
class CorrectionFit:
    """The fitted parameters (module doc), their bootstrap intervals and how many plateau points set F."""

    latency_s: float
    bandwidth_factor: float
    knot_sizes: tuple[float, ...]
    knot_values: tuple[float, ...]
    above_range_factor: float
    size_range: tuple[float, float]
    latency_ci: tuple[float, float]
    bandwidth_factor_ci: tuple[float, float]
    plateau_points: int
    latency_by_ranks: dict[int, float]


def isotonic(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Non-decreasing least-squares fit of ``values`` (pool adjacent violators, weighted)."""
    blocks: list[list[float]] = []  # [weighted mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([float(v), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            b = blocks.pop()
            a = blocks[-1]
            total = a[1] + b[1]
            a[0] = (a[0] * a[1] + b[0] * b[1]) / total if total > 0 else 0.5 * (a[0] + b[0])
            a[1], a[2] = total, a[2] + b[2]
    return np.array([b[0] for b in blocks for _ in range(int(b[2]))], dtype=float)


def _bins(log_sizes: np.ndarray) -> list[np.ndarray]:
    """Runs of consecutive distinct sizes, as equal in number as possible: one per POINTS_PER_KNOT sizes, at least
    one, at most MAX_KNOTS (none for no sizes)."""
    distinct = np.unique(log_sizes)
    if not len(distinct):
        return []
    k = max(1, min(MAX_KNOTS, len(distinct) // POINTS_PER_KNOT))
    return list(np.array_split(distinct, k))


@dataclass(frozen=True, slots=True)
class _Fit:
    latency_s: float
    latency_by_ranks: dict[int, float]
    knots_log2: tuple[float, ...]
    rates: tuple[float, ...]
    plateau: float
    plateau_points: int


def _latency(x: np.ndarray, y: np.ndarray, bound: np.ndarray) -> float:
    # Assumption: interference on a shared host only ever adds time (a stalled rank, a descheduled proxy), so the
    # lower quartile of t - t_model over the latency-bound points, not their mean, estimates the latency.
    return max(0.0, float(np.percentile(y[bound] - x[bound], LATENCY_QUANTILE))) if bound.any() else 0.0


def _fit(x: np.ndarray, y: np.ndarray, share: np.ndarray, logs: np.ndarray, ranks: np.ndarray,
         monotone: bool) -> _Fit:
    """L per rank count, the knots of r and F for one set of points (module doc)."""
    bound = share < LATENCY_SHARE
    latency = _latency(x, y, bound)
    by_ranks = {int(n): _latency(x, y, bound & (ranks == n)) for n in np.unique(ranks[bound])}
    each = np.array([by_ranks.get(int(n), latency) for n in ranks])
    each = np.minimum(each, 0.98 * y)
    bw_part = y - each
    usable = (bw_part > _BANDWIDTH_PART * y) & ~bound
    r = np.where(usable, x / np.maximum(bw_part, 1e-300), np.nan)
    plateau_mask = usable & (share >= PLATEAU_SHARE)
    plateau = float(np.median(r[plateau_mask])) if plateau_mask.any() else 1.0
    # A size is latency-bound when most of its points are: those sizes get one knot at r = 1 (the model's own
    # latency terms, plus L); the others are cut into runs, one knot each.
    sizes = np.unique(logs)
    size_bound = np.array([np.median(share[logs == v]) < LATENCY_SHARE for v in sizes])
    runs = ([sizes[size_bound]] if size_bound.any() else []) + _bins(sizes[~size_bound])
    knots, values, weights, shares = [], [], [], []
    for run in runs:
        inside = np.isin(logs, run)
        good = inside & usable
        knots.append(float(np.median(logs[inside])))
        if run is not runs[0] or not size_bound.any():
            values.append(float(np.median(r[good])) if good.any() else math.nan)
        else:
            values.append(1.0)
        weights.append(float(good.sum()))
        shares.append(max(float(np.median(share[inside])), 1e-6))
    order = np.argsort(knots, kind="stable")
    knots_a = np.array(knots)[order]
    rates = np.array(values)[order]
    sh = np.array(shares)[order]
    w = np.array(weights)[order]
    if np.isnan(rates).all():
        rates[:] = 1.0
    else:  # a run of points with no bandwidth to read takes its nearest neighbour's rate
        idx = np.where(~np.isnan(rates))[0]
        rates = np.array([rates[idx[np.argmin(np.abs(idx - i))]] for i in range(len(rates))])
    g = rates * sh
    if monotone and len(g) > 1:
        g = isotonic(g, np.maximum(w, 0.5))
    g = np.clip(g, 1e-6, max(plateau, float(np.max(sh))))  # never faster than the plateau
    rates = g / sh
    return _Fit(latency, by_ranks, tuple(float(k) for k in knots_a), tuple(float(v) for v in rates), plateau,
                int(plateau_mask.sum()))


def fit_correction(sizes: Sequence[float], model_s: Sequence[float], measured_s: Sequence[float],
                   share: Sequence[float], ranks: Sequence[int], *, monotone: bool, seed: int = 0,
                   resamples: int = _RESAMPLES) -> CorrectionFit:
    """Fit L (per rank count), f, e(S) and the plateau factor F to one op's points (module doc)."""
    s, x, y, w = (np.asarray(v, dtype=float) for v in (sizes, model_s, measured_s, share))
    n_ranks = np.asarray(ranks, dtype=int)
    logs = np.log2(s)
    best = _fit(x, y, w, logs, n_ranks, monotone)
    f = max(best.rates)
    values = tuple(max(1e-4, round(v / f, 4)) for v in best.rates) if len(best.rates) > 1 else ()
    rng = np.random.default_rng(seed)
    boot_l, boot_f = [], []
    n = len(s)
    if n >= 3:
        for _ in range(resamples):
            idx = rng.integers(0, n, size=n)
            if len(np.unique(s[idx])) < 2:
                continue
            c = _fit(x[idx], y[idx], w[idx], logs[idx], n_ranks[idx], monotone)
            boot_l.append(c.latency_s)
            boot_f.append(max(c.rates))

    def interval(values_: list[float], point: float) -> tuple[float, float]:
        if not values_:
            return point, point
        lo, hi = float(np.percentile(values_, 2.5)), float(np.percentile(values_, 97.5))
        return min(lo, point), max(hi, point)

    by_ranks = best.latency_by_ranks if len(best.latency_by_ranks) > 1 else {}
    return CorrectionFit(
        latency_s=best.latency_s, bandwidth_factor=f,
        knot_sizes=tuple(2.0 ** k for k in best.knots_log2) if values else (), knot_values=values,
        above_range_factor=best.plateau, size_range=(float(np.min(s)), float(np.max(s))),
        latency_ci=interval(boot_l, best.latency_s), bandwidth_factor_ci=interval(boot_f, f),
        plateau_points=best.plateau_points, latency_by_ranks=by_ranks)
