"""Calibration files (``simdist calibrate ... --out cal.yaml``): measured corrections of a topology preset.

A calibration file is YAML with these sections (``simdist schema calibration`` prints the JSON schema)::

    topology: dgx-h100                 # the preset it was fitted for; using it on another cluster is an error
    gpu: NVIDIA H100 80GB HBM3         # the device the measurements ran on; another GPU warns, naming both
    num_nodes: 1                       # nodes of the fitted cluster (informational)
    overrides:                         # topology fields laid over the preset (units as in topologies/*.yaml)
      scale_up: {efficiency: 0.81}     #   one efficiency per link tier the measurements crossed:
      inter_node: {efficiency: 0.93}   #   scale_up (NVLink), host.pcie (PCIe-only boxes), inter_node (network)
    collectives:                       # per op, a correction of simdist's prediction t_model (seconds):
      all_reduce:                      #   t = latency + t_model / (bandwidth_factor x efficiency(size))
        latency: 12.5 us               #   latency the model misses (host launch, proxy threads)
        latency_by_ranks: {2: 0.3 ms, 4: 6 ms}   # optional: per measured rank count (gloo ranks sharing cores)
        bandwidth_factor: 0.93         #   multiplier on the predicted bandwidth
        efficiency_sizes: [1048576 B, 16777216 B]   # optional size-dependent efficiency: knots (bytes) ...
        efficiency: [0.71, 0.97]       #   ... and values in (0, 1], linear in log2(size) between knots
        size_range: [32768 B, 268435456 B]   # the sizes measured: below, the smallest size's correction holds;
        above_range_factor: 1.0        #   above, t = latency + t_model / above_range_factor (the physical model)
    compute:                           # roofline constants of simdist.hardware.compute (absent: the defaults)
      gemm_peak_efficiency: 0.64       #   from measured kernels (validation.kernels: also gemm_knee_dim,
      launch_overhead: 4 us            #   memory_efficiency) or the single-process MLP step
    fit: {...}                         # informational: points, MAPE, confidence intervals, sources, date

Applied by ``simdist run/collective --calibration cal.yaml`` or a scenario's ``calibration:`` field: the
overrides go to the cluster, the collective corrections to every priced collective, the compute constants
to every kernel (simdist.calibrate.calibration).
"""

from __future__ import annotations

import itertools
from typing import Any

from pydantic import Field, field_validator, model_validator

from simdist.limits import CORRECTION_MAX, CORRECTION_MIN
from simdist.spec.base import AnyBandwidth, ByteSize, Count, Duration, Fraction, Latency, Spec, bounded
from simdist.spec.topology import TopologySpec

Factor = bounded(CORRECTION_MIN, CORRECTION_MAX, "factor")
"""A calibration's multiplier on a modelled rate: within 1000x of the model either way (simdist.limits)."""


class CollectiveCalibration(Spec):
    """Correction of one collective op: t = latency + t_model / (bandwidth_factor x efficiency(size))."""

    latency: Latency = Field(description="extra latency per call, added to the predicted time")
    latency_by_ranks: dict[int, Latency] | None = Field(
        default=None, description="extra latency per call at each measured rank count (ranks that are processes "
                                  "sharing cores pay more per call in larger groups); other counts take `latency`")
    bandwidth_factor: Factor = Field(description="multiplier on the predicted bandwidth (1 = as predicted), within "
                                                 "1000x either way")
    efficiency_sizes: list[ByteSize] | None = Field(
        default=None, description="sizes (nccl-tests bytes, increasing) of the size-dependent efficiency knots")
    efficiency: list[float] | None = Field(
        default=None, description="efficiency at each knot, in (0, 1]: the share of bandwidth_factor x the predicted "
                                  "bandwidth reached at that size; linear in log2(size) between knots, the end value "
                                  "beyond them (within size_range)")
    size_range: list[ByteSize] | None = Field(
        default=None, description="[smallest, largest] size measured: above the largest the correction falls back to "
                                  "the physical model (latency + t_model / above_range_factor), with a warning")
    above_range_factor: Factor = Field(
        default=1.0, description="multiplier on the predicted bandwidth above size_range: the measured "
                                         "plateau's when the sweep reached the bandwidth-bound regime, else 1")

    @model_validator(mode="after")
    def _knots(self) -> CollectiveCalibration:
        sizes, values = self.efficiency_sizes, self.efficiency
        if (sizes is None) != (values is None):
            raise ValueError("give efficiency_sizes and efficiency together")
        if sizes is not None and values is not None:
            if len(sizes) != len(values) or not sizes:
                raise ValueError(f"{len(sizes)} efficiency_sizes but {len(values)} efficiency values")
            if any(b <= a for a, b in itertools.pairwise(sizes)) or sizes[0] <= 0:
                raise ValueError("efficiency_sizes must be positive and increasing")
            if any(not CORRECTION_MIN.value <= v <= 1.0 for v in values):
                raise ValueError(f"efficiency values must be in [{CORRECTION_MIN.value:g}, 1] "
                                 f"({CORRECTION_MIN.reason}; a file from an older simdist: fit it again with "
                                 "simdist calibrate)")
        if self.size_range is not None and (len(self.size_range) != 2 or not 0 < self.size_range[0]
                                            <= self.size_range[1]):
            raise ValueError("size_range must be [smallest, largest] measured size, both positive")
        return self


