"""Roofline time of compute kernels on a GPU.

    time = max(flops / (peak(dtype) x gemm_efficiency(m, n, k) x quantization), hbm_bytes / (hbm_bandwidth x
           memory_eff)) + launch_overhead x launch gaps

(Williams, Waterman & Patterson 2009, "Roofline", CACM 52(4)). GEMM efficiency depends on size: a GEMM
whose smallest dimension x is small cannot fill the tensor cores (too short a k loop to amortise loading the
tiles, too few tiles per SM), so

    gemm_efficiency = gemm_peak_efficiency x x / (x + gemm_knee_dim),   x = min(m, n, k)

a saturating function reaching half its plateau at ``gemm_knee_dim``; and work is done in whole tiles and whole
waves of tiles (``quantization``, simdist.hardware.gemm: NVIDIA's matrix-multiplication performance guide), which
makes shapes that do not divide into the GPU's tiles and SMs slower per FLOP than their neighbours. FP8 GEMMs run
at the fp8 peak times ``fp8_gemm_efficiency_ratio`` (FP8 GEMMs reach a smaller share of their peak than 16-bit
ones, from measured maximum-achievable matmul rates). Fused attention kernels (FlashAttention-2/3, cuDNN) have
their own measured curves (simdist.hardware.attention). Element-wise ("memory") kernels run on the CUDA cores
(fp32 vector rate) and are bandwidth-bound in practice; eager PyTorch ops of a chain that converts between 16-bit
activations and fp32 (an RMSNorm or rotary embedding run op by op) reach ``eager_cast_share`` of that bandwidth
(measured per GPU on such chains: data/compute_efficiency.csv), and the step's other element-wise and normalisation
kernels ``memory_kernel_share`` of it (``memory_efficiency`` is a streaming kernel's share; the median training
kernel, forward and backward, reaches less: docs/accuracy-memory-kernels.md).

A modelled kernel may stand for several launches (``Kernel.launches``: Transformer Engine's grouped GEMM launches
one cuBLASLt GEMM per local expert over `TE_GEMM_STREAMS` side streams); the GPU pays a launch gap for each of them
but those that overlap on side streams (``Kernel.launch_gaps`` = ceil(launches / streams)).

Only kernels marked ``dtype="fp8"`` run at the fp8 rate: under ``precision: fp8`` every other kernel (attention,
norms, the logits GEMM) is a bf16 kernel (Transformer Engine's FP8 recipes cast only the linear layers' GEMMs).

The constants are data: ``data/compute_efficiency.csv`` (one row per GPU name and parameter, with a source
and what it was fitted on). A GPU without rows of its own uses the ``default`` rows. Its ``reference_gpus`` rows say
how many GPUs ran together in the measurements the constants reproduce (`reference_gpus`: the slowest of them set
the pace; simdist.hardware.variability).
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Protocol

from simdist.errors import SpecError
from simdist.hardware.attention import (
    attention_efficiency,
    has_attention_data,
    kernel_family,
    padded_head_dim,
    window_efficiency,
)
from simdist.hardware.clock import clock_share
from simdist.hardware.gemm import quantization
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

# Optional attributes read with getattr: ``dtype`` (None: the step's compute dtype), ``attention``
# (simdist.plan.layer_cost.AttentionShape: a fused attention kernel's family, direction, head dim and parts).


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
    fp8_gemm_efficiency_ratio: float = 0.914
    """Share of the fp8 peak a large FP8 GEMM reaches, relative to the bf16 GEMM's share of the bf16 peak."""
    graph_launch_overhead_s: float = 1e-6
    """Per kernel replayed from a CUDA graph: the gap between back-to-back kernels without a launch each."""
    comm_interference: float = 0.189
    """How much longer compute takes while collectives run beside it on the GPU (simdist.plan.interference)."""
    eager_cast_share: float = 0.79
    """Share of ``memory_efficiency``'s bandwidth that eager PyTorch element-wise ops reach in chains converting between
    16-bit activations and fp32 (an RMSNorm's, a rotary embedding's ATen ops: `Kernel.eager_cast`)."""
    memory_kernel_share: float = 1.0
    """Share of ``memory_efficiency``'s bandwidth (a streaming kernel's) that a step's other element-wise and
    normalisation kernels reach: the median over fused and ATen kernels, forward and backward, measured on H100
    (docs/accuracy-memory-kernels.md); 1 where the constants were fitted on layer times that hold it (A100)."""
    norm_kernel_share: float | None = None
    """Share of ``memory_efficiency``'s bandwidth that normalisation kernels (`Kernel.norm`) reach where it differs
    from ``memory_kernel_share`` (None: the same): measured on B200, whose LayerNorms reach less of it than its
    streaming kernels (docs/accuracy-memory-kernels.md)."""
    strided_copy_share: float = 0.222
    """Share of ``memory_efficiency``'s bandwidth that an eager copy out of strided views reaches
    (`Kernel.strided_copy`: DTensor's concatenation of a batch-first activation's sequence chunks before a
    sequence-parallel reduce-scatter, simdist.plan.tp_plan.layout_copy): measured on H200 in a training step's trace."""

    @property
    def norm_share(self) -> float:
        """The share of the streaming bandwidth a normalisation kernel reaches."""
        return self.memory_kernel_share if self.norm_kernel_share is None else self.norm_kernel_share

    def replayed(self) -> ComputeEfficiency:
        """The constants of kernels replayed from a CUDA graph: the graph's gap between kernels instead of a launch's
        (training.cuda_graphs, training.cuda_graph_scope)."""
        return dataclasses.replace(self, launch_overhead_s=self.graph_launch_overhead_s)


