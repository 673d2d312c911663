"""Build a calibration from measurements and a topology preset, and apply one to predictions.

Building (`fit_calibration`), in three stages, each parameter fitted only from the points that identify it:

1. **Link tiers.** Each measured point's group is placed on the cluster (the first GPUs; ``num_nodes``
   of the measurement spreads them over that many nodes) and sorted into a tier: every rank in one node
   -> ``scale_up`` (NVLink) or, without NVLink, ``pcie``; ranks on several nodes -> ``inter_node``.
   A tier's efficiency (achieved / nominal bandwidth of its links) is a statement about bandwidth, so it is
   set only from the points where the model is bandwidth-bound (simdist.calibrate.points.PLATEAU_SHARE:
   latency, protocol and pipeline terms under 2 % of the time), of every op on the tier: efficiency x the
   median of t_model / t_measured there, at most 1 (a link never beats its nominal bandwidth). A tier
   whose sweeps stop before that regime keeps the preset's efficiency. (Fitting a line t = alpha + S / busbw
   through the whole sweep instead, as before, mixed the knee of one op's protocol switches into the links
   of every op: see `TierFit` and the module doc of simdist.calibrate.correction_fit.)
   The links are also told apart from the in-switch reduction (NVLS): simdist.calibrate.tiers.
2. **Collectives.** With those overrides applied, per op the measured time is fitted as
   t = latency + t_model / (bandwidth_factor x efficiency(S)) (t_model: simdist's closed-form prediction, the
   collective NCCL's tuner would pick, simdist.analytic.select), regularised: few knots, efficiency <= 1, the
   achieved rate bounded by the plateau and, on GPU interconnects, non-decreasing with size; above the largest
   measured size the physical model (simdist.calibrate.correction_fit).
3. **Compute.** The roofline's constants are fitted to measured kernels where there are any (``python -m
   validation.kernels``: gemm_peak_efficiency, gemm_knee_dim, memory_efficiency, launch overhead, each from the
   kernels that identify it; simdist.calibrate.kernel_fit), else gemm_peak_efficiency and launch overhead to the
   measured single-GPU MLP training steps (cut ``single`` only: no communication to subtract), see `fit_compute`.
   all_to_all rows with an ``imbalance`` (``python -m validation.moe``: unequal splits) are priced as the uneven
   all_to_all of simdist.collectives.uneven (as a step prices an MoE dispatch) and fitted with the op's other rows.

What a calibration cannot vouch for is said with a `SimdistWarning` (recorded in ``fit.warnings`` too): an op
fitted from fewer than `MIN_SIZES` sizes, measurements of another GPU than the topology's, a link measured
faster than its nominal bandwidth, and (when applied) sizes above the measured range.
"""

from __future__ import annotations

import datetime
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from simdist.calibrate.correction_fit import MIN_SIZES, fit_correction
from simdist.calibrate.devices import device_family, same_device
from simdist.calibrate.fit import mape_pct
from simdist.calibrate.measurements import Measurement
from simdist.collectives.ops import OPS
from simdist.errors import SimdistWarning, SpecError
from simdist.hardware.compute import ComputeEfficiency
from simdist.hardware.topology import Topology
from simdist.predict.price import Adjust
from simdist.spec.calibration import (
    CalibrationSpec,
    CollectiveCalibration,
    CollectiveFit,
    FitInfo,
)
from simdist.spec.gpu import GpuSpec
from simdist.spec.load import Document, read_yaml, validate

__all__ = ["Calibration", "Correction", "Point", "aggregate", "build_cluster", "check_device", "fit_calibration",
           "load_calibration", "predict_points", "split_holdout", "tier_of", "to_yaml"]

from simdist.calibrate.points import (
    PLATEAU_SHARE,
    Point,
    aggregate,
    build_cluster,
    lower_envelope,
    predict_details,
    predict_points,
    split_holdout,
    tier_of,
)
from simdist.calibrate.tiers import fit_tiers


