"""GPU description: peak compute per dtype, memory capacity and bandwidth."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from simdist.errors import SpecError
from simdist.limits import TDP_MAX
from simdist.spec.base import Bandwidth, FlopRate, Memory, Spec

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]


class PeakFlopsSpec(Spec):
    """Dense (no structured sparsity) peak FLOP/s per dtype; fp32 is the non-tensor-core rate."""

    fp32: FlopRate = Field(description="fp32 without tensor cores (CUDA cores), e.g. '67 TFLOP/s' for H100 SXM")
    tf32: FlopRate = Field(description="tf32 tensor-core dense peak")
    bf16: FlopRate = Field(description="bf16 tensor-core dense peak, e.g. '989 TFLOP/s' for H100 SXM")
    fp16: FlopRate = Field(description="fp16 tensor-core dense peak")
    fp8: FlopRate | None = Field(default=None, description="absent on GPUs without fp8 tensor cores")


class GpuSpec(Spec):
    """One GPU model. Presets live in `simdist.hardware.gpus`; a topology may inline its own."""

    name: str = Field(description="the GPU's product name, e.g. 'H100-SXM5-80GB'")
    form_factor: Literal["sxm", "pcie", "superchip"] = Field(description="sxm, pcie or superchip (GB200)")
    peak: PeakFlopsSpec = Field(description="dense peak compute per dtype")
    hbm_capacity: Memory = Field(description="device memory capacity, e.g. '80 GiB'")
    hbm_bandwidth: Bandwidth = Field(description="device memory bandwidth, e.g. '3.35 TB/s'")
    tdp_w: float | None = Field(default=None, gt=0, le=TDP_MAX.value,
                                description="board power limit in watts (at most 10,000)")
    power_limit_w: float | None = Field(
        default=None, gt=0, le=TDP_MAX.value,
        description="a power cap below tdp_w (nvidia-smi -pl; H100 SXM parts capped at 500 W, DGX B200's 700 W set "
                    "point): the GPU sustains a lower clock under load, so compute-bound kernels slow and bandwidth-"
                    "bound ones do not (simdist.hardware.clock); absent: tdp_w")

    def peak_flops(self, dtype: Dtype) -> float:
        """Dense peak FLOP/s for ``dtype``; a clear error where the GPU lacks it (fp8 on A100)."""
        value = getattr(self.peak, dtype)
        if value is None:
            raise SpecError(
                f"GPU {self.name} has no {dtype} tensor cores",
                field="training.precision",
                fix="choose bf16 or fp16 for this GPU",
            )
        return value
