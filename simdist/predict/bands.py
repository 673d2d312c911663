"""Prediction bands: how sure a step time is, from the model's own stated uncertainty and a calibration's intervals.

The step's assumed efficiencies carry stated ranges (simdist/predict/data/uncertainty.yaml, each with its reason):
a time factor on every compute kernel (by GPU: the GEMMs' share of peak and the launch gap), one on every
memory-bound kernel (by GPU: its share of HBM bandwidth, from kernel timings, docs/accuracy-memory-kernels.md) and
one on every collective (by message size). Each is a split log-normal with median 1 and the stated p10 and p90. A
fourth is the GPUs' speed spread (cluster.gpu_speed_cv, simdist.hardware.variability): a synchronous step runs at
the pace of its slowest GPU, and the spread of the cluster a run lands on is known only as a range (Sinha et al.
2022's average and largest: ``gpu_speed_spread``), so each draw scales the stated spread by a factor of that range
and the step's compute by the slowest GPU's pace at the drawn spread over that at the stated one (`_spread_factors`;
none on one GPU, or where identical GPUs are stated). A fifth is the host's framework time per op
(simdist.hardware.host's dispatch_s: what one op costs the CPU depends on the framework and its version, from a
view's dispatch to a Transformer Engine module's: ``host``), which moves the step where the host sets its pace
(`_host_variants`; none where a CPU core stands in for the device). A Latin-hypercube sample of them (seeded: the
same band on every run) is propagated through the closed form
(simdist.analytic.step.analytic_observables), which reads the same step model as the engine; the band is the
prediction times the p10, p50 and p90 of the sampled step over the nominal closed-form step. The closed form
leaves contention out, so the band is that of the step's compute and communication costs, not of how collectives
share links.

Where a calibration is applied (`simdist run --calibration`, a scenario's ``calibration:``), each constant it
fitted with a confidence interval is sampled from that interval instead (simdist.predict.band_ranges: a split
normal with the interval's ends at -/+1.96 sigma at 95 %), each in its own Latin-hypercube column: the roofline's
gemm_peak_efficiency, gemm_knee_dim, memory_efficiency and launch overhead, and per calibrated collective its
latency and bandwidth factor (sizes up to the largest calibrated). The rest keeps its stated range: compute
constants the calibration did not fit (or fitted without an interval) take the compute time factor
(memory_efficiency the memory-bound one), collectives without a calibrated interval and sizes above an op's
calibrated range the collective time factor of their size.
# Assumption: the compute factor is one for the whole step (a GPU type's GEMMs are all off by the same share of
# peak), so is the memory-bound factor (its element-wise kernels all reach the same share of HBM bandwidth) and the
# communication factor within a size band (a fabric's collectives err together), and the host factor (a
# framework's ops all cost its host alike); the five are independent.
# Assumption: the spread's draw moves every kernel of the compute pieces by its factor (the GEMMs' share of peak,
# the HBM share and the launch gap, as the stated compute factor does), a straggler's stated factor with them.
# Assumption: a calibration's constants are independent of one another and of the stated factors (the bootstrap
# reports each constant's interval alone, not their joint distribution).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from simdist.analytic.step import CommPricer, fast_forward_plan
from simdist.analytic.step_batch import Variant, perturbed_step_s
from simdist.hardware.compute import ComputeEfficiency, compute_efficiency
from simdist.hardware.host import HostOverhead, runs_on_host
from simdist.plan.step_config import StepConfig
from simdist.predict.band_ranges import COMPUTE_CONSTANTS, CalibratedRanges
from simdist.predict.beside import Beside, can_fork
from simdist.predict.stated_ranges import (
    DATA_NAME,
    compute_range,
    host_range,
    memory_range,
    range_key,
    size_factor,
    spread_range,
    time_factor,
    uncertainty,
)

__all__ = ["Band", "BandRatios", "BandWork", "band_of", "band_ratios", "step_band"]

_STATED_COMPUTE = ("gemm_peak_efficiency", "launch_overhead_s")
"""The constants the stated compute time factor moves (the knee is not: the factor is a share of peak)."""
_STATED_MEMORY = "memory_efficiency"
"""The constant the stated memory-bound time factor moves."""


def _normal_quantiles(n: int, rng: np.random.Generator) -> np.ndarray:
    """One standard normal value in each of ``n`` equal-probability strata, shuffled (a Latin-hypercube column)."""
    from statistics import NormalDist

    u = (np.arange(n) + rng.random(n)) / n
    return rng.permutation(np.array([NormalDist().inv_cdf(float(x)) for x in u]))


def _samples(columns: int = 2) -> list[np.ndarray]:
    """``columns`` Latin-hypercube columns of standard normal values: the stated compute and collective factors
    first (the same draws with or without a calibration), then one per calibrated constant (`_columns`), then the
    stated memory-bound factor's, the speed spread's and the host's."""
    data = uncertainty()
    rng = np.random.default_rng(int(data["seed"]))
    n = int(data["samples"])
    return [_normal_quantiles(n, rng) for _ in range(max(columns, 2))]


