"""Metrics of a simulated training step, read off its timeline.

Every figure here is measured on the simulated trace of the representative ranks (one per pipeline stage, of the
first data-parallel replica), not computed from a formula. What counts as bubble, compute or exposed
communication is simdist.plan.accounting's one definition (the closed form uses it too): the breakdown
partitions each representative rank's step, so its parts add up to the step time exactly.

`observables` returns the additive quantities (seconds, FLOPs) a step's metrics derive from, so that a step
simulated on fewer micro-batches can be extended by its repeating steady state (simdist.predict.fastforward)
before `metrics` turns them into step time, throughput, MFU, bubble and breakdown.
"""

from __future__ import annotations

from typing import Any, Protocol

from simdist.plan.accounting import Interval, account, category_of, is_work
from simdist.plan.opgraph import OpGraph

__all__ = ["bubble_fraction", "exposed_comm", "metrics", "observables", "stage_intervals", "step_metrics"]


class TraceLike(Protocol):
    start_s: tuple[float, ...]
    end_s: tuple[float, ...]
    makespan_s: float


def stage_intervals(graph: OpGraph, trace: TraceLike, ranks: list[int]) -> list[list[Interval]]:
    """Per rank of ``ranks`` (one per stage), its ops as (start, end, category, pipeline work) intervals."""
    return _read(graph, trace, ranks)[0]


def _read(graph: OpGraph, trace: TraceLike, ranks: list[int]) -> tuple[list[list[Interval]], float, float]:
    """`stage_intervals`, and the model and hardware FLOPs of those ranks' ops (summed in op order), in one pass."""
    by_rank: dict[int, list[Interval]] = {r: [] for r in ranks}
    start, end = trace.start_s, trace.end_s
    kinds: dict[tuple[str, str | None, bool], tuple[str, bool]] = {}  # (kind, axis, per mb) -> (category, work)
    model = hardware = 0.0
    for i, op in enumerate(graph.ops):
        mine = by_rank.get(op.rank)
        if mine is None:
            continue
        key = (op.kind, op.comm.axis if op.comm is not None else None, op.microbatch >= 0)
        got = kinds.get(key)
        if got is None:
            got = kinds[key] = (category_of(key[0], key[1]), is_work(key[0], key[1], 0 if key[2] else -1))
        mine.append((start[i], end[i], *got))
        model += op.model_flops
        hardware += op.hardware_flops
    return [by_rank[r] for r in ranks], model, hardware


def bubble_fraction(graph: OpGraph, trace: TraceLike, ranks: list[int]) -> float:
    """simdist.plan.accounting's bubble fraction of ``ranks`` (one per stage)."""
    return account(stage_intervals(graph, trace, ranks), trace.makespan_s).bubble_fraction


def observables(graph: OpGraph, trace: TraceLike, ranks: list[int]) -> dict[str, float]:
    """The additive quantities of a step (mean over ``ranks`` where a per-GPU share is meant)."""
    intervals, model, hardware = _read(graph, trace, ranks)
    acct = account(intervals, trace.makespan_s)
    n = len(ranks)
    mean = acct.mean()
    return {"step_s": trace.makespan_s, "phase_s": acct.phase_s, "model_flops": model / n,
            "hardware_flops": hardware / n, **{f"{k}_s": v for k, v in mean.items()}}


DENSE_AXES = ("tp", "cp", "pp", "dp")
EXPERT_AXES = ("ep", "etp", "edp")


def exposed_comm(obs: dict[str, float]) -> dict[str, float]:
    """Exposed communication per axis: tp, cp, pp, dp, and the expert groups' ep (token all_to_all), etp (expert
    tensor parallelism) and edp (expert gradients) where the step exposes any of theirs."""
    out = {a: obs[f"{a}_s"] for a in DENSE_AXES}
    if any(obs.get(f"{a}_s", 0.0) > 0 for a in EXPERT_AXES):
        out.update({a: obs.get(f"{a}_s", 0.0) for a in EXPERT_AXES})
    return out


def metrics(obs: dict[str, float], *, tokens_per_step: float, peak_flops: float) -> dict[str, Any]:
    """Step time, throughput, FLOP/s per GPU, MFU/HFU, bubble and breakdown from `observables`."""
    step = obs["step_s"]
    model_per_gpu = obs["model_flops"] / step if step > 0 else 0.0
    hardware_per_gpu = obs["hardware_flops"] / step if step > 0 else 0.0
    phase = obs["phase_s"]
    return {
        "step_time_s": step,
        "tokens_per_s": tokens_per_step / step if step > 0 else 0.0,
        "model_tflops_per_gpu": model_per_gpu / 1e12,
        "hardware_tflops_per_gpu": hardware_per_gpu / 1e12,
        "mfu": model_per_gpu / peak_flops,
        "hfu": hardware_per_gpu / peak_flops,
        "bubble_fraction": max(obs["bubble_s"] / phase, 0.0) if phase > 0 else 0.0,
        "pipeline_phase_s": phase,
        "breakdown": {
            "compute_s": obs["compute_s"],
            "recompute_s": obs["recompute_s"],
            "exposed_comm_s": exposed_comm(obs),
            "bubble_s": obs["bubble_s"],
            "optimizer_s": obs["optimizer_s"],
            "idle_s": obs["idle_s"],
        },
    }


def step_metrics(graph: OpGraph, trace: TraceLike, *, ranks: list[int], tokens_per_step: float,
                 peak_flops: float) -> dict[str, Any]:
    """`metrics` of the simulated step of ``ranks`` (one per stage)."""
    return metrics(observables(graph, trace, ranks), tokens_per_step=tokens_per_step, peak_flops=peak_flops)

