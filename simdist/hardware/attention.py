"""Achieved throughput of fused attention kernels, from kernel-level benchmarks (``data/attention_kernels.csv``: the
kernels' papers' figures and NVIDIA's cudnn-frontend measurements, sources per row; ``data/attention_relative.csv``:
kernels priced relative to another, and forward/backward splits).

    efficiency(kernel, architecture, direction, causal, seq_len, head_dim)
        = achieved TFLOP/s / the measuring GPU's peak,

interpolated linearly in log2(seq_len) (clamped at the measured ends) and linearly in the head dimension between the
measured ones (clamped), and applied to the target GPU's bf16 peak. Where a figure is missing it is derived, in this
order (each step an assumption stated where it is taken):

1. a direction published only as forward+backward (FlashAttention-2 paper Fig. 4 on A100, Fig. 7 on H100): with the
   other direction at the same point, ``3.5 / fwd_bwd = 1 / fwd + 2.5 / bwd`` (the papers' FLOP counts); without it,
   split with the kernel's forward/backward ratio (``split`` rows);
2. a causal curve not published for a direction: the non-causal one, scaled by the forward's causal / non-causal
   ratio at that length;
3. a head dimension outside those a direction publishes (Hopper's cuDNN backward: 128 only) while the other direction
   publishes it: the nearest measured one, scaled by the other direction's ratio between the two head dimensions.
   A head dimension beyond every one the kernel measures is priced at the nearest measured one.

A kernel run in fp8 (``dtype`` fp8: per-tensor scales; mxfp8: MX block scales; Transformer Engine's FP8
DotProductAttention, training.fp8_attention) runs at its bf16 efficiency times its fp8 / bf16 throughput ratio measured
in one benchmark file at the same point (``data/attention_fp8.csv``), interpolated like the curves.
# Assumption: the ratio, measured at head dimension 128, holds at every head dimension; an architecture without fp8
# figures (along `_ARCH_FALLBACK`) runs fp8 attention at its bf16 rate (ratio 1).

Kernel names: flash2 (FlashAttention-2, also PyTorch SDPA's flash backend), flash3 (Hopper), flash4 (Blackwell, CuTe
DSL), cudnn (cuDNN fused attention: Transformer Engine's and SDPA's cuDNN backend), efficient (the memory-efficient /
xformers kernel), triton (FlashAttention in Triton), flex (FlexAttention); ``flash`` is flash2 and ``sdpa`` is the
backend PyTorch's scaled_dot_product_attention picks for the GPU (`SDPA_BACKEND`). The kernels pad the head dimension
to the next one they are compiled for (`padded_head_dim`: tile quantization in the head dimension).
"""

from __future__ import annotations

import bisect
import csv
import math
from functools import cache, lru_cache
from importlib import resources
from typing import Any

from simdist.errors import SpecError
from simdist.hardware.gemm import architecture
from simdist.spec.gpu import GpuSpec

__all__ = ["KERNELS", "SDPA_BACKEND", "WINDOW_AS_CAUSAL", "attention_efficiency", "fp8_ratio", "has_attention_data",
           "kernel_family", "padded_head_dim", "window_efficiency"]

KERNELS = ("flash2", "flash3", "flash4", "cudnn", "efficient", "triton", "flex", "flash1")
_HEAD_DIMS = {"flash2": (32, 64, 96, 128, 160, 192, 224, 256), "flash1": (16, 32, 64, 128),
              "flash3": (64, 96, 128, 192, 256), "flash4": (64, 96, 128, 192, 256), "cudnn": (64, 96, 128, 192, 256),
              "efficient": (32, 64, 96, 128, 160, 192, 224, 256), "triton": (16, 32, 64, 128, 256),
              "flex": (16, 32, 64, 128, 256)}
"""Head dimensions each kernel is compiled for (FlashAttention-2: flash_attn/csrc/flash_attn/flash_api.cpp rounds
head_size to 32/64/.../256; FlashAttention-3, -4 and cuDNN: 64, 96, 128, 192, 256; the Triton and Flex kernels work in
powers of two (tl.arange needs a power-of-two block); the memory-efficient kernel as FlashAttention-2)."""
SDPA_BACKEND = {"ampere": "flash2", "ada": "flash2", "hopper": "flash2", "blackwell": "cudnn",
                "blackwell_ultra": "cudnn"}