def _scaled_efficiency(eff: ComputeEfficiency, factor: float, memory_factor: float | None = None
                       ) -> ComputeEfficiency:
    """Kernels ``factor`` x as long: the GEMM share of peak divided by it, launch times it; memory-bound kernels
    ``memory_factor`` x as long (their HBM efficiency divided by it; None: ``factor``)."""
    memory = factor if memory_factor is None else memory_factor
    return dataclasses.replace(eff, gemm_peak_efficiency=eff.gemm_peak_efficiency / factor,
                               memory_efficiency=eff.memory_efficiency / memory,
                               launch_overhead_s=eff.launch_overhead_s * factor)


def _spread_factors(cfg: StepConfig, z: np.ndarray) -> list[float] | None:
    """The compute time factor of each draw ``z`` of the GPUs' speed spread (module doc): the paced variability at
    the stated spread x the drawn factor (`spread_range`) over that at the stated spread; None where no draw moves
    the step (identical GPUs stated, or one GPU priced by constants of one)."""
    from simdist.plan.stage_pace import paced_variabilities

    cv = cfg.gpu_speed_cv
    if not cv:
        return None
    r = spread_range()
    nominal, *drawn = paced_variabilities(cfg, [cv, *(cv * time_factor(x, r["p10"], r["p90"]) for x in z.tolist())])
    factors = [f / nominal for f in drawn]
    return factors if any(abs(f - 1.0) > 1e-12 for f in factors) else None


def _host_variants(cfg: StepConfig, z: np.ndarray) -> list[HostOverhead] | None:
    """The step's host costs at each draw ``z`` of the host's framework time per op: its ``dispatch_s`` x the stated
    factor (`host_range`), the launch and the step gap as they are; None where the step has no framework dispatch to
    vary (a CPU core standing in for a device runs its ops on the host, their time in its compute constants)."""
    host = cfg.host_overhead
    if runs_on_host(cfg.gpu) or host.dispatch_s <= 0:
        return None
    r = host_range()
    return [dataclasses.replace(host, dispatch_s=host.dispatch_s * time_factor(x, r["p10"], r["p90"]))
            for x in z.tolist()]


def _columns(ranges: CalibratedRanges | None, calibrated_compute: bool) -> list[tuple[str, str]]:
    """The calibrated constants sampled, in column order after the two stated ones: (op or "compute", name)."""
    if ranges is None:
        return []
    out = [("compute", name) for name in COMPUTE_CONSTANTS if calibrated_compute and name in ranges.compute]
    for op, c in ranges.collectives.items():
        out += [(op, name) for name, i in (("latency", c.latency), ("bandwidth_factor", c.bandwidth_factor))
                if i is not None]
    return out


def _compute_variant(eff: ComputeEfficiency, factor: float, memory_factor: float, ranges: CalibratedRanges | None,
                     z: dict[tuple[str, str], float]) -> ComputeEfficiency:
    """``eff`` with each calibrated constant at its sampled value and the others moved by the stated ``factor``
    (memory_efficiency by ``memory_factor``)."""
    if ranges is None or not any(key[0] == "compute" for key in z):
        return _scaled_efficiency(eff, factor, memory_factor)
    stated = {"gemm_peak_efficiency": eff.gemm_peak_efficiency / factor,
              "memory_efficiency": eff.memory_efficiency / memory_factor,
              "launch_overhead_s": eff.launch_overhead_s * factor, "gemm_knee_dim": eff.gemm_knee_dim}
    values = {}
    for name in COMPUTE_CONSTANTS:
        interval = ranges.compute.get(name)
        own = getattr(eff, name)
        if interval is None or ("compute", name) not in z:
            values[name] = stated[name]
        elif interval.value > 0:  # relative to the calibrated constant (the same number where they agree)
            values[name] = own * interval.at(z["compute", name]) / interval.value
        else:
            values[name] = own + interval.at(z["compute", name])
    return dataclasses.replace(eff, **values)


