"""Fit the roofline's compute constants to measured kernels (`fit_kernels`) and predict kernels (`predict_kernels`).

Each measured kernel (simdist.calibrate.kernels.KernelMeasurement, from ``python -m validation.kernels``) is priced
as simdist prices a kernel of a training step (simdist.hardware.compute.kernel_time_s; Williams et al. 2009,
"Roofline", CACM 52(4)):

    t = max(flops / rate, hbm_bytes / (hbm_bandwidth x memory_efficiency)) + launch_overhead
    rate = peak(dtype) x gemm_peak_efficiency x x / (x + gemm_knee_dim) x quantization,   x = min(m, n, k)

(quantization: tile and wave quantization on the GPU's SMs, simdist.hardware.gemm; memory kernels compute at the
fp32 vector rate). Each constant is fitted only from the kernels that identify it:

1. **memory kernels** (norms, element-wise, softmax), where the model is memory-bound: launch_overhead and
   memory_efficiency are the intercept and 1 / slope of t = launch + hbm_bytes / (hbm_bandwidth x
   memory_efficiency), a robust straight line (simdist.calibrate.fit.fit_line: relative residuals, Huber then
   Tukey weights); a slope faster than the nominal bandwidth (caches) is bounded at efficiency 1, with a note.
2. **GEMMs**: gemm_peak_efficiency and gemm_knee_dim by a grid search minimising the mean |relative error| (the
   efficiency in 0.01 steps, the knee on quarter octaves from 1 to 16384 elements) with step 1's launch overhead
   and memory efficiency (without memory kernels, the launch overhead is per candidate the median residual per
   kernel, clamped at 0, as simdist.calibrate.compute_fit does). The knee needs GEMMs of two or more smallest
   dimensions; otherwise the GPU's default knee is kept and said so.
3. **attention** kernels are not fitted: they are predicted with the fitted constants (fused flash/cuDNN kernels
   from their published curves, simdist.hardware.attention; others as batched GEMMs), a check on kernels the fit
   did not see.

Confidence intervals: percentiles of a seeded bootstrap over the kernels (Efron & Tibshirani 1993, ch. 13).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from simdist.calibrate.compute_fit import _precision
from simdist.calibrate.fit import fit_line, mape_pct
from simdist.calibrate.kernels import KERNEL_KINDS, KernelMeasurement, kernel_of
from simdist.errors import SpecError
from simdist.hardware.compute import ComputeEfficiency, compute_efficiency, gemm_rate, kernel_time_s
from simdist.limits import KERNEL_ROWS, check_work
from simdist.spec.calibration import ComputeCalibration, KernelFit, KernelKindFit
from simdist.spec.gpu import GpuSpec

__all__ = ["KNEE_GRID", "efficiency_of", "fit_kernels", "predict_kernels", "split_kernel_holdout"]

_PE_GRID = np.round(np.arange(0.01, 1.0001, 0.01), 2)
KNEE_GRID = tuple(float(2.0 ** (i / 4)) for i in range(0, 57))  # 1 .. 16384 elements, quarter octaves
_RESAMPLES = 100


def efficiency_of(gpu: GpuSpec, cal: ComputeCalibration | None) -> ComputeEfficiency:
    """The GPU's constants with a fitted calibration's laid over them (as simdist.calibrate.calibration applies it)."""
    base = compute_efficiency(gpu)
    if cal is None:
        return base
    launch = base.launch_overhead_s if cal.launch_overhead is None else float(cal.launch_overhead)
    # a fitted memory_efficiency is the rate the machine's own memory kernels reached: every memory-bound kernel runs
    # at it (memory_kernel_share 1, normalisations too), not at a share of it as the stated streaming rates are priced
    memory = {} if cal.memory_efficiency is None else {"memory_efficiency": cal.memory_efficiency,
                                                       "memory_kernel_share": 1.0, "norm_kernel_share": None}
    return replace(base, gemm_peak_efficiency=cal.gemm_peak_efficiency,
                   gemm_knee_dim=base.gemm_knee_dim if cal.gemm_knee_dim is None else cal.gemm_knee_dim,
                   launch_overhead_s=launch, **memory)


def predict_kernels(rows: Sequence[KernelMeasurement], gpu: GpuSpec, eff: ComputeEfficiency | None = None
                    ) -> np.ndarray:
    """simdist's time of each measured kernel with constants ``eff`` (default: the GPU's own)."""
    eff = eff or compute_efficiency(gpu)
    return np.array([kernel_time_s(gpu, kernel_of(r), _precision(r), eff) for r in rows], dtype=float)


def split_kernel_holdout(rows: Sequence[KernelMeasurement], holdout: str
                         ) -> tuple[list[KernelMeasurement], list[KernelMeasurement]]:
    """(fit, held out) per kernel kind, ordered by FLOPs (memory kernels by bytes): ``sizes`` every other one (kinds
    of 4 or more), ``large`` the largest third (kinds of 3 or more); ``none`` and ``ranks`` (kernels have no rank
    count) hold nothing out."""
    if holdout in ("none", "ranks"):
        return list(rows), []
    if holdout not in ("sizes", "large"):
        raise SpecError(f"unknown holdout '{holdout}'", field="--holdout", fix="use one of: none, sizes, large, ranks")
    train, test = [], []
    for kind in KERNEL_KINDS:
        mine = sorted((r for r in rows if r.kernel == kind), key=lambda r: (r.flops or r.hbm_bytes, r.hbm_bytes))
        n = len(mine)
        for i, r in enumerate(mine):
            out = n >= 4 and i % 2 == 1 if holdout == "sizes" else n >= 3 and i >= n - math.ceil(n / 3)
            (test if out else train).append(r)
    return train, test


def _memory_fit(rows: Sequence[KernelMeasurement], gpu: GpuSpec, default: ComputeEfficiency, seed: int,
                notes: list[str]) -> tuple[float, float, list[float] | None, list[float] | None]:
    """(launch_overhead_s, memory_efficiency, their CIs) from the memory kernels (module doc, step 1)."""
    x = np.array([r.hbm_bytes / gpu.hbm_bandwidth for r in rows])
    y = np.array([r.time_s for r in rows])
    if len(set(x.tolist())) < 2:
        launch = default.launch_overhead_s
        me = float(np.median(x / np.maximum(y - launch, 1e-300)))
        notes.append(f"memory kernels of {len(set(x.tolist()))} size only: launch overhead not identified, kept "
                     f"{launch / 1e-6:.3g} us")
        lo = hi = None
    else:
        line = fit_line(x, y, seed=seed)
        launch = max(line.intercept, 0.0)
        me = 1.0 / line.slope if line.slope > 0 else math.inf
        lo = [max(line.intercept_ci[0], 0.0), max(line.intercept_ci[1], 0.0)]
        hi = sorted(min(1.0 / s, 1.0) if s > 0 else 1.0 for s in line.slope_ci)
    if not me <= 1.0:
        notes.append(f"memory kernels ran at {me:.3g}x the nominal {gpu.hbm_bandwidth / 1e9:.4g} GB/s of {gpu.name} "
                     "(served from caches?): memory efficiency bounded at 1; measure buffers larger than the caches")
        me = 1.0
    return launch, me, lo, hi


def _gemm_components(rows: Sequence[KernelMeasurement], gpu: GpuSpec, default: ComputeEfficiency, me: float
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(compute seconds at efficiency 1 per knee of `KNEE_GRID` x row, memory seconds per row)."""
    kernels = [kernel_of(r) for r in rows]
    precisions = [_precision(r) for r in rows]
    compute = np.empty((len(KNEE_GRID), len(rows)))
    for a, knee in enumerate(KNEE_GRID):
        unit = replace(default, gemm_peak_efficiency=1.0, gemm_knee_dim=knee, memory_efficiency=me,
                       launch_overhead_s=0.0)
        compute[a] = [k.flops / gemm_rate(gpu, k, p, unit) for k, p in zip(kernels, precisions, strict=True)]
    memory = np.array([k.hbm_bytes / (gpu.hbm_bandwidth * me) for k in kernels])
    return compute, memory


