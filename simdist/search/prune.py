"""Feasibility: why a candidate layout cannot run (one reason, the first rule it breaks), or None.

The rules are `simdist run`'s own (simdist.plan.layout.check_layout, named by simdist.plan.layout.RULES), applied
to the candidate's scenario; the search adds two filters: ``framework``, a layout the scenario's framework cannot
run (simdist.search.framework_layouts; off with ``SearchProblem.framework_layouts`` False; a base scenario's own
ZeRO stage, with or without pipeline stages as it has them, is always in: its user runs it), and ``memory``: the
peak per GPU over the pipeline stages (simdist.plan.step_memory.peak_memory_bytes, the memory model `simdist run`
reports) plus the problem's headroom exceeds the GPU's memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter

from simdist.errors import SpecError
from simdist.plan.layout import RULES as LAYOUT_RULES
from simdist.plan.layout import LayoutRuleError
from simdist.plan.schedule import check_schedule
from simdist.search.evaluate import Context, configured
from simdist.search.framework_layouts import why_not_run
from simdist.search.space import LAYOUT_FIELDS, Candidate, SearchProblem

__all__ = ["RULES", "Pruned", "why_pruned"]

GIB = 2**30
RULES = ("framework", *LAYOUT_RULES)
"""Every reason a candidate is pruned for, in the order they are checked (the framework first: no layout it
cannot run is built)."""


@dataclass(frozen=True, slots=True)
class Pruned:
    candidate: Candidate
    rule: str
    why: str | Callable[[], str]
    """The reason, or what finds it when asked (`reason`): a layout pruned because a smaller micro-batch of it
    does not fit (`_smaller_does_not_fit`) has its own peak memory worked out only if someone reads it."""

    @property
    def reason(self) -> str:
        return self.why if isinstance(self.why, str) else self.why()


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
    found = _smaller_does_not_fit(problem, c, ctx)
    if found is None:
        found = _rules(problem, c, ctx)
        if found is not None and found.rule == "memory":
            key = _without_micro_batch(c)
            ctx.too_big[key] = min(ctx.too_big.get(key, c.micro_batch_size), c.micro_batch_size)
    if twin is not None:
        ctx.verdicts[twin] = None if found is None else (found.rule, found.why)
    return found


_without_micro_batch = attrgetter(*(name for name in LAYOUT_FIELDS if name != "micro_batch_size"))
"""The candidate's layout fields but its micro-batch size (`Candidate`'s own list: a field added there is in it)."""


def _smaller_does_not_fit(problem: SearchProblem, c: Candidate, ctx: Context) -> Pruned | None:
    """The memory verdict of a layout whose smaller micro-batch (all else alike) was pruned for memory, without
    building its StepConfig: a layout's peak memory never falls as its micro-batch grows (its activations are
    micro-batch x in-flight micro-batches, min(stages x b, the replica's batch) under 1F1B and alike under the
    other schedules; the model states do not change: tests/test_search_prune.py checks it on random layouts), so
    it does not fit either, provided it passes the layout rules that read the micro-batch (the batch split and the
    schedule's micro-batch count), checked here first as `simdist.plan.layout.check_layout` orders them; the other
    rules passed for the smaller one. Its reason (with its own peak) is worked out when read."""
    smallest = ctx.too_big.get(_without_micro_batch(c))
    if smallest is None or smallest >= c.micro_batch_size or ctx.base.training.dp_batch_split is not None:
        return None
    per_replica = c.micro_batch_size * c.dp
    batch = ctx.base.training.global_batch_size  # (what the candidate's scenario has: `candidate_spec`)
    if batch % per_replica:
        return None  # the batch rule's verdict: `_rules` words it
    try:
        check_schedule(c.schedule, num_stages=c.pp, num_microbatches=batch // per_replica, vpp=c.vpp)
    except SpecError:
        return None
    return Pruned(c, "memory", lambda: _own_reason(problem, c, ctx, smallest))


def _own_reason(problem: SearchProblem, c: Candidate, ctx: Context, smallest: int) -> str:
    found = _rules(problem, c, ctx)
    if found is not None and found.rule == "memory":
        return found.reason
    return f"micro-batch {smallest} of this layout does not fit the GPU's memory"  # (never: the peak is monotone)


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
