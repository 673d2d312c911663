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

from simdist.analytic.select import rank_choices
from simdist.calibrate.fit import fit_line, mape_pct
from simdist.calibrate.measurements import Measurement
from simdist.collectives.group import Group
from simdist.collectives.ops import OPS, op_info
from simdist.collectives.registry import ALGORITHMS
from simdist.collectives.request import Request
from simdist.errors import SimdistError, SpecError
from simdist.hardware.compute import ComputeEfficiency, compute_efficiency
from simdist.hardware.presets import load_topology, topology_document
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

HOLDOUTS = ("none", "sizes", "large", "ranks")
MAX_KNOTS = 24
TIER_FIELD = {"scale_up": ("scale_up",), "pcie": ("host", "pcie"), "inter_node": ("inter_node",)}
_TIER_KINDS = {"scale_up": {"nvlink"}, "pcie": {"pcie"}}


# --------------------------------------------------------------------------- measured points
@dataclass(frozen=True, slots=True)
class Point:
    """Median of the measurements of one (op, ranks, nodes, size, algorithm)."""

    op: str
    num_ranks: int
    num_nodes: int | None
    nbytes: float
    time_s: float
    algorithm: str | None
    source: str
    samples: int = 1

    @property
    def series(self) -> tuple:
        return (self.op, self.num_ranks, self.num_nodes, self.algorithm)


def aggregate(measurements: Sequence[Measurement]) -> list[Point]:
    """Median time per (op, ranks, nodes, size, algorithm): robust to warm-up spikes of single samples."""
    groups: dict[tuple, list[Measurement]] = {}
    for m in measurements:
        if m.op == "barrier" or m.nbytes <= 0:
            raise SpecError(f"a {m.op} of {m.nbytes} bytes has no size to fit a bandwidth to", source=m.source,
                            fix="remove barrier and 0-byte rows from the measurements")
        algo = (m.algorithm or "").lower() or None
        algo = algo if algo in ALGORITHMS else None  # e.g. NCCL_ALGO=CollnetDirect: priced as NCCL's choice
        nodes = m.num_nodes if m.num_nodes and m.num_nodes > 1 else None
        groups.setdefault((m.op, m.num_ranks, nodes, float(m.nbytes), algo), []).append(m)
    order = sorted(groups, key=lambda k: (k[0], k[1], k[2] or 0, str(k[4]), k[3]))
    return [Point(op, n, nodes, size, float(np.median([m.time_s for m in groups[key]])), algo,
                  groups[key][0].source, len(groups[key])) for key in order for (op, n, nodes, size, algo) in [key]]


def split_holdout(points: Sequence[Point], holdout: str) -> tuple[list[Point], list[Point]]:
    """(fit, held out): ``sizes`` every other size of each sweep, ``large`` its largest third, ``ranks``
    the largest rank count of each op measured at several, ``none`` nothing held out."""
    if holdout not in HOLDOUTS:
        raise SpecError(f"unknown holdout '{holdout}'", field="--holdout", fix=f"use one of: {', '.join(HOLDOUTS)}")
    if holdout == "none":
        return list(points), []
    train, test = [], []
    if holdout == "ranks":
        counts: dict[str, set[int]] = {}
        for p in points:
            counts.setdefault(p.op, set()).add(p.num_ranks)
        held = {op: max(c) for op, c in counts.items() if len(c) > 1}
        if not held:
            raise SpecError("--holdout ranks needs an op measured at two or more rank counts", field="--holdout",
                            fix="use --holdout sizes, or add measurements at another rank count")
        for p in points:
            (test if held.get(p.op) == p.num_ranks else train).append(p)
        return train, test
    series: dict[tuple, list[Point]] = {}
    for p in points:
        series.setdefault(p.series, []).append(p)
    for pts in series.values():
        pts = sorted(pts, key=lambda p: p.nbytes)
        n = len(pts)
        for i, p in enumerate(pts):
            out = n >= 4 and i % 2 == 1 if holdout == "sizes" else n >= 3 and i >= n - math.ceil(n / 3)
            (test if out else train).append(p)
    if not test:
        raise SpecError(f"--holdout {holdout} leaves no point to predict", field="--holdout",
                        fix="measure sweeps of at least 4 sizes, or use --holdout none")
    return train, test


