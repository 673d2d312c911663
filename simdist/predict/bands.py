"""Prediction bands: how sure a step time is, from the model's own stated uncertainty.

The step's assumed efficiencies carry stated ranges (simdist/predict/data/uncertainty.yaml, each with its reason):
a time factor on every compute kernel (by GPU) and one on every collective (by message size). Each is a split
log-normal with median 1 and the stated p10 and p90. A Latin-hypercube sample of both (seeded: the same band on
every run) is propagated through the closed form (simdist.analytic.step.analytic_observables), which reads the
same step model as the engine; the band is the prediction times the p10, p50 and p90 of the sampled step over
the nominal closed-form step. The closed form leaves contention out, so the band is that of the step's compute
and communication costs, not of how collectives share links.
# Assumption: the compute factor is one for the whole step (a GPU type's kernels are all off by the same share
# of peak) and so is the communication factor within a size band (a fabric's collectives err together); compute
# and communication errors are independent.
"""

from __future__ import annotations

import dataclasses
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from simdist.analytic.step import CommPricer
from simdist.analytic.step_batch import perturbed_step_s
from simdist.hardware.compute import ComputeEfficiency, compute_efficiency
from simdist.plan.step_config import StepConfig

DATA = Path(__file__).parent / "data" / "uncertainty.yaml"
Z90 = 1.2815515655446004
"""The standard normal's 90th percentile: a log-normal factor with p90 = x has sigma = ln x / Z90."""


@lru_cache(maxsize=1)
def uncertainty() -> dict[str, Any]:
    """The data file (simdist/predict/data/uncertainty.yaml)."""
    return yaml.safe_load(DATA.read_text(encoding="utf-8"))


def _factor(z: float, p10: float, p90: float) -> float:
    """A split log-normal time factor at standard normal ``z``: median 1, p10 and p90 as given."""
    return math.exp(z * (math.log(p90) if z >= 0 else -math.log(p10)) / Z90)


def _normal_quantiles(n: int, rng: np.random.Generator) -> np.ndarray:
    """One standard normal value in each of ``n`` equal-probability strata, shuffled (a Latin-hypercube column)."""
    from statistics import NormalDist

    u = (np.arange(n) + rng.random(n)) / n
    return rng.permutation(np.array([NormalDist().inv_cdf(float(x)) for x in u]))


def _samples() -> tuple[np.ndarray, np.ndarray]:
    data = uncertainty()
    rng = np.random.default_rng(int(data["seed"]))
    n = int(data["samples"])
    return _normal_quantiles(n, rng), _normal_quantiles(n, rng)


def _scaled_efficiency(eff: ComputeEfficiency, factor: float) -> ComputeEfficiency:
    """Kernels ``factor`` x as long: the GEMM share of peak and HBM efficiency divided by it, launch times it."""
    return dataclasses.replace(eff, gemm_peak_efficiency=eff.gemm_peak_efficiency / factor,
                               memory_efficiency=eff.memory_efficiency / factor,
                               launch_overhead_s=eff.launch_overhead_s * factor)


def compute_range(gpu_name: str) -> dict[str, Any]:
    table = uncertainty()["compute"]
    return table.get(gpu_name, table["default"])


def _comm_factor(z: float):
    bands = uncertainty()["communication"]

    def factor(nbytes: float) -> float:
        for b in bands:
            if nbytes < float(b["max_bytes"]):
                return _factor(z, b["p10"], b["p90"])
        return _factor(z, bands[-1]["p10"], bands[-1]["p90"])

    return factor


def step_band(cfg: StepConfig, pricer: CommPricer, step_s: float,
              plan: tuple[int, int, int, int] | bool | None = False) -> tuple[dict[str, float], str]:
    """(``step_time_band_s``: p10, p50, p90 of the step around the prediction ``step_s``, how it was obtained).

    The nominal step and the sampled ones are timed together in one pass (simdist.analytic.step_batch), each
    fast-forwarded along its own cycle. Where they cannot share a pass, each is timed alone on ``plan``'s samples:
    the `simdist.analytic.step.fast_forward_plan` of ``cfg`` for the engine (its cycle detected once for all of them;
    None: none, each closed form then decides its own; False: detect it there).
    """
    eff = cfg.compute_efficiency or compute_efficiency(cfg.gpu)
    crange = compute_range(cfg.gpu.name)
    zc, zn = _samples()
    variants = [(_scaled_efficiency(eff, _factor(a, crange["p10"], crange["p90"])), _comm_factor(b))
                for a, b in zip(zc.tolist(), zn.tolist(), strict=True)]
    base, steps = perturbed_step_s(cfg, pricer, variants, plan=plan)
    if not base > 0:
        return {"p10": step_s, "p50": step_s, "p90": step_s}, "no step time to perturb"
    ratios = (steps / base).tolist()
    p10, p50, p90 = np.quantile(np.asarray(ratios), [0.1, 0.5, 0.9]).tolist()
    calibrated = " (around the calibrated constants)" if cfg.compute_efficiency is not None or pricer.adjust else ""
    how = (f"closed form sampled {len(ratios)} times (Latin hypercube, seed {uncertainty()['seed']}) over the stated "
           f"ranges of simdist/predict/data/uncertainty.yaml{calibrated}: compute time x {crange['p10']}-"
           f"{crange['p90']} (p10-p90, {cfg.gpu.name if cfg.gpu.name in uncertainty()['compute'] else 'default'}),"
           " collective time by message size; band = prediction x sampled / nominal closed-form step")
    return {"p10": step_s * p10, "p50": step_s * p50, "p90": step_s * p90}, how