class ComputeCalibration(Spec):
    """Roofline constants (simdist.hardware.compute.ComputeEfficiency); absent ones keep the GPU's defaults."""

    gemm_peak_efficiency: Fraction = Field(description="share of the dense peak large GEMMs reach (the plateau)")
    gemm_knee_dim: float | None = Field(default=None, gt=0.0, le=1e6,
                                        description="GEMM dimension at half the plateau (at most 10^6)")
    memory_efficiency: Fraction | None = Field(default=None, description="share of the HBM bandwidth "
                                                                        "memory-bound kernels reach")
    launch_overhead: Latency | None = Field(default=None, description="per kernel launch and tail")


class TierFit(Spec):
    """One op on one link tier (informational): its latency alpha (the median measured time where the model is
    latency-bound: its bytes under 10 % of its time), the busbw measured where the model is bandwidth-bound,
    which sets the tier's efficiency, and the uncalibrated prediction's error on the series (mape_pct)."""

    tier: str = Field(description="the link tier: scale_up, pcie or inter_node")
    op: str = Field(description="the collective op fitted")
    num_ranks: Count = Field(description="ranks of the fitted measurements")
    points: Count = Field(description="measured points fitted")
    alpha: Duration = Field(description="fitted latency")
    alpha_ci: list[Duration] = Field(description="its confidence interval [low, high]")
    busbw: AnyBandwidth = Field(description="measured busbw where the model is bandwidth-bound (median over "
                                            "plateau_points), else the largest measured busbw (a lower bound)")
    busbw_ci: list[AnyBandwidth] = Field(description="its confidence interval [low, high]")
    model_busbw: AnyBandwidth = Field(description="the uncalibrated prediction's busbw at the same points")
    plateau_points: int = Field(default=0, ge=0, description="points where the model is bandwidth-bound (latency, "
                                                             "protocol and pipeline terms under 2 %); 0: none measured")
    efficiency_before: Fraction | None = Field(default=None, description="the tier's efficiency in the preset")
    efficiency_after: Fraction | None = Field(default=None, description="the tier's fitted efficiency")
    mape_pct: float = Field(description="mean absolute percentage error of the fit, %")


class CollectiveFit(Spec):
    """How one op's correction was fitted (informational)."""

    points: Count = Field(description="measured points fitted")
    latency_ci: list[Duration] = Field(description="confidence interval [low, high] of the latency")
    bandwidth_factor_ci: list[float] = Field(description="confidence interval [low, high] of the bandwidth factor")
    mape_pct: float = Field(description="calibrated prediction vs the fitted points, %")
    mape_uncalibrated_pct: float = Field(description="the preset's prediction vs the same points, %")


class ComputeFit(Spec):
    """How the compute constants were fitted (informational)."""

    points: Count = Field(description="measured training steps fitted")
    cut: str = Field(description="which measured training steps were fitted")
    gemm_peak_efficiency_ci: list[float] = Field(description="confidence interval [low, high]")
    launch_overhead_ci: list[Duration] = Field(description="confidence interval [low, high]")
    mape_pct: float = Field(description="calibrated prediction vs the fitted steps, %")
    mape_uncalibrated_pct: float = Field(description="uncalibrated prediction vs the same steps, %")


class KernelKindFit(Spec):
    """The fit's error on one kind of measured kernel (informational)."""

    points: Count = Field(description="measured kernels of this kind")
    mape_pct: float = Field(description="calibrated prediction vs the measured kernels, %")
    mape_uncalibrated_pct: float = Field(description="the GPU's default constants vs the same kernels, %")