# --------------------------------------------------------------------------- the cluster and its predictions
def build_cluster(topology: str, points: Sequence[Point], *, num_nodes: int | None = None,
                  overrides: dict[str, Any] | None = None) -> Topology:
    """The preset with enough nodes for every measured group (or exactly ``num_nodes``) and ``overrides``."""
    gpn = int(topology_document(topology).data.get("gpus_per_node", 1))
    needed = max([p.num_nodes or -(-p.num_ranks // gpn) for p in points] or [1])
    if num_nodes is not None and num_nodes < needed:
        worst = max(points, key=lambda p: p.num_nodes or -(-p.num_ranks // gpn))
        raise SpecError(f"{worst.op} on {worst.num_ranks} ranks needs {needed} nodes of {topology}, "
                        f"--num-nodes is {num_nodes}", source=worst.source, fix=f"use --num-nodes {needed}")
    doc = Document(data=overrides, source="calibration overrides") if overrides else None
    return load_topology(topology, num_nodes=num_nodes or needed, overrides=doc)


def _group(topology: Topology, p: Point) -> Group:
    gpn = topology.gpus_per_node
    if p.num_nodes is None:
        return Group.first(topology, p.num_ranks)
    per, rest = divmod(p.num_ranks, p.num_nodes)
    if rest or per > gpn or p.num_nodes > topology.num_nodes:
        raise SpecError(f"{p.num_ranks} ranks on {p.num_nodes} nodes do not fit nodes of {gpn} GPUs",
                        source=p.source, fix="check the num_ranks and num_nodes columns")
    return Group(topology, tuple(node * gpn + j for node in range(p.num_nodes) for j in range(per)))


def tier_of(topology: Topology, group: Group) -> str:
    """scale_up (one NVLink domain), pcie (one node without NVLink) or inter_node."""
    if len({topology.locate(r)[0] for r in group.ranks}) > 1:
        return "inter_node"
    return "scale_up" if topology.spec.scale_up is not None else "pcie"


def _tier_efficiency(topology: Topology, tier: str) -> float:
    if tier == "inter_node":
        assert topology.fabric is not None
        return topology.fabric.efficiency
    return next(lk.efficiency for lk in topology.node.links if lk.kind in _TIER_KINDS[tier])


def predict_points(topology: Topology, points: Sequence[Point]) -> np.ndarray:
    """simdist's closed-form time of each point: the (algorithm, protocol) NCCL's tuner would take, or the
    measured algorithm where the file names one (simdist.analytic.select.rank_choices)."""
    cache: dict[tuple, float] = {}
    out = []
    for p in points:
        key = (p.op, p.num_ranks, p.num_nodes, p.nbytes, p.algorithm)
        if key not in cache:
            try:
                group = _group(topology, p)
                request = Request(p.op, group, p.nbytes)
                choices = rank_choices(request, algorithms=[p.algorithm] if p.algorithm else None)
            except SpecError:
                raise
            except SimdistError as err:
                raise SpecError(f"{p.op} on {p.num_ranks} ranks cannot be priced on {topology.spec.name}: "
                                f"{err.problem}", source=p.source, fix=err.fix or "check num_ranks") from None
            if not choices:
                raise SpecError(f"no algorithm runs {p.op} on {p.num_ranks} ranks of {topology.spec.name}",
                                source=p.source, fix="remove these rows or calibrate another topology")
            cache[key] = choices[0].predicted_s
        out.append(cache[key])
    return np.asarray(out, dtype=float)


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
            launch_overhead_s=c.launch_overhead if c.launch_overhead is not None else base.launch_overhead_s)

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
