"""A calibration's confidence intervals as ranges of the prediction band (simdist.predict.bands).

`simdist calibrate` reports, next to each fitted constant, a percentile-bootstrap confidence interval (95 % unless
``fit.confidence`` says otherwise; Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13): the
roofline's gemm_peak_efficiency, gemm_knee_dim, memory_efficiency and launch overhead (simdist.calibrate.kernel_fit,
simdist.calibrate.compute_fit) and, per collective, the latency and bandwidth factor of its correction
t = latency + t_model / (bandwidth_factor x efficiency(S)) (simdist.calibrate.correction_fit). Where a run applies a
calibration, the band samples each of those constants from its interval instead of the stated range around it.

How an interval becomes a sampling distribution: a split normal whose median is the fitted value (the prediction's
own) and whose two halves put the interval's ends at their percentiles, the low end at -z and the high end at +z
with z = Phi^-1((1 + confidence) / 2) = 1.96 at 95 % (each half its own sigma: bootstrap intervals are often
lopsided, e.g. a latency of 8.1 ms with the interval [0, 8.1] ms). The same construction as the stated ranges,
whose p10 and p90 sit at -/+1.28 of a split log-normal (simdist.predict.bands). Not uniform inside the interval:
that would put nothing in the 5 % outside it and as much at its ends as at the fitted value. Rates (efficiencies,
the knee, the bandwidth factor) are taken on the log scale (a sampled rate stays positive and the time, which goes
as 1 / rate, is log-symmetric as the stated time factors are); additive times (latency, launch overhead) on the
linear scale, clamped at 0 (their intervals often start at 0). A percentile interval maps through any monotone
transform (Efron & Tibshirani 1993, sec. 13.3), so either scale reads the same interval.

An interval of zero width says nothing about the spread (the fits report the point itself when they do not
bootstrap: fewer than 3 points, or a constant they do not identify, e.g. the launch overhead of one MLP shape):
such a constant keeps the stated range. An interval that leaves out its fitted value is widened to hold it (as
simdist.calibrate.correction_fit's own are).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache
from statistics import NormalDist
from typing import TYPE_CHECKING

from simdist.errors import SpecError

if TYPE_CHECKING:  # a run without a calibration does not build the calibration file's models
    from simdist.spec.calibration import CalibrationSpec

__all__ = ["COMPUTE_CONSTANTS", "CalibratedRanges", "CollectiveRanges", "Interval", "calibrated_ranges"]

COMPUTE_CONSTANTS = ("gemm_peak_efficiency", "gemm_knee_dim", "memory_efficiency", "launch_overhead_s")
"""The roofline constants a calibration may fit (simdist.hardware.compute.ComputeEfficiency fields), in the order
the band draws their samples."""
_RATES = frozenset({"gemm_peak_efficiency", "gemm_knee_dim", "memory_efficiency", "bandwidth_factor"})


@cache
def _end_quantile(confidence: float) -> float:
    """Phi^-1((1 + confidence) / 2): where a two-sided ``confidence`` interval's ends sit on a standard normal."""
    return NormalDist().inv_cdf(0.5 * (1.0 + confidence))


@dataclass(frozen=True, slots=True)
class Interval:
    """A fitted constant and its confidence interval [low, high] at ``confidence``; ``log``: sampled on the log
    scale (a rate), else linearly and clamped at 0 (a time)."""

    value: float
    low: float
    high: float
    confidence: float = 0.95
    log: bool = False

    @property
    def z(self) -> float:
        """The standard normal quantile the interval's ends sit at: 1.96 at 95 %."""
        return _end_quantile(self.confidence)

    def at(self, z: float) -> float:
        """The constant at standard normal ``z`` of its split normal (module doc): the value at 0, low at -`z`,
        high at +`z`."""
        if self.log:
            end = self.high if z >= 0 else self.low
            return self.value * math.exp(abs(z) / self.z * math.log(end / self.value))
        half = (self.high - self.value) if z >= 0 else (self.value - self.low)
        return max(0.0, self.value + z / self.z * half)

    def as_dict(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high, "confidence": self.confidence}

    @classmethod
    def of(cls, name: str, value: float, ci: list[float] | None, confidence: float) -> Interval | None:
        """The interval of constant ``name`` (its fitted ``value``), None where ``ci`` is absent or of zero width
        (module doc) or a rate's is not positive."""
        if ci is None or len(ci) != 2:
            return None
        low, high = min(float(ci[0]), float(ci[1]), value), max(float(ci[0]), float(ci[1]), value)
        log = name in _RATES
        if not high > low or not all(map(math.isfinite, (low, high))) or (log and not low > 0):
            return None
        return cls(value, low, high, confidence, log)