"""PyTorch scaled_dot_product_attention's default backend for bf16 causal attention (aten/src/ATen/native/transformers/
cuda/sdp_utils.cpp, priority_order): flash (PyTorch's copy of FlashAttention-2 since 2.2) first on sm80/sm89/sm90 in
2.2-2.8 (cuDNN made opt-in by pytorch/pytorch PR #138522 for 2.5.1); cuDNN first on sm100 (PR #162073, 2.9; torchtitan
puts it first on SM100 since 2025-03, commit 5cfe514b6). Name ``cudnn`` in the scenario for cuDNN on Hopper (PyTorch
2.5.0, 2.9+, torchtitan v0.2.0)."""
_ARCH_FALLBACK = {"blackwell_ultra": "blackwell", "blackwell": "hopper", "ada": "ampere"}
"""Assumption: an architecture without figures for a kernel runs it at the share of peak the nearest older one
reaches (Blackwell Ultra as Blackwell: the same tcgen05 tensor cores; Ada as Ampere: the same mma.sync code path)."""


def _rows(name: str) -> list[dict[str, str]]:
    text = (resources.files("simdist.hardware") / "data" / name).read_text(encoding="utf-8")
    return list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))


Curve = tuple[tuple[float, float], ...]


@cache
def _table() -> dict[tuple[str, str, str, bool, int], Curve]:
    """(architecture, kernel, direction, causal, head dim) -> ((log2 seq_len, efficiency), ...) sorted."""
    out: dict[tuple[str, str, str, bool, int], list[tuple[float, float]]] = {}
    for r in _rows("attention_kernels.csv"):
        key = (r["architecture"], r["kernel"], r["direction"], r["causal"] == "true", int(r["head_dim"]))
        out.setdefault(key, []).append((math.log2(float(r["seq_len"])), float(r["tflops"]) / float(r["peak_tflops"])))
    return {k: tuple(sorted(v)) for k, v in out.items()}


@cache
def _fp8_table() -> dict[tuple[str, str, str, str, bool], Curve]:
    """(architecture, kernel, dtype, direction, causal) -> ((log2 seq_len, fp8 / bf16 throughput), ...) sorted."""
    out: dict[tuple[str, str, str, str, bool], list[tuple[float, float]]] = {}
    for r in _rows("attention_fp8.csv"):
        key = (r["architecture"], r["kernel"], r["dtype"], r["direction"], r["causal"] == "true")
        out.setdefault(key, []).append((math.log2(float(r["seq_len"])), float(r["tflops"]) / float(r["bf16_tflops"])))
    return {k: tuple(sorted(v)) for k, v in out.items()}


def fp8_ratio(arch: str, kernel: str, dtype: str, direction: str, causal: bool, seq_len: float) -> float:
    """How much faster (or slower) ``kernel`` runs in ``dtype`` than in bf16 on ``arch`` (the module docstring):
    the measured ratio along `_ARCH_FALLBACK`, 1.0 for bf16 or where none is measured."""
    if dtype == "bf16":
        return 1.0
    points = _along_fallback(_fp8_table(), arch, (kernel, dtype, direction, causal))
    return _curve(points, math.log2(max(seq_len, 1.0))) if points else 1.0


def _along_fallback(table: dict, arch: str | None, rest: tuple) -> Any:
    """``table``'s entry for (``arch``, *``rest``), else for the first architecture along `_ARCH_FALLBACK` that has
    one (None: none has)."""
    while arch is not None:
        hit = table.get((arch, *rest))
        if hit:
            return hit
        arch = _ARCH_FALLBACK.get(arch)
    return None


@cache
def _relative() -> tuple[dict[tuple[str, str, str], tuple[str, float]], dict[tuple[str, str], float]]:
    rel: dict[tuple[str, str, str], tuple[str, float]] = {}
    split: dict[tuple[str, str], float] = {}
    for r in _rows("attention_relative.csv"):
        if r["kind"] == "relative":
            rel[(r["architecture"], r["kernel"], r["direction"])] = (r["base"], float(r["factor"]))
        else:
            split[(r["architecture"], r["kernel"])] = float(r["factor"])
    return rel, split


def kernel_family(kernel: str, gpu: GpuSpec) -> str:
    """The kernel a scenario's ``training.attention`` runs on ``gpu`` (flash -> flash2; sdpa -> `SDPA_BACKEND`)."""
    if kernel == "flash":
        return "flash2"
    if kernel == "sdpa":
        return SDPA_BACKEND.get(architecture(gpu).name, "flash2")
    return kernel


