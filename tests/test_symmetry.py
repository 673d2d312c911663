"""Symmetry reduction: simulating one rank per class equals simulating every rank, and switches itself off.

The reduced graph simulates one rank per pipeline stage; the tensor/context-parallel peers and data-parallel
replicas it leaves out put their traffic on the shared links through their groups' translates
(simdist.predict.price). On layouts small enough to simulate every rank, both must give the same step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simdist import api
from simdist.engine.graph import run_graph
from simdist.plan.mesh import Mesh
from simdist.plan.opgraph import Job, Op, OpGraph
from simdist.predict import engine_step as engine_module
from simdist.predict.step import predict_step
from tests.conftest import TOY_TOPOLOGY

LAYOUTS = {
    # 64 GPUs, fat tree with 2:1 oversubscription: data-parallel traffic of the 8 tp peers meets on spines.
    "h100-64-fat-tree-oversubscribed": """
cluster: {preset: dgx-h100, num_nodes: 8, inter_node: {fabric: fat_tree, oversubscription: 2}}
model: {num_layers: 8, hidden_size: 4096, num_attention_heads: 32, seq_length: 2048, vocab_size: 51200}
parallel: {tp: 8, pp: 2, dp: 4, zero_stage: 1, sequence_parallel: true}
training: {micro_batch_size: 1, global_batch_size: 32}
""",
    # 64 GPUs, PCIe boxes with 4 NICs for 8 GPUs: two GPUs share each NIC.
    "pcie-64-shared-nics": """
cluster: {preset: pcie-gen4-8gpu, num_nodes: 8}
model: {num_layers: 8, hidden_size: 2048, num_attention_heads: 16, seq_length: 2048, vocab_size: 32000}
parallel: {tp: 2, pp: 4, dp: 8}
training: {micro_batch_size: 1, global_batch_size: 64}
""",
    # 256 GPUs, interleaved schedule, overlapped bucketed gradient all-reduce, rail-optimized fabric.
    "h100-256-interleaved-overlapped": """
cluster: {preset: dgx-h100, num_nodes: 32}
model: {num_layers: 16, hidden_size: 4096, num_attention_heads: 32, seq_length: 2048, vocab_size: 51200}
parallel: {tp: 8, pp: 4, dp: 8, vpp: 2}
training: {micro_batch_size: 1, global_batch_size: 64, grad_reduce: overlapped, grad_bucket_size: 100 MB}
schedule: interleaved_1f1b
""",
}


def load(tmp_path: Path, text: str):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return api.load_scenario(path)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_reduced_simulation_equals_full(tmp_path: Path, name: str) -> None:
    s = load(tmp_path, LAYOUTS[name])
    reduced = predict_step(s.spec, s.topology, simulate="representatives")
    full = predict_step(s.spec, s.topology, simulate="full")
    assert reduced.result["layout"]["reduction_exact"]
    assert len(full.plan.graph.ranks()) == s.topology.num_gpus
    assert len(reduced.plan.graph.ranks()) == s.spec.parallel.pp
    assert reduced.result["step_time_s"] == pytest.approx(full.result["step_time_s"], rel=1e-9)
    for key in ("compute_s", "bubble_s", "optimizer_s"):
        assert reduced.result["breakdown"][key] == pytest.approx(full.result["breakdown"][key], rel=1e-9, abs=1e-12)
    for axis, t in reduced.result["breakdown"]["exposed_comm_s"].items():
        assert t == pytest.approx(full.result["breakdown"]["exposed_comm_s"][axis], rel=1e-9, abs=1e-12)


def test_shared_nics_slow_the_data_parallel_reduction(tmp_path: Path) -> None:
    # pcie-gen4-8gpu: two GPUs per NIC, so the two tensor-parallel peers' data-parallel all-reduces share each
    # NIC: the simulated reduction takes longer than the collective's closed form alone.
    s = load(tmp_path, LAYOUTS["pcie-64-shared-nics"])
    pred = predict_step(s.spec, s.topology, simulate="representatives")
    graph, trace = pred.plan.graph, pred.trace
    dp_ops = [i for i, op in enumerate(graph.ops) if op.comm is not None and op.comm.axis == "dp"]
    assert dp_ops
    for i in dp_ops:
        simulated_s = trace.end_s[i] - trace.start_s[i]  # the engine's time for it, not the clock's
        assert simulated_s > graph.ops[i].duration_s * 1.3  # about 2x on the transfer part
    alone = [p for p in pred.priced.values() if p.axis == "dp"]
    assert all(p.num_translates == 2 for p in alone)


def test_unequal_batches_simulate_every_replica(tmp_path: Path) -> None:
    text = LAYOUTS["pcie-64-shared-nics"].replace("global_batch_size: 64}",
                                                  "global_batch_size: 64, dp_batch_split: [4, 4, 4, 4, 4, 4, 4, 36]}")
    s = load(tmp_path, text)
    pred = predict_step(s.spec, s.topology)
    assert "dp" not in pred.plan.reduced_axes
    assert len(pred.plan.graph.ranks()) == 4 * 8  # every stage of every replica


def test_asymmetric_translates_switch_to_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 256 A100s on a rail fabric needing two leaves per rail: pipeline sends of equivalent ranks hash onto
    # different spines, so their translates do not meet the same bottleneck.
    text = """