_FIELDS = ("gemm_peak_efficiency", "gemm_knee_dim", "memory_efficiency", "launch_overhead_s",
           "fp8_gemm_efficiency_ratio", "graph_launch_overhead_s", "comm_interference", "eager_cast_share",
           "memory_kernel_share", "norm_kernel_share", "strided_copy_share")


@cache
def _table() -> dict[str, dict[str, float]]:
    text = (resources.files("simdist.hardware") / "data" / "compute_efficiency.csv").read_text(encoding="utf-8")
    out: dict[str, dict[str, float]] = {}
    for row in csv.DictReader(line for line in text.splitlines() if not line.startswith("#")):
        out.setdefault(row["gpu"], {})[row["parameter"]] = float(row["value"])
    return out


@lru_cache(maxsize=64)
def compute_efficiency(gpu: GpuSpec) -> ComputeEfficiency:
    """The GPU's own rows of compute_efficiency.csv, each missing parameter taken from the ``default`` rows (one
    without a default row, ``norm_kernel_share``, keeps the dataclass default)."""
    table = _table()
    own, default = table.get(gpu.name, {}), table["default"]
    return ComputeEfficiency(**{k: own.get(k, default.get(k)) for k in _FIELDS if k in own or k in default})


def reference_gpus(gpu: GpuSpec) -> int:
    """GPUs that ran together in the measurements ``gpu``'s constants reproduce (the ``reference_gpus`` rows of
    compute_efficiency.csv: 8 for the A100's, fitted on layer times under TP 8; 1, a typical GPU, by default)."""
    table = _table()
    return int(table.get(gpu.name, {}).get("reference_gpus", table["default"]["reference_gpus"]))


def gemm_efficiency(eff: ComputeEfficiency, mnk: tuple[int, int, int] | None) -> float:
    if mnk is None:
        return eff.gemm_peak_efficiency
    x = min(mnk)
    return eff.gemm_peak_efficiency * x / (x + eff.gemm_knee_dim)


def compute_dtype(precision: str) -> str:
    """The dtype of a step's matrix kernels that are not marked otherwise: fp8 training computes in bf16 except
    the GEMMs its recipe casts (Transformer Engine: te.Linear / LayerNormLinear / LayerNormMLP under fp8_autocast)."""
    return "bf16" if precision == "fp8" else precision


