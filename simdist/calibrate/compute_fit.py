"""Fit the roofline's compute constants to measured MLP training steps (`fit_compute`).

A measured step (simdist.calibrate.steps.StepMeasurement: cut, world_size, num_layers, width,
global_batch, num_microbatches, dtype, time_s, ...) of the cut ``single`` is one process running the
CS336 lecture's MLP (`cs336-mlp` preset, simdist.plan.model_presets, with the row's depth and width):
per micro-batch of global_batch / num_microbatches samples, every layer's forward and backward kernels
(simdist.plan.layer_cost.layer_work). Its predicted time is the roofline sum of those kernels
(simdist.hardware.compute.kernel_time_s):

    t = sum_k max(flops_k / (peak x gemm_peak_efficiency x x_k / (x_k + knee)), bytes_k / (hbm x mem_eff))
        + launch_overhead x kernels

Only the ``single`` cut is fitted: the data-, tensor- and pipeline-parallel cuts include communication
that would have to be predicted and subtracted first, mixing the collective model's error into the
compute constants. gemm_peak_efficiency is found by a grid search (0.01 steps) minimising the mean
|relative error|; for each candidate the launch overhead is the median of the per-row residual per
kernel (robust to a slow row), clamped at 0. With a single (layers, width, batch) shape the two are not
separately identified, so the launch overhead keeps the GPU's default there. CIs: seeded bootstrap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from simdist.errors import SpecError
from simdist.hardware.compute import compute_efficiency, gemm_rate
from simdist.plan.layer_cost import layer_work
from simdist.plan.model_presets import resolve_model
from simdist.spec.calibration import ComputeCalibration, ComputeFit
from simdist.spec.gpu import GpuSpec
from simdist.spec.scenario import ModelSpec

__all__ = ["DTYPES", "fit_compute", "step_kernels"]

DTYPES = {"float32": "fp32", "fp32": "fp32", "float": "fp32", "tf32": "tf32", "bfloat16": "bf16", "bf16": "bf16",
          "float16": "fp16", "fp16": "fp16", "half": "fp16"}
FIT_CUT = "single"
_GRID = np.round(np.arange(0.01, 1.0001, 0.01), 2)


def _precision(step: Any) -> str:
    key = str(step.dtype).lower().removeprefix("torch.")
    if key not in DTYPES:
        raise SpecError(f"unknown dtype '{step.dtype}'", field="dtype", source=getattr(step, "source", None),
                        fix=f"use one of: {', '.join(sorted(DTYPES))}")
    return DTYPES[key]


def step_kernels(step: Any) -> tuple[list, str, int]:
    """(kernels of one micro-batch through every layer, precision, micro-batches) of a measured step."""
    if step.num_microbatches < 1 or step.global_batch % step.num_microbatches:
        raise SpecError(f"global batch {step.global_batch} does not split into {step.num_microbatches} "
                        "micro-batches", field="num_microbatches", source=getattr(step, "source", None),
                        fix="give a num_microbatches dividing global_batch")
    model = resolve_model(ModelSpec(preset="cs336-mlp", num_layers=step.num_layers, hidden_size=step.width,
                                    kind="mlp"))
    precision = _precision(step)
    work = layer_work(model, micro_batch_size=step.global_batch // step.num_microbatches, precision=precision)
    return [*work.forward, *work.backward] * model.num_layers, precision, step.num_microbatches


def _components(steps: Sequence[Any], gpu: GpuSpec, knee: float, mem_eff: float
                ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], np.ndarray]:
    """Per step: GEMM compute seconds at gemm_peak_efficiency 1, other compute, memory seconds; kernel counts."""
    gemm_s, other_s, memory_s, counts = [], [], [], []
    probe = compute_efficiency(gpu)
    unit = type(probe)(1.0, knee, mem_eff, 0.0, fp8_gemm_efficiency_ratio=probe.fp8_gemm_efficiency_ratio)
    for step in steps:
        kernels, precision, micro = step_kernels(step)
        g, o, m = [], [], []
        for k in kernels:
            mem = k.hbm_bytes / (gpu.hbm_bandwidth * mem_eff)
            if k.kind == "memory":
                g.append(0.0)
                o.append(k.flops / gpu.peak_flops("fp32"))
            else:
                g.append(k.flops / gemm_rate(gpu, k, precision, unit))
                o.append(0.0)
            m.append(mem)
        gemm_s.append(np.array(g) * micro)
        other_s.append(np.array(o) * micro)
        memory_s.append(np.array(m) * micro)
        counts.append(len(kernels) * micro)
    return gemm_s, other_s, memory_s, np.array(counts, dtype=float)


def _predict(pe: float, launch: float, comps: tuple) -> np.ndarray:
    gemm_s, other_s, memory_s, counts = comps
    # max per kernel, as simdist.hardware.compute.kernel_time_s; each array already holds micro x kernel time
    return np.array([np.maximum(g / pe + o, m).sum() for g, o, m in zip(gemm_s, other_s, memory_s, strict=True)]) \
        + launch * counts


def _fit(y: np.ndarray, comps: tuple, default_launch: float, identified: bool) -> tuple[float, float, float]:
    best = (np.inf, 1.0, default_launch)
    counts = comps[3]
    for pe in _GRID:
        base = _predict(pe, 0.0, comps)
        launch = max(float(np.median((y - base) / counts)), 0.0) if identified else default_launch
        err = float(np.mean(np.abs(base + launch * counts - y) / y))
        if err < best[0] - 1e-12:
            best = (err, float(pe), launch)
    return best[1], best[2], 100.0 * best[0]


def fit_compute(steps: Sequence[Any], gpu: GpuSpec, *, seed: int = 0, resamples: int = 100
                ) -> tuple[ComputeCalibration, ComputeFit]:
    """gemm_peak_efficiency and launch overhead fitted to the ``single`` cut's measured step times."""
    rows = [s for s in steps if s.cut == FIT_CUT]
    if not rows:
        cuts = sorted({s.cut for s in steps})
        raise SpecError(f"no '{FIT_CUT}' MLP steps to fit compute on (cuts given: {', '.join(cuts)})", field="cut",
                        fix="measure the single-process cut too (python -m validation.mlp ... --cut single)")
    default = compute_efficiency(gpu)
    comps = _components(rows, gpu, default.gemm_knee_dim, default.memory_efficiency)
    y = np.array([s.time_s for s in rows], dtype=float)
    identified = len({(s.num_layers, s.width, s.global_batch, s.num_microbatches) for s in rows}) > 1
    pe, launch, mape = _fit(y, comps, default.launch_overhead_s, identified)
    rng = np.random.default_rng(seed)
    boot_pe, boot_l = [], []
    if len(rows) >= 3:
        for _ in range(resamples):
            idx = rng.integers(0, len(rows), size=len(rows))
            sub = (*tuple([c[i] for i in idx] for c in comps[:3]), comps[3][idx])
            b_pe, b_l, _ = _fit(y[idx], sub, default.launch_overhead_s, identified)
            boot_pe.append(b_pe)
            boot_l.append(b_l)
    uncal = _predict(default.gemm_peak_efficiency, default.launch_overhead_s, comps)

    def ci(values: list[float], point: float) -> list[float]:
        return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))] if values else [point, point]

    cal = ComputeCalibration(gemm_peak_efficiency=pe, launch_overhead=f"{launch / 1e-6:.12g} us")
    info = ComputeFit(points=len(rows), cut=FIT_CUT, gemm_peak_efficiency_ci=ci(boot_pe, pe),
                      launch_overhead_ci=[f"{v / 1e-6:.12g} us" for v in ci(boot_l, launch)], mape_pct=mape,
                      mape_uncalibrated_pct=float(100.0 * np.mean(np.abs(uncal - y) / y)))
    return cal, info
