"""GPU description: peak compute per dtype, memory capacity and bandwidth."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from simdist.errors import SpecError
from simdist.spec.base import Bandwidth, ByteSize, FlopRate, Spec

Dtype = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]


class PeakFlopsSpec(Spec):
    """Dense (no structured sparsity) peak FLOP/s per dtype; fp32 is the non-tensor-core rate."""

    fp32: FlopRate
    tf32: FlopRate
    bf16: FlopRate
    fp16: FlopRate
    fp8: FlopRate | None = Field(default=None, description="absent on GPUs without fp8 tensor cores")


class GpuSpec(Spec):
    """One GPU model. Presets live in `simdist.hardware.gpus`; a topology may inline its own."""

    name: str
    form_factor: Literal["sxm", "pcie", "superchip"]
    peak: PeakFlopsSpec
    hbm_capacity: ByteSize = Field(description="device memory capacity, e.g. '80 GiB'")
    hbm_bandwidth: Bandwidth = Field(description="device memory bandwidth, e.g. '3.35 TB/s'")
    tdp_w: float | None = Field(default=None, gt=0, description="board power limit in watts")

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
