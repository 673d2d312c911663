"""A link tier's efficiency from the bandwidth-bound points measured on it (`fit_tiers`).

A tier (simdist.calibrate.points.tier_of: scale_up = NVLink, pcie inside a node without NVLink, inter_node =
the network) has one efficiency, achieved / nominal bandwidth of its links (a topology field). It is a
statement about bandwidth, so only points where the model is bandwidth-bound (points.PLATEAU_SHARE: latency,
protocol and pipeline-fill terms under 2 % of the time) may move it, those of every op on the tier:
efficiency x the median over them of t_model / t_measured, at most 1 (a link never beats its nominal
bandwidth; a measurement that would need more says so in a warning). A tier whose sweeps stop before that
regime keeps the preset's efficiency: the sizes below the plateau are the per-op corrections' business
(simdist.calibrate.correction_fit), and letting their protocol knee set the links' efficiency would change
every other op on those links, which the per-op corrections do not see (what straight lines through whole
sweeps did instead: docs/validation-history.md).

The links are also told apart from the in-switch reduction: where the model prices a plateau point with NVLS
(NVLink SHARP, simdist.collectives.nvls: the switch reduces, so the GPUs' links carry half the bytes of a
ring) and the measurement names no algorithm, the point is also priced as NCCL runs it without NVLS (its best
other algorithm: the fallback when the switch has no SHARP or NCCL_NVLS_ENABLE=0), and the links take the
larger implied efficiency of the two that does not exceed 1. A measurement no faster than the links alone
allow is no evidence that the switch reduced anything; blaming the links for a reduction that did not happen
would slow every ring on them (measured on the A100 sample: docs/validation-history.md).

The per-series record (`TierFit`, informational): latency alpha (median time at the latency-bound sizes),
the busbw measured where the model is bandwidth-bound (bootstrap CI of the median: finite), the model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from simdist.calibrate.correction_fit import LATENCY_SHARE
from simdist.calibrate.fit import mape_pct
from simdist.calibrate.points import (
    PLATEAU_SHARE,
    Point,
    _group,
    _tier_efficiency,
    predict_without_nvls,
    tier_field,
    tier_of,
)
from simdist.collectives.ops import op_info
from simdist.hardware.topology import Topology
from simdist.spec.calibration import TierFit

__all__ = ["fit_tiers"]


def _us(seconds: float) -> str:
    return f"{seconds / 1e-6:.12g} us"


def _gbps(bps: float) -> str:
    return f"{bps / 1e9:.12g} GB/s"


def _median_ci(values: np.ndarray, seed: int, resamples: int = 200) -> tuple[float, float, float]:
    """(median, 2.5 %, 97.5 % bootstrap percentiles of the median): finite for finite values."""
    med = float(np.median(values))
    if len(values) < 2:
        return med, med, med
    rng = np.random.default_rng(seed)
    boot = [float(np.median(values[rng.integers(0, len(values), size=len(values))])) for _ in range(resamples)]
    return med, min(med, float(np.percentile(boot, 2.5))), max(med, float(np.percentile(boot, 97.5)))


def fit_tiers(topology: Topology, points: Sequence[Point], predicted: np.ndarray, share: np.ndarray, seed: int
               ) -> tuple[dict[str, Any], list[TierFit], list[str]]:
    """Tier efficiency overrides from the bandwidth-bound points of each tier (module doc), and the per-series
    record of what was measured there."""
    tiers: dict[str, list[int]] = {}
    series: dict[tuple[str, str, int], list[int]] = {}
    for i, p in enumerate(points):
        tier = tier_of(topology, _group(topology, p))
        tiers.setdefault(tier, []).append(i)
        series.setdefault((tier, p.op, p.num_ranks), []).append(i)
    measured = np.array([p.time_s for p in points])
    overrides: dict[str, Any] = {}
    notes: list[str] = []
    after: dict[str, float] = {}
    for tier, idx in sorted(tiers.items()):
        bound = [i for i in idx if share[i] >= PLATEAU_SHARE]
        before = _tier_efficiency(topology, tier)
        if not bound:
            after[tier] = before
            continue
        implied = []
        ring = predict_without_nvls(topology, [points[i] for i in bound])
        for i, t_ring in zip(bound, ring, strict=True):
            options = [before * predicted[i] / measured[i]]
            if t_ring is not None:
                options.append(before * t_ring / measured[i])
            feasible = [e for e in options if e <= 1.0]
            implied.append(max(feasible) if feasible else min(options))
        switched = [points[i].op for i, t, e in zip(bound, ring, implied, strict=True)
                    if t is not None and e != before * predicted[i] / measured[i]]
        if switched:
            notes.append(f"{tier}: the plateau of {', '.join(sorted(set(switched)))} is no faster than the links "
                         "allow without NVLS, so the links were fitted to NCCL's non-NVLS algorithm (a GPU or switch "
                         "without NVLink SHARP, or NCCL_NVLS_ENABLE=0?)")
        wanted = float(np.median(implied))
        if wanted > 1.0:
            notes.append(f"{tier}: the measurements move bytes {wanted / before:.2f} x faster than the preset "
                         f"predicts, beyond the links' nominal bandwidth (efficiency {before:g} -> {wanted:.3g} > 1; "
                         f"kept at 1): is '{topology.spec.name}' the machine they ran on?")
        after[tier] = round(min(1.0, max(0.01, wanted)), 4)
        *where, name = tier_field(topology, tier)
        node = overrides
        for key in where:
            node = node.setdefault(key, {})
        node[name] = after[tier]
    fits: list[TierFit] = []
    for (tier, op, n), idx in sorted(series.items()):
        pts = [points[i] for i in idx]
        factor = op_info(op).busbw_factor(n)
        busbw = np.array([factor * p.nbytes / p.time_s for p in pts])
        model_busbw = np.array([factor * p.nbytes / predicted[i] for p, i in zip(pts, idx, strict=True)])
        bound = np.array([share[i] >= PLATEAU_SHARE for i in idx])
        if bound.any():
            bw, lo, hi = _median_ci(busbw[bound], seed)
            model = float(np.median(model_busbw[bound]))
        else:  # the plateau was not reached: the largest measured busbw is a lower bound on it
            bw = lo = hi = float(np.max(busbw))
            model = float(model_busbw[int(np.argmax(busbw))])
        times = np.array([p.time_s for p in pts])
        small = np.array([share[i] < LATENCY_SHARE for i in idx])
        alpha, a_lo, a_hi = _median_ci(times[small], seed) if small.any() else (float(times.min()),) * 3
        fits.append(TierFit(tier=tier, op=op, num_ranks=n, points=len(pts), alpha=_us(alpha),
                            alpha_ci=[_us(a_lo), _us(a_hi)], busbw=_gbps(bw),
                            busbw_ci=[_gbps(lo), _gbps(hi)], model_busbw=_gbps(model), plateau_points=int(bound.sum()),
                            efficiency_before=_tier_efficiency(topology, tier), efficiency_after=after[tier],
                            mape_pct=mape_pct(predicted[idx], times)))
    return overrides, fits, notes