def _comm_variant(z_stated: float, ranges: CalibratedRanges | None, z: dict[tuple[str, str], float],
                  used: set[str]) -> Callable[[str, int, float, float], float]:
    """(op, ranks, bytes, t) -> the sampled time: calibrated ops' constants at their draws (simdist.predict.band_ranges
    CollectiveRanges.time_s), every other collective x the stated factor of its size; ``used``: the calibrated ops
    the step priced."""
    by_size = size_factor(z_stated)
    calibrated = ranges.collectives if ranges is not None else {}

    def time_of(op: str, num_ranks: int, nbytes: float, t: float) -> float:
        c = calibrated.get(op)
        if c is None:
            return t * by_size(nbytes)
        if nbytes <= c.max_bytes * (1 + 1e-9):
            used.add(op)
        return c.time_s(t, num_ranks, nbytes, z.get((op, "latency"), 0.0), z.get((op, "bandwidth_factor"), 0.0),
                        by_size(nbytes))

    return time_of


@dataclass(frozen=True, slots=True)
class Band:
    """A step's prediction band: ``band`` (p10, p50, p90 seconds: the JSON's ``step_time_band_s``), ``how`` it was
    obtained (one paragraph: ``step_time_band_how``) and per source of uncertainty what was sampled and from where
    (``sources``: ``step_time_band_sources``)."""

    band: dict[str, float]
    how: str
    sources: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class BandRatios:
    """A step's band relative to its prediction (`band_ratios`): p10, p50 and p90 of the sampled step times over the
    nominal one (None: no step time to perturb), ``how`` and ``sources`` as `Band`'s."""

    ratios: tuple[float, float, float] | None
    how: str
    sources: list[dict[str, Any]]

    def around(self, step_s: float) -> Band:
        """The band around the prediction ``step_s``."""
        if self.ratios is None:
            return Band({"p10": step_s, "p50": step_s, "p90": step_s}, self.how, self.sources)
        p10, p50, p90 = self.ratios
        return Band({"p10": step_s * p10, "p50": step_s * p50, "p90": step_s * p90}, self.how, self.sources)


def band_of(cfg: StepConfig, pricer: CommPricer, step_s: float,
            plan: tuple[int, int, int, int] | bool | None = False, ranges: CalibratedRanges | None = None) -> Band:
    """The band of the step around the prediction ``step_s`` (module doc): `band_ratios` around it."""
    return band_ratios(cfg, pricer, plan, ranges).around(step_s)


def band_ratios(cfg: StepConfig, pricer: CommPricer, plan: tuple[int, int, int, int] | bool | None = False,
                ranges: CalibratedRanges | None = None) -> BandRatios:
    """The band of the step relative to its prediction (module doc); ``ranges``: the applied calibration's
    intervals (simdist.predict.band_ranges.calibrated_ranges), None: the stated ranges only.

    The nominal step and the sampled ones are timed together in one pass (simdist.analytic.step_batch), each
    fast-forwarded along its own cycle. Where they cannot share a pass, each is timed alone on ``plan``'s samples:
    the `simdist.analytic.step.fast_forward_plan` of ``cfg`` for the engine (its cycle detected once for all of them;
    None: none, each closed form then decides its own; False: detect it there).
    """
    eff = cfg.compute_efficiency or compute_efficiency(cfg.gpu)
    crange, mrange = compute_range(cfg.gpu.name), memory_range(cfg.gpu.name)
    columns = _columns(ranges, cfg.compute_efficiency is not None)
    # the memory-bound factor's column comes after the calibrated ones, the spread's and the host's last: the others
    # keep the draws they have without them
    zc, zn, *drawn, zm, zs, zh = _samples(5 + len(columns))
    spread = _spread_factors(cfg, zs)
    hosts = _host_variants(cfg, zh)
    used: set[str] = set()
    variants = []
    for i, (a, b, m) in enumerate(zip(zc.tolist(), zn.tolist(), zm.tolist(), strict=True)):
        z = {key: float(col[i]) for key, col in zip(columns, drawn, strict=True)}
        variant = _compute_variant(eff, time_factor(a, crange["p10"], crange["p90"]),
                                   time_factor(m, mrange["p10"], mrange["p90"]), ranges, z)
        if spread is not None:
            variant = _scaled_efficiency(variant, spread[i])
        variants.append(Variant(variant, _comm_variant(b, ranges, z, used), hosts[i] if hosts else None))
    base, steps = perturbed_step_s(cfg, pricer, variants, plan=plan)
    if not base > 0:
        return BandRatios(None, "no step time to perturb", [])
    ratios = (steps / base).tolist()
    p10, p50, p90 = np.quantile(np.asarray(ratios), [0.1, 0.5, 0.9]).tolist()
    how, sources = _describe(cfg, pricer, ranges, columns, used, len(ratios), spread is not None, bool(hosts))
    return BandRatios((p10, p50, p90), how, sources)


