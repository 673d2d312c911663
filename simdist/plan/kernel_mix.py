"""What a step's compute is made of: its kernels' seconds by kind (GEMMs, fused attention, memory-bound element-wise
work) and how many kernels, over one micro-batch of every model part on one GPU of each part's stage.

The same kernels `simdist.plan.chunk_cost` prices a chunk with (`chunk_parts`), each at its roofline time
(simdist.hardware.compute.kernel_time_s): no host time, no interference taxes, no communication. It describes a
layout's compute, as a reader of a prediction (or of its error against a measured run) wants to know it: a step made
of a few long GEMMs is one the GEMM constants decide; one of many short memory-bound kernels, another
(docs/accuracy-training.md, "What the errors track").
"""

from __future__ import annotations

from dataclasses import dataclass

from simdist.hardware.compute import compute_efficiency, kernel_time_s
from simdist.plan.chunk_cost import chunk_parts
from simdist.plan.graph_scope import replayed, stretches
from simdist.plan.step_config import StepConfig

__all__ = ["KernelMix", "kernel_mix"]


@dataclass(frozen=True, slots=True)
class KernelMix:
    gemm_s: float
    """Seconds of the GEMMs (dense and grouped) of one micro-batch's forward, backward and recompute."""
    attention_s: float
    """Of fused or materialized attention kernels."""
    memory_s: float
    """Of memory-bound (element-wise, norm, permutation, cast, loss) kernels."""
    num_kernels: int
    """Kernels those seconds are made of (each launch of a kernel that stands for several: Kernel.launches)."""
    launch_gaps: int = 0
    """Launch gaps the GPU pays between them (Kernel.launch_gaps: launches on side streams overlap)."""
    gaps_s: float = 0.0
    """Seconds of those gaps (each launch_overhead_s, a graph's shorter gap where the kernel is replayed from a CUDA
    graph: simdist.plan.graph_scope), included in the kinds' seconds."""

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.attention_s + self.memory_s

    def share(self, kind: str) -> float:
        """``kind`` (gemm, attention, memory)'s share of the kernels' seconds."""
        total = self.total_s
        return getattr(self, f"{kind}_s") / total if total > 0 else 0.0

    @property
    def kernels_per_ms(self) -> float:
        """Kernels per millisecond of kernel time: how short the step's kernels are on average."""
        return self.num_kernels / (self.total_s * 1e3) if self.total_s > 0 else 0.0


def kernel_mix(cfg: StepConfig) -> KernelMix:
    """The kernels of one micro-batch of every model part of ``cfg`` (each on its stage's GPU), by kind."""
    eff = cfg.compute_efficiency or compute_efficiency(cfg.gpu)
    ex = cfg.execution
    if ex.cuda_graphs:
        eff = eff.replayed()
    graph_eff = eff.replayed()
    seconds = {"gemm": 0.0, "attention": 0.0, "memory": 0.0}
    count = gaps = 0
    gaps_s = 0.0
    last = cfg.num_parts - 1
    for part in range(cfg.num_parts):
        for work, n in chunk_parts(cfg, cfg.part_layers(part), part == 0, part == last):
            for phase in ("forward", "backward", "recompute"):
                kernels = getattr(work, phase)
                flags = replayed(work, phase, ex.graph_tags)
                # a replay's copy of its input (simdist.plan.graph_scope): a memory-bound kernel of its own
                copies = (work.graph_input,) * stretches(flags) if flags and work.graph_input else ()
                for i, k in enumerate((*kernels, *copies)):
                    kind_eff = graph_eff if i < len(flags) and flags[i] else eff
                    seconds[k.kind] += n * kernel_time_s(cfg.gpu, k, cfg.precision, kind_eff)
                    count += n * k.launches
                    gaps += n * k.launch_gaps
                    gaps_s += n * k.launch_gaps * kind_eff.launch_overhead_s
    return KernelMix(seconds["gemm"], seconds["attention"], seconds["memory"], count, gaps, gaps_s)
