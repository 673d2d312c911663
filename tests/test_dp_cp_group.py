"""The dense parameters' gradients and ZeRO / distributed-optimizer shards live over dp x cp ranks.

Megatron-Core reduces the dense gradients and shards the distributed optimizer over the data-parallel group with
context parallelism (parallel_state.py ``get_ranks("dp-cp")``): the cp ranks of a replica hold the same weights.
simdist names that group ``dp_cp`` where cp > 1 (simdist.plan.data_parallel.dense_data_parallel_axis) and charges it to
the breakdown's dp. These tests pin the group's ranks on hand-checkable meshes (orders where cp and dp are not
adjacent included), the bytes and group of the reduction on a tiny cluster, the memory and optimizer shards, and
that both fidelities and the reduced graph agree on such groups.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdist import api
from simdist.analytic.step import CommPricer, analytic_observables
from simdist.plan.accounting import category_of
from simdist.plan.data_parallel import data_parallel_groups, optimizer_params
from simdist.plan.layout import LayoutRuleError, step_config_of
from simdist.plan.memory import stage_memory
from simdist.plan.mesh import Mesh, parse_order
from simdist.plan.model_presets import resolve_model
from simdist.plan.step import build_step, chunk_costs_of, grad_bytes_per_element
from simdist.predict.price import translate_axes
from simdist.predict.step import predict_step
from simdist.spec.scenario import ScenarioSpec
from tests.test_analytic_step import SMALL, _agree, _graph_observables, _spec


# ----------------------------------------------------------------------------- the mesh's group
def test_tp1_cp2_dp2_one_group_of_all_four_ranks() -> None:
    # tp-cp-dp-pp: cp peers are neighbours (stride 1), dp replicas 2 apart; dp x cp is every rank, peer j = rank j.
    mesh = Mesh(tp=1, cp=2, dp=2)
    assert mesh.size("dp_cp") == 4
    assert all(mesh.group("dp_cp", r) == (0, 1, 2, 3) for r in range(4))
    assert mesh.group("dp", 1) == (1, 3) and mesh.group("cp", 2) == (2, 3)  # the parts stay what they were
    assert mesh.stride("dp_cp") == 1 and mesh.shape("dp_cp") == (4, 1)
    assert mesh.nodes_spanned("dp_cp", 2) == 2


def test_tp_dp_cp_pp_order_puts_dp_inside_cp() -> None:
    # tp-dp-cp-pp with tp 2, dp 2, cp 2, pp 2: tp stride 1, dp stride 2, cp stride 4, pp stride 8. The dp x cp group
    # of rank 1 (tp 1) is tp 1 + 2 dp + 4 cp: 1, 3, 5, 7 (peer j: dp = j % 2, cp = j // 2, Megatron's order).
    mesh = Mesh(tp=2, cp=2, dp=2, pp=2, order=parse_order("tp-dp-cp-pp"))
    assert mesh.group("dp_cp", 1) == (1, 3, 5, 7)
    assert mesh.group("dp_cp", 12) == (8, 10, 12, 14)
    assert mesh.levels("dp_cp") == ((4, 2),) and mesh.stride("dp_cp") == 2


def test_cp_and_dp_not_adjacent_is_not_one_stride() -> None:
    # tp-cp-pp-dp with every axis 2: tp stride 1, cp 2, pp 4, dp 8. Rank 1's dp x cp group: 1 + 2 cp + 8 dp =
    # 1, 3, 9, 11 (pp between them: no single stride); pipeline stage 1's (rank 5): 5, 7, 13, 15.
    mesh = Mesh(tp=2, cp=2, dp=2, pp=2, order=parse_order("tp-cp-pp-dp"))
    assert mesh.group("dp_cp", 1) == (1, 3, 9, 11)
    assert mesh.group("dp_cp", 15) == (5, 7, 13, 15)
    assert mesh.levels("dp_cp") == ((2, 2), (2, 8))
    assert mesh.offsets("dp_cp") == (0, 2, 8, 10) and mesh.shape("dp_cp") == (4, (0, 2, 8, 10))
    with pytest.raises(ValueError, match="not evenly spaced"):
        mesh.stride("dp_cp")
    assert mesh.nodes_spanned("dp_cp", 4) == 2  # ranks 0, 2 on node 0; 8, 10 on node 2


@pytest.mark.parametrize("order", ["-".join(p) for p in itertools.permutations(("tp", "cp", "dp", "pp"))])
def test_group_is_every_rank_sharing_tp_and_pp_ascending(order: str) -> None:
    # Independent of the strides: the dp x cp group of r is the ranks with r's tp and pp coordinates, listed in
    # ascending order (Megatron's masked decomposition, innermost axis first, lists them so); its size dp x cp.
    for tp, cp, dp, pp in itertools.product((1, 2), (1, 2, 3), (1, 2, 3), (1, 2)):
        mesh = Mesh(tp=tp, cp=cp, dp=dp, pp=pp, order=parse_order(order))
        coords = [mesh.coords(r) for r in range(mesh.num_ranks)]
        for r in range(mesh.num_ranks):
            same = tuple(q for q in range(mesh.num_ranks)
                         if coords[q]["tp"] == coords[r]["tp"] and coords[q]["pp"] == coords[r]["pp"])
            assert mesh.group("dp_cp", r) == same, (order, tp, cp, dp, pp, r)
        first = mesh.group("dp_cp", 0)
        assert tuple(first[0] + o for o in mesh.offsets("dp_cp")) == first and len(first) == cp * dp


def test_translates_of_a_dp_cp_group_run_along_the_other_axes_only() -> None:
    # The reduced graph's dp x cp group has images along tp (its own axes dp and cp give the same ranks again).
    assert translate_axes("dp_cp", ("tp", "cp", "dp")) == ("tp",)
    assert translate_axes("dp", ("tp", "cp", "dp")) == ("tp", "cp")


def test_expert_data_parallel_group_already_spans_the_cp_ranks() -> None:
    # The expert generator has cp = 1 (Megatron-Core initialize_model_parallel): edp = tp x cp x dp / (etp x ep).
    # tp 1, cp 2, dp 4, ep 1: the experts' group is the dense dp x cp group, all 8 ranks.
    mesh = Mesh(tp=1, cp=2, dp=4)
    assert mesh.size("edp") == 8 and mesh.group("edp", 5) == mesh.group("dp_cp", 5) == tuple(range(8))
    # ep 2 (inside dp by default: etp, ep, edp innermost first): edp = 8 / 2 = 4, every other rank
    mesh = Mesh(tp=1, cp=2, dp=4, ep=2)
    assert mesh.size("edp") == 4 and mesh.group("edp", 0) == (0, 2, 4, 6) and mesh.group("ep", 0) == (0, 1)


# ----------------------------------------------------------------------------- the tiny step
TINY = """
name: tp1 cp2 dp2 on 4 GPUs
cluster: {{preset: dgx-h100, gpus_per_node: {gpus}, host: {{cpu_sockets: 1, pcie_switches_per_socket: 1}},
          inter_node: {{nics_per_node: {gpus}}}}}
