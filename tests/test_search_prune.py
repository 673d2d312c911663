"""Pruning a layout for memory because its smaller micro-batch does not fit (simdist.search.prune
`_smaller_does_not_fit`): the same feasible layouts, rules and reasons as building every layout's StepConfig, and the
peak memory it relies on never falling as the micro-batch grows."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

import pytest

from simdist.plan.layout import LayoutRuleError
from simdist.search import prune, rank
from simdist.search.evaluate import _CONTEXTS, configured, context
from simdist.search.space import SearchProblem, raw_candidates

DENSE = SearchProblem("llama3-70b", "dgx-h100", 2, 64, max_cp=2, max_vpp=2, max_pp=8, max_micro_batch=8)
MOE = SearchProblem("qwen3-30b-a3b", "dgx-h100", 1, 32, max_cp=1, max_vpp=2, max_pp=4, max_micro_batch=8,
                    schedules=("1f1b", "interleaved_1f1b"), zero_stages=(0, 1, 3))


def _enumerate(problem: SearchProblem):
    _CONTEXTS.clear()
    feasible, pruned, n, *_ = rank.enumerate_feasible(problem)
    return ([c.key for c in feasible], [(p.candidate.key, p.rule, p.reason) for p in pruned], n,
            sum(1 for p in pruned if not isinstance(p.why, str)))


def _scenario() -> SearchProblem:
    # a scenario's own batch and training (the problem's global_batch_size is a placeholder there)
    from simdist.api.search import scenario_problem

    return scenario_problem(Path(__file__).resolve().parents[1] / "scenarios" / "korthikanti2022-22b.yaml", [],
                            max_cp=1, max_vpp=2, max_pp=8, max_micro_batch=8)


@pytest.mark.parametrize("problem", [DENSE, MOE, "scenario"], ids=["dense", "moe", "scenario"])
def test_the_shortcut_prunes_what_building_every_layout_prunes(problem, monkeypatch):
    problem = _scenario() if problem == "scenario" else problem
    feasible, pruned, n, lazy = _enumerate(problem)
    assert lazy > 0  # the shortcut ran (else this test could not fail)
    monkeypatch.setattr(prune, "_smaller_does_not_fit", lambda *args: None)
    assert _enumerate(problem) == (feasible, pruned, n, 0)


@pytest.mark.parametrize("problem", [DENSE, MOE], ids=["dense", "moe"])
def test_peak_memory_never_falls_as_the_micro_batch_grows(problem):
    _CONTEXTS.clear()
    ctx = context(problem)
    peaks: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for c in raw_candidates(problem, num_gpus=ctx.topology.num_gpus, gpus_per_node=ctx.topology.gpus_per_node,
                            num_layers=ctx.model.num_layers, num_experts=ctx.model.num_experts):
        try:
            _, peak = configured(problem, c, ctx)
        except LayoutRuleError:
            continue
        peaks[prune._without_micro_batch(c)].append((c.micro_batch_size, peak))
    grown = 0
    for runs in peaks.values():
        runs.sort()
        for (b0, p0), (b1, p1) in itertools.pairwise(runs):
            assert p1 >= p0 * (1 - 1e-12), (b0, p0, b1, p1)
            grown += p1 > p0
    assert grown > 100


def test_a_placement_built_from_another_equals_one_built_from_its_scenario():
    # `configured` builds a dense layout's other placements from its first StepConfig with their axis order
    from simdist.plan.layout import step_config_of
    from simdist.search.evaluate import candidate_spec

    problem = SearchProblem("llama3-8b", "dgx-h100", 4, 64, max_cp=2, max_vpp=2, max_pp=4, max_micro_batch=2,
                            placement=True)
    _CONTEXTS.clear()
    feasible, *_ = rank.enumerate_feasible(problem)
    ctx = context(problem)
    placed = [c for c in feasible if c.order]
    assert len({c.order for c in placed}) > 1
    for c in placed:
        fast, _ = configured(problem, c, ctx)
        assert fast == step_config_of(candidate_spec(problem, ctx.base, c), ctx.topology, ctx.model), c.key
    assert any(ctx.placed.get(c.unplaced) is not configured(problem, c, ctx)[0] for c in placed)
