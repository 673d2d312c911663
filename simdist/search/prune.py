"""Feasibility: why a candidate layout cannot run (one reason, the first rule it breaks), or None.

The rules are `simdist run`'s own (simdist.plan.layout.check_layout, named by simdist.plan.layout.RULES), applied
to the candidate's scenario; the search adds two filters: ``framework``, a layout the scenario's framework cannot
run (simdist.search.framework_layouts; off with ``SearchProblem.framework_layouts`` False; a base scenario's own
ZeRO stage, with or without pipeline stages as it has them, is always in: its user runs it), and ``memory``: the
peak per GPU over the pipeline stages (simdist.plan.step_memory.peak_memory_bytes, the memory model `simdist run`
reports) plus the problem's headroom exceeds the GPU's memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from simdist.plan.layout import RULES as LAYOUT_RULES
from simdist.plan.layout import LayoutRuleError
from simdist.search.evaluate import Context, configured
from simdist.search.framework_layouts import why_not_run
from simdist.search.space import Candidate, SearchProblem

__all__ = ["RULES", "Pruned", "why_pruned"]

GIB = 2**30
RULES = ("framework", *LAYOUT_RULES)
"""Every reason a candidate is pruned for, in the order they are checked (the framework first: no layout it
cannot run is built)."""


@dataclass(frozen=True, slots=True)
class Pruned:
    candidate: Candidate
    rule: str
    reason: str


def why_pruned(problem: SearchProblem, c: Candidate, ctx: Context) -> Pruned | None:
    own = ctx.base.parallel  # the scenario's own ZeRO stage with (or without) a pipeline: its user runs it
    if problem.framework_layouts and not (problem.base and c.zero_stage == own.zero_stage
                                          and (c.pp > 1) == (own.pp > 1)):
        reason = why_not_run(ctx.base.training.framework, c.zero_stage, c.pp)
        if reason is not None:
            return Pruned(c, "framework", reason)
    # The placements of one layout of a dense model meet the same rules (the one rule that reads the mesh's axis
    # order, `experts`, checks MoE pipeline groups: simdist.plan.layout.check_layout) and need the same memory
    # (Context.memory): the first placement's verdict is every placement's, without building their configs.
    twin = c.unplaced if c.order and ctx.model.num_experts == 0 else None
    if twin is not None and twin in ctx.verdicts:
        verdict = ctx.verdicts[twin]
        return None if verdict is None else Pruned(c, *verdict)
    found = _rules(problem, c, ctx)
    if twin is not None:
        ctx.verdicts[twin] = None if found is None else (found.rule, found.reason)
    return found


def _rules(problem: SearchProblem, c: Candidate, ctx: Context) -> Pruned | None:
    try:
        _, peak = configured(problem, c, ctx)
    except LayoutRuleError as err:
        return Pruned(c, err.rule, err.problem)
    gpu = ctx.topology.gpu
    headroom = problem.memory_headroom_bytes
    if peak + headroom > gpu.hbm_capacity:
        ctx.configs.pop(c.key, None)  # pruned: no bound or closed form reads it
        extra = f" + {headroom / GIB:g} GiB headroom" if headroom else ""
        return Pruned(c, "memory", f"needs {peak / GIB:.1f} GiB per GPU{extra}, the GPU has "
                                   f"{gpu.hbm_capacity / GIB:.0f} GiB")
    return None
