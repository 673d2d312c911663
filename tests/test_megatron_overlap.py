"""Megatron-Core's gradient overlap defaults, its argument names, and the host costs of a step (issue 14, 4-5)."""

from __future__ import annotations

import math

import pytest

from simdist import api
from simdist.engine.uncontended import uncontended
from simdist.errors import SpecError
from simdist.hardware.gpus import GPU_PRESETS
from simdist.hardware.host import NONE, HostOverhead, host_overhead
from simdist.plan.data_parallel import megatron_bucket_params, num_buckets
from simdist.plan.kernel_work import Kernel
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.plan.recipe import step_recipe
from simdist.plan.step import build_step, chunk_costs_of
from simdist.predict.price import price_graph
from simdist.report.step_metrics import observables

ROCE = "scenarios/gpt3-175b-roce.yaml"
DP1 = ["parallel.dp=1", "cluster.num_nodes=8", "training.global_batch_size=64"]  # the same 64 micro-batches


def _config(path: str, assignments: list[str]):
    sc = api.load_scenario(path, assignments)
    return step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model)), sc.topology


# ----------------------------------------------------------------------------- default buckets
def test_megatron_default_buckets_on_model_part_0_only():
    cfg, _ = _config(ROCE, ["training.grad_reduce=overlapped"])
    costs = chunk_costs_of(cfg)
    # GPT-3 175B on tp 8: a layer holds 12 h^2 + 13 h = 1,812,099,072 parameters, 226,512,384 per GPU; stage 0
    # holds 12 of them and the embedding 51200 x 12288 / 8 = 78,643,200: 2,796,791,808 parameters.
    assert costs[(0, 0)].num_params == 2_796_791_808
    assert megatron_bucket_params(2) == 40_000_000 and megatron_bucket_params(64) == 64_000_000
    assert num_buckets(cfg, costs[(0, 0)]) == math.ceil(2_796_791_808 / 40e6) == 70
    assert all(num_buckets(cfg, costs[(s, 0)]) == 1 for s in range(1, 8))  # Megatron: no buckets on pp rank > 0
    # without overlap one bucket (Megatron sets bucket_size None); a given size cuts every chunk
    plain, _ = _config(ROCE, [])
    assert num_buckets(plain, chunk_costs_of(plain)[(0, 0)]) == 1
    sized, _ = _config(ROCE, ["training.grad_reduce=overlapped", "training.grad_bucket_size=1 GB"])
    assert [num_buckets(sized, c) for c in chunk_costs_of(sized).values()] == [12] + [11] * 7  # 11.19 GB, then 10.87 GB


def _stage_tails(path: str, assignments: list[str]):
    """(step, pipeline phase, bubble, optimizer, per stage: dp-stream end - last backward end) on the
    uncontended op graph."""
    cfg, topology = _config(path, assignments)
    plan = build_step(cfg)
    price_graph(plan.graph, topology, mesh=cfg.mesh, reduced_axes=plan.reduced_axes, with_links=False)
    trace = uncontended(plan.graph)
    ranks = sorted(r for (_, d), r in plan.stage_ranks.items() if d == 0)
    obs = observables(plan.graph, trace, ranks)
    tails = []
    for r in ranks:
        ops = [(i, op) for i, op in enumerate(plan.graph.ops) if op.rank == r]
        last_b = max(trace.end_s[i] for i, op in ops if op.kind in ("backward", "weight_grad") and op.microbatch >= 0)
        dp_end = max((trace.end_s[i] for i, op in ops if op.stream == "dp"), default=last_b)
        tails.append(dp_end - last_b)
    return obs["step_s"], obs["phase_s"], obs["bubble_s"], obs["optimizer_s"], tails


def test_overlapped_reduction_is_the_dp1_step_plus_its_unhidden_tail_and_no_bubble():
    step, phase, bubble, optimizer, tails = _stage_tails(ROCE, ["training.grad_reduce=overlapped"])
    step1, phase1, bubble1, _, tails1 = _stage_tails(ROCE, DP1)
    assert tails1 == [0.0] * 8
    # stage 0 ends the pipeline; its reduction's unhidden tail is what the step adds to the dp = 1 step
    assert step == pytest.approx(step1 + tails[0], rel=0.02)
    assert 0 < tails[0] < tails[1]  # Megatron's 70 buckets on stage 0 hide part of its reduction
    # gradient traffic stretches the pipeline only by the compute its buckets slow on the last backward of each stage
    # (simdist.plan.interference: a fraction of a micro-batch's backward), and its bubble differs at most by
    # optimizers that waited for their reduction and left the phase
    assert phase1 < phase < phase1 * 1.01
    assert bubble1 - 1e-9 <= bubble <= bubble1 + optimizer


