"""Megatron-LM --overlap-param-gather with the distributed optimizer (issue 14, item 4): the updated parameters'
all-gather moves from after the optimizer into each chunk's first forward, bucket by bucket
(simdist.plan.data_parallel._gathered_forward), the same in the closed form, its batched band and the op graph."""

from __future__ import annotations

import pytest

from simdist import api
from simdist.analytic.bound import lower_bound_s
from simdist.analytic.stages import _stages
from simdist.analytic.step import CommPricer, analytic_observables, analytic_step
from simdist.analytic.step_batch import _batch_step_s
from simdist.analytic.timeline import _fast
from simdist.engine.uncontended import uncontended
from simdist.plan.data_parallel import num_buckets, param_bytes_per_element, tail
from simdist.plan.layout import LayoutRuleError, step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.plan.recipe import edge_recipe, is_edge
from simdist.plan.step import build_step, chunk_costs_of
from simdist.predict.price import price_graph
from tests.cli_harness import REPO, run_cli
from tests.test_analytic_step import _agree, _graph_observables, _spec

# pp 1, dp 2 (one GPU per node, each on its own NIC), a 3-layer model: 70.5M parameters on the one chunk, two of
# Megatron-Core's default 40M-parameter buckets
BASE = {"tp": 1, "pp": 1, "dp": 2, "cp": 1, "vpp": 1, "zero_stage": 1, "recompute": "none", "schedule": "1f1b",
        "grad_reduce": "overlapped", "bucket": None, "microbatches": 2, "mbs": 1, "sp": False, "per_parameter": False,
        "num_layers": 3, "host": {"step_gap": "0 us", "dispatch": "0 us", "launch": "0 us"},
        "gpu_speed_cv": 0.0}  # identical GPUs: the hand count's


def _made(x: dict, *, overlap: bool):
    spec = _spec({**x, "param_overlap": overlap})
    topology = api.cluster_of(spec)
    return step_config_of(spec, topology, resolve_model(spec.model)), topology


def _trace(cfg, topology):
    plan = build_step(cfg)
    price_graph(plan.graph, topology, mesh=cfg.mesh, reduced_axes=plan.reduced_axes, with_links=False)
    return plan, uncontended(plan.graph)


@pytest.mark.parametrize("mbs,regime", [(1, "gather-bound"), (64, "compute-bound")])
def test_two_buckets_hand_computed(mbs, regime):
    # The step is the plain one with the tail's gather of all parameters (after the optimizer) replaced by the first
    # forward's wait: bucket 0's gather g0 before any compute, then bucket 1's gather g1 beside the first half c0 of
    # the forward: exposed g0 + max(0, g1 - c0). Compute-bound (c0 > g1): only the first bucket's gather is
    # exposed; gather-bound: the sum of the gathers less the compute they overlap.
    x = {**BASE, "mbs": mbs}
    on, topology = _made(x, overlap=True)
    off, _ = _made(x, overlap=False)
    cost = chunk_costs_of(on)[(0, 0)]
    n = cost.num_params
    assert num_buckets(on, cost) == 2 and 40e6 < n < 80e6
    pricer = CommPricer(topology)
    nbytes = n * param_bytes_per_element(on)
    g = pricer.time_s("all_gather", (0, 1), nbytes / 2)  # one bucket: half the parameters
    whole = pricer.time_s("all_gather", (0, 1), nbytes)
    c0 = cost.forward_s / 2
    assert (c0 > g) == (regime == "compute-bound") and g > 0
    exposed = g + max(0.0, g - c0)
    # bucket 1's gather beside slice 0 slows it (simdist.plan.interference): x / (1 + x) of the time they overlap
    x = on.interference
    slowed = x / (1 + x) * min(g, c0)
    a_on, a_off = analytic_step(on, pricer), analytic_step(off, pricer)
    assert a_on.step_time_s == pytest.approx(a_off.step_time_s - whole + exposed + slowed, rel=1e-12)
    # the breakdown's exposed dp time drops by as much: the forward's waits are dp time, not bubble
    assert a_on.dp_exposed_s == pytest.approx(a_off.dp_exposed_s - whole + exposed, rel=1e-9)
    assert a_on.bubble_s == pytest.approx(0.0, abs=1e-15)
    # the op graph's first forward: slice 0 after bucket 0's gather, slice 1 after max(slice 0, bucket 1's gather)
    plan, trace = _trace(on, topology)
    names = [op.name for op in plan.graph.ops]
    g0, g1, s0, s1 = (names.index(n) for n in ("F0 params bucket 1 all_gather", "F0 params bucket 0 all_gather",
                                                "F0/0", "F0/1"))
    assert trace.start_s[g0] == 0.0 and plan.graph.ops[g0].microbatch == 0  # micro-batch 0's pipeline work
    assert trace.start_s[g1] == pytest.approx(g, rel=1e-12)  # back to back on the dp stream
    assert trace.start_s[s0] == pytest.approx(g, rel=1e-12)
    assert trace.start_s[s1] == pytest.approx(max(g + c0, 2 * g), rel=1e-12)
    assert trace.makespan_s == pytest.approx(a_on.step_time_s, rel=1e-12)