def _grid(y: np.ndarray, compute: np.ndarray, memory: np.ndarray, launch: float | None, knees: Sequence[int]
          ) -> tuple[float, int, float]:
    """(gemm_peak_efficiency, knee index, launch_s) minimising mean |relative error| (module doc, step 2)."""
    best = (math.inf, 1.0, knees[0], 0.0)
    for a in knees:
        base = np.maximum(compute[a][None, :] / _PE_GRID[:, None], memory[None, :])  # pe x rows
        if launch is None:
            per = np.maximum(np.median(y[None, :] - base, axis=1), 0.0)
        else:
            per = np.full(len(_PE_GRID), launch)
        err = np.mean(np.abs(base + per[:, None] - y[None, :]) / y[None, :], axis=1)
        i = int(np.argmin(err))
        if err[i] < best[0] - 1e-12:
            best = (float(err[i]), float(_PE_GRID[i]), a, float(per[i]))
    return best[1], best[2], best[3]


def _ci(values: list[float], point: float) -> list[float]:
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))] if values else [point, point]


def _per_kind(rows: Sequence[KernelMeasurement], calibrated: np.ndarray, uncalibrated: np.ndarray
              ) -> dict[str, KernelKindFit]:
    y = np.array([r.time_s for r in rows])
    out = {}
    for kind in KERNEL_KINDS:
        idx = [i for i, r in enumerate(rows) if r.kernel == kind]
        if idx:
            out[kind] = KernelKindFit(points=len(idx), mape_pct=mape_pct(calibrated[idx], y[idx]),
                                      mape_uncalibrated_pct=mape_pct(uncalibrated[idx], y[idx]))
    return out


