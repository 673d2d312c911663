"""The contention estimate search ranks by (simdist.search.contention): a collective waits for its translates'
traffic on the links it shares with them, so placement, NICs and oversubscription move the closed form where they
move the engine (benchmarks/contention.py measures it over 224 layouts)."""

from __future__ import annotations

import dataclasses

import pytest

from simdist import api
from simdist.analytic.pricing import CommPricer
from simdist.hardware import load_topology
from simdist.plan.mesh import Mesh
from simdist.plan.opgraph import Comm
from simdist.predict.price import class_bottleneck_s, price_comm
from simdist.predict.step import predict_step
from simdist.search.contention import ContendedPricer
from simdist.search.evaluate import context, evaluate_one
from simdist.search.space import Candidate
from simdist.spec.load import Document


def _two_nodes(nics: int):
    return load_topology("dgx-a100", overrides=Document(data={
        "num_nodes": 2, "gpus_per_node": 2, "host": {"cpu_sockets": 1, "pcie_switches_per_socket": 1},
        "inter_node": {"nics_per_node": nics}}, source="test", lines={}))


@pytest.mark.parametrize("nics,factor", [(1, 2.0), (2, 1.0)])
def test_two_data_parallel_groups_on_one_nic_take_twice_as_long(nics, factor):
    # tp 2 inside each of 2 nodes, dp 2 across them: the dp groups {0, 2} and {1, 3} all-reduce together. With one
    # NIC per node both cross it, so the transfer takes twice as long as alone; with a NIC per GPU, as long.
    topology = _two_nodes(nics)
    pricer = CommPricer(topology)
    alone = pricer.time_s("all_reduce", (0, 2), 1e9)
    latency = pricer.time_s("all_reduce", (0, 2), 1.0)  # the one-byte time
    contended = ContendedPricer(topology, Mesh(tp=2, dp=2)).time_s("all_reduce", (0, 2), 1e9)
    assert contended - latency == pytest.approx(factor * (alone - latency), rel=1e-6)
    # the factor is the class's busiest link against the transfer alone, measured on the engine's own link loads
    priced = price_comm(topology, Comm("all_reduce", (0, 2), 2**26, "dp"), translates=[(0, 2), (1, 3)])
    assert ContendedPricer(topology, Mesh(tp=2, dp=2)).factor("all_reduce", (0, 2)) == pytest.approx(
        max(1.0, class_bottleneck_s(topology, priced) / (priced.time_s - priced.latency_s)), rel=1e-12)
    # a group without translates (tp 1: the dp group is every rank) is priced alone
    assert ContendedPricer(topology, Mesh(dp=4)).time_s("all_reduce", (0, 1, 2, 3), 1e9) == pytest.approx(
        CommPricer(topology).time_s("all_reduce", (0, 1, 2, 3), 1e9), rel=1e-12)


@pytest.mark.parametrize("order", [("tp", "cp", "dp", "pp"), ("tp", "cp", "pp", "dp")])
def test_every_member_of_a_class_gets_its_own_price_comm_factor(order):
    # 16 DGX A100 on a 3:1 oversubscribed RoCE fat tree, tp 8 x dp 4 x pp 4: each data-parallel and pipeline group's
    # factor comes from one batch of its class's routes (ContendedPricer._class_factor); it must be what pricing
    # that group itself with its translates gives (price_comm: its own busiest link's class bytes), group by group
    topology = api.load_scenario("scenarios/gpt3-175b-roce.yaml",
                                 ["cluster.inter_node.oversubscription=3", "cluster.num_nodes=16"]).topology
    mesh = Mesh(tp=8, dp=4, pp=4, order=order)
    pricer = ContendedPricer(topology, mesh)
    checked = 0
    for axis, op in (("dp", "all_reduce"), ("pp", "all_gather")):
        for group in sorted({mesh.group(axis, r) for r in range(mesh.num_ranks)}):
            images = pricer._images(group, pricer._translate_axes(group))
            shared = pricer._class_factor(op, group, 1.0, "nccl", images)
            if shared is None:
                continue
            priced = price_comm(topology, Comm(op, group, 2**26, axis), translates=images,
                                stand_in=pricer.alone.stand_in(group))
            own = max(1.0, class_bottleneck_s(topology, priced) / (priced.time_s - priced.latency_s))
            assert shared == pytest.approx(own, rel=1e-12), (axis, group)
            checked += 1
    assert checked >= 8  # the dp groups of every stage at least


