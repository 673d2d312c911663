"""Robust straight-line fits with bootstrap confidence intervals (numpy only).

The calibration fits ``y = a + b x`` where y is a measured time: the alpha-beta model of a collective
(x = busbw factor x size, a = alpha, b = 1 / busbw; nccl-tests doc/PERFORMANCE.md for the factor) or a
correction of simdist's own prediction (x = predicted seconds, b = 1 / bandwidth_factor).

Measured times span five orders of magnitude and carry warm-up spikes and outliers, so

- residuals are *relative*, r_i = (y_i - a - b x_i) / y_i: a weighted least-squares step uses weights
  1 / y_i^2 (each point counts by its percentage error, as MAPE does);
- the weights are iteratively reweighted (IRLS, Holland & Welsch 1977, "Robust regression using
  iteratively reweighted least-squares", Commun. Stat. 6(9)): first Huber's psi (Huber 1964, Ann. Math.
  Stat. 35(1), k = 1.345), then Tukey's biweight (Beaton & Tukey 1974, Technometrics 16(2), c = 4.685),
  which gives a gross outlier zero weight; the scale is the normalised median absolute deviation
  (MAD / 0.6745) of the residuals;
- a fit with a < 0 is refitted through the origin (a time model has no negative latency);
- confidence intervals are percentiles of a seeded bootstrap over points (Efron & Tibshirani 1993,
  "An Introduction to the Bootstrap", ch. 13: the percentile interval), so they are deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LineFit", "fit_line", "mape_pct", "robust_line", "weighted_median"]

HUBER_K = 1.345  # Huber 1964; 95 % efficiency at the normal (Holland & Welsch 1977)
BISQUARE_C = 4.685  # Beaton & Tukey 1974; 95 % efficiency at the normal
_MAD_NORMAL = 0.6745  # MAD of a standard normal: the scale estimate sigma = MAD / 0.6745


@dataclass(frozen=True, slots=True)
class LineFit:
    """``y = intercept + slope x``, robustly fitted, with bootstrap percentile intervals."""

    intercept: float
    slope: float
    intercept_ci: tuple[float, float]
    slope_ci: tuple[float, float]
    residuals: tuple[float, ...]
    """Relative residuals (y - fit) / y of the fitted points, in input order."""
    weights: tuple[float, ...]
    """Final robustness weight of each point (0: treated as an outlier)."""
    mape_pct: float
    """Mean |relative residual| over the points, in percent."""
    num_points: int
    confidence: float

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.intercept + self.slope * np.asarray(x, dtype=float)


def _wls(x: np.ndarray, y: np.ndarray, w: np.ndarray, through_origin: bool) -> tuple[float, float]:
    """Weighted least squares of y = a + b x (weights w >= 0)."""
    if through_origin:
        den = float(np.sum(w * x * x))
        return 0.0, (float(np.sum(w * x * y)) / den if den > 0 else 0.0)
    sw = float(np.sum(w))
    if sw <= 0:
        return 0.0, 0.0
    xm, ym = float(np.sum(w * x)) / sw, float(np.sum(w * y)) / sw
    sxx = float(np.sum(w * (x - xm) ** 2))
    if sxx <= 0:  # one distinct x: the line is not identified; all of y is latency
        return ym, 0.0
    b = float(np.sum(w * (x - xm) * (y - ym))) / sxx
    return ym - b * xm, b


def _robust_weights(r: np.ndarray, kind: str) -> np.ndarray:
    mad = float(np.median(np.abs(r - np.median(r))))
    scale = mad / _MAD_NORMAL if mad > 0 else 0.0
    if scale <= 1e-12:
        return np.ones_like(r)
    u = np.abs(r) / scale
    if kind == "huber":
        return np.where(u <= HUBER_K, 1.0, HUBER_K / np.maximum(u, 1e-300))
    return np.where(u < BISQUARE_C, (1.0 - (u / BISQUARE_C) ** 2) ** 2, 0.0)


def robust_line(x: np.ndarray, y: np.ndarray, *, iterations: int = 20) -> tuple[float, float, np.ndarray]:
    """(a, b, weights) of y = a + b x by IRLS on relative residuals: Huber steps, then biweight steps."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    base = 1.0 / np.maximum(np.abs(y), 1e-300) ** 2
    robust = np.ones_like(y)
    origin = False
    a, b = _wls(x, y, base, origin)
    for kind in ("huber", "bisquare"):
        for _ in range(iterations):
            if a < 0 and not origin:
                origin = True  # Assumption: a time model has no negative latency; refit through the origin
                a, b = _wls(x, y, base * robust, origin)
            new = _robust_weights((y - a - b * x) / y, kind)
            if not np.any(new > 0):
                break
            robust = new
            a_new, b_new = _wls(x, y, base * robust, origin)
            done = abs(a_new - a) <= 1e-9 * max(abs(a), 1e-30) and abs(b_new - b) <= 1e-9 * max(abs(b), 1e-30)
            a, b = a_new, b_new
            if done:
                break
    if a < 0:
        a, b = _wls(x, y, base * robust, True)
    return a, b, robust


def fit_line(x: np.ndarray | list[float], y: np.ndarray | list[float], *, seed: int = 0, resamples: int = 200,
             confidence: float = 0.95) -> LineFit:
    """Robust fit of y = a + b x with bootstrap percentile intervals (seeded: the same input, the same CIs)."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    a, b, w = robust_line(xa, ya)
    rng = np.random.default_rng(seed)
    n = len(xa)
    boot_a, boot_b = [], []
    if n >= 3:
        for _ in range(resamples):
            idx = rng.integers(0, n, size=n)
            if len(np.unique(xa[idx])) < 2:
                continue
            ba, bb, _ = robust_line(xa[idx], ya[idx])
            boot_a.append(ba)
            boot_b.append(bb)
    lo, hi = 50.0 * (1.0 - confidence), 50.0 * (1.0 + confidence)

    def interval(values: list[float], point: float) -> tuple[float, float]:
        if not values:
            return point, point
        return float(np.percentile(values, lo)), float(np.percentile(values, hi))

    r = (ya - a - b * xa) / ya
    return LineFit(a, b, interval(boot_a, a), interval(boot_b, b), tuple(float(v) for v in r),
                   tuple(float(v) for v in w), float(100.0 * np.mean(np.abs(r))) if n else 0.0, n, confidence)


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The weighted median (the value where the cumulative weight reaches half)."""
    order = np.argsort(values)
    v, w = np.asarray(values, dtype=float)[order], np.asarray(weights, dtype=float)[order]
    cum = np.cumsum(w)
    return float(v[np.searchsorted(cum, 0.5 * cum[-1])])


def mape_pct(predicted: list[float] | np.ndarray, measured: list[float] | np.ndarray) -> float:
    """Mean absolute percentage error of ``predicted`` against ``measured`` (|p - m| / m), in percent."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    return float(100.0 * np.mean(np.abs(p - m) / m)) if len(m) else float("nan")