def fit_kernels(rows: Sequence[KernelMeasurement], gpu: GpuSpec, *, holdout: str = "none", seed: int = 0
                ) -> tuple[ComputeCalibration, KernelFit]:
    """Compute constants fitted to the measured kernels (module doc); ``holdout``: fit on part
    (`split_kernel_holdout`), the rest's error in ``heldout_per_kind``."""
    check_work(len(rows), KERNEL_ROWS, what="the measured kernels to fit", field="kernel",
               source=rows[0].source if rows else None,
               fix="fit on fewer kernels (fewer sizes, or one file per device)")
    train, test = split_kernel_holdout(rows, holdout)
    gemms = [r for r in train if r.kernel == "gemm"]
    if not gemms:
        raise SpecError("no GEMM kernels to fit compute on", field="kernel", source=rows[0].source if rows else None,
                        fix="measure GEMMs too (python -m validation.kernels ... --gemm-sizes 64:1024:x2)")
    default = compute_efficiency(gpu)
    notes: list[str] = []
    memory_rows = [r for r in train if r.kernel == "memory"]
    if memory_rows:
        launch, me, launch_ci, me_ci = _memory_fit(memory_rows, gpu, default, seed, notes)
    else:
        launch, me, launch_ci, me_ci = None, default.memory_efficiency, None, None
        notes.append("no memory kernels: memory efficiency kept, launch overhead fitted from the GEMMs")
    y = np.array([r.time_s for r in gemms])
    compute, memory = _gemm_components(gemms, gpu, default, me)
    identified = len({min(r.m or 0, r.n or 0, r.k or 0) for r in gemms}) > 1
    default_knee = int(np.argmin([abs(k - default.gemm_knee_dim) for k in KNEE_GRID]))
    knees = list(range(len(KNEE_GRID))) if identified else [default_knee]
    if not identified:
        notes.append(f"GEMMs of one smallest dimension only: gemm_knee_dim not identified, kept "
                     f"{default.gemm_knee_dim:g}")
    pe, knee_i, fitted_launch = _grid(y, compute, memory, launch, knees)
    if pe >= _PE_GRID[-1]:
        notes.append(f"GEMMs ran at or above {gpu.name}'s peak at efficiency 1 (the top of the fit's range): the "
                     "device's spec understates its peak (e.g. cpu-core's AVX2 figure on a wider-vector host)")
    rng = np.random.default_rng(seed)
    boot_pe, boot_knee, boot_launch = [], [], []
    if len(gemms) >= 3:
        for _ in range(_RESAMPLES):
            idx = rng.integers(0, len(gemms), size=len(gemms))
            b_pe, b_knee, b_launch = _grid(y[idx], compute[:, idx], memory[idx], launch, knees)
            boot_pe.append(b_pe)
            boot_knee.append(KNEE_GRID[b_knee])
            boot_launch.append(b_launch)
    knee = KNEE_GRID[knee_i] if identified else None
    cal = ComputeCalibration(gemm_peak_efficiency=pe, gemm_knee_dim=knee,
                             memory_efficiency=me if memory_rows else None,
                             launch_overhead=f"{fitted_launch / 1e-6:.12g} us")
    eff = efficiency_of(gpu, cal)
    if launch_ci is None and launch is None:
        launch_ci = _ci(boot_launch, fitted_launch)
    info = KernelFit(
        points=len(gemms) + len(memory_rows), per_kind=_per_kind(train, predict_kernels(train, gpu, eff),
                                                                 predict_kernels(train, gpu, default)),
        gemm_peak_efficiency_ci=_ci(boot_pe, pe), gemm_knee_dim_ci=_ci(boot_knee, knee) if knee else None,
        memory_efficiency_ci=me_ci if memory_rows else None,
        launch_overhead_ci=[f"{v / 1e-6:.12g} us" for v in launch_ci] if launch_ci else None,
        heldout_points=len(test),
        heldout_per_kind=_per_kind(test, predict_kernels(test, gpu, eff), predict_kernels(test, gpu, default))
        if test else {}, notes=notes)
    return cal, info