def test_gathers_leave_the_tail_and_follow_the_gradient_buckets():
    on, _ = _made(BASE, overlap=True)
    off, _ = _made(BASE, overlap=False)
    cost = chunk_costs_of(on)[(0, 0)]
    assert [p.label for p in tail(off, [cost]).pieces][-1] == "params all_gather"
    assert "params all_gather" not in [p.label for p in tail(on, [cost]).pieces]
    first = edge_recipe(on, cost, "F", True).pieces
    other = edge_recipe(on, cost, "F", False).pieces
    assert [p.label for p in first if p.stream == "dp"] == ["params bucket 1 all_gather", "params bucket 0 all_gather"]
    assert all(not p.per_step and p.comm.op == "all_gather" for p in first if p.stream == "dp")
    assert all(p.stream != "dp" for p in other)  # only micro-batch 0 gathers
    assert sum(p.duration_s for p in first if p.kind == "forward" and not p.tax_of) == pytest.approx(cost.forward_s,
                                                                                                       rel=1e-12)
    assert is_edge("F", 0, 4) and not is_edge("F", 3, 4) and is_edge("B", 3, 4) and not is_edge("B", 0, 4)


def test_pipeline_rank_1_gathers_its_one_bucket_after_its_input():
    # Without interleaving Megatron launches a chunk's first gather from the first module's forward pre-hook, and
    # on pipeline ranks > 0 a chunk is one bucket: stage 1's gather starts when its input has arrived and its
    # forward waits for all of it.
    x = {**BASE, "pp": 2, "num_layers": 4}
    cfg, topology = _made(x, overlap=True)
    plan, trace = _trace(cfg, topology)
    ops = plan.graph.ops
    rank = plan.stage_ranks[(1, 0)]
    gather = next(i for i, op in enumerate(ops) if op.rank == rank and "params bucket" in op.name)
    entry = next(i for i, op in enumerate(ops) if op.rank == rank and op.kind == "wait" and op.microbatch == 0)
    forward = next(i for i, op in enumerate(ops) if op.rank == rank and op.kind == "forward" and op.microbatch == 0)
    arrival = max(trace.end_s[d] for d in ops[entry].deps)
    assert trace.start_s[gather] == pytest.approx(arrival, rel=1e-12) and arrival > 0
    assert trace.start_s[forward] == pytest.approx(trace.end_s[gather], rel=1e-12)
    closed, _ = analytic_observables(cfg, CommPricer(topology), fast_forward=False)
    _agree(_graph_observables(cfg, topology), closed, 1e-9)


def test_interleaved_chunks_gather_from_the_step_start():
    # With interleaving (align_param_gather) every chunk's gathers are issued at the step's start, queued on the dp
    # stream in chunk order: stage 1 gathers while it waits for its first input, and the step is shorter than with
    # the gathers after the optimizer.
    x = {**BASE, "pp": 2, "vpp": 2, "schedule": "interleaved_1f1b", "num_layers": 8, "microbatches": 2}
    cfg, topology = _made(x, overlap=True)
    off, _ = _made(x, overlap=False)
    plan, trace = _trace(cfg, topology)
    rank = plan.stage_ranks[(1, 0)]
    gathers = [i for i, op in enumerate(plan.graph.ops) if op.rank == rank and "params bucket" in op.name]
    assert len(gathers) == 2 and trace.start_s[gathers[0]] == 0.0
    assert trace.start_s[gathers[1]] == pytest.approx(trace.end_s[gathers[0]], rel=1e-12)
    pricer = CommPricer(topology)
    assert analytic_step(cfg, pricer).step_time_s < analytic_step(off, pricer).step_time_s
    closed, _ = analytic_observables(cfg, pricer, fast_forward=False)
    _agree(_graph_observables(cfg, topology), closed, 1e-9)


