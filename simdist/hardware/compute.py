"""Roofline time of compute kernels on a GPU.

    time = max(flops / (peak(precision) x gemm_efficiency(m, n, k)), hbm_bytes / (hbm_bandwidth x memory_eff))
           + launch_overhead

(Williams, Waterman & Patterson 2009, "Roofline", CACM 52(4)). GEMM efficiency depends on size: a GEMM
whose smallest dimension x is small cannot fill the tensor cores (too few output tiles per SM, too short a
k loop to amortise loading the tiles), so

    gemm_efficiency = gemm_peak_efficiency x x / (x + gemm_knee_dim),   x = min(m, n, k)

a saturating function reaching half its plateau at ``gemm_knee_dim``. Element-wise ("memory") kernels
run on the CUDA cores (fp32 vector rate) and are bandwidth-bound in practice.

The constants are data: ``data/compute_efficiency.csv`` (one row per GPU name and parameter, with a source
and what it was fitted on). A GPU without rows of its own uses the ``default`` rows.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Protocol

from simdist.errors import SpecError
from simdist.spec.gpu import GpuSpec

_PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")


class KernelLike(Protocol):
    """What the roofline reads of a kernel (simdist.plan.layer_cost.Kernel satisfies it)."""

    @property
    def flops(self) -> float: ...
    @property
    def hbm_bytes(self) -> float: ...
    @property
    def kind(self) -> str: ...
    @property
    def gemm_mnk(self) -> tuple[int, int, int] | None: ...


@dataclass(frozen=True, slots=True)
class ComputeEfficiency:
    gemm_peak_efficiency: float
    """Share of the dense peak a large GEMM reaches."""
    gemm_knee_dim: float
    """Smallest GEMM dimension at which efficiency is half the plateau."""
    memory_efficiency: float
    """Achieved / nominal HBM bandwidth of element-wise kernels."""
    launch_overhead_s: float
    """Per kernel: launch and tail (the gap between back-to-back kernels)."""
    host_op_s: float = 5e-6
    """Host time to dispatch one eager framework op (PyTorch's dispatcher + cudaLaunchKernel); what a loop of
    small ops costs when the host, not the GPU, sets the pace."""


_FIELDS = ("gemm_peak_efficiency", "gemm_knee_dim", "memory_efficiency", "launch_overhead_s", "host_op_s")


@cache
def _table() -> dict[str, dict[str, float]]:
    text = (resources.files("simdist.hardware") / "data" / "compute_efficiency.csv").read_text(encoding="utf-8")
    out: dict[str, dict[str, float]] = {}
    for row in csv.DictReader(line for line in text.splitlines() if not line.startswith("#")):
        out.setdefault(row["gpu"], {})[row["parameter"]] = float(row["value"])
    return out


@lru_cache(maxsize=64)
def compute_efficiency(gpu: GpuSpec) -> ComputeEfficiency:
    """The GPU's own rows of compute_efficiency.csv, each missing parameter taken from the ``default`` rows."""
    table = _table()
    own = table.get(gpu.name, {})
    return ComputeEfficiency(**{k: own.get(k, table["default"][k]) for k in _FIELDS})


def gemm_efficiency(eff: ComputeEfficiency, mnk: tuple[int, int, int] | None) -> float:
    if mnk is None:
        return eff.gemm_peak_efficiency
    x = min(mnk)
    return eff.gemm_peak_efficiency * x / (x + eff.gemm_knee_dim)


def kernel_time_s(gpu: GpuSpec, kernel: KernelLike, precision: str, eff: ComputeEfficiency | None = None) -> float:
    """Roofline seconds of one kernel, plus its launch overhead."""
    eff = eff or compute_efficiency(gpu)
    if precision not in _PRECISIONS:
        raise SpecError(f"unknown precision {precision!r}", field="training.precision",
                        fix=f"write one of {', '.join(_PRECISIONS)}")
    if kernel.kind == "memory":
        # Element-wise work runs on the CUDA cores at the fp32 vector rate.
        flop_rate = gpu.peak_flops("fp32")
    else:
        flop_rate = gpu.peak_flops(precision) * gemm_efficiency(eff, kernel.gemm_mnk)  # type: ignore[arg-type]
    compute_s = kernel.flops / flop_rate if kernel.flops else 0.0
    memory_s = kernel.hbm_bytes / (gpu.hbm_bandwidth * eff.memory_efficiency)
    return max(compute_s, memory_s) + eff.launch_overhead_s


def kernels_time_s(gpu: GpuSpec, kernels: Iterable[KernelLike], precision: str,
                   eff: ComputeEfficiency | None = None) -> float:
    """Seconds to run ``kernels`` back to back on one stream (``eff``: calibrated constants, else the CSV's)."""
    eff = eff or compute_efficiency(gpu)
    return sum(kernel_time_s(gpu, k, precision, eff) for k in kernels)