model: {{num_layers: 4, hidden_size: 1024, num_attention_heads: 16, seq_length: 512, vocab_size: 32000}}
parallel: {{tp: 1, cp: {cp}, dp: {dp}, pp: 1, zero_stage: {zero}}}
training: {{micro_batch_size: 1, global_batch_size: {batch}}}
"""


def _tiny(tmp_path: Path, *, cp: int = 2, dp: int = 2, zero: int = 0):
    path = tmp_path / "s.yaml"
    path.write_text(TINY.format(gpus=cp * dp, cp=cp, dp=dp, zero=zero, batch=2 * dp))
    return api.load_scenario(path)


def test_gradient_all_reduce_runs_over_the_four_ranks(tmp_path: Path) -> None:
    # One replica's two cp ranks and the other replica's two hold the same weights: one all_reduce of all the
    # gradients over ranks 0-3, whose ring on 4 peers moves 2 (4 - 1) / 4 = 1.5 x the gradient bytes through each
    # GPU's NVLink port (ranks 2 and 3 run nothing else of the simulated rank's: their ports carry exactly that).
    s = _tiny(tmp_path)
    pred = predict_step(s.spec, s.topology)
    cfg = pred.plan.config
    grads = chunk_costs_of(cfg)[(0, 0)].num_params * grad_bytes_per_element(cfg.precision, cfg.grad_reduce_in_fp32)
    ops = [op.comm for op in pred.plan.graph.ops if op.comm is not None and op.comm.axis == "dp_cp"]
    assert [(c.op, c.ranks, c.count) for c in ops] == [("all_reduce", (0, 1, 2, 3), 1)]
    assert ops[0].nbytes == pytest.approx(grads, rel=1e-12)
    rows = [c for c in pred.result["collectives"] if c["axis"] == "dp_cp"]
    assert [(r["op"], r["num_ranks"], r["algorithm"]) for r in rows] == [("all_reduce", 4, "ring")]
    ports = {(link["src"], link["dst"]): link["bytes"] for link in pred.result["links"]}
    for gpu in ("n0/gpu2", "n0/gpu3"):
        assert ports[(gpu, "n0/nvswitch")] == pytest.approx(1.5 * grads, rel=1e-12)
        assert ports[("n0/nvswitch", gpu)] == pytest.approx(1.5 * grads, rel=1e-12)
    # charged to the breakdown's dp, the one data-parallel collective, after the backward and alone: all exposed
    exposed = pred.result["breakdown"]["exposed_comm_s"]
    assert set(exposed) == {"tp", "cp", "pp", "dp"}
    assert exposed["dp"] == pytest.approx(rows[0]["time_s"], rel=1e-12)
    assert category_of("comm", "dp_cp") == "dp"


def test_cp_without_data_parallelism_still_reduces_over_the_cp_ranks(tmp_path: Path) -> None:
    # dp 1, cp 2: the two cp ranks compute gradients on different halves of the sequence and all-reduce them.
    s = _tiny(tmp_path, dp=1)
    pred = predict_step(s.spec, s.topology)
    ops = [op.comm for op in pred.plan.graph.ops if op.comm is not None and op.comm.axis == "dp_cp"]
    assert [(c.op, c.ranks) for c in ops] == [("all_reduce", (0, 1))]
    assert pred.result["breakdown"]["exposed_comm_s"]["dp"] > 0


def test_cp1_keeps_the_dp_axis(tmp_path: Path) -> None:
    s = _tiny(tmp_path, cp=1, dp=4)
    cfg = predict_step(s.spec, s.topology).plan.config
    assert [a for a, _ in data_parallel_groups(cfg, 1e6, 0.0)] == ["dp"]
    assert cfg.mesh.group("dp_cp", 0) == cfg.mesh.group("dp", 0) == (0, 1, 2, 3)


def test_zero1_shards_optimizer_state_and_update_over_four(tmp_path: Path) -> None:
    # ZeRO-1 (the distributed optimizer) over dp x cp = 4: each GPU holds and updates a quarter of the fp32 master
    # weights and Adam moments (12 B per parameter, Rajbhandari et al. 2020 Figure 1), 16-bit weights whole.
    s = _tiny(tmp_path, zero=1)
    pred = predict_step(s.spec, s.topology)
    mem = pred.result["memory"][0]
    n = mem["params_bytes"] / 2
    assert mem["optimizer_bytes"] == pytest.approx(n * 12 / 4, rel=1e-12)
    cfg = pred.plan.config
    assert optimizer_params(cfg, 8e6) == pytest.approx(2e6, rel=1e-12)
    parts = stage_memory(resolve_model(s.spec.model), layers_on_stage=4, first_stage=True, last_stage=True, cp=2,
                         dp=2, zero_stage=1)
    assert parts.optimizer_bytes == pytest.approx(stage_memory(
        resolve_model(s.spec.model), layers_on_stage=4, first_stage=True, last_stage=True, dp=4,
        zero_stage=1).optimizer_bytes, rel=1e-12)
    ops = {(op.comm.op, op.comm.ranks) for op in pred.plan.graph.ops if op.comm is not None
           and op.comm.axis == "dp_cp"}
    assert ops == {("reduce_scatter", (0, 1, 2, 3)), ("all_gather", (0, 1, 2, 3))}


# ----------------------------------------------------------------------------- both fidelities, non-adjacent orders
def _ordered(x: dict, order: str, fabric: str | None = None):
    data = _spec(x).model_dump()
    data["parallel"]["order"] = order
    if fabric is not None:
        data["cluster"]["inter_node"]["fabric"] = fabric
    spec = ScenarioSpec.model_validate(data)
    topology = api.cluster_of(spec)
    try:
        return step_config_of(spec, topology, resolve_model(spec.model)), topology
    except LayoutRuleError:
        return None


BASE = {"tp": 2, "pp": 2, "dp": 2, "cp": 2, "vpp": 1, "zero_stage": 1, "recompute": "none", "schedule": "1f1b",
        "grad_reduce": "bucketed", "bucket": None, "microbatches": 3, "mbs": 1, "sp": True, "per_parameter": False,
        "num_layers": SMALL["num_layers"]}


@pytest.mark.parametrize("order", ["tp-cp-pp-dp", "cp-tp-dp-pp", "tp-dp-cp-pp", "dp-pp-tp-cp"])
@pytest.mark.parametrize("zero,grad_reduce", [(0, "bucketed"), (1, "overlapped"), (2, "bucketed"), (3, "bucketed")])
def test_closed_form_is_the_uncontended_graph_on_any_order(order: str, zero: int, grad_reduce: str) -> None:
    made = _ordered({**BASE, "zero_stage": zero, "grad_reduce": grad_reduce}, order)
    assert made is not None
    cfg, topology = made
    mesh = cfg.mesh
    assert len(mesh.group("dp_cp", 0)) == 4
    closed, _ = analytic_observables(cfg, CommPricer(topology), fast_forward=False)
    _agree(_graph_observables(cfg, topology), closed, 1e-9)
    plan = build_step(cfg)
    groups = {op.comm.ranks for op in plan.graph.ops if op.comm is not None and op.comm.axis == "dp_cp"}
    assert groups == {mesh.group("dp_cp", mesh.rank(pp=s)) for s in range(mesh.pp)}


@pytest.mark.parametrize("schedule,vpp", [("zb_v", 2), ("dualpipe", 1), ("dualpipev", 2)])
def test_closed_form_is_the_uncontended_graph_with_the_two_chunk_schedules(schedule: str, vpp: int) -> None:
    # the V placement and dualpipe's two copies, with DualPipe(V)'s held sends, over a dp x cp group
    made = _ordered({**BASE, "schedule": schedule, "vpp": vpp, "microbatches": 4, "grad_reduce": "overlapped"},
                    "tp-dp-cp-pp")
    assert made is not None
    cfg, topology = made
    closed, _ = analytic_observables(cfg, CommPricer(topology), fast_forward=False)
    _agree(_graph_observables(cfg, topology), closed, 1e-9)


orders = st.sampled_from(["-".join(p) for p in itertools.permutations(("tp", "cp", "dp", "pp"))])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(order=orders, tp=st.sampled_from([1, 2]), cp=st.sampled_from([2, 4]), dp=st.sampled_from([1, 2, 3]),
       pp=st.sampled_from([1, 2]), zero=st.sampled_from([0, 1, 2, 3]),
       grad_reduce=st.sampled_from(["per_parameter", "bucketed", "overlapped"]),
       per_parameter=st.booleans())
def test_closed_form_equals_the_uncontended_graph_property(order, tp, cp, dp, pp, zero, grad_reduce, per_parameter):
    # On a fat tree of one leaf (at most 6 nodes x 8 NICs here): the closed form prices a group by its shape
    # re-placed on the first nodes (simdist.analytic.pricing.CommPricer's assumption), which a rail-optimized fabric
    # breaks where a ring crosses rails through the spines, whose ECMP choice depends on the nodes: an irregular
    # dp x cp group of nodes 0-2 and the same shape on nodes 3-5 can then collide on a spine link or not.
    x = {**BASE, "tp": tp, "cp": cp, "dp": dp, "pp": pp, "zero_stage": zero, "grad_reduce": grad_reduce,
         "per_parameter": per_parameter, "sp": tp > 1}
    made = _ordered(x, order, "fat_tree")
    if made is None:
        return
    cfg, topology = made
    closed, _ = analytic_observables(cfg, CommPricer(topology), fast_forward=False)
    _agree(_graph_observables(cfg, topology), closed, 1e-9)


SYMMETRY = """
cluster: {preset: dgx-h100, num_nodes: 4, inter_node: {fabric: fat_tree, oversubscription: 2}}
model: {num_layers: 8, hidden_size: 2048, num_attention_heads: 16, seq_length: 2048, vocab_size: 32000}
parallel: {tp: 4, cp: 2, pp: 2, dp: 2, zero_stage: 1, sequence_parallel: true, order: tp-cp-pp-dp}
training: {micro_batch_size: 1, global_batch_size: 8}
"""


def test_reduced_graph_equals_every_rank_on_a_non_adjacent_group(tmp_path: Path) -> None:
    # 32 GPUs, tp-cp-pp-dp: each dp x cp group (4 ranks 4 and 16 apart) spans two nodes; its tp translates share the
    # oversubscribed fabric. One rank per stage with translates must give the step every rank gives.
    path = tmp_path / "s.yaml"
    path.write_text(SYMMETRY)
    s = api.load_scenario(path)
    reduced = predict_step(s.spec, s.topology, simulate="representatives")
    full = predict_step(s.spec, s.topology, simulate="full")
    assert len(full.plan.graph.ranks()) == 32 and len(reduced.plan.graph.ranks()) == 2
    assert reduced.plan.config.mesh.group("dp_cp", 0) == (0, 4, 16, 20)
    assert reduced.result["step_time_s"] == pytest.approx(full.result["step_time_s"], rel=1e-9)
    for axis, seconds in full.result["breakdown"]["exposed_comm_s"].items():
        assert reduced.result["breakdown"]["exposed_comm_s"][axis] == pytest.approx(seconds, rel=1e-9, abs=1e-12)