# --------------------------------------------------------------------------- applying a calibration
@dataclass(frozen=True, slots=True)
class Correction:
    """t = latency_s + t_model / (bandwidth_factor x efficiency(S)) for one op, within ``size_range``;
    above it t = latency_s + t_model / above_range_factor (the physical model), with a `SimdistWarning`."""

    latency_s: float
    bandwidth_factor: float
    knots_log2: tuple[float, ...] = ()
    values: tuple[float, ...] = ()
    size_range: tuple[float, float] = (0.0, math.inf)
    above_range_factor: float = 1.0
    op: str = "this op"
    latency_by_ranks: tuple[tuple[int, float], ...] = ()

    def latency_for(self, num_ranks: int | None) -> float:
        """The extra latency per call of a group of ``num_ranks`` (`latency_s` where not measured)."""
        return dict(self.latency_by_ranks).get(num_ranks, self.latency_s) if num_ranks else self.latency_s

    def efficiency(self, nbytes: float) -> float:
        if not self.knots_log2 or nbytes <= 0:
            return 1.0
        return float(np.interp(math.log2(nbytes), self.knots_log2, self.values))  # flat beyond the end knots

    def rate(self, nbytes: float) -> float:
        """The multiplier on the predicted bandwidth at this size."""
        if nbytes > self.size_range[1] * (1 + 1e-9):
            lo, hi = self.size_range
            warnings.warn(SimdistWarning(
                f"{self.op}: sizes above the largest calibrated one ({_bytes(hi)}; fitted on {_bytes(lo)} .. "
                f"{_bytes(hi)}) are predicted by the physical model plus the fitted latency, not extrapolated"),
                stacklevel=3)
            return self.above_range_factor
        return self.bandwidth_factor * self.efficiency(nbytes)

    def time_s(self, predicted_s: float, nbytes: float, num_ranks: int | None = None) -> float:
        return self.latency_for(num_ranks) + predicted_s / self.rate(nbytes)

    @classmethod
    def of(cls, c: CollectiveCalibration, op: str = "this op") -> Correction:
        knots = tuple(math.log2(s) for s in c.efficiency_sizes or ())
        span = (float(c.size_range[0]), float(c.size_range[1])) if c.size_range else (0.0, math.inf)
        by_ranks = tuple(sorted((int(n), float(v)) for n, v in (c.latency_by_ranks or {}).items()))
        return cls(c.latency, c.bandwidth_factor, knots, tuple(c.efficiency or ()), span, c.above_range_factor, op,
                   by_ranks)


def _bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.0f} B"


@dataclass(frozen=True, slots=True)
class Calibration:
    """A loaded calibration file: what `predict_step` and `api.collective` need of it."""

    spec: CalibrationSpec
    source: str
    corrections: dict[str, Correction] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: CalibrationSpec, source: str = "calibration") -> Calibration:
        return cls(spec, source, {op: Correction.of(c, op) for op, c in spec.collectives.items()})

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
            return predicted_s if c is None else c.time_s(predicted_s, nbytes, num_ranks)

        return adjust

    def compute_efficiency(self, gpu: GpuSpec) -> ComputeEfficiency | None:
        from simdist.calibrate.kernel_fit import efficiency_of

        return None if self.spec.compute is None else efficiency_of(gpu, self.spec.compute)

    def check_topology(self, name: str, *, field: str = "--cluster", gpu: GpuSpec | None = None,
                       fitted: str | None = None) -> None:
        """One clear error when this calibration is used on another topology than it was fitted for (``fitted``:
        the name of the topology it names, where it names a file; else its ``topology`` field); a `SimdistWarning`
        naming both when the cluster's ``gpu`` is not the one the measurements ran on."""
        fitted = self.spec.topology if fitted is None else fitted
        if name != fitted:
            raise SpecError(f"calibration {self.source} was fitted for topology '{fitted}', not "
                            f"'{name}'", field=field,
                            fix=f"use a calibration fitted on {name} (simdist calibrate ... --topology {name}) "
                                f"or the cluster {self.spec.topology}")
        if gpu is not None and same_device(self.spec.gpu, gpu) is False:
            warnings.warn(SimdistWarning(
                f"calibration {self.source} was fitted on measurements of {self.spec.gpu}, but the cluster's GPU is "
                f"{gpu.name}: its corrections describe the other GPU's links"), stacklevel=2)

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


