"""Which GPU a measurement ran on, compared with a topology's GPU preset (`same_device`).

Measurements name their device as the tool that took them does: nccl-tests prints CUDA's device name
(``cudaDeviceProp.name``, nccl-tests src/util.cu: "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3",
"NVIDIA H100 PCIe", "NVIDIA H200"), the harness writes ``torch.cuda.get_device_name`` (the same string) or,
on gloo, the CPU model ("AMD EPYC 7763 64-Core Processor"). GPU presets are named by simdist
(simdist.hardware.gpus: "A100-SXM4-80GB", "H100-SXM5-80GB", "CPU-core-AVX2"). Both are reduced to a
*family* (A100, H100, H200, B200, GB200, L40S, ..., or CPU) and, where the name says it, a form factor (PCIe
or SXM), and compared on those: memory size and marketing suffixes do not change the interconnect.
"""

from __future__ import annotations

import re

from simdist.spec.gpu import GpuSpec

__all__ = ["device_family", "same_device"]

_FAMILY = re.compile(r"\b(GB\d{3}|GH\d{3}|[ABHLV]\d{2,3}S?|MI\d{3}X?)\b")
_CPU = re.compile(r"\b(EPYC|XEON|RYZEN|CORE\(TM\)|THREADRIPPER|NEOVERSE|GRAVITON|CPU)\b")


def device_family(name: str) -> tuple[str, str | None] | None:
    """("A100", "pcie" | "sxm" | None) of a device name, ("CPU", None) for a CPU model; None if unrecognised."""
    text = name.upper().replace("-", " ").replace("_", " ")
    if m := _FAMILY.search(text):
        form = "pcie" if "PCIE" in text else "sxm" if "SXM" in text or "HBM" in text else None
        return m[1], form
    if _CPU.search(text) or "INTEL" in text or "AMD" in text:
        return "CPU", None
    return None


def same_device(measured: str | None, gpu: GpuSpec) -> bool | None:
    """Whether a measurement's device is the preset's GPU; None when either name says too little to tell."""
    if not measured:
        return None
    mine, theirs = device_family(measured), device_family(gpu.name)
    if mine is None or theirs is None:
        return None
    if mine[0] != theirs[0]:
        return False
    form = theirs[1] or gpu.form_factor
    return mine[1] is None or form in (None, "superchip") or mine[1] == form