def _measured_arch(arch: str, kernel: str) -> str | None:
    """The architecture whose figures price ``kernel`` on ``arch`` (itself, or along `_ARCH_FALLBACK`)."""
    rel = _relative()[0]
    while arch is not None:
        if any(k[0] == arch and k[1] == kernel for k in _table()) or any(
                k[0] == arch and k[1] == kernel for k in rel):
            return arch
        arch = _ARCH_FALLBACK.get(arch)  # type: ignore[assignment]
    return None


def has_attention_data(gpu: GpuSpec) -> bool:
    """True where the table has any kernel for the GPU's architecture (not for the CPU pseudo-device)."""
    return _measured_arch(architecture(gpu).name, "flash2") is not None or _measured_arch(
        architecture(gpu).name, "cudnn") is not None


def _curve(points: Curve, x: float) -> float:
    xs = [p[0] for p in points]
    i = bisect.bisect_left(xs, x)
    if i == 0:
        return points[0][1]
    if i >= len(points):
        return points[-1][1]
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def padded_head_dim(kernel: str, head_dim: int) -> int:
    """The head dimension the kernel computes with (the next one it is compiled for)."""
    for d in _HEAD_DIMS.get(kernel, _HEAD_DIMS["flash2"]):
        if d >= head_dim:
            return d
    raise SpecError(f"head dim {head_dim} exceeds {kernel}'s largest ({_HEAD_DIMS[kernel][-1]})",
                    field="training.attention", fix="use materialized attention for this model")


def _head_dims(arch: str, kernel: str, direction: str, causal: bool) -> list[int]:
    return sorted(k[4] for k in _table() if k[:4] == (arch, kernel, direction, causal))


def _at_head_dim(arch: str, kernel: str, direction: str, causal: bool, x: float, head_dim: int,
                 clamp: bool = True) -> float | None:
    """The published curve of one direction and mask, interpolated in the head dimension; None where absent, and,
    unless ``clamp``, where ``head_dim`` lies outside the head dimensions measured (step 3 of the module docstring
    derives those first)."""
    dims = _head_dims(arch, kernel, direction, causal)
    if not dims or (not clamp and not dims[0] <= head_dim <= dims[-1]):
        return None
    table = _table()
    if head_dim <= dims[0] or len(dims) == 1:
        return _curve(table[(arch, kernel, direction, causal, dims[0])], x) if head_dim <= dims[0] else \
            _curve(table[(arch, kernel, direction, causal, dims[-1])], x)
    if head_dim >= dims[-1]:
        return _curve(table[(arch, kernel, direction, causal, dims[-1])], x)
    j = bisect.bisect_left(dims, head_dim)
    if dims[j] == head_dim:
        return _curve(table[(arch, kernel, direction, causal, head_dim)], x)
    d0, d1 = dims[j - 1], dims[j]
    y0 = _curve(table[(arch, kernel, direction, causal, d0)], x)
    y1 = _curve(table[(arch, kernel, direction, causal, d1)], x)
    return y0 + (y1 - y0) * (head_dim - d0) / (d1 - d0)


def _direct(arch: str, kernel: str, direction: str, causal: bool, x: float, head_dim: int,
            clamp: bool = True) -> float | None:
    """A direction's efficiency from its own rows or from the forward+backward sum (step 1 of the module docstring);
    ``clamp``: as `_at_head_dim`."""
    own = _at_head_dim(arch, kernel, direction, causal, x, head_dim, clamp)
    if own is not None:
        return own
    both = _at_head_dim(arch, kernel, "forward_backward", causal, x, head_dim, clamp)
    if both is None:
        return None
    other_dir = "backward" if direction == "forward" else "forward"
    other = _at_head_dim(arch, kernel, other_dir, causal, x, head_dim, clamp)
    if other is not None:
        # 3.5 / fwd_bwd = 1 / fwd + 2.5 / bwd (FLOPs as the papers count them)
        rest = 3.5 / both - (2.5 / other if other_dir == "backward" else 1.0 / other)
        if rest > 0:
            return (1.0 if direction == "forward" else 2.5) / rest
    ratio = _relative()[1].get((arch, kernel))
    if ratio is None:
        return None
    # Assumption: the kernel's forward/backward ratio of its plateau holds at every length (split row's source)
    fwd = both * (1.0 + 2.5 / ratio) / 3.5
    return fwd if direction == "forward" else fwd / ratio


