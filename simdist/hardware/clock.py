"""The clock a power-capped GPU sustains under load, and what it does to compute-bound kernels.

A GPU's board power splits into a part that does not follow the SM clock (HBM, its controllers and PHYs, NVLink and
PCIe, leakage, the board) and the SMs' dynamic power, ``C V^2 f`` (Weste & Harris, "CMOS VLSI Design", 4th ed., sec.
5.1). Under dynamic voltage and frequency scaling the voltage follows the clock over the operating range, so the
dynamic power grows as ``f^3``, and a cap ``P`` below the rated ``TDP`` leaves the clock at

    f / f_rated = ((P - s TDP) / ((1 - s) TDP)) ** (1/3),

with ``s`` the share of the rated power that does not scale with the clock. Tensor-core and vector work scales with
the clock; HBM-bound work does not (the memory clock is not capped). The rated clock is the one the dense peaks and
simdist's efficiency constants are measured at, so a GPU at its TDP gets factor 1.

Checked against a kernel-level measurement (tests/test_power.py): an H100 SXM capped at 500 W runs a bf16 8192^3
GEMM at 585 TFLOP/s (pytorch/FBGEMM PR #2546, H100 at 500 W); the model at 700 W prices it at 696, and
0.852 x 696 = 593.
"""

from __future__ import annotations

from simdist.errors import SpecError
from simdist.spec.gpu import GpuSpec

__all__ = ["STATIC_POWER_SHARE", "capped", "clock_share"]

STATIC_POWER_SHARE = 0.25
"""Assumption: a quarter of a training GPU's rated power does not follow the SM clock (HBM3 stacks at 20-30 W each,
NVLink/PCIe PHYs, leakage, the board's regulators and fans); with it a 500 W cap on a 700 W H100 leaves 0.852 of the
clock, against 585 / 696 = 0.84 measured (the module docstring)."""


MIN_DYNAMIC_SHARE = 0.05
"""A cap that leaves the SMs under 5 % of their rated dynamic power is outside the model's range (the clock would fall
below the voltage floor, where power no longer scales as f^3): refused."""


def capped(gpu: GpuSpec, power_limit_w: float) -> GpuSpec:
    """``gpu`` under a power cap (`clock_share` checks it)."""
    out = gpu.model_copy(update={"power_limit_w": float(power_limit_w)})
    clock_share(out, field="cluster.gpu_power_limit_w")
    return out


def clock_share(gpu: GpuSpec, field: str = "gpu.power_limit_w") -> float:
    """The sustained clock of ``gpu`` under its power cap / its rated clock (1 without a cap, or at or above TDP)."""
    cap, tdp = gpu.power_limit_w, gpu.tdp_w
    if cap is None:
        return 1.0
    if tdp is None:
        raise SpecError(f"{gpu.name} has a power limit of {cap:g} W but no rated power (tdp_w)", field=field,
                        fix="give the GPU's tdp_w, or drop the power limit")
    if cap >= tdp:
        return 1.0
    dynamic = (cap - STATIC_POWER_SHARE * tdp) / ((1.0 - STATIC_POWER_SHARE) * tdp)
    if dynamic <= MIN_DYNAMIC_SHARE:
        minimum = tdp * (STATIC_POWER_SHARE + MIN_DYNAMIC_SHARE * (1.0 - STATIC_POWER_SHARE))
        raise SpecError(f"a {cap:g} W cap on {gpu.name} ({tdp:g} W rated) leaves the SMs almost no power (about "
                        f"{STATIC_POWER_SHARE * tdp:.0f} W does not follow the clock)", field=field,
                        fix=f"give a cap above {minimum:.0f} W")
    return dynamic ** (1.0 / 3.0)