class BandWork:
    """A step's `band_ratios`, computed in a child process beside the engine where the machine has a CPU to spare
    (simdist.predict.beside), else when asked for: the same ratios either way. The child starts at once and reads
    the engine's fast-forward plan itself (`simdist.analytic.step.fast_forward_plan`, as `engine_step` does: the same
    plan, while the engine's process finds it too, a CPU being free then); `ratios` takes the child's answer where
    the engine's step used that plan."""

    def __init__(self, cfg: StepConfig, pricer: CommPricer, ranges: CalibratedRanges | None, *,
                 fast_forward: bool) -> None:
        self._cfg, self._pricer, self._ranges = cfg, pricer, ranges
        forked = can_fork()
        # niced: the band is asked for last, after the engine's two processes, which go first where CPUs are short
        self._job = (Beside(partial(_planned_ratios, cfg, pricer, ranges, fast_forward, forked), nice=5)
                     if forked else None)

    def ratios(self, plan: tuple[int, int, int, int] | bool) -> BandRatios:
        """The band's ratios on ``plan`` (the engine's answer's fast-forward plan: False where it had none)."""
        job, self._job = self._job, None
        if job is not None:
            with job:
                found, ratios = job.result(None)
            if found == plan:
                return ratios
        return band_ratios(self._cfg, self._pricer, plan, self._ranges)


def _planned_ratios(cfg: StepConfig, pricer: CommPricer, ranges: CalibratedRanges | None, fast_forward: bool,
                    beside: bool) -> tuple[tuple[int, int, int, int] | bool, BandRatios]:
    """(the engine's fast-forward plan of ``cfg``, False where none: `engine_step`'s, whose samples run ``beside``;
    the band's ratios on it)."""
    found = fast_forward_plan(cfg, pricer, for_engine=True, beside=beside) if fast_forward else None
    plan = found if found is not None else False
    return plan, band_ratios(cfg, pricer, plan, ranges)


def step_band(cfg: StepConfig, pricer: CommPricer, step_s: float,
              plan: tuple[int, int, int, int] | bool | None = False, ranges: CalibratedRanges | None = None
              ) -> tuple[dict[str, float], str]:
    """(``step_time_band_s``: p10, p50, p90 of the step around the prediction ``step_s``, how it was obtained): see
    `band_of`."""
    b = band_of(cfg, pricer, step_s, plan, ranges)
    return b.band, b.how


