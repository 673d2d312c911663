"""Metrics of a simulated training step, read off its timeline.

Every figure here is measured on the simulated trace of the representative ranks, not computed from a
formula: the breakdown partitions each representative rank's step into what its GPU was doing at each
instant, so its parts add up to the step time exactly.

- compute / recompute / optimizer: time the compute stream runs that kind of op.
- exposed comm per axis: time some collective of that axis runs while the compute stream is idle (when
  several axes overlap, the time goes to the first of tp, cp, pp, dp).
- bubble: the rest, the GPU waiting (pipeline fill and drain, waits on other stages).
Averaged over the representative ranks of the first data-parallel replica (one per pipeline stage).

bubble_fraction: over the pipeline phase (first forward to last backward), 1 - sum over stages of the time
a stage is busy with its forward/backward work (compute, its TP/CP collectives, or its per-micro-batch ZeRO-2/3
data-parallel collectives) / (stages x span). With
uniform stages and free communication this is (K-1)/(M+K-1) for GPipe and 1F1B (Huang et al. 2019;
Narayanan et al. 2021 sec 2.2.1) and (K-1)/(V*M+K-1) interleaved (Narayanan et al. 2021 sec 2.2.2).
"""

from __future__ import annotations

from typing import Any, Protocol

from simdist.plan.opgraph import OpGraph

PIPELINE_KINDS = ("forward", "backward", "weight_grad", "recompute")
PRIORITY = ("compute", "recompute", "optimizer", "tp", "cp", "pp", "dp")


class TraceLike(Protocol):
    start_s: tuple[float, ...]
    end_s: tuple[float, ...]
    makespan_s: float


def _category(graph: OpGraph, i: int) -> str:
    op = graph.ops[i]
    if op.comm is not None:
        return op.comm.axis
    if op.kind == "recompute":
        return "recompute"
    if op.kind == "optimizer":
        return "optimizer"
    return "compute"


def rank_breakdown(graph: OpGraph, trace: TraceLike, rank: int, ids: list[int]) -> dict[str, float]:
    """Partition [0, makespan] of one rank into categories by priority (see the module docstring)."""
    events: list[tuple[float, int, str]] = []
    for i in ids:
        s, e = trace.start_s[i], trace.end_s[i]
        if e > s:
            cat = _category(graph, i)
            events.append((s, 1, cat))
            events.append((e, -1, cat))
    events.sort(key=lambda x: (x[0], x[1]))
    active = dict.fromkeys(PRIORITY, 0)
    out = dict.fromkeys((*PRIORITY, "bubble"), 0.0)
    t = 0.0
    for time, delta, cat in events:
        if time > t:
            top = next((c for c in PRIORITY if active[c] > 0), "bubble")
            out[top] += time - t
            t = time
        active[cat] += delta
    if trace.makespan_s > t:
        out["bubble"] += trace.makespan_s - t
    return out


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def bubble_fraction(graph: OpGraph, trace: TraceLike, ranks: list[int]) -> float:
    """1 - busy / (stages x span) over the pipeline phase of ``ranks`` (one per stage)."""
    by_rank: dict[int, list[tuple[float, float]]] = {r: [] for r in ranks}
    lo, hi = float("inf"), float("-inf")
    for i, op in enumerate(graph.ops):
        if op.rank not in by_rank or op.microbatch < 0:
            continue
        if op.comm is not None and op.comm.axis not in ("tp", "cp", "dp"):
            continue  # dp: only per-micro-batch ZeRO-2/3 collectives get here (step-level ones have microbatch -1)
        if op.comm is None and op.kind not in PIPELINE_KINDS:
            continue
        s, e = trace.start_s[i], trace.end_s[i]
        by_rank[op.rank].append((s, e))
        lo, hi = min(lo, s), max(hi, e)
    if hi <= lo:
        return 0.0
    busy = sum(_union_length(iv) for iv in by_rank.values())
    return 1.0 - busy / (len(ranks) * (hi - lo))


def step_metrics(graph: OpGraph, trace: TraceLike, *, ranks: list[int], tokens_per_step: float,
                 peak_flops: float) -> dict[str, Any]:
    """Step time, throughput, FLOP/s per GPU, MFU/HFU, bubble and breakdown for ``ranks`` (one per stage)."""
    step = trace.makespan_s
    tracks: dict[int, list[int]] = {r: [] for r in ranks}
    model = hardware = 0.0
    for i, op in enumerate(graph.ops):
        if op.rank in tracks:
            tracks[op.rank].append(i)
            model += op.model_flops
            hardware += op.hardware_flops
    n = len(ranks)
    parts = [rank_breakdown(graph, trace, r, tracks[r]) for r in ranks]
    mean = {k: sum(p[k] for p in parts) / n for k in parts[0]}
    model_per_gpu = model / n / step if step > 0 else 0.0
    hardware_per_gpu = hardware / n / step if step > 0 else 0.0
    return {
        "step_time_s": step,
        "tokens_per_s": tokens_per_step / step if step > 0 else 0.0,
        "model_tflops_per_gpu": model_per_gpu / 1e12,
        "hardware_tflops_per_gpu": hardware_per_gpu / 1e12,
        "mfu": model_per_gpu / peak_flops,
        "hfu": hardware_per_gpu / peak_flops,
        "bubble_fraction": bubble_fraction(graph, trace, ranks),
        "breakdown": {
            "compute_s": mean["compute"],
            "recompute_s": mean["recompute"],
            "exposed_comm_s": {a: mean[a] for a in ("tp", "cp", "pp", "dp")},
            "bubble_s": mean["bubble"],
            "optimizer_s": mean["optimizer"],
        },
    }
