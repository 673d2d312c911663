"""Feasibility: why a candidate layout cannot run (one reason, the first rule it breaks), or None.

The rules are `simdist run`'s own (simdist.plan.layout.check_layout, named by simdist.plan.layout.RULES), applied
to the candidate's scenario; the search adds one filter, ``memory``: the peak per GPU over the pipeline stages
(simdist.plan.step.peak_memory_bytes, the memory model `simdist run` reports) exceeds the GPU's memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from simdist.plan.layout import RULES, LayoutRuleError
from simdist.plan.step import peak_memory_bytes
from simdist.search.evaluate import Context, step_config
from simdist.search.space import Candidate, SearchProblem

__all__ = ["RULES", "Pruned", "why_pruned"]

GIB = 2**30


@dataclass(frozen=True, slots=True)
class Pruned:
    candidate: Candidate
    rule: str
    reason: str


def why_pruned(problem: SearchProblem, c: Candidate, ctx: Context) -> Pruned | None:
    try:
        cfg = step_config(problem, c, ctx)
    except LayoutRuleError as err:
        return Pruned(c, err.rule, err.problem)
    peak = peak_memory_bytes(cfg)
    gpu = ctx.topology.gpu
    if peak > gpu.hbm_capacity:
        return Pruned(c, "memory", f"needs {peak / GIB:.1f} GiB per GPU, the GPU has {gpu.hbm_capacity / GIB:.0f} GiB")
    return None