# --------------------------------------------------------------------------- how the band was obtained
def _describe(cfg: StepConfig, pricer: CommPricer, ranges: CalibratedRanges | None, columns: list[tuple[str, str]],
              used: set[str], n: int, spread: bool = False, host: bool = False) -> tuple[str, list[dict[str, Any]]]:
    """(``step_time_band_how``, ``step_time_band_sources``) of a band sampled over ``columns`` (`_columns`); a
    calibrated op counts where the step priced it (``used``); ``spread``: the GPUs' speed spread was drawn too;
    ``host``: the host's framework time per op too."""
    data = uncertainty()
    crange, mrange = compute_range(cfg.gpu.name), memory_range(cfg.gpu.name)
    gpu_key, memory_key = range_key("compute", cfg.gpu.name), range_key("memory", cfg.gpu.name)
    sampled = [(op, name) for op, name in columns if op == "compute" or op in used]
    stated_compute = [name for name in _STATED_COMPUTE if ("compute", name) not in sampled]
    stated_memory = ("compute", _STATED_MEMORY) not in sampled
    sources: list[dict[str, Any]] = []
    intervals = []
    for op, name in sampled:
        assert ranges is not None  # columns come from the ranges
        interval = ranges.compute[name] if op == "compute" else getattr(ranges.collectives[op], name)
        intervals.append((op, name, interval))
        entry: dict[str, Any] = {"part": "compute" if op == "compute" else "collective",
                                 "constant": "latency_s" if name == "latency" else name,
                                 "method": "calibration_ci", "source": ranges.source,
                                 "interval": interval.as_dict(), "scale": "log" if interval.log else "linear"}
        if op != "compute":
            entry.update(op=op, max_bytes=_finite(ranges.collectives[op].max_bytes))
        sources.append(entry)
    without = list(ranges.without_interval) if ranges is not None else []
    if stated_compute:
        entry = {"part": "compute", "constant": "kernel time factor", "applies_to": stated_compute,
                 "method": "stated_range", "source": f"{DATA_NAME} (compute.{gpu_key})",
                 "p10": crange["p10"], "p90": crange["p90"]}
        others = [n for n in without if n != _STATED_MEMORY]
        if others:  # why a fitted constant is here: the calibration gave it no interval of any width
            entry["calibrated_without_interval"] = others
        sources.append(entry)
    if stated_memory:
        entry = {"part": "memory", "constant": "memory-bound kernel time factor", "applies_to": [_STATED_MEMORY],
                 "method": "stated_range", "source": f"{DATA_NAME} (memory.{memory_key})",
                 "p10": mrange["p10"], "p90": mrange["p90"]}
        if _STATED_MEMORY in without:
            entry["calibrated_without_interval"] = [_STATED_MEMORY]
        sources.append(entry)
    comm_sampled = any(op != "compute" for op, _ in sampled)
    sources.append({"part": "collective", "constant": "collective time factor", "method": "stated_range",
                    "source": f"{DATA_NAME} (communication)",
                    "applies_to": "collectives without a calibrated interval, and sizes above an op's calibrated "
                                  "range" if comm_sampled else "every collective",
                    "by_max_bytes": [{"max_bytes": _finite(float(b["max_bytes"])), "p10": b["p10"], "p90": b["p90"]}
                                     for b in data["communication"]]})
    head = f"closed form sampled {n} times (Latin hypercube, seed {data['seed']})"
    tail = "; band = prediction x sampled / nominal closed-form step"
    if spread:
        srange, cv = spread_range(), cfg.gpu_speed_cv
        sources.append({"part": "compute", "constant": "GPU speed spread factor", "applies_to": ["gpu_speed_cv"],
                        "method": "stated_range", "source": f"{DATA_NAME} (gpu_speed_spread)",
                        "p10": srange["p10"], "p90": srange["p90"],
                        "gpu_speed_cv": {"p10": cv * srange["p10"], "p50": cv, "p90": cv * srange["p90"]}})
        tail = (f", the GPUs' speed spread x {srange['p10']}-{srange['p90']} (p10-p90: gpu_speed_cv "
                f"{cv * srange['p10']:.3g}-{cv * srange['p90']:.3g}, the slowest GPU's pace at each){tail}")
    if host:
        hrange, dispatch = host_range(), cfg.host_overhead.dispatch_s
        sources.append({"part": "host", "constant": "framework time per op factor", "applies_to": ["dispatch_s"],
                        "method": "stated_range", "source": f"{DATA_NAME} (host)",
                        "p10": hrange["p10"], "p90": hrange["p90"],
                        "dispatch_s": {"p10": dispatch * hrange["p10"], "p50": dispatch,
                                       "p90": dispatch * hrange["p90"]}})
        tail = (f", the host's framework time per op x {hrange['p10']}-{hrange['p90']} (p10-p90: dispatch "
                f"{dispatch * hrange['p10'] * 1e6:.3g}-{dispatch * hrange['p90'] * 1e6:.3g} us, the launch held)"
                f"{tail}")
    compute_text = f"compute time x {crange['p10']}-{crange['p90']} (p10-p90, {gpu_key})"
    memory_text = f"memory-bound kernel time x {mrange['p10']}-{mrange['p90']} (p10-p90, {memory_key})"
    if ranges is None or not sampled:
        calibrated = " (around the calibrated constants)" if cfg.compute_efficiency is not None or pricer.adjust \
            else ""
        missing = f"; no calibration interval (zero width or absent) for {', '.join(without)}" if without else ""
        return (f"{head} over the stated ranges of {DATA_NAME}{calibrated}: {compute_text}, {memory_text}, "
                f"collective time by message size{missing}{tail}"), sources
    missing = f" (no calibration interval, zero width or absent, for {', '.join(without)})" if without else ""
    fitted = ", ".join(f"{name if op == 'compute' else f'{op} {name}'} [{i.low:.4g}, {i.high:.4g}]"
                       for op, name, i in intervals)
    rest = [f"{compute_text} on {', '.join(stated_compute)}"] if stated_compute else []
    if stated_memory:
        rest.append(memory_text)
    rest.append("collective time by message size for "
                + ("the other collectives and sizes above an op's calibrated range" if comm_sampled else
                   "every collective"))
    return (f"{head}, each source its own column: the {ranges.confidence:.0%} confidence intervals of calibration "
            f"{ranges.source} for {fitted} (split normal: the fitted value its median, the interval's ends at "
            f"-/+{intervals[0][2].z:.2f} sigma; rates on the log scale), the stated ranges of {DATA_NAME} for the "
            f"rest: {'; '.join(rest)}{missing}{tail}"), sources


def _finite(nbytes: float) -> float | None:
    """A size bound for JSON: None for no bound (JSON has no infinity)."""
    return nbytes if math.isfinite(nbytes) else None