cluster: {preset: dgx-a100, num_nodes: 32}
model: {num_layers: 16, hidden_size: 4096, num_attention_heads: 32, seq_length: 2048, vocab_size: 51200}
parallel: {tp: 4, pp: 4, dp: 16}
training: {micro_batch_size: 2, global_batch_size: 64}
"""
    s = load(tmp_path, text)
    reduced = predict_step(s.spec, s.topology, simulate="representatives")
    assert not reduced.result["layout"]["reduction_exact"]
    assert "approximate" in reduced.result["layout"]["note"]
    runs = []
    real = engine_module.engine_trace
    monkeypatch.setattr(engine_module, "engine_trace",
                        lambda plan, *a, **k: runs.append(plan) or real(plan, *a, **k))
    auto = predict_step(s.spec, s.topology)
    # the asymmetry is seen in the representatives' prices, before the engine runs: it runs once, on every rank
    assert len(runs) == 1 and len(runs[0].graph.ranks()) == s.topology.num_gpus
    full = predict_step(s.spec, s.topology, simulate="full")
    assert auto.result["layout"]["simulation"] == "full"
    assert auto.result["step_time_s"] == pytest.approx(full.result["step_time_s"], rel=1e-12)
    # the approximate reduction stays within a few % of the full simulation here (4.4 % when written)
    assert reduced.result["step_time_s"] == pytest.approx(full.result["step_time_s"], rel=0.06)


def test_mesh_translates() -> None:
    mesh = Mesh(tp=2, dp=2, pp=2)
    assert mesh.translates(mesh.group("tp", 0), ("dp",)) == [(0, 1), (2, 3)]
    assert mesh.translates(mesh.group("dp", 0), ("tp", "dp")) == [(0, 2), (1, 3)]
    assert sorted(mesh.translates((0, 4), ("tp", "dp"))) == [(0, 4), (1, 5), (2, 6), (3, 7)]


# ----------------------------------------------------------------------------- jobs on shared links
def test_engine_equals_closed_form_alone_and_is_slower_when_sharing() -> None:
    # Two collectives on different tracks, each alone: latency 1 + transfer 2. Sharing link 0 they both need
    # all of it (demand x rate = capacity), so each transfer takes twice as long.
    def graph(shared: bool) -> OpGraph:
        g = OpGraph()
        for rank in (0, 1):
            link = 0 if shared else rank
            g.add(Op(f"c{rank}", rank, "dp", "comm", job=Job(1.0, 2.0, ((link, 10.0, 1),))))
        return g

    capacity = {0: 5.0, 1: 5.0}
    alone = run_graph(graph(False), capacity_of=capacity.__getitem__)
    assert alone.makespan_s == pytest.approx(3.0, rel=1e-12)
    shared = run_graph(graph(True), capacity_of=capacity.__getitem__)
    assert shared.makespan_s == pytest.approx(1.0 + 4.0, rel=1e-12)


def test_collective_members_start_together() -> None:
    g = OpGraph()
    a = g.add(Op("slow", 0, "compute", "forward", duration_s=3.0))
    g.add(Op("ar", 0, "dp", "comm", deps=[a], job=Job(0.5, 0.0), sync=0))
    g.add(Op("ar", 1, "dp", "comm", job=Job(0.5, 0.0), sync=0))
    trace = run_graph(g)
    assert trace.start_s[1] == trace.start_s[2] == 3.0
    assert trace.end_s[1] == trace.end_s[2] == 3.5


# ----------------------------------------------------------------------------- fast paths, same results
def test_unique_inverse_is_numpy_unique() -> None:
    import numpy as np

    from simdist.engine.sharing import unique_inverse

    rng = np.random.default_rng(3)
    for n, top in ((0, 5), (1, 1), (50, 10), (1000, 10**5), (100, 10**9)):
        values = rng.integers(0, top, n)
        ids, inverse = unique_inverse(values)
        want_ids, want_inverse = np.unique(values, return_inverse=True)
        assert ids.tolist() == want_ids.tolist() and inverse.tolist() == want_inverse.reshape(-1).tolist()


def test_translates_array_and_peer_order() -> None:
    import numpy as np

    mesh = Mesh(tp=4, dp=8, pp=2)
    for group in (mesh.group("tp", 32), mesh.group("dp", 1), (3, 35), (35, 3)):
        for axes in (("tp",), ("dp",), ("tp", "dp")):
            images = mesh.translates_array(group, axes)
            assert [tuple(row) for row in images.tolist()] == mesh.translates(group, axes)
            # the images of a group in another peer order are the same images, columns permuted
            order = np.argsort(group)
            assert (mesh.translates_array(tuple(np.asarray(group)[order].tolist()), axes)
                    == images[:, order]).all()


def test_capacity_of_is_the_links_effective_bandwidth(tmp_path: Path) -> None:
    from simdist.predict.link_loads import capacity_of

    for name in LAYOUTS:
        topology = load(tmp_path, LAYOUTS[name]).topology
        capacity = capacity_of(topology)
        assert all(capacity(link) == topology.link(link).effective_bandwidth_Bps for link in range(topology.num_links))
        with pytest.raises(IndexError):
            capacity(topology.num_links)


def test_price_graph_batches_like_price_comm(tmp_path: Path) -> None:
    # price_graph resolves every collective's translates in one batch of routes; each collective priced alone
    # (price_comm with the same translates) gives the same loads, bit for bit.
    from simdist.plan.layout import step_config_of as step_config
    from simdist.plan.model_presets import resolve_model
    from simdist.plan.step import build_step
    from simdist.predict.price import price_comm, price_graph

    s = load(tmp_path, LAYOUTS["h100-64-fat-tree-oversubscribed"])
    cfg = step_config(s.spec, s.topology, resolve_model(s.spec.model))
    plan = build_step(cfg)
    priced = price_graph(plan.graph, s.topology, mesh=cfg.mesh, reduced_axes=plan.reduced_axes)
    comms = {(c.op, c.ranks, c.nbytes, c.axis, c.imbalance, c.kernel): c
             for op in plan.graph.ops if (c := op.comm) is not None}
    assert any(p.num_translates > 1 for p in priced.values())
    for key, c in comms.items():
        axes = tuple(a for a in plan.reduced_axes if a != c.axis)
        alone = price_comm(s.topology, c, translates=cfg.mesh.translates(c.ranks, axes) if axes else None)
        assert alone == priced[key]


def _fresh(topology, comm):
    """The price parts of ``comm`` computed on its own group (no re-placing, no memo): the tuner's choice, its
    one-byte time, and its plan's transfers and levels."""
    from simdist.analytic.select import evaluate, rank_choices
    from simdist.predict.link_loads import _plan_links
    from simdist.predict.price import request_of

    request = request_of(topology, comm.op, comm.ranks, comm.nbytes, comm.imbalance)
    choice = rank_choices(request)[0]
    tiny = evaluate(request_of(topology, comm.op, comm.ranks, 1.0, comm.imbalance), choice.algorithm, choice.protocol)
    transfers, levels = _plan_links(topology, request, choice)
    return (choice.algorithm, choice.protocol, choice.predicted_s, tiny.predicted_s, transfers,
            None if levels is None else levels.tolist())


