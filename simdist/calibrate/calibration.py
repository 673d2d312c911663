"""Build a calibration from measurements and a topology preset, and apply one to predictions.

Building (`fit_calibration`), in three stages:

1. **Link tiers.** Each measured point's group is placed on the cluster (the first GPUs; ``num_nodes``
   of the measurement spreads them over that many nodes) and sorted into a tier: every rank in one node
   -> ``scale_up`` (NVLink) or, without NVLink, ``pcie``; ranks on several nodes -> ``inter_node``.
   Per tier and (op, rank count) the alpha-beta model t(S) = alpha + factor x S / busbw is fitted
   robustly (simdist.calibrate.fit; factor = the op's busbw factor, nccl-tests doc/PERFORMANCE.md, so
   the ring all_reduce reads t = alpha + 2(n-1)/n x S / B) to the measured and to simdist's predicted
   times. The series with the most points sets the tier's efficiency override:
   efficiency x measured busbw / predicted busbw (capped at 1).
2. **Collectives.** With those overrides applied, per op the measured time is fitted as
   t = latency + t_model / bandwidth_factor (t_model: simdist's closed-form prediction, the collective
   NCCL's tuner would pick, simdist.analytic.select), then a size-dependent efficiency
   e(S) = t_model / (bandwidth_factor x (t - latency)) is tabulated at up to 24 log-spaced knots
   (medians), so that t = latency + t_model / (bandwidth_factor x e(S)).
3. **Compute.** The roofline's gemm_peak_efficiency and launch overhead are fitted to the measured
   single-GPU MLP training steps (cut ``single`` only: no communication to subtract), see `fit_compute`.
"""

from __future__ import annotations

import datetime
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from simdist.calibrate.fit import fit_line, mape_pct
from simdist.calibrate.measurements import Measurement
from simdist.collectives.ops import OPS, op_info
from simdist.errors import SpecError
from simdist.hardware.compute import ComputeEfficiency, compute_efficiency
from simdist.hardware.topology import Topology
from simdist.predict.price import Adjust
from simdist.spec.calibration import (
    CalibrationSpec,
    CollectiveCalibration,
    CollectiveFit,
    FitInfo,
    TierFit,
)
from simdist.spec.gpu import GpuSpec
from simdist.spec.load import Document, read_yaml, validate

__all__ = ["Calibration", "Correction", "Point", "aggregate", "build_cluster", "fit_calibration",
           "load_calibration", "predict_points", "split_holdout", "tier_of", "to_yaml"]

from simdist.calibrate.points import (
    MAX_KNOTS,
    TIER_FIELD,
    Point,
    _group,
    _tier_efficiency,
    aggregate,
    build_cluster,
    predict_points,
    split_holdout,
    tier_of,
)


# --------------------------------------------------------------------------- applying a calibration
@dataclass(frozen=True, slots=True)
class Correction:
    """t = latency_s + t_model / (bandwidth_factor x efficiency(S)) for one op."""

    latency_s: float
    bandwidth_factor: float
    knots_log2: tuple[float, ...] = ()
    values: tuple[float, ...] = ()

    def efficiency(self, nbytes: float) -> float:
        if not self.knots_log2 or nbytes <= 0:
            return 1.0
        return float(np.interp(math.log2(nbytes), self.knots_log2, self.values))  # flat beyond the ends

    def rate(self, nbytes: float) -> float:
        """The multiplier on the predicted bandwidth at this size."""
        return self.bandwidth_factor * self.efficiency(nbytes)

    def time_s(self, predicted_s: float, nbytes: float) -> float:
        return self.latency_s + predicted_s / self.rate(nbytes)

    @classmethod
    def of(cls, c: CollectiveCalibration) -> Correction:
        knots = tuple(math.log2(s) for s in c.efficiency_sizes or ())
        return cls(c.latency, c.bandwidth_factor, knots, tuple(c.efficiency or ()))


