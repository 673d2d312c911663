"""Host-side costs of an eager training step: what the CPU spends per framework op and per pipeline step.

A GPU runs kernels asynchronously: while the host enqueues faster than the GPU drains, host time is hidden. Two
mechanisms expose it (constants: ``data/host_overhead.csv``, each with its source):

- **Host-bound kernels.** Each op costs the host its eager dispatch plus one kernel launch (``op_s`` =
  ``dispatch_s`` + ``launch_s``); a modelled kernel that stands for several launches from fewer framework calls
  (Transformer Engine's grouped GEMM: one call, one cuBLASLt launch per local expert; a chain of small kernels)
  costs its calls' dispatches and its launches (`HostOverhead.issue_s`). A run of kernels whose GPU time is shorter
  than the host's time to issue them takes the host's time instead: max(GPU time, the run's issue time) (the
  roofline of the host: small micro-batches and small models, where kernels last microseconds).
- **The ramp after a synchronize.** Where the host waits for the device (an MoE layer's token counts), the GPU queue
  is empty when it resumes: kernel i of the kernels it then issues reaches the GPU ``step_gap_s`` plus the issue
  time of kernels 0..i-1 after the wait (``step_gap_s + i x op_s`` where each is one op) and runs once it has
  arrived and the kernel before it has finished (one in-order stream), so the run ends ``step_gap_s + max over i of
  (issue time of kernels 0..i-1 + the GPU time of kernels i..n-1)`` after it (`ramp_time_s`): short kernels early in
  the run leave the GPU waiting on the host even where the run as a whole is GPU-bound.
- **The step gap.** Megatron-Core synchronizes the device after every batched pipeline send/recv
  (p2p_communication.py, ``batch_p2p_sync``), so each pipeline step on a stage with neighbours starts on an empty
  GPU queue: the GPU idles ``step_gap_s`` until the host's first kernel of the step reaches it. It is paid per
  micro-batch, so it weighs more per sample at small micro-batches.

The host CPU matters: a Grace CPU (GB200, GB300 superchips) takes about 2.75 times as long as a DGX server's
x86 CPU to issue the same op (``data/host_cpu.csv``), so the dispatch and launch costs are scaled by the GPU's
host factor; the step gap, a GPU-side idle time measured after a synchronize, is not.

A CPU core standing in for a device (simdist.hardware.gpus.CPU_PRESETS) runs each op synchronously on the host:
its dispatch is already part of every kernel's ``launch_overhead_s`` (simdist.hardware.compute) and there is no
device queue to drain, so it has no host costs of its own here.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

from simdist.hardware.gpus import CPU_PRESETS, GPU_PRESETS
from simdist.spec.gpu import GpuSpec

__all__ = ["NONE", "HostOverhead", "host_op_factor", "host_overhead", "runs_on_host"]


@dataclass(frozen=True, slots=True)
class HostOverhead:
    launch_s: float
    """CPU time of one kernel submission (cudaLaunchKernel through the driver)."""
    dispatch_s: float
    """Framework (PyTorch eager) time of one op before its launch."""
    step_gap_s: float
    """GPU idle time at the start of a pipeline step that follows a device synchronize."""

    @property
    def op_s(self) -> float:
        """Host time to issue one op: its dispatch and its kernel launch."""
        return self.dispatch_s + self.launch_s

    def issue_s(self, kernel: object) -> float:
        """Host time to issue one modelled kernel: a dispatch per framework call and a launch per kernel it stands
        for (`simdist.plan.kernel_work.Kernel.calls`, ``launches``; one op each by default)."""
        return (getattr(kernel, "calls", 1) * self.dispatch_s + getattr(kernel, "launches", 1) * self.launch_s)

    def run_time_s(self, gpu_s: float, kernels: Sequence[object]) -> float:
        """Time of ``kernels`` back to back taking ``gpu_s`` on the GPU, when the host issues them (`issue_s`)."""
        return max(gpu_s, sum(self.issue_s(k) for k in kernels))

    def ramp_time_s(self, kernel_s: Sequence[float], issue_s: Sequence[float]) -> float:
        """Time from the end of a host wait on the device to the end of the kernels the host then issues, each
        taking ``kernel_s[i]`` on the GPU and ``issue_s[i]`` on the host (`issue_s`): the step gap, then an in-order
        queue kernel i reaches after the issue time of the kernels before it (module doc): step_gap_s + max over i of
        (sum(issue_s[:i]) + sum(kernel_s[i:]))."""
        if not kernel_s:
            return self.step_gap_s
        suffix = np.cumsum(np.asarray(kernel_s, dtype=float)[::-1])[::-1]
        arrival = np.concatenate(([0.0], np.cumsum(np.asarray(issue_s, dtype=float))[:-1]))
        return self.step_gap_s + float(np.max(arrival + suffix))


_FIELDS = ("launch_s", "dispatch_s", "step_gap_s")


NONE = HostOverhead(0.0, 0.0, 0.0)
_CPU_DEVICES = frozenset(GPU_PRESETS[p].name for p in CPU_PRESETS)


def runs_on_host(gpu: GpuSpec | None) -> bool:
    """Whether ``gpu`` is a CPU core standing in for a device (simdist.hardware.gpus.CPU_PRESETS): its ops run on the
    host, their dispatch inside each kernel's ``launch_overhead_s`` (simdist.hardware.compute), no host costs here."""
    return gpu is not None and gpu.name in _CPU_DEVICES


def host_overhead(gpu: GpuSpec | None = None) -> HostOverhead:
    """The defaults of ``data/host_overhead.csv`` for ``gpu``'s host CPU (`host_op_factor`), `NONE` for a CPU core
    standing in for ``gpu`` (`runs_on_host`)."""
    if runs_on_host(gpu):
        return NONE
    base = _defaults()
    factor = host_op_factor(gpu)
    if factor == 1.0:
        return base
    # Assumption: the step gap (GPU idle from a host call to its kernel after a synchronize) is driver and
    # device latency, not host compute, so the host CPU does not scale it.
    return HostOverhead(launch_s=base.launch_s * factor, dispatch_s=base.dispatch_s * factor,
                        step_gap_s=base.step_gap_s)


def host_op_factor(gpu: GpuSpec | None) -> float:
    """How long ``gpu``'s host CPU takes to issue one framework op, relative to a DGX server's x86 CPU
    (``data/host_cpu.csv``; 1 for a GPU without a row)."""
    if gpu is None:
        return 1.0
    return _host_cpus().get(gpu.name, 1.0)


def _rows(name: str) -> list[dict[str, str]]:
    """The rows of ``data/<name>``, its ``#`` lines skipped."""
    text = (resources.files("simdist.hardware") / "data" / name).read_text(encoding="utf-8")
    return list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))


@cache
def _host_cpus() -> dict[str, float]:
    return {r["gpu"]: float(r["op_time_factor"]) for r in _rows("host_cpu.csv")}


@cache
def _defaults() -> HostOverhead:
    rows = {r["parameter"]: float(r["value"]) for r in _rows("host_overhead.csv")}
    return HostOverhead(**{k: rows[k] for k in _FIELDS})