def _masked(arch: str, kernel: str, direction: str, causal: bool, x: float, head_dim: int,
            clamp: bool) -> float | None:
    """Steps 1 and 2 of the module docstring: a direction's own (or split) curve, or a causal one derived from the
    unmasked curve; ``clamp``: as `_at_head_dim`."""
    value = _direct(arch, kernel, direction, causal, x, head_dim, clamp)
    if value is not None or not causal:
        return value
    # Assumption (step 2): where only the unmasked curve of a direction is published, the causal kernel loses the same
    # share as its forward does at that length.
    full = _masked(arch, kernel, direction, False, x, head_dim, clamp)
    fwd_c = _direct(arch, kernel, "forward", True, x, head_dim, clamp)
    fwd_f = _direct(arch, kernel, "forward", False, x, head_dim, clamp)
    if full is not None and fwd_c is not None and fwd_f:
        return full * fwd_c / fwd_f
    return None


@lru_cache(maxsize=8192)
def _efficiency(arch: str, kernel: str, direction: str, causal: bool, x: float, head_dim: int) -> float | None:
    # A head dimension beyond every one the kernel measures (either direction) is priced at the nearest measured;
    # then steps 1-2 within the head dimensions each direction measures, step 3, and last steps 1-2 clamped to the
    # direction's nearest measured head dimension.
    measured = sorted({k[4] for k in _table() if k[:2] == (arch, kernel)})
    if measured:
        head_dim = min(max(head_dim, measured[0]), measured[-1])
    value = _masked(arch, kernel, direction, causal, x, head_dim, clamp=False)
    if value is not None:
        return value
    # Assumption (step 3): a head dimension without figures for this direction scales like the other direction
    # between it and the nearest measured head dimension (Hopper's cuDNN backward is published at head dimension
    # 128 only; at 64 its forward runs at 0.70 of its rate at 128, FlashAttention-3 paper Fig. 5, and NVIDIA's
    # cudnn-frontend H200 benchmark, cuDNN 9.19, measures head dimension 64's backward at 0.61 of 128's on
    # GPT-OSS's and Llama 3.1's heads: tests/test_attention_head_dim.py).
    other_dir = "backward" if direction == "forward" else "forward"
    dims = _head_dims(arch, kernel, direction, causal) or _head_dims(arch, kernel, direction, False)
    if dims:
        near = min(dims, key=lambda d: abs(d - head_dim))
        here = _masked(arch, kernel, other_dir, causal, x, head_dim, clamp=False)
        there = _masked(arch, kernel, other_dir, causal, x, near, clamp=False)
        base = _efficiency(arch, kernel, direction, causal, x, near)
        if here is not None and there and base is not None:
            return base * here / there
    value = _masked(arch, kernel, direction, causal, x, head_dim, clamp=True)
    if value is not None:
        return value
    ratio = _relative()[1].get((arch, kernel))
    if ratio is not None and direction == "backward":
        fwd = _efficiency(arch, kernel, "forward", causal, x, head_dim)
        if fwd is not None:
            return fwd / ratio
    return None


def attention_efficiency(gpu: GpuSpec, kernel: str, direction: str, causal: bool, seq_len: float,
                         head_dim: int = 128, dtype: str = "bf16") -> float:
    """Share of the GPU's bf16 peak the kernel reaches (FLOPs counted as the papers count them); ``dtype``: the data
    type it runs in (bf16, or fp8 / mxfp8: `fp8_ratio` times the bf16 figure)."""
    if dtype != "bf16":
        family = kernel_family(kernel, gpu)
        return (attention_efficiency(gpu, kernel, direction, causal, seq_len, head_dim)
                * fp8_ratio(architecture(gpu).name, family, dtype, direction, causal, seq_len))
    kernel = kernel_family(kernel, gpu)
    arch = _measured_arch(architecture(gpu).name, kernel)
    x = math.log2(max(seq_len, 1.0))
    value = None
    if arch is not None:
        rel = _relative()[0].get((arch, kernel, direction))
        if rel is not None and not any(k[:2] == (arch, kernel) for k in _table()):
            base, factor = rel
            return factor * attention_efficiency(gpu, base, direction, causal, seq_len, head_dim)
        value = _efficiency(arch, kernel, direction, causal, x, int(head_dim))
    if value is None:
        own = architecture(gpu).name
        have = sorted({k[1] for k in _table() if k[0] == (_measured_arch(own, "flash2") or own)})
        raise SpecError(f"no {kernel} attention-kernel figures for {gpu.name} ({own})",
                        field="training.attention",
                        fix=f"use one of {', '.join(['flash', 'sdpa', *have, 'materialized'])} on this GPU, or add "
                            "rows to simdist/hardware/data/attention_kernels.csv")
    return value


