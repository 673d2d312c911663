"""What-if faults: a straggler GPU and a degraded link on tiny topologies, against hand calculations."""

from __future__ import annotations

from pathlib import Path

import pytest

from simdist import api
from simdist.errors import SimdistError
from simdist.hardware.compute import kernels_time_s
from simdist.hardware.gpus import GPU_PRESETS
from simdist.plan.layer_cost import layer_work
from simdist.plan.model import Model
from simdist.plan.model_ends import head_work
from simdist.plan.optimizer import optimizer_step_kernels

MLP = Model("cs336-mlp", "mlp", num_layers=4, hidden_size=1024)


def scenario(tmp_path: Path, *, dp: int, tp: int = 1, faults: str = "", batch: int = 128, name: str = "s") -> Path:
    """The lecture's MLP on ``dp`` x ``tp`` GPUs of one cut-down DGX H100 node (one micro-batch per replica);
    no host costs (simdist.hardware.host), so the hand calculations are the GPU roofline alone."""
    n = dp * tp
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"""
cluster: {{preset: dgx-h100, gpus_per_node: {n}, host: {{cpu_sockets: 1, pcie_switches_per_socket: 1}},
          inter_node: {{nics_per_node: {n}}}, gpu_speed_cv: 0}}
model: {{preset: cs336-mlp}}
parallel: {{tp: {tp}, dp: {dp}, tp_style: column}}
training: {{micro_batch_size: {batch // dp}, global_batch_size: {batch}, precision: fp32,
           host_overhead: {{launch: 0 s, dispatch: 0 s}}}}
{faults}
""")
    return path


def kernels_s(micro_batch_size: int) -> float:
    """Seconds of one GPU's kernels in a step of one micro-batch: forward and backward of 4 layers and the head,
    and the Adam update (the roofline of simdist.hardware.compute, as test_step's single-GPU check)."""
    gpu = GPU_PRESETS["h100-sxm"]
    layer = layer_work(MLP, micro_batch_size=micro_batch_size, precision="fp32", tp_style="column")
    head = head_work(MLP, tp=1, micro_batch_size=micro_batch_size, precision="fp32")
    return (MLP.num_layers * (kernels_time_s(gpu, layer.forward, "fp32") + kernels_time_s(gpu, layer.backward, "fp32"))
            + kernels_time_s(gpu, head.forward, "fp32") + kernels_time_s(gpu, head.backward, "fp32")
            + kernels_time_s(gpu, optimizer_step_kernels(MLP.num_params, precision="fp32"), "fp32"))


def test_straggler_20_percent_slows_a_dp_step_by_the_hand_calculation(tmp_path: Path) -> None:
    # dp = 4, one micro-batch each: every replica runs forward, backward, the gradient all-reduce, then Adam.
    # Rank 2 is 20 % slower: it reaches the all-reduce 0.2 x (forward + backward) late, the other three wait
    # for it there, and its Adam takes 0.2 x longer too. By hand:
    #   step(straggler) - step(healthy) = 0.2 x (forward + backward + optimizer of one GPU).
    healthy = api.run(scenario(tmp_path, dp=4, name="healthy")).result
    slow = api.run(scenario(tmp_path, dp=4, name="slow",
                            faults="faults: {stragglers: [{rank: 2, slower_by: 0.2}]}")).result
    delta = 0.2 * kernels_s(32)
    assert slow["step_time_s"] - healthy["step_time_s"] == pytest.approx(delta, rel=1e-9)
    f = slow["faults"]
    assert f["stragglers"] == [{"rank": 2, "stage": 0, "dp": 2, "tp": 0, "cp": 0, "compute_time_factor": 1.2}]
    # the three healthy replicas wait 0.2 x (forward + backward) for rank 2 at the gradient all-reduce
    optimizer_s = kernels_time_s(GPU_PRESETS["h100-sxm"], optimizer_step_kernels(MLP.num_params, precision="fp32"),
                                 "fp32")
    waits = {w["rank"]: w for w in f["waits"]}
    assert sorted(waits) == [0, 1, 3]
    for w in waits.values():
        assert w["waits_for"] == [2]
        assert w["wait_s"] == pytest.approx(0.2 * (kernels_s(32) - optimizer_s), rel=1e-9)
    # the closed form sees the straggler's compute too, and agrees where nothing contends
    closed = api.run(scenario(tmp_path, dp=4, name="slow",
                              faults="faults: {stragglers: [{rank: 2, slower_by: 0.2}]}"),
                     fidelity="closed_form").result
    assert closed["step_time_s"] == pytest.approx(slow["step_time_s"], rel=1e-9)
    assert closed["faults"]["seen_by"].startswith("closed form")