@pytest.mark.parametrize("x", [
    BASE,
    {**BASE, "pp": 2, "num_layers": 4, "microbatches": 5},
    {**BASE, "pp": 2, "vpp": 2, "schedule": "interleaved_1f1b", "num_layers": 8, "microbatches": 3,
     "bucket": "20 MB"},
    {**BASE, "tp": 2, "sp": True, "tp_overlap": True, "num_layers": 5, "bucket": "50 MB"},
])
def test_the_fast_closed_form_and_the_batched_band_run_it(x):
    # The first forwards are timed piece by piece inside the fast timeline (no fall-back to the slow one), the band's
    # one batched pass times them too, and the search's lower bound stays below the exact closed form.
    cfg, topology = _made(x, overlap=True)
    pricer = CommPricer(topology)
    stages = _stages(cfg, pricer)
    assert _fast(stages)
    assert any(sm is None and r is not None for st in stages for r, sm in zip(st.recipes, st.simple, strict=True))
    steps = _batch_step_s(cfg, stages, [(cfg, pricer.scaled(lambda n: 1.5))])
    assert steps is not None
    alone = analytic_observables(cfg, pricer)[0]["step_s"]
    assert steps[0] == pytest.approx(alone, rel=1e-12) and steps[1] > steps[0]
    assert 0 < lower_bound_s(cfg, pricer) <= alone * (1 + 1e-12)


@pytest.mark.parametrize("zero,grad_reduce,words", [
    (0, "overlapped", "zero_stage is 0"),
    (2, "overlapped", "zero_stage is 2"),
    (3, "overlapped", "zero_stage is 3"),
    (1, "bucketed", "grad_reduce: bucketed"),
])
def test_needs_the_distributed_optimizer_and_overlapped_reduction(zero, grad_reduce, words):
    spec = _spec({**BASE, "zero_stage": zero, "grad_reduce": grad_reduce})
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"overlap_param_gather": True})})
    with pytest.raises(LayoutRuleError) as err:
        step_config_of(spec, api.cluster_of(spec), resolve_model(spec.model))
    assert err.value.field == "training.overlap_param_gather" and err.value.rule == "zero"
    assert words in str(err.value) and err.value.fix and "\n" not in str(err.value)


def test_missing_distributed_optimizer_is_one_line_on_the_command_line():
    r = run_cli(["run", "scenarios/published/korthikanti2022-22b.yaml", "--set", "training.overlap_param_gather=true",
                 "--set", "training.grad_reduce=overlapped"], cwd=REPO)
    assert r.one_line_error() and "training.overlap_param_gather" in r.err and "zero_stage: 1" in r.err


def test_megatron_argument_names_parse():
    # Megatron-LM's three flags by their own names: --use-distributed-optimizer --overlap-grad-reduce
    # --overlap-param-gather
    doc = {"cluster": {"preset": "dgx-a100", "num_nodes": 2}, "model": {"preset": "llama3-8b"},
           "parallel": {"tp": 8, "dp": 2, "use_distributed_optimizer": True},
           "training": {"global_batch_size": 8, "overlap_grad_reduce": True, "overlap_param_gather": True}}
    sc = api.scenario_of(doc)
    cfg = step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
    assert (cfg.zero_stage, cfg.grad_reduce, cfg.overlap_param_gather) == (1, "overlapped", True)


def test_schema_documents_it():
    training = api.schema("scenario")["$defs"]["TrainingSpec"]["properties"]
    text = training["overlap_param_gather"]["description"]
    assert "--overlap-param-gather" in text and "zero_stage: 1" in text and "overlapped" in text
    r = run_cli(["schema", "scenario"], cwd=REPO)
    assert r.code == 0 and "overlap_param_gather" in r.out


def test_megatron_lm_default_bucket_counts_data_and_context_parallel_ranks():
    # Megatron-LM's training loop sizes the default bucket on the dp x cp group (megatron/training/training.py,
    # resolve_ddp_bucket_size): 32 x 2 ranks give max(40M, 64M) = 64M parameters, not max(40M, 32M) = 40M.
    cfg, _ = _made({**BASE, "dp": 32, "cp": 2, "num_layers": 12}, overlap=False)
    cost = chunk_costs_of(cfg)[(0, 0)]
    assert 128e6 < cost.num_params < 192e6
    assert num_buckets(cfg, cost) == 3  # ceil(n / 64M); with 40M buckets it would be 4 or 5