def _collective_fits(points: Sequence[Point], predicted: np.ndarray, share: np.ndarray, uncalibrated: np.ndarray,
                     measured: Sequence[Point], *, monotone: bool, seed: int
                     ) -> tuple[dict[str, CollectiveCalibration], dict[str, CollectiveFit], list[str]]:
    cals: dict[str, CollectiveCalibration] = {}
    infos: dict[str, CollectiveFit] = {}
    notes: list[str] = []
    for op in sorted({p.op for p in points}):
        idx = [i for i, p in enumerate(points) if p.op == op]
        pts = [points[i] for i in idx]
        sizes = [p.nbytes for p in pts]
        y = np.array([p.time_s for p in pts])  # the sweep's lower envelope (fitted)
        raw = np.array([measured[i].time_s for i in idx])  # as measured (the errors)
        fit = fit_correction(sizes, predicted[idx], y, share[idx], [p.num_ranks for p in pts], monotone=monotone,
                             seed=seed)
        distinct = len(set(sizes))
        if distinct < MIN_SIZES:
            notes.append(f"{op}: calibrated from {distinct} size(s) ({len(pts)} point(s)); {MIN_SIZES} or more are "
                         "needed to tell a latency from a bandwidth: treat its correction as a rough one")
        cal = CollectiveCalibration(
            latency=_us(fit.latency_s), bandwidth_factor=fit.bandwidth_factor,
            latency_by_ranks={n: _us(v) for n, v in sorted(fit.latency_by_ranks.items())} or None,
            efficiency_sizes=[f"{round(v)} B" for v in fit.knot_sizes] or None,
            efficiency=list(fit.knot_values) or None,
            size_range=[f"{round(v)} B" for v in fit.size_range], above_range_factor=fit.above_range_factor)
        corr = Correction.of(cal, op)
        calibrated = [corr.time_s(xi, p.nbytes, p.num_ranks) for xi, p in zip(predicted[idx], pts, strict=True)]
        cals[op] = cal
        infos[op] = CollectiveFit(points=len(pts), latency_ci=[_us(v) for v in fit.latency_ci],
                                  bandwidth_factor_ci=_interval(*fit.bandwidth_factor_ci),
                                  mape_pct=mape_pct(calibrated, raw),
                                  mape_uncalibrated_pct=mape_pct(uncalibrated[idx], raw))
    return cals, infos, notes


def measured_device(measurements: Sequence[Measurement]) -> str | None:
    """The device(s) the measurements name, joined with ' + ' (None when none does)."""
    names = sorted({m.device for m in measurements if m.device})
    return " + ".join(names) if names else None


def check_device(device: str | None, topology: Topology, *, what: str = "the measurements") -> str | None:
    """A warning line when ``device`` (measured) is not ``topology``'s GPU, else None."""
    if device is None or same_device(device, topology.gpu) is not False:
        return None
    family = device_family(device)
    return (f"{what} ran on {device}, but topology '{topology.spec.name}' has {topology.gpu.name}: a calibration "
            f"fitted across GPUs describes neither (fix: calibrate a topology of the "
            f"{family[0] if family else 'measured'} GPU)")


