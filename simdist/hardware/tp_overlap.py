"""Tensor-parallel communication overlap: what the overlapped communication kernels take from their GEMM.

With Megatron-LM's --tp-comm-overlap, Transformer Engine's userbuffers split each sequence-parallel all-gather and
reduce-scatter into chunks that run while the adjacent GEMM computes (ring exchange over peer-to-peer copies, or a
pipelined reduce-scatter whose reductions are kernels of their own). Where a method sets ``set_sm_margin`` the GEMM
runs on the SMs the communication kernels leave it, so it takes num_sms / (num_sms - num_sm) as long
(``data/tp_comm_overlap.csv``, the SM counts of Megatron-Bridge's H100 userbuffers configurations).
Each overlapped collective still exposes one chunk: the first of an all-gather (the first GEMM chunk needs it) or the
last of a reduce-scatter (`exposed_share`).
# Assumption: a GEMM on fewer SMs takes longer in proportion (its wave quantization on the smaller count is not
# recomputed), and GPUs other than H100 use the H100 configuration's SM counts and splits.
"""

from __future__ import annotations

import csv
from functools import cache
from importlib import resources

from simdist.hardware.gemm import architecture
from simdist.spec.gpu import GpuSpec

__all__ = ["exposed_share", "gemm_slowdown"]


@cache
def _margins() -> dict[tuple[str, str], int]:
    text = (resources.files("simdist.hardware") / "data" / "tp_comm_overlap.csv").read_text(encoding="utf-8")
    rows = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    return {(r["precision"], r["gemm"]): int(r["num_sm"]) for r in rows if r["sm_margin"] == "true"}


@cache
def _splits() -> dict[str, int]:
    text = (resources.files("simdist.hardware") / "data" / "tp_comm_overlap.csv").read_text(encoding="utf-8")
    rows = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    return {r["precision"]: int(r["num_splits"]) for r in rows if r["gemm"] == "projection" and r["num_splits"]}


def exposed_share(op: str, precision: str, tp: int) -> float:
    """The share of an overlapped tp collective that stays exposed: its first chunk (an all-gather's, which the
    first GEMM chunk waits for) or its last (a reduce-scatter's, after the last GEMM chunk). Ring exchange moves
    one chunk per tp peer (1 / tp); the pipelined reduce-scatter num_splits chunks (1 / num_splits)."""
    if op == "reduce_scatter":
        splits = _splits().get("fp8" if precision == "fp8" else "bf16")
        if splits:
            return 1.0 / splits
    return 1.0 / max(tp, 1)


def gemm_slowdown(gpu: GpuSpec, precision: str, gemm: str) -> float:
    """Time factor of forward GEMM ``gemm`` (a simdist.plan kernel name: projection, mlp_down) whose
    reduce-scatter overlaps it: 1 where no SMs are taken."""
    taken = _margins().get(("fp8" if precision == "fp8" else "bf16", gemm), 0)
    sms = architecture(gpu).num_sms
    return sms / (sms - taken) if taken and sms > taken else 1.0
