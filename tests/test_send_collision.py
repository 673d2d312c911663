"""A pipeline send the engine runs slower alone than its price: its data-parallel copies share its spine (issue 13).

The reduced graph simulates one rank per stage and folds the traffic of the ranks it leaves out (the send's
translates) onto the representative's links (simdist.predict.price). Where a translate's route crosses the same
leaf-spine link at the same instant (static per-flow ECMP hashes both pairs onto one spine:
simdist.hardware.fabric.Fabric.spine_for), the folded send takes longer than its closed-form price although no
other collective is on its links. That is contention between two real transfers, not an artefact of the folding:
the simulation of every rank, where the two sends are separate ops, gives each the same time, and the step's
``contention_s`` is exactly the engine's step minus the closed form's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simdist import api
from simdist.engine.contention import alone_durations
from simdist.predict.link_loads import capacity_of
from simdist.predict.step import predict_step

# Four one-GPU nodes with one NIC each on 4-port leaves (2 down, 2 up): nodes 0, 1 on leaf0, nodes 2, 3 on leaf1,
# two spines, each leaf-spine link one NIC's bandwidth (simdist.hardware.fabric, oversubscription 1).
# pp 2 x dp 2: stage 0 on ranks 0, 1, stage 1 on ranks 2, 3.
SCENARIO = """
cluster: {preset: dgx-h100, num_nodes: 4, gpus_per_node: 1,
          host: {cpu_sockets: 1, pcie_switches_per_socket: 1}, inter_node: {nics_per_node: 1, switch_radix: 4}}
model: {preset: cs336-mlp}
parallel: {dp: 2, pp: 2, tp_style: column}
training: {micro_batch_size: 64, global_batch_size: 128, precision: fp32}
"""


def _pp_ops(prediction) -> dict[tuple[int, int], list[int]]:
    out: dict[tuple[int, int], list[int]] = {}
    for i, op in enumerate(prediction.plan.graph.ops):
        if op.comm is not None and op.comm.axis == "pp":
            out.setdefault(op.comm.ranks, []).append(i)
    return out


def test_a_send_folded_with_its_colliding_copy_equals_every_rank_simulated(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    sc = api.load_scenario(path)
    topology = sc.topology
    spine = {pair: topology.route_vertices(topology.route(*pair))[4] for pair in ((0, 2), (1, 3), (2, 0), (3, 1))}
    # the forward sends of both replicas hash onto spine1; the backward ones onto different spines
    assert spine == {(0, 2): "spine1", (1, 3): "spine1", (2, 0): "spine1", (3, 1): "spine0"}

    reduced = predict_step(sc.spec, topology, simulate="representatives")
    full = predict_step(sc.spec, topology, simulate="full")
    assert sorted(reduced.plan.graph.ranks()) == [0, 2] and sorted(full.plan.graph.ranks()) == [0, 1, 2, 3]

    # Reduced: the forward send 0 -> 2 carries its translate 1 -> 3 on leaf0 -> spine1 -> leaf1 (twice its own
    # bytes there, a link of one NIC's capacity): alone in the engine its transfer part takes twice its price's.
    ops = reduced.plan.graph.ops
    alone = alone_durations(reduced.plan.graph, capacity_of(topology))
    (fwd, *_), (bwd, *_) = _pp_ops(reduced)[(0, 2)], _pp_ops(reduced)[(2, 0)]
    job = ops[fwd].job
    assert job.bandwidth_s > 0
    assert alone[fwd] == pytest.approx(ops[fwd].duration_s + job.bandwidth_s, rel=1e-12)
    assert alone[bwd] == pytest.approx(ops[bwd].duration_s, rel=1e-12)  # 2 -> 0 alone on spine1 (3 -> 1: spine0)
    folded_s = reduced.trace.end_s[fwd] - reduced.trace.start_s[fwd]
    assert folded_s == pytest.approx(alone[fwd], rel=1e-12)

    # Full: 0 -> 2 and 1 -> 3 are two ops, each alone priced as its closed form, which meet on spine1 at the same
    # instants; the engine gives each exactly the folded send's time.
    full_ops = _pp_ops(full)
    full_alone = alone_durations(full.plan.graph, capacity_of(topology))
    for pair in ((0, 2), (1, 3)):
        i = full_ops[pair][0]
        assert full_alone[i] == pytest.approx(full.plan.graph.ops[i].duration_s, rel=1e-12)
        assert full.trace.end_s[i] - full.trace.start_s[i] == pytest.approx(folded_s, rel=1e-12)
    a, b = full_ops[(0, 2)][0], full_ops[(1, 3)][0]
    assert full.trace.start_s[a] == pytest.approx(full.trace.start_s[b], rel=1e-12)

    # Both simulations: the same step and the same contention; the closed form is the uncontended step, and
    # contention_s is what the collision adds to it.
    closed = predict_step(sc.spec, topology, fidelity="closed_form")
    step_s, contention_s = reduced.result["step_time_s"], reduced.result["contention_s"]
    assert full.result["step_time_s"] == pytest.approx(step_s, rel=1e-12)
    assert full.result["contention_s"] == pytest.approx(contention_s, rel=1e-9)
    assert contention_s > 0
    assert closed.result["step_time_s"] + contention_s == pytest.approx(step_s, rel=1e-12)