@dataclass(frozen=True, slots=True)
class Calibration:
    """A loaded calibration file: what `predict_step` and `api.collective` need of it."""

    spec: CalibrationSpec
    source: str
    corrections: dict[str, Correction] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: CalibrationSpec, source: str = "calibration") -> Calibration:
        return cls(spec, source, {op: Correction.of(c) for op, c in spec.collectives.items()})

    def overrides_document(self) -> Document | None:
        return Document(data=self.spec.overrides, source=self.source) if self.spec.overrides else None

    def correction(self, op: str) -> Correction | None:
        return self.corrections.get(op)

    def adjust(self) -> Adjust | None:
        """(op, ranks, nbytes, predicted_s) -> calibrated seconds, for simdist.predict.price."""
        if not self.corrections:
            return None
        corrections = self.corrections

        def adjust(op: str, num_ranks: int, nbytes: float, predicted_s: float) -> float:
            c = corrections.get(op)
            return predicted_s if c is None else c.time_s(predicted_s, nbytes)

        return adjust

    def compute_efficiency(self, gpu: GpuSpec) -> ComputeEfficiency | None:
        c = self.spec.compute
        if c is None:
            return None
        base = compute_efficiency(gpu)
        return ComputeEfficiency(
            gemm_peak_efficiency=c.gemm_peak_efficiency,
            gemm_knee_dim=c.gemm_knee_dim if c.gemm_knee_dim is not None else base.gemm_knee_dim,
            memory_efficiency=c.memory_efficiency if c.memory_efficiency is not None else base.memory_efficiency,
            launch_overhead_s=c.launch_overhead if c.launch_overhead is not None else base.launch_overhead_s,
            host_op_s=base.host_op_s)

    def check_topology(self, name: str, *, field: str = "--cluster") -> None:
        """One clear error when this calibration is used on another topology than it was fitted for."""
        if name != self.spec.topology:
            raise SpecError(f"calibration {self.source} was fitted for topology '{self.spec.topology}', not "
                            f"'{name}'", field=field,
                            fix=f"use a calibration fitted on {name} (simdist calibrate ... --topology {name}) "
                                f"or the cluster {self.spec.topology}")

    def assignments(self, prefix: str, keep: dict[str, Any] | None = None) -> list[str]:
        """The overrides as ``prefix.a.b=value`` assignments, except fields already set in ``keep``."""
        out: list[str] = []

        def walk(node: dict[str, Any], mine: dict[str, Any] | None, path: list[str]) -> None:
            for key, value in node.items():
                theirs = mine.get(key) if isinstance(mine, dict) else None
                if isinstance(value, dict):
                    walk(value, theirs if isinstance(theirs, dict) else None, [*path, key])
                elif theirs is None:
                    out.append(f"{'.'.join([prefix, *path, key])}={value}")

        walk(self.spec.overrides, keep, [])
        return out


def load_calibration(path: str | Path) -> Calibration:
    """Read and validate a calibration YAML file (one-line SpecError naming file, line and field)."""
    doc = read_yaml(path)
    spec = validate(CalibrationSpec, doc)
    for op in spec.collectives:
        if op not in OPS:
            raise SpecError(f"unknown collective '{op}'", field=f"collectives.{op}",
                            source=doc.where(("collectives", op)), fix=f"use one of: {', '.join(OPS)}")
    return Calibration.of(spec, str(path))


def to_yaml(spec: CalibrationSpec) -> str:
    """The calibration as YAML (unit strings for quantities); `load_calibration` reads it back unchanged."""
    data = spec.model_dump(mode="json", exclude_none=True)
    return yaml.safe_dump(data, sort_keys=False, width=120)


# --------------------------------------------------------------------------- fitting
def _interval(lo: float, hi: float) -> list[float]:
    return [min(lo, hi), max(lo, hi)]


def _us(seconds: float) -> str:
    """Seconds as the unit string the spec's Duration fields take (a bare number is refused)."""
    return f"{seconds / 1e-6:.12g} us"


def _gbps(bps: float) -> str:
    return f"{bps / 1e9:.12g} GB/s"