@dataclass(frozen=True, slots=True)
class CollectiveRanges:
    """One op's calibrated correction, as the band perturbs it: t = latency + t_model / (bandwidth_factor x
    efficiency(S)) up to the largest calibrated size ``max_bytes``, where an interval says how sure each is."""

    op: str
    latency_s: float
    latency_by_ranks: tuple[tuple[int, float], ...]
    max_bytes: float
    latency: Interval | None
    bandwidth_factor: Interval | None

    def latency_for(self, num_ranks: int) -> float:
        """The latency this op's correction adds for a group of ``num_ranks`` (as simdist.calibrate's Correction)."""
        return dict(self.latency_by_ranks).get(num_ranks, self.latency_s)

    def time_s(self, t: float, num_ranks: int, nbytes: float, z_latency: float, z_bandwidth: float,
               stated: float) -> float:
        """The calibrated time ``t`` of one call with its constants at standard normal ``z_latency`` and
        ``z_bandwidth``; the part a constant without an interval governs, and the whole above the calibrated sizes,
        x ``stated`` (the stated time factor of its size, simdist.predict.bands).

        With the latency L_n = `latency_for`, t = L_n + B (B = t_model / (f e(S))); sampled L' and f':
        t' = L_n x L' / L + B x f / f' (L' added where the fitted L is 0). Each rank count's latency moves by the
        pooled one's relative interval (the per-count latencies are fitted alike, on fewer points)."""
        if nbytes > self.max_bytes * (1 + 1e-9):
            return t * stated
        base = min(self.latency_for(num_ranks), t)
        bandwidth = t - base
        if self.latency is None:
            latency = base * stated
        elif self.latency.value > 0:
            latency = base * self.latency.at(z_latency) / self.latency.value
        else:
            latency = base + self.latency.at(z_latency)
        f = self.bandwidth_factor
        return latency + (bandwidth * f.value / f.at(z_bandwidth) if f is not None else bandwidth * stated)


@dataclass(frozen=True, slots=True)
class CalibratedRanges:
    """What a calibration says about how sure its constants are: the band's ranges where it is applied."""

    source: str
    confidence: float
    compute: dict[str, Interval] = field(default_factory=dict)
    """Compute constants (`COMPUTE_CONSTANTS`) with an interval; the others keep the stated range."""
    collectives: dict[str, CollectiveRanges] = field(default_factory=dict)
    """Ops whose correction has an interval on its latency or bandwidth factor; the others keep the stated range."""
    without_interval: tuple[str, ...] = ()
    """Fitted constants whose interval has zero width or is absent (they keep the stated range), e.g.
    ``launch_overhead_s`` or ``all_reduce bandwidth_factor``."""


def calibrated_ranges(spec: CalibrationSpec, source: str = "calibration") -> CalibratedRanges:
    """The band's ranges of a calibration file (its ``fit`` section's intervals; none in a hand-written file)."""
    fit = spec.fit
    level = float(fit.confidence)
    if not 0.0 < level < 1.0:
        raise SpecError(f"calibration {source}: fit.confidence {level:g} is not a confidence level",
                        field="fit.confidence", fix="give the intervals' level in (0, 1), e.g. 0.95")
    compute: dict[str, Interval] = {}
    missing: list[str] = []
    cal = spec.compute
    if cal is not None:
        kernels, steps = fit.kernels, fit.compute
        values = {"gemm_peak_efficiency": cal.gemm_peak_efficiency, "gemm_knee_dim": cal.gemm_knee_dim,
                  "memory_efficiency": cal.memory_efficiency, "launch_overhead_s": cal.launch_overhead}
        cis: dict[str, list[float] | None] = {}
        if kernels is not None:
            cis = {"gemm_peak_efficiency": kernels.gemm_peak_efficiency_ci, "gemm_knee_dim": kernels.gemm_knee_dim_ci,
                   "memory_efficiency": kernels.memory_efficiency_ci, "launch_overhead_s": kernels.launch_overhead_ci}
        elif steps is not None:
            cis = {"gemm_peak_efficiency": steps.gemm_peak_efficiency_ci, "launch_overhead_s": steps.launch_overhead_ci}
        for name in COMPUTE_CONSTANTS:
            value = values[name]
            if value is None:
                continue  # not fitted: the GPU's own constant, with the stated range
            interval = Interval.of(name, float(value), cis.get(name), level)
            if interval is None:
                missing.append(name)
            else:
                compute[name] = interval
    collectives: dict[str, CollectiveRanges] = {}
    for op, c in sorted(spec.collectives.items()):
        info = fit.collectives.get(op)
        latency = Interval.of("latency_s", float(c.latency), info.latency_ci if info else None, level)
        factor = Interval.of("bandwidth_factor", float(c.bandwidth_factor),
                             info.bandwidth_factor_ci if info else None, level)
        missing += [f"{op} {name}" for name, i in (("latency_s", latency), ("bandwidth_factor", factor)) if i is None]
        if latency is None and factor is None:
            continue
        by_ranks = tuple(sorted((int(n), float(v)) for n, v in (c.latency_by_ranks or {}).items()))
        top = float(c.size_range[1]) if c.size_range else math.inf
        collectives[op] = CollectiveRanges(op, float(c.latency), by_ranks, top, latency, factor)
    return CalibratedRanges(source, level, compute, collectives, tuple(missing))