def test_straggler_in_a_tensor_parallel_group_slows_the_group(tmp_path: Path) -> None:
    # tp = 2 x dp = 2, the straggler at tp coordinate 1: the representatives (tp coordinate 0) stand for it
    # (its peer waits for it at every tensor-parallel collective); simulating every rank gives the same step.
    faults = "faults: {stragglers: [{rank: 3, slower_by: 0.5}]}"
    path = scenario(tmp_path, dp=2, tp=2, faults=faults)
    reduced = api.run(path, simulate="representatives").result
    full = api.run(path, simulate="full").result
    healthy = api.run(scenario(tmp_path, dp=2, tp=2, name="healthy")).result
    assert reduced["step_time_s"] > healthy["step_time_s"] * 1.2
    assert reduced["step_time_s"] == pytest.approx(full["step_time_s"], rel=1e-6)


def test_degraded_nic_slows_the_all_reduce_by_its_transfer_part(tmp_path: Path) -> None:
    # Two nodes of one GPU each, dp = 2: the gradient all-reduce crosses both NICs. Half the bandwidth on one
    # NIC's uplink doubles the all-reduce's transfer part (its latency part is unchanged); only the engine sees
    # it (the closed form prices the nominal bandwidth).
    def two_nodes(faults: str, name: str) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"""
cluster: {{preset: dgx-h100, num_nodes: 2, gpus_per_node: 1, host: {{cpu_sockets: 1, pcie_switches_per_socket: 1}},
          inter_node: {{nics_per_node: 1}}, gpu_speed_cv: 0}}
model: {{preset: cs336-mlp}}
parallel: {{dp: 2, tp_style: column}}
training: {{micro_batch_size: 64, global_batch_size: 128, precision: fp32}}
{faults}
""")
        return path

    base = api.run(two_nodes("", "base")).result
    slow = api.run(two_nodes("faults: {degraded_links: [{src: n0/nic0, dst: leaf0, bandwidth_fraction: 0.5, "
                             "one_way: true}]}", "slow")).result
    dp = [c for c in base["collectives"] if c["axis"] == "dp"]
    assert len(dp) == 1 and dp[0]["count"] == 1
    (row,) = [r for r in base["links"] if r["src"] == "n0/nic0" and r["dst"] == "leaf0"]
    nic_Bps = row["bytes"] / (row["utilization"] * base["step_time_s"])  # the link's effective bandwidth
    extra = row["bytes"] / (0.5 * nic_Bps) - row["bytes"] / nic_Bps  # its bytes at half the bandwidth, minus full
    assert slow["step_time_s"] - base["step_time_s"] == pytest.approx(extra, rel=1e-6)
    assert slow["faults"]["degraded_links"][0]["bandwidth_fraction"] == 0.5


def test_unknown_link_and_rank_are_refused(tmp_path: Path) -> None:
    bad_link = scenario(tmp_path, dp=2, faults="faults: {degraded_links: [{src: n0/nic9, dst: leaf0, "
                                               "bandwidth_fraction: 0.5}]}", name="link")
    with pytest.raises(SimdistError, match=r"faults\.degraded_links\.0"):
        api.run(bad_link)
    bad_rank = scenario(tmp_path, dp=2, faults="faults: {stragglers: [{rank: 7, slower_by: 0.2}]}", name="rank")
    with pytest.raises(SimdistError, match=r"faults\.stragglers\.0\.rank"):
        api.run(bad_rank)
    typo = scenario(tmp_path, dp=2, faults="faults: {stragglers: [{rank: 1, slower: 0.2}]}", name="typo")
    with pytest.raises(SimdistError, match="slower"):
        api.run(typo)


def _fabric_scenario(tmp_path: Path, faults: str, name: str, nodes: int = 4) -> Path:
    """The lecture's MLP, pp 2 x dp 2 on four one-GPU nodes with one NIC each on 4-port leaves: nodes 0, 1 on
    leaf0 and 2, 3 on leaf1, two spines, each leaf-spine link one NIC's bandwidth (simdist.hardware.fabric)."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"""
