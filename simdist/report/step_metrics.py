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

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from simdist.plan.accounting import (
    CATEGORIES,
    Account,
    Interval,
    account_tables,
    category_of,
    interval_table,
    is_work,
)
from simdist.plan.opgraph import OpGraph

__all__ = ["bubble_fraction", "exposed_comm", "metrics", "observables", "stage_intervals", "step_metrics"]


class TraceLike(Protocol):
    start_s: tuple[float, ...]
    end_s: tuple[float, ...]
    makespan_s: float


def stage_intervals(graph: OpGraph, trace: TraceLike, ranks: list[int]) -> list[list[Interval]]:
    """Per rank of ``ranks`` (one per stage), its ops as (start, end, category, pipeline work) intervals."""
    columns = _columns(graph, trace, ranks)
    return [list(zip(start.tolist(), end.tolist(), [CATEGORIES[k] for k in category.tolist()], work.tolist(),
                     strict=True)) for start, end, category, work in columns[0]]


def _columns(graph: OpGraph, trace: TraceLike, ranks: list[int]
             ) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], float, float]:
    """Per rank of ``ranks``, its ops in op order as columns (start, end, category: index into CATEGORIES,
    pipeline work), and the model and hardware FLOPs of those ranks' ops (summed in op order)."""
    table = graph.op_rows()
    if table is not None:  # the builder's rows (simdist.plan.step_emitter): each distinct row categorised once
        category_of_row, work_of_row = _categorised(table.kind, table.axis)
        row = table.row
        category = category_of_row[row]
        work = (work_of_row & table.per_microbatch)[row]
        rank = table.rank[row]
    else:
        ops = graph.ops
        n = len(ops)
        # Per op its kind and its collective's axis as small codes (dict lookups of interned strings), each
        # distinct (kind, axis) categorised once; pipeline work also needs a micro-batch
        # (simdist.plan.accounting.is_work)
        kinds = [op.kind for op in ops]
        axes = [None if op.comm is None else op.comm.axis for op in ops]
        kind_ids = {k: j for j, k in enumerate(dict.fromkeys(kinds))}
        axis_ids = {a: j for j, a in enumerate(dict.fromkeys(axes))}
        pair = (np.fromiter(map(kind_ids.__getitem__, kinds), dtype=np.int64, count=n) * len(axis_ids)
                + np.fromiter(map(axis_ids.__getitem__, axes), dtype=np.int64, count=n))
        pairs = [(k, a) for k in kind_ids for a in axis_ids]  # index kind x len(axis_ids) + axis
        category_of_pair, work_of_pair = _categorised([k for k, _ in pairs], [a for _, a in pairs])
        category = category_of_pair[pair]
        work = work_of_pair[pair] & (np.fromiter([op.microbatch for op in ops], dtype=np.int64, count=n) >= 0)
        rank = np.fromiter([op.rank for op in ops], dtype=np.int64, count=n)
    start, end = _floats(trace.start_s), _floats(trace.end_s)
    columns = []
    for r in ranks:
        mine = np.flatnonzero(rank == r)
        columns.append((start[mine], end[mine], category[mine], work[mine]))
    # cumsum adds in order, left to right: the sums of a loop over the ops, bit for bit
    mine = np.isin(rank, ranks)
    if table is not None:
        model_flops = table.model_flops[row[mine]]
        hardware_flops = table.hardware_flops[row[mine]]
    else:
        model_flops = np.fromiter([op.model_flops for op in ops], dtype=float, count=n)[mine]
        hardware_flops = np.fromiter([op.hardware_flops for op in ops], dtype=float, count=n)[mine]
    model = float(np.cumsum(model_flops)[-1]) if len(model_flops) else 0.0
    hardware = float(np.cumsum(hardware_flops)[-1]) if len(hardware_flops) else 0.0
    return columns, model, hardware


def _floats(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """``values`` as a float array (a trace's tuple: np.fromiter, a third cheaper than np.asarray)."""
    if isinstance(values, tuple):
        return np.fromiter(values, dtype=float, count=len(values))
    return np.asarray(values, dtype=float)


def _categorised(kinds: Sequence[str], axes: Sequence[str | None]) -> tuple[np.ndarray, np.ndarray]:
    """Per (kind, axis) of ``kinds`` and ``axes`` (same length), its category (index into CATEGORIES) and whether
    it is pipeline work when it belongs to a micro-batch (simdist.plan.accounting.is_work of a step's op)."""
    seen: dict[tuple[str, str | None], tuple[int, bool]] = {}
    for k, a in zip(kinds, axes, strict=True):
        if (k, a) not in seen:
            seen[(k, a)] = (CATEGORIES.index(category_of(k, a)), is_work(k, a, 0))
    got = [seen[(k, a)] for k, a in zip(kinds, axes, strict=True)]
    return (np.array([c for c, _ in got], dtype=np.int64).reshape(-1),
            np.array([w for _, w in got], dtype=bool).reshape(-1))


def bubble_fraction(graph: OpGraph, trace: TraceLike, ranks: list[int]) -> float:
    """simdist.plan.accounting's bubble fraction of ``ranks`` (one per stage)."""
    return _account(graph, trace, ranks)[0].bubble_fraction


def _account(graph: OpGraph, trace: TraceLike, ranks: list[int]) -> tuple[Account, float, float]:
    """simdist.plan.accounting's `account` of ``ranks`` (one per stage), and their model and hardware FLOPs."""
    columns, model, hardware = _columns(graph, trace, ranks)
    return account_tables([interval_table(*c) for c in columns], trace.makespan_s), model, hardware


def observables(graph: OpGraph, trace: TraceLike, ranks: list[int]) -> dict[str, float]:
    """The additive quantities of a step (mean over ``ranks`` where a per-GPU share is meant)."""
    acct, model, hardware = _account(graph, trace, ranks)
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

