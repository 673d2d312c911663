"""A measured training step read off a profiler trace (`measured_step`): its time, and where it went, in the
terms simdist's step breakdown uses (simdist.plan.accounting), so a prediction and a trace compare line by line.

Per rank and ``ProfilerStep#N`` window (the time the training loop took from one ``prof.step()`` to the next):

- ``step_s``: the window's length;
- ``compute_s``: the time some compute kernel (GEMM, attention, memory-bound; on a CPU trace a leaf operator) ran,
  intervals merged across streams, and per class (``gemm_s``, ``attention_s``, ``memory_s``: summed durations);
- ``comm_s``: the time some collective ran (merged), ``exposed_comm_s``: of it, the time no compute ran beside it
  (what the step waited for, simdist's exposed communication); per collective op both, ``comm_by_op_s`` and
  ``exposed_by_op_s`` (the op its operator's "Collective name" says, else its kernel's: NCCL's all_to_all and
  DeepEP's and HybridEP's dispatch and combine are all_to_all, simdist.calibrate.trace_kernels.op_of): what
  training.moe_a2a_overlap_share is read from;
- ``idle_s``: the window's time with neither (host overhead, launch gaps, synchronisation, the pipeline's bubble).

compute_s + exposed_comm_s + idle_s = step_s. Each figure is the median over the rank's steps (the first step
left out when there are three or more: it often carries one-off work); `measured_step` reports each rank and the
run: the step time of the slowest rank, the other figures of the ranks' mean.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from simdist.calibrate.trace_kernels import Classified, classify, op_of
from simdist.calibrate.trace_read import Trace
from simdist.errors import SpecError

__all__ = ["StepBreakdown", "measured_step", "union_s"]

_FIELDS = ("step_s", "compute_s", "gemm_s", "attention_s", "memory_s", "comm_s", "exposed_comm_s", "idle_s")


@dataclass(frozen=True, slots=True)
class StepBreakdown:
    """One rank's (or the run's) measured step, in seconds (module doc)."""

    step_s: float
    compute_s: float
    gemm_s: float
    attention_s: float
    memory_s: float
    comm_s: float
    exposed_comm_s: float
    idle_s: float
    exposed_by_op_s: dict[str, float]
    steps: int
    comm_by_op_s: dict[str, float] = field(default_factory=dict)
    rank: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _merged(intervals: list[tuple[float, float]]) -> np.ndarray:
    """Disjoint sorted (start, end) rows covering the same time as ``intervals``."""
    if not intervals:
        return np.zeros((0, 2))
    a = np.asarray(sorted(intervals), dtype=float)
    out = [list(a[0])]
    for s, e in a[1:]:
        if s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return np.asarray(out)


def union_s(intervals: list[tuple[float, float]]) -> float:
    """The time covered by the intervals (microseconds in, microseconds out)."""
    m = _merged(intervals)
    return float((m[:, 1] - m[:, 0]).sum()) if len(m) else 0.0


def _minus(intervals: list[tuple[float, float]], cover: np.ndarray) -> float:
    """Time of ``intervals`` (merged) not covered by ``cover`` (merged rows)."""
    total = 0.0
    for s, e in _merged(intervals):
        covered = 0.0
        if len(cover):
            lo = np.maximum(cover[:, 0], s)
            hi = np.minimum(cover[:, 1], e)
            covered = float(np.clip(hi - lo, 0.0, None).sum())
        total += (e - s) - covered
    return float(total)


def _step(work: Sequence[Classified], a: float, b: float) -> dict:
    clip = [(max(c.start_us, a), min(c.end_us, b), c) for c in work if c.end_us > a and c.start_us < b]
    compute = [(s, e) for s, e, c in clip if c.kind in ("gemm", "attention", "memory", "compute")]
    comm = [(s, e, c) for s, e, c in clip if c.kind == "collective"]
    cover = _merged(compute)
    out = {"step_s": b - a, "compute_s": union_s(compute), "comm_s": union_s([(s, e) for s, e, _ in comm])}
    for kind in ("gemm", "attention", "memory"):
        out[f"{kind}_s"] = sum(e - s for s, e, c in clip if c.kind == kind)
    out["exposed_comm_s"] = _minus([(s, e) for s, e, _ in comm], cover)
    by_op: dict[str, list[tuple[float, float]]] = {}
    for s, e, c in comm:
        by_op.setdefault(op_of(c) or "other", []).append((s, e))
    out["exposed_by_op"] = {op: _minus(iv, cover) for op, iv in by_op.items()}
    out["comm_by_op"] = {op: union_s(iv) for op, iv in by_op.items()}
    out["idle_s"] = max(0.0, out["step_s"] - union_s(compute + [(s, e) for s, e, _ in comm]))
    return out


def rank_step(trace: Trace) -> StepBreakdown:
    """One rank's measured step (module doc); a trace without ``ProfilerStep#N`` windows is an error."""
    windows = trace.steps
    if not windows:
        counts = ", ".join(f"{n} {cat}" for cat, n in sorted(trace.counts().items()))
        raise SpecError(f"{trace.path}: no ProfilerStep#N annotation, so no step to measure (it has {counts})",
                        field="TRACE", fix="call prof.step() once per training step inside torch.profiler.profile "
                                           "(with a schedule), as the harness does")
    work = classify(trace)
    per = [_step(work, a, b) for a, b in windows]
    if len(per) >= 3:
        per = per[1:]
    med = {f: statistics.median(p[f] for p in per) * 1e-6 for f in _FIELDS}
    ops = sorted({op for p in per for op in p["exposed_by_op"]})
    by_op = {op: statistics.median(p["exposed_by_op"].get(op, 0.0) for p in per) * 1e-6 for op in ops}
    comm = {op: statistics.median(p["comm_by_op"].get(op, 0.0) for p in per) * 1e-6 for op in ops}
    return StepBreakdown(**med, exposed_by_op_s=by_op, steps=len(per), rank=trace.rank, comm_by_op_s=comm)


def measured_step(traces: Sequence[Trace]) -> tuple[StepBreakdown, list[StepBreakdown]]:
    """The run's measured step and each rank's (module doc)."""
    ranks = [rank_step(t) for t in traces]
    mean = {f: statistics.fmean(getattr(r, f) for r in ranks) for f in _FIELDS}
    mean["step_s"] = max(r.step_s for r in ranks)
    ops = sorted({op for r in ranks for op in r.exposed_by_op_s})
    by_op = {op: statistics.fmean(r.exposed_by_op_s.get(op, 0.0) for r in ranks) for op in ops}
    comm = {op: statistics.fmean(r.comm_by_op_s.get(op, 0.0) for r in ranks) for op in ops}
    return StepBreakdown(**mean, exposed_by_op_s=by_op, steps=min(r.steps for r in ranks), comm_by_op_s=comm), ranks