TRANSLATED = [("all_to_all", (20, 21, 22, 23), 3e6, 1.0), ("all_to_all", (21, 23, 20), 5e5, 1.7),
              ("all_gather", (22, 20), 1e7, 1.0), ("reduce_scatter", (20, 21, 22, 23), 64.0, 1.0),
              ("all_reduce", (23, 22, 21, 20), 2e8, 1.0), ("all_reduce", (8, 9, 10, 11), 4e6, 1.0)]


@pytest.mark.parametrize(("op", "ranks", "nbytes", "imbalance"), TRANSLATED)
def test_a_group_inside_another_node_is_priced_on_its_first_node_copy_exactly(op, ranks, nbytes, imbalance):
    # price_graph prices a collective whose group sits inside one node on that group's copy on node 0 (the same
    # node graph at another link offset), and keeps it in that copy's memo: what it finds, and the PricedComm of
    # the group itself, equal the choice, times and plan computed on the group itself, bit for bit.
    from simdist.hardware import load_topology
    from simdist.plan.opgraph import Comm
    from simdist.predict.price import _finish, _prepare, node_translate

    topology = load_topology(TOY_TOPOLOGY, num_nodes=8)  # 4 GPUs per node on one NVSwitch: NVL-style
    comm = Comm(op, ranks, nbytes, "ep", imbalance=imbalance)
    home = node_translate(topology, ranks)
    assert home == tuple(r % 4 for r in ranks)
    first = _prepare(topology, Comm(op, home, nbytes, "ep", imbalance=imbalance), None, True, None, topology.groups)
    reused = _prepare(topology, comm, None, True, None, topology.groups)
    assert ranks not in topology.groups  # priced on the copy: its own group was never built
    expected = _fresh(topology, comm)
    for pending in (first, reused):
        got = (pending.choice.algorithm, pending.choice.protocol, pending.time_s, expected[3], pending.transfers,
               None if pending.levels is None else pending.levels.tolist())
        assert got == expected
        assert pending.latency_s == min(expected[3], expected[2])
    alone = _finish(topology, reused)
    per_node = topology.layout.links_per_node
    assert alone.link_bytes and all(link // per_node == ranks[0] // 4 for link in alone.link_bytes)  # its own links


def test_failed_leaf_spine_links_price_a_group_where_it_is():
    # With faults.failed_links a topology's routes depend on where a group runs: no re-placing (the group itself is
    # priced, and built), and its price is still the one computed on it.
    from simdist.hardware import load_topology
    from simdist.plan.opgraph import Comm
    from simdist.predict.price import _prepare, node_translate

    topology = load_topology(TOY_TOPOLOGY, num_nodes=8).with_failed_uplinks([(0, 0)])
    comm = Comm("all_to_all", (20, 21, 22, 23), 3e6, "ep")
    assert node_translate(topology, comm.ranks) == comm.ranks
    pending = _prepare(topology, comm, None, True, None, topology.groups)
    assert comm.ranks in topology.groups and (0, 1, 2, 3) not in topology.groups
    assert (pending.choice.algorithm, pending.choice.protocol, pending.time_s) == _fresh(topology, comm)[:3]
    # a group across nodes is never re-placed either (its routes cross NICs, leaves and hashed spines)
    assert node_translate(load_topology(TOY_TOPOLOGY, num_nodes=8), (3, 4)) == (3, 4)