def gemm_rate(gpu: GpuSpec, kernel: KernelLike, precision: str, eff: ComputeEfficiency) -> float:
    """FLOP/s of a tensor-core (GEMM-like) kernel: peak x size efficiency x tile/wave quantization (x the fp8
    ratio for an fp8 GEMM)."""
    dtype = getattr(kernel, "dtype", None) or compute_dtype(precision)
    mnk = kernel.gemm_mnk
    rate = gpu.peak_flops(dtype) * gemm_efficiency(eff, mnk)  # type: ignore[arg-type]
    if dtype == "fp8":
        rate *= eff.fp8_gemm_efficiency_ratio
    if mnk is not None and kernel.flops:
        # Batched GEMMs (attention per head) carry one GEMM's (m, n, k): the batch is flops / 2mnk.
        batch = max(1, round(kernel.flops / (2.0 * mnk[0] * mnk[1] * mnk[2])))
        rate *= quantization(gpu, mnk, dtype, batch)
    return rate


def _attention_s(gpu: GpuSpec, kernel: KernelLike, shape) -> float:
    """A fused attention kernel from its measured curve: each part (share of the FLOPs, causal, sequence length)
    at its efficiency for the head dimension; the head dimension padded to the kernel's (tile quantization in the head
    dimension)."""
    family = kernel_family(shape.kernel, gpu)
    padded = padded_head_dim(family, shape.head_dim)
    peak = gpu.peak_flops("bf16")
    window = shape.window  # a causal sliding window's keys per query (0: none)

    def efficiency(causal: bool, seq: float) -> float:
        if window:
            return window_efficiency(gpu, family, shape.direction, window, seq, padded, shape.dtype)
        return attention_efficiency(gpu, family, shape.direction, causal, seq, padded, shape.dtype)

    return sum(kernel.flops * share * padded / shape.head_dim / (peak * efficiency(causal, seq))
               for share, causal, seq in shape.parts)


def kernel_time_s(gpu: GpuSpec, kernel: KernelLike, precision: str, eff: ComputeEfficiency | None = None) -> float:
    """Roofline seconds of one kernel, plus its launch overhead (one per launch gap it pays: `Kernel.launch_gaps`)."""
    eff = eff or compute_efficiency(gpu)
    if precision not in _PRECISIONS:
        raise SpecError(f"unknown precision {precision!r}", field="training.precision",
                        fix=f"write one of {', '.join(_PRECISIONS)}")
    if precision == "fp8":
        gpu.peak_flops("fp8")  # a GPU without fp8 tensor cores refuses fp8 training (one line, exit 2)
    shape = getattr(kernel, "attention", None)
    if kernel.kind == "memory":
        # Element-wise work runs on the CUDA cores at the fp32 vector rate.
        compute_s = kernel.flops / gpu.peak_flops("fp32") if kernel.flops else 0.0
    elif shape is not None and has_attention_data(gpu):
        compute_s = _attention_s(gpu, kernel, shape)
    else:
        compute_s = kernel.flops / gemm_rate(gpu, kernel, precision, eff) if kernel.flops else 0.0
    if gpu.power_limit_w is not None:
        compute_s /= clock_share(gpu)  # a power cap slows the SMs, not HBM (simdist.hardware.clock)
    # an eager op of a 16-bit <-> fp32 chain reaches a share of a streaming kernel's bandwidth (Kernel.eager_cast),
    # fitted on such chains alone; a normalisation kernel its GPU's norm share (Kernel.norm: B200 measured); an eager
    # copy out of strided views its own (Kernel.strided_copy: H200 measured); the other element-wise kernels the
    # median share (memory_kernel_share)
    share = (eff.eager_cast_share if getattr(kernel, "eager_cast", False)
             else eff.norm_share if getattr(kernel, "norm", False)
             else eff.strided_copy_share if getattr(kernel, "strided_copy", False) else eff.memory_kernel_share)
    memory_s = kernel.hbm_bytes / (gpu.hbm_bandwidth * eff.memory_efficiency * share)
    # one launch gap per kernel it stands for, those on side streams overlapping (Kernel.launch_gaps)
    return max(compute_s, memory_s) + eff.launch_overhead_s * getattr(kernel, "launch_gaps", 1)


def kernels_time_s(gpu: GpuSpec, kernels: Iterable[KernelLike], precision: str,
                   eff: ComputeEfficiency | None = None) -> float:
    """Seconds to run ``kernels`` back to back on one stream (``eff``: calibrated constants, else the CSV's)."""
    eff = eff or compute_efficiency(gpu)
    return sum(kernel_time_s(gpu, k, precision, eff) for k in kernels)