class KernelFit(Spec):
    """How the compute constants were fitted to measured kernels (simdist.calibrate.kernel_fit; informational)."""

    points: Count = Field(description="measured kernels fitted (GEMM and memory rows; attention rows are checked)")
    per_kind: dict[str, KernelKindFit] = Field(default_factory=dict, description="error per kernel kind (gemm, "
                                                                                 "attention, memory)")
    gemm_peak_efficiency_ci: list[float] = Field(description="confidence interval [low, high]")
    gemm_knee_dim_ci: list[float] | None = Field(default=None, description="confidence interval [low, high]; "
                                                                           "None: not identified (kept)")
    memory_efficiency_ci: list[float] | None = Field(default=None, description="confidence interval [low, high]; "
                                                                               "None: no memory kernels")
    launch_overhead_ci: list[Duration] | None = Field(default=None, description="confidence interval [low, high]")
    heldout_points: int = Field(default=0, ge=0, description="kernels held out of the fit")
    heldout_per_kind: dict[str, KernelKindFit] = Field(default_factory=dict,
                                                       description="the held-out kernels' error per kind")
    notes: list[str] = Field(default_factory=list, description="what the fit could not identify or had to bound")


class FitInfo(Spec):
    """Where a calibration came from and how well it fits (not used when applying it)."""

    points: int = Field(default=0, description="measured points fitted")
    mape_pct: float | None = Field(default=None, description="calibrated prediction vs the fitted points, %")
    mape_uncalibrated_pct: float | None = Field(default=None, description="uncalibrated, the same points, %")
    holdout: str = Field(default="none", description="which points were held out of the fit")
    heldout_points: int = Field(default=0, description="points held out")
    heldout_mape_pct: float | None = Field(default=None, description="calibrated prediction vs the held-out "
                                                                     "points, %")
    heldout_mape_uncalibrated_pct: float | None = Field(default=None, description="uncalibrated, the held-out "
                                                                                  "points, %")
    confidence: float = Field(default=0.95, description="confidence level of the intervals")
    sources: list[str] = Field(default_factory=list, description="the measurement files")
    date: str = Field(default="", description="when the fit was made")
    method: str = Field(default="", description="how the fit was made")
    tiers: list[TierFit] = Field(default_factory=list, description="the alpha-beta fit per tier and op")
    collectives: dict[str, CollectiveFit] = Field(default_factory=dict, description="the fit per collective op")
    compute: ComputeFit | None = Field(default=None, description="the compute fit, if steps were measured")
    kernels: KernelFit | None = Field(default=None, description="the compute fit, if kernels were measured "
                                                                "(python -m validation.kernels)")
    warnings: list[str] = Field(default_factory=list, description="what the fit warned about (few points, another "
                                                                  "GPU than the topology's, ...)")


class CalibrationSpec(Spec):
    """A calibration of a topology preset, fitted to measurements (``simdist calibrate``)."""

    topology: str = Field(description="the topology preset (name) the calibration was fitted for")
    gpu: str | None = Field(default=None, description="the device the measurements ran on, as they name it (e.g. "
                                                      "'NVIDIA A100-SXM4-80GB'); None where they do not say")
    num_nodes: Count | None = Field(default=None, description="nodes of the fitted cluster (informational)")
    overrides: dict[str, Any] = Field(default_factory=dict,
                                      description="topology fields laid over the preset (deep merge)")
    collectives: dict[str, CollectiveCalibration] = Field(default_factory=dict,
                                                          description="the correction of each collective op")
    compute: ComputeCalibration | None = Field(default=None, description="roofline constants; absent: the "
                                                                         "GPU's defaults")
    fit: FitInfo = Field(default_factory=FitInfo, description="how the calibration was fitted (informational)")

    @field_validator("overrides")
    @classmethod
    def _topology_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        allowed = set(TopologySpec.model_fields) - {"name"}
        unknown = sorted(set(value) - allowed)
        if unknown:
            valid = ", ".join(sorted(allowed))
            raise ValueError(f"unknown topology field '{unknown[0]}' in overrides (valid: {valid})")
        for path in _leaves(value):
            if not _link_correction(path):
                raise ValueError(
                    f"overrides.{'.'.join(map(str, path))}: a calibration corrects the links' efficiency and latency "
                    "only; this would change the cluster itself (its GPU, size or links) without the scenario "
                    "saying so (fix: set it in the topology or the scenario's cluster, where it is seen)")
        return value


def _leaves(tree: Any, path: tuple = ()) -> list[tuple]:
    """The paths to every non-mapping value of a nested mapping."""
    if isinstance(tree, dict):
        return [leaf for key, sub in tree.items() for leaf in _leaves(sub, (*path, key))]
    return [path]


_LINK_TIERS = (("scale_up",), ("host", "pcie"), ("host", "cpu_interconnect"), ("inter_node",))


def _link_correction(path: tuple) -> bool:
    """A path a calibration may set: a link tier's efficiency or latency (simdist.calibrate.points.tier_field), or a
    node graph's efficiency per link kind."""
    if len(path) == 3 and path[:2] == ("node", "efficiency"):
        return True
    return bool(path) and path[-1] in ("efficiency", "latency") and tuple(path[:-1]) in _LINK_TIERS