def test_search_ranks_two_placements_as_the_engine_does():
    # GPT-3 175B tp 8, pp 4, dp 4 on 16 DGX A100 over a 3:1 oversubscribed RoCE fat tree: the engine separates the
    # placements tp-cp-dp-pp and tp-cp-pp-dp by > 10 % (the data-parallel groups of a stage share leaf uplinks);
    # alone, every collective prices the same in both; search's closed form orders them as the engine does
    sets = ["parallel.tp=8", "parallel.pp=4", "parallel.dp=4", "cluster.inter_node.oversubscription=3"]
    from simdist.api.search import scenario_problem

    problem = scenario_problem("scenarios/gpt3-175b-roce.yaml", sets, placement=True)
    ctx = context(problem)
    alone_problem = dataclasses.replace(problem, contention=False)
    rows, alone, engine = {}, {}, {}
    for order in ("tp-cp-dp-pp", "tp-cp-pp-dp"):
        c = Candidate(8, 4, 4, 1, 1, 1, 0, "full", False, "1f1b", order)
        rows[order] = evaluate_one(problem, c, ctx)
        alone[order] = evaluate_one(alone_problem, c, context(alone_problem))["step_time_s"]
        engine[order] = predict_step(api.load_scenario("scenarios/gpt3-175b-roce.yaml",
                                                       [*sets, f"parallel.order={order}"]).spec,
                                     ctx.topology).result["step_time_s"]
    a, b = "tp-cp-dp-pp", "tp-cp-pp-dp"
    assert engine[b] / engine[a] > 1.10
    assert alone[a] == pytest.approx(alone[b], rel=1e-9)
    assert rows[a]["step_time_s"] < rows[b]["step_time_s"]
    for order in (a, b):  # within 5 % of the engine each
        assert rows[order]["step_time_s"] == pytest.approx(engine[order], rel=0.05)


def test_a_contended_rows_band_is_the_contention_free_band_scaled():
    # a row the engine did not re-simulate gets the closed form's band (simdist.predict.bands), which perturbs the
    # contention-free step: scaled by the contention estimate's ratio, it brackets the row's step as it brackets
    # `run --fidelity closed_form`'s
    from simdist.analytic.step import analytic_step
    from simdist.api.search import scenario_problem
    from simdist.predict.bands import step_band
    from simdist.search.evaluate import step_config
    from simdist.search.rank import closed_form_band

    sets = ["parallel.tp=8", "parallel.pp=4", "parallel.dp=4", "cluster.inter_node.oversubscription=3"]
    problem = scenario_problem("scenarios/gpt3-175b-roce.yaml", sets, placement=True)
    ctx = context(problem)
    c = Candidate(8, 4, 4, 1, 1, 1, 0, "full", False, "1f1b", "tp-cp-pp-dp")
    row = evaluate_one(problem, c, ctx)
    cfg = step_config(problem, c, ctx)
    alone = analytic_step(cfg, ctx.pricer).step_time_s
    assert row["step_time_s"] > alone * 1.05  # contention adds
    band, _ = step_band(cfg, ctx.pricer, alone)
    scaled = closed_form_band(problem, row)
    assert scaled == pytest.approx({q: v * row["step_time_s"] / alone for q, v in band.items()}, rel=1e-12)
    assert scaled["p10"] <= row["step_time_s"] <= scaled["p90"]