cluster: {{preset: dgx-h100, num_nodes: {nodes}, gpus_per_node: 1,
          host: {{cpu_sockets: 1, pcie_switches_per_socket: 1}}, inter_node: {{nics_per_node: 1, switch_radix: 4}},
          gpu_speed_cv: 0}}
model: {{preset: cs336-mlp}}
parallel: {{dp: {nodes // 2}, pp: 2, tp_style: column}}
training: {{micro_batch_size: 64, global_batch_size: {64 * (nodes // 2)}, precision: fp32}}
{faults}
""")
    return path


def test_failed_uplink_reroutes_and_its_flows_share_the_other_spine(tmp_path: Path) -> None:
    # Stage 0 on nodes 0, 1 (leaf0), stage 1 on nodes 2, 3 (leaf1). The ECMP hash sends both forward activations
    # (0 -> 2, 1 -> 3) over spine1, where they share leaf0 -> spine1 -> leaf1, and the backward gradients 2 -> 0 over
    # spine1 and 3 -> 1 over spine0, each alone. With leaf1 - spine0 down, leaf1 rehashes over the spines it still
    # reaches (spine1 only): the backward sends now share leaf1 -> spine1 -> leaf0 as the forward ones share their
    # path, so by symmetry each takes exactly as long as a forward send, and the step (one micro-batch per replica:
    # one backward send on its critical path) grows by the difference. Both fidelities route around the link.
    from simdist.predict.step import predict_step

    def sends(path: Path) -> tuple[dict[tuple[int, int], float], float]:
        sc = api.load_scenario(path)
        p = predict_step(sc.spec, sc.topology, simulate="full")
        times = {op.comm.ranks: p.trace.end_s[i] - p.trace.start_s[i] for i, op in enumerate(p.plan.graph.ops)
                 if op.comm is not None and op.comm.axis == "pp"}
        return times, p.result["step_time_s"]

    base_path = _fabric_scenario(tmp_path, "", "base")
    topology = api.load_scenario(base_path).topology
    spine = {(a, b): topology.route_vertices(topology.route(a, b))[4] for a, b in ((0, 2), (1, 3), (2, 0), (3, 1))}
    assert spine == {(0, 2): "spine1", (1, 3): "spine1", (2, 0): "spine1", (3, 1): "spine0"}
    failed = "faults: {failed_links: [{src: spine0, dst: leaf1}]}"
    cut = api.load_scenario(_fabric_scenario(tmp_path, failed, "cut")).topology
    assert [cut.route_vertices(cut.route(a, b))[4] for a, b in spine] == ["spine1"] * 4

    base, base_step = sends(base_path)
    slow, slow_step = sends(_fabric_scenario(tmp_path, failed, "slow"))
    forward, backward = base[(0, 2)], base[(2, 0)]
    assert backward < forward  # alone on its spine in the healthy cluster
    assert slow[(2, 0)] == pytest.approx(forward, rel=1e-9) and slow[(3, 1)] == pytest.approx(forward, rel=1e-9)
    assert slow_step - base_step == pytest.approx(forward - backward, rel=1e-6)
    report = api.run(_fabric_scenario(tmp_path, failed, "report")).result
    assert report["faults"]["failed_links"] == [{"src": "leaf1", "dst": "spine0"}]
    closed = api.run(_fabric_scenario(tmp_path, failed, "closed"), fidelity="closed_form").result
    assert closed["faults"]["failed_links"] == [{"src": "leaf1", "dst": "spine0"}]


def test_rehash_moves_only_the_flows_of_leaves_that_lost_an_uplink(tmp_path: Path) -> None:
    # Three leaves, two spines: leaf0 - spine1 down. Pairs of leaf1 and leaf2 keep the hash's spine; pairs with
    # leaf0 all cross spine0; the array form (all_pairs, batch routes) agrees with the scalar form (Topology.route).
    import numpy as np

    from simdist.hardware.fabric import fmix64
    from simdist.hardware.topology import Topology

    spec = api.load_scenario(_fabric_scenario(tmp_path, "", "six", nodes=6)).topology.spec
    healthy = Topology(spec).fabric
    cut = Topology(spec, failed_uplinks=[(0, 1)]).fabric
    assert (healthy.num_leaves, healthy.num_spines) == (3, 2)
    nics = np.arange(6)
    src, dst = np.meshgrid(nics, nics, indexing="ij")
    many = cut.spine_for(src, dst)
    for a in range(6):
        for b in range(6):
            one = cut.spine_for(a, b)
            assert one == many[a, b]
            if 0 in (cut.leaf_of(a), cut.leaf_of(b)):
                assert one == 0
            else:
                assert one == fmix64((a << 32) | b) % 2 == healthy.spine_for(a, b)


def test_failed_links_that_cut_the_fabric_or_are_not_leaf_spine_are_refused(tmp_path: Path) -> None:
    both = "faults: {failed_links: [{src: leaf0, dst: spine0}, {src: leaf0, dst: spine1}]}"
    with pytest.raises(SimdistError, match=r"faults\.failed_links"):
        api.run(_fabric_scenario(tmp_path, both, "both"))
    nic = "faults: {failed_links: [{src: n0/nic0, dst: leaf0}]}"
    with pytest.raises(SimdistError, match=r"faults\.failed_links\.0"):
        api.run(_fabric_scenario(tmp_path, nic, "nic"))
    far = "faults: {failed_links: [{src: leaf0, dst: spine9}]}"
    with pytest.raises(SimdistError, match=r"spine0\.\.spine1"):
        api.run(_fabric_scenario(tmp_path, far, "far"))


def test_nodes_of_another_gpu_run_the_kernels_at_its_speed(tmp_path: Path) -> None:
    # dp = 2 on two one-GPU H100 nodes; node 1 is an A100. Its replica's kernels take f x as long, f = the layer's
    # forward + backward kernel time on the A100 over the H100 (the kernel model of each GPU); the H100 replica waits
    # for it at the gradient all-reduce, so the step grows by (f - 1) x (forward + backward + optimizer) of one GPU,
    # as a straggler slower_by f - 1 would make it.
    def two(faults: str, name: str) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"""
cluster: {{preset: dgx-h100, num_nodes: 2, gpus_per_node: 1, host: {{cpu_sockets: 1, pcie_switches_per_socket: 1}},
          inter_node: {{nics_per_node: 1}}, gpu_speed_cv: 0}}
model: {{preset: cs336-mlp}}
parallel: {{dp: 2, tp_style: column}}
training: {{micro_batch_size: 64, global_batch_size: 128, precision: fp32,
           host_overhead: {{launch: 0 s, dispatch: 0 s}}}}
{faults}
""")
        return path

    a100 = next(name for name in GPU_PRESETS if name.startswith("a100"))
    layer = layer_work(MLP, micro_batch_size=64, precision="fp32", tp_style="column")
    head = head_work(MLP, tp=1, micro_batch_size=64, precision="fp32")

    def chunk_s(gpu: str) -> float:  # the first (and only) model part: 4 layers and the head, forward + backward
        g = GPU_PRESETS[gpu]
        return (MLP.num_layers * (kernels_time_s(g, layer.forward, "fp32") + kernels_time_s(g, layer.backward, "fp32"))
                + kernels_time_s(g, head.forward, "fp32") + kernels_time_s(g, head.backward, "fp32"))

    f = chunk_s(a100) / chunk_s("h100-sxm")
    assert f > 1.5  # an A100 is much slower at fp32 (tf32-less) matmuls of this size
    healthy = api.run(two("", "healthy")).result
    mixed = api.run(two(f"faults: {{heterogeneous_nodes: [{{nodes: [1], gpu: {a100}}}]}}", "mixed")).result
    straggler = api.run(two(f"faults: {{stragglers: [{{rank: 1, slower_by: {f - 1!r}}}]}}", "straggler")).result
    assert mixed["step_time_s"] == pytest.approx(straggler["step_time_s"], rel=1e-9)
    assert mixed["step_time_s"] - healthy["step_time_s"] == pytest.approx((f - 1) * kernels_s(64), rel=1e-6)
    assert mixed["faults"]["heterogeneous_nodes"] == [{"nodes": [1], "gpu": a100}]
    assert mixed["faults"]["stragglers"][0]["compute_time_factor"] == pytest.approx(f, rel=1e-12)
    with pytest.raises(SimdistError, match=r"faults\.heterogeneous_nodes\.0\.nodes"):
        api.run(two(f"faults: {{heterogeneous_nodes: [{{nodes: [5], gpu: {a100}}}]}}", "far"))
    with pytest.raises(SimdistError, match=r"faults\.heterogeneous_nodes\.0\.gpu"):
        api.run(two("faults: {heterogeneous_nodes: [{nodes: [1], gpu: v100-typo}]}", "typo"))
