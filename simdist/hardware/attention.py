"""Achieved throughput of a fused attention kernel (FlashAttention-2, FlashAttention-3, cuDNN), from the kernels'
published benchmark figures (``data/attention_kernels.csv``; sources per row).

    efficiency(kernel, architecture, direction, causal, seq_len) = achieved TFLOP/s / the measuring GPU's peak,

interpolated linearly in log2(seq_len) and clamped at the measured ends, applied to the target GPU's bf16 peak.
The kernels pad the head dimension to the next one they are compiled for (FlashAttention-2: multiples of 32 up to
256, flash_attn/csrc/flash_attn/flash_api.cpp rounds head_size to 32/64/96/128/160/192/224/256; FlashAttention-3 and
cuDNN: 64, 96, 128, 192, 256), so a head dim of 108 does the work of 128: tile quantization in the head dimension
(`padded_head_dim`).
"""

from __future__ import annotations

import csv
import itertools
import math
from functools import cache
from importlib import resources

from simdist.errors import SpecError
from simdist.hardware.gemm import architecture
from simdist.spec.gpu import GpuSpec

__all__ = ["KERNELS", "attention_efficiency", "has_attention_data", "padded_head_dim"]

KERNELS = ("flash2", "flash3", "cudnn")
_HEAD_DIMS = {"flash2": (32, 64, 96, 128, 160, 192, 224, 256), "flash3": (64, 96, 128, 192, 256),
              "cudnn": (64, 96, 128, 192, 256)}
# Assumption: Blackwell runs the Hopper kernels' share of its peak (no published per-kernel figures in the data
# yet); Ada runs FlashAttention-2 at Ampere's share (same mma.sync code path).
_FALLBACK = {"blackwell": "hopper", "ada": "ampere"}


@cache
def _table() -> dict[tuple[str, str, str, bool], list[tuple[float, float]]]:
    text = (resources.files("simdist.hardware") / "data" / "attention_kernels.csv").read_text(encoding="utf-8")
    out: dict[tuple[str, str, str, bool], list[tuple[float, float]]] = {}
    for r in csv.DictReader(line for line in text.splitlines() if not line.startswith("#")):
        key = (r["architecture"], r["kernel"], r["direction"], r["causal"] == "true")
        out.setdefault(key, []).append((math.log2(float(r["seq_len"])), float(r["tflops"]) / float(r["peak_tflops"])))
    return {k: sorted(v) for k, v in out.items()}


def _arch(gpu: GpuSpec) -> str:
    a = architecture(gpu).name
    return _FALLBACK.get(a, a)


def has_attention_data(gpu: GpuSpec) -> bool:
    """True where the table has any kernel for the GPU's architecture (not for the CPU pseudo-device)."""
    arch = _arch(gpu)
    return any(k[0] == arch for k in _table())


def _curve(points: list[tuple[float, float]], x: float) -> float:
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def padded_head_dim(kernel: str, head_dim: int) -> int:
    """The head dimension the kernel computes with (the next one it is compiled for)."""
    for d in _HEAD_DIMS[kernel]:
        if d >= head_dim:
            return d
    raise SpecError(f"head dim {head_dim} exceeds {kernel}'s largest ({_HEAD_DIMS[kernel][-1]})",
                    field="training.attention", fix="use materialized attention for this model")


def attention_efficiency(gpu: GpuSpec, kernel: str, direction: str, causal: bool, seq_len: float) -> float:
    """Share of the GPU's bf16 peak the kernel reaches (FLOPs counted as the papers count them)."""
    table = _table()
    arch = _arch(gpu)
    if not any(k[0] == arch and k[1] == kernel for k in table):
        raise SpecError(f"no {kernel} attention-kernel figures for {gpu.name} ({architecture(gpu).name})",
                        field="training.attention",
                        fix="use flash (FlashAttention-2) or materialized, or add rows to "
                            "simdist/hardware/data/attention_kernels.csv")
    x = math.log2(max(seq_len, 1.0))
    points = table.get((arch, kernel, direction, causal))
    if points is not None:
        return _curve(points, x)
    full = table.get((arch, kernel, direction, False)) or table[(arch, kernel, "forward", False)]
    value = _curve(full, x)
    if causal:
        # Assumption: where only the unmasked curve of a direction is published, the causal kernel loses the same
        # share as the forward does at that length (the FA3 paper's causal and non-causal forward figures).
        fwd_causal = table.get((arch, kernel, "forward", True))
        fwd_full = table.get((arch, kernel, "forward", False))
        if fwd_causal and fwd_full:
            value *= _curve(fwd_causal, x) / _curve(fwd_full, x)
    return value