def _tier_fits(topology: Topology, points: Sequence[Point], predicted: np.ndarray, seed: int
               ) -> tuple[dict[str, Any], list[TierFit]]:
    series: dict[tuple[str, str, int], list[int]] = {}
    for i, p in enumerate(points):
        series.setdefault((tier_of(topology, _group(topology, p)), p.op, p.num_ranks), []).append(i)
    fits: list[TierFit] = []
    best: dict[str, tuple[tuple, TierFit]] = {}
    for (tier, op, n), idx in sorted(series.items()):
        pts = [points[i] for i in idx]
        if len({p.nbytes for p in pts}) < 3:
            continue
        factor = op_info(op).busbw_factor(n)
        x = np.array([factor * p.nbytes for p in pts])
        measured = fit_line(x, [p.time_s for p in pts], seed=seed)
        model = fit_line(x, predicted[idx], resamples=0)
        if measured.slope <= 0 or model.slope <= 0:
            continue
        before = _tier_efficiency(topology, tier)
        after = min(1.0, max(0.01, before * model.slope / measured.slope))
        fit = TierFit(tier=tier, op=op, num_ranks=n, points=len(pts), alpha=_us(measured.intercept),
                      alpha_ci=[_us(v) for v in measured.intercept_ci], busbw=_gbps(1.0 / measured.slope),
                      busbw_ci=[_gbps(v) for v in _interval(1.0 / max(measured.slope_ci[1], 1e-300),
                                                             1.0 / max(measured.slope_ci[0], 1e-300))],
                      model_busbw=_gbps(1.0 / model.slope), efficiency_before=before, efficiency_after=round(after, 4),
                      mape_pct=measured.mape_pct)
        fits.append(fit)
        rank = (len(pts), op == "all_reduce", n)
        if tier not in best or rank > best[tier][0]:
            best[tier] = (rank, fit)
    overrides: dict[str, Any] = {}
    for tier, (_, fit) in sorted(best.items()):
        node = overrides
        for key in TIER_FIELD[tier]:
            node = node.setdefault(key, {})
        node["efficiency"] = fit.efficiency_after
    return overrides, fits


def _knots(points: Sequence[Point], x: np.ndarray, latency: float, factor: float) -> tuple[list[float], list[float]]:
    """Size-dependent efficiency at up to MAX_KNOTS log-spaced sizes (medians of the points near each)."""
    logs = np.log2([p.nbytes for p in points])
    y = np.array([p.time_s for p in points])
    bw_part = y - latency
    usable = bw_part > 0.1 * y  # a point almost all latency says nothing about bandwidth
    eff = np.where(usable, x / (factor * np.maximum(bw_part, 1e-300)), np.nan)
    distinct = np.unique(logs)
    if len(distinct) < 4:
        return [], []
    edges = np.linspace(distinct[0], distinct[-1], min(MAX_KNOTS, len(distinct)) + 1)
    sizes, values = [], []
    for lo, hi in itertools.pairwise(edges):
        inside = (logs >= lo) & ((logs <= hi) if hi == edges[-1] else (logs < hi))
        if not inside.any():
            continue
        vals = eff[inside & usable]
        sizes.append(float(2.0 ** np.median(logs[inside])))
        values.append(float(np.clip(np.median(vals), 0.05, 10.0)) if len(vals) else 1.0)
    return sizes, values


def _collective_fits(points: Sequence[Point], predicted: np.ndarray, uncalibrated: np.ndarray, seed: int
                     ) -> tuple[dict[str, CollectiveCalibration], dict[str, CollectiveFit]]:
    cals: dict[str, CollectiveCalibration] = {}
    infos: dict[str, CollectiveFit] = {}
    for op in sorted({p.op for p in points}):
        idx = [i for i, p in enumerate(points) if p.op == op]
        pts = [points[i] for i in idx]
        x, y = predicted[idx], np.array([p.time_s for p in pts])
        line = fit_line(x, y, seed=seed)
        if line.slope <= 0:  # Assumption: no size trend to fit: keep the model's bandwidth, fit the latency only
            latency, factor = max(float(np.median(y - x)), 0.0), 1.0
            slope_ci = (1.0, 1.0)
        else:
            latency, factor = max(line.intercept, 0.0), 1.0 / line.slope
            slope_ci = (1.0 / max(line.slope_ci[1], 1e-300), 1.0 / max(line.slope_ci[0], 1e-300))
        sizes, values = _knots(pts, x, latency, factor)
        if values:  # the largest size's efficiency is 1: bandwidth_factor then scales the plateau
            scale = values[-1]
            factor, values = factor * scale, [min(v / scale, 10.0) for v in values]
            slope_ci = (slope_ci[0] * scale, slope_ci[1] * scale)
        cal = CollectiveCalibration(latency=_us(latency), bandwidth_factor=factor,
                                    efficiency_sizes=[f"{round(v)} B" for v in sizes] or None,
                                    efficiency=[round(v, 4) for v in values] or None)
        corr = Correction.of(cal)
        calibrated = [corr.time_s(xi, p.nbytes) for xi, p in zip(x, pts, strict=True)]
        cals[op] = cal
        infos[op] = CollectiveFit(points=len(pts), latency_ci=[_us(max(v, 0.0)) for v in line.intercept_ci],
                                  bandwidth_factor_ci=_interval(*slope_ci), mape_pct=mape_pct(calibrated, y),
                                  mape_uncalibrated_pct=mape_pct(uncalibrated[idx], y))
    return cals, infos