# ----------------------------------------------------------------------------- Megatron-LM argument names
@pytest.mark.parametrize("training,parallel,grad_reduce,zero", [
    ({"overlap_grad_reduce": True}, {"use_distributed_optimizer": True}, "overlapped", 1),
    ({"overlap_grad_reduce": False}, {"use_distributed_optimizer": False}, "bucketed", 0),
    ({"overlap_grad_reduce": True, "grad_reduce": "overlapped"}, {"use_distributed_optimizer": True,
                                                                   "zero_stage": 1}, "overlapped", 1),
])
def test_megatron_switches(training, parallel, grad_reduce, zero):
    doc = {"cluster": {"preset": "dgx-a100", "num_nodes": 2}, "model": {"preset": "llama3-8b"},
           "parallel": {"tp": 8, "dp": 2, **parallel}, "training": {"global_batch_size": 8, **training}}
    spec = api.scenario_of(doc).spec
    assert spec.training.grad_reduce == grad_reduce and spec.parallel.zero_stage == zero


@pytest.mark.parametrize("training,parallel,words", [
    ({"overlap_grad_reduce": True, "grad_reduce": "per_parameter"}, {}, "contradicts grad_reduce"),
    ({"overlap_grad_reduce": False, "grad_reduce": "overlapped"}, {}, "contradicts grad_reduce"),
    ({}, {"use_distributed_optimizer": True, "zero_stage": 3}, "contradicts zero_stage"),
    ({}, {"use_distributed_optimizer": "yes"}, "write true or false"),
])
def test_megatron_switch_contradictions_are_one_line(training, parallel, words):
    doc = {"cluster": {"preset": "dgx-a100", "num_nodes": 2}, "model": {"preset": "llama3-8b"},
           "parallel": {"tp": 8, "dp": 2, **parallel}, "training": {"global_batch_size": 8, **training}}
    with pytest.raises(SpecError) as err:
        api.scenario_of(doc)
    assert words in str(err.value) and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- host costs
def test_host_costs_defaults_and_floor():
    h = host_overhead()
    assert (h.launch_s, h.dispatch_s, h.step_gap_s) == (5e-6, 8.48e-6, 20e-6)
    assert h.op_s == pytest.approx(13.48e-6)
    # ten kernels of 50 us on the GPU: the host issues them faster (135 us < 500 us); of 5 us: host-bound
    ten = [Kernel("k", 0.0, 0.0, "memory")] * 10
    assert h.run_time_s(500e-6, ten) == 500e-6
    assert h.run_time_s(50e-6, ten) == pytest.approx(134.8e-6)
    assert host_overhead(GPU_PRESETS["cpu-core"]) is NONE  # a CPU core's dispatch is in its launch overhead
    assert host_overhead(GPU_PRESETS["h100-sxm"]) == h


def test_step_gap_on_each_pipeline_step_and_scenario_override():
    cfg, _ = _config(ROCE, [])
    cost = chunk_costs_of(cfg)[(1, 0)]
    f = step_recipe(cfg, cost, "F")
    assert f.pieces[0].duration_s == pytest.approx(cost.forward_s + 20e-6, rel=1e-12)
    b = step_recipe(cfg, cost, "B")
    assert b.pieces[0].label == "recompute" and b.pieces[0].duration_s == pytest.approx(cost.recompute_s + 20e-6)
    off, _ = _config(ROCE, ["training.host_overhead.step_gap=0 us", "training.host_overhead.dispatch=4 us"])
    assert off.host_overhead == HostOverhead(launch_s=5e-6, dispatch_s=4e-6, step_gap_s=0.0)
    assert step_recipe(off, cost, "F").pieces[0].duration_s == cost.forward_s
    single, _ = _config(ROCE, ["parallel.pp=1", "parallel.dp=16", "training.global_batch_size=128"])
    one = chunk_costs_of(single)[(0, 0)]
    assert step_recipe(single, one, "F").pieces[0].duration_s == one.forward_s  # no neighbours, no sync


def test_step_gap_weighs_more_per_sample_at_micro_batch_1():
    # The gap is paid per micro-batch: 4x as many at micro-batch 1 as at 4 for the same samples.
    def per_sample(b: int, gap: str) -> float:
        sc = api.load_scenario(ROCE, [f"training.micro_batch_size={b}", f"training.host_overhead.step_gap={gap}"])
        cfg = step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
        from simdist.analytic.step import CommPricer, analytic_step
        return analytic_step(cfg, CommPricer(sc.topology)).step_time_s / 128

    extra_1 = per_sample(1, "1 ms") - per_sample(1, "0 us")
    extra_4 = per_sample(4, "1 ms") - per_sample(4, "0 us")
    assert extra_1 > 3 * extra_4 > 0