def fit_calibration(measurements: Sequence[Measurement], topology: str, *, num_nodes: int | None = None,
                    steps: Sequence[Any] = (), holdout: str = "none", seed: int = 0,
                    sources: Sequence[str] = (), kernels: Sequence[Any] = ()) -> CalibrationSpec:
    """Fit a calibration of ``topology`` to collective ``measurements`` (and MLP ``steps``, measured ``kernels``), see
    the module doc.

    ``holdout``: fit on part of the points (`split_holdout`, for kernels `split_kernel_holdout`) and report the
    held-out error in ``fit``. Warnings (module doc) are raised as `SimdistWarning` and recorded in ``fit.warnings``.
    """
    from simdist.calibrate.compute_fit import fit_compute
    from simdist.calibrate.kernel_fit import fit_kernels

    if not measurements and not steps and not kernels:
        raise SpecError("no measurements to fit", field="MEASUREMENTS",
                        fix="pass a measurement CSV, nccl-tests output, an MLP step CSV or a kernel CSV")
    points = aggregate(measurements)
    train, test = split_holdout(points, holdout) if points else ([], [])
    base = build_cluster(topology, points, num_nodes=num_nodes)
    notes: list[str] = []
    device = measured_device([*measurements, *kernels])
    if (mismatch := check_device(device, base)) is not None:
        notes.append(mismatch)
    fit_on = lower_envelope(train)  # interference spikes out (points.lower_envelope); the errors use `train`
    uncal, share = predict_details(base, fit_on)
    overrides, tiers, tier_notes = fit_tiers(base, fit_on, uncal, share, seed)
    tuned = build_cluster(topology, points, num_nodes=num_nodes, overrides=overrides) if overrides else base
    predicted, tuned_share = predict_details(tuned, fit_on)
    # Assumption: on a CPU host the achieved bandwidth may fall with size (caches); elsewhere it never does.
    monotone = (device_family(base.gpu.name) or ("",))[0] != "CPU"
    collectives, infos, op_notes = _collective_fits(fit_on, predicted, tuned_share, uncal, train, monotone=monotone,
                                                    seed=seed) if train else ({}, {}, [])
    notes += tier_notes + op_notes
    kernel_info = None
    if kernels:
        compute, kernel_info = fit_kernels(kernels, base.gpu, holdout=holdout, seed=seed)
        compute_info = None
        notes += kernel_info.notes
        if steps:
            notes.append("compute constants fitted to the measured kernels; the MLP steps were not used for them")
    else:
        compute, compute_info = fit_compute(steps, base.gpu, seed=seed) if steps else (None, None)
    spec = CalibrationSpec(topology=topology, gpu=device, num_nodes=base.num_nodes, overrides=overrides,
                           collectives=collectives, compute=compute)
    info: dict[str, Any] = {
        "points": len(train), "holdout": holdout,
        "sources": sorted(set(sources) or {p.source for p in points} | {k.source for k in kernels}),
        "date": datetime.date.today().isoformat(), "tiers": tiers, "collectives": infos, "compute": compute_info,
        "kernels": kernel_info,
        "method": "tiers: efficiency x median t_model / t_measured over the points where the model is bandwidth-"
                  f"bound (share >= {PLATEAU_SHARE}); collectives: t = latency + t_model / (bandwidth_factor x "
                  "efficiency(S)) inside the measured sizes (knots <= sizes / 2, efficiency <= 1, the achieved rate "
                  "<= the plateau and non-decreasing on GPU links), t = latency + t_model / above_range_factor above; "
                  f"95 % CIs: seeded bootstrap over points (seed {seed}); compute: "
                  + ("measured kernels (simdist.calibrate.kernel_fit)" if kernels else "cut 'single' only"),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimdistWarning)  # the held-out sizes above the range: validate says so
        cal = Calibration.of(spec)
        if train:
            info["mape_pct"] = mape_pct(calibrated_times(cal, tuned, train), [p.time_s for p in train])
            info["mape_uncalibrated_pct"] = mape_pct(uncal, [p.time_s for p in train])
        if test:
            info["heldout_points"] = len(test)
            info["heldout_mape_pct"] = mape_pct(calibrated_times(cal, tuned, test), [p.time_s for p in test])
            info["heldout_mape_uncalibrated_pct"] = mape_pct(predict_points(base, test), [p.time_s for p in test])
    for note in notes:
        warnings.warn(SimdistWarning(note), stacklevel=2)
    info["warnings"] = notes
    return spec.model_copy(update={"fit": FitInfo(**info)})


def calibrated_times(cal: Calibration, tuned: Topology, points: Sequence[Point]) -> np.ndarray:
    """Calibrated predictions of ``points`` on ``tuned`` (the cluster with the calibration's overrides)."""
    model = predict_points(tuned, points)
    out = []
    for t, p in zip(model, points, strict=True):
        c = cal.correction(p.op)
        out.append(t if c is None else c.time_s(float(t), p.nbytes, p.num_ranks))
    return np.asarray(out, dtype=float)