WINDOW_AS_CAUSAL = 2048
"""From this many keys per query a sliding window is priced as a causal kernel over that many keys
(`window_efficiency`): the shortest sequence the Blackwell causal curves measure."""


@cache
def _window_table() -> dict[tuple[str, str, str, str], tuple[int, Curve]]:
    """(architecture, kernel, dtype, direction) -> (the window measured, ((log2 seq_len, efficiency), ...) sorted), from
    ``data/attention_window.csv`` (one window and head dimension per key: the only ones published)."""
    out: dict[tuple[str, str, str, str], tuple[int, list[tuple[float, float]]]] = {}
    for r in _rows("attention_window.csv"):
        key = (r["architecture"], r["kernel"], r["dtype"], r["direction"])
        window, points = out.setdefault(key, (int(r["window"]), []))
        if int(r["window"]) != window:
            raise ValueError(f"attention_window.csv: {key} measured at two windows")  # one curve per key, as read
        points.append((math.log2(float(r["seq_len"])), float(r["tflops"]) / float(r["peak_tflops"])))
    return {k: (w, tuple(sorted(v))) for k, (w, v) in out.items()}


def window_efficiency(gpu: GpuSpec, kernel: str, direction: str, window: float, seq_len: float, head_dim: int = 128,
                      dtype: str = "bf16") -> float:
    """Share of the GPU's bf16 peak a causal sliding-window kernel reaches, each query meeting ``window`` keys of a
    ``seq_len`` sequence (FLOPs counted over the band: simdist.plan.attention_cost.window_share).

    A banded kernel does a few key blocks per query block, so it runs far below the full causal kernel: cuDNN 9.22
    on GB200 runs GPT-OSS's 128-key window at 153-167 TFLOP/s forward and 176-188 backward from 2k to 16k tokens,
    where its causal kernel reaches 1,097-1,708 over as many tokens at head dimension 128 (at 64, B200 measured
    658-869 of its 2,250) (``data/attention_window.csv``,
    ``data/attention_kernels.csv``). Where the band is measured for the GPU's architecture (along `_ARCH_FALLBACK`),
    kernel, dtype and direction, a window up to the measured one runs at the measured curve (interpolated in
    log2(seq_len), clamped at its ends); from `WINDOW_AS_CAUSAL` keys on, as the causal kernel over ``window`` keys
    (`attention_efficiency`); between the two, linearly in log2(window). Elsewhere (no band measured: Hopper, Ampere;
    or a dtype without rows) the causal kernel over ``window`` keys.
    # Assumption: the band's efficiency does not depend on the head dimension (measured at 64 only) nor on the
    # number of heads; a window wider than the measured one gains towards the causal kernel's efficiency as its key
    # blocks per query block grow, reaching it at WINDOW_AS_CAUSAL keys (interpolated in log2 of the window).
    # Assumption: without a band measured, a sliding-window kernel runs at the efficiency of a causal kernel over
    # window keys (each query block meets about W keys, masked at both edges of its band).
    """
    hit = _along_fallback(_window_table(), architecture(gpu).name, (kernel_family(kernel, gpu), dtype, direction))
    if hit is not None and window <= hit[0]:
        return _curve(hit[1], math.log2(max(seq_len, 1.0)))
    causal = attention_efficiency(gpu, kernel, direction, True, window, head_dim, dtype)
    if hit is None or window >= WINDOW_AS_CAUSAL:
        return causal
    measured_window, points = hit
    band = _curve(points, math.log2(max(seq_len, 1.0)))
    t = (math.log2(window) - math.log2(measured_window)) / (math.log2(WINDOW_AS_CAUSAL) - math.log2(measured_window))
    return band + t * (causal - band)