def fit_calibration(measurements: Sequence[Measurement], topology: str, *, num_nodes: int | None = None,
                    steps: Sequence[Any] = (), holdout: str = "none", seed: int = 0,
                    sources: Sequence[str] = ()) -> CalibrationSpec:
    """Fit a calibration of ``topology`` to collective ``measurements`` (and MLP ``steps``), see the module doc.

    ``holdout``: fit on part of the points (`split_holdout`) and report the held-out error in ``fit``.
    """
    from simdist.calibrate.compute_fit import fit_compute

    if not measurements and not steps:
        raise SpecError("no measurements to fit", field="MEASUREMENTS",
                        fix="pass a measurement CSV, nccl-tests output or an MLP step CSV")
    points = aggregate(measurements)
    train, test = split_holdout(points, holdout) if points else ([], [])
    base = build_cluster(topology, points, num_nodes=num_nodes)
    uncal = predict_points(base, train)
    overrides, tiers = _tier_fits(base, train, uncal, seed)
    tuned = build_cluster(topology, points, num_nodes=num_nodes, overrides=overrides) if overrides else base
    predicted = predict_points(tuned, train)
    collectives, infos = _collective_fits(train, predicted, uncal, seed)
    compute, compute_info = fit_compute(steps, base.gpu, seed=seed) if steps else (None, None)
    spec = CalibrationSpec(topology=topology, num_nodes=base.num_nodes, overrides=overrides,
                           collectives=collectives, compute=compute)
    info: dict[str, Any] = {
        "points": len(train), "holdout": holdout, "sources": sorted(set(sources) or {p.source for p in points}),
        "date": datetime.date.today().isoformat(), "tiers": tiers, "collectives": infos, "compute": compute_info,
        "method": "tiers: Huber/biweight IRLS of t = alpha + factor x S / busbw on relative residuals; collectives:"
                  " t = latency + t_model / (bandwidth_factor x efficiency(S)); 95 % CIs: seeded bootstrap over "
                  f"points (seed {seed}); compute: cut 'single' only",
    }
    if train:
        cal = Calibration.of(spec)
        info["mape_pct"] = mape_pct(calibrated_times(cal, tuned, train), [p.time_s for p in train])
        info["mape_uncalibrated_pct"] = mape_pct(uncal, [p.time_s for p in train])
    if test:
        cal = Calibration.of(spec)
        info["heldout_points"] = len(test)
        info["heldout_mape_pct"] = mape_pct(calibrated_times(cal, tuned, test), [p.time_s for p in test])
        info["heldout_mape_uncalibrated_pct"] = mape_pct(predict_points(base, test), [p.time_s for p in test])
    return spec.model_copy(update={"fit": FitInfo(**info)})


def calibrated_times(cal: Calibration, tuned: Topology, points: Sequence[Point]) -> np.ndarray:
    """Calibrated predictions of ``points`` on ``tuned`` (the cluster with the calibration's overrides)."""
    model = predict_points(tuned, points)
    out = []
    for t, p in zip(model, points, strict=True):
        c = cal.correction(p.op)
        out.append(t if c is None else c.time_s(float(t), p.nbytes))
    return np.asarray(out, dtype=float)
