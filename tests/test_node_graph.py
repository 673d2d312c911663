"""A node given as a graph (topology files' ``node:``, simdist.spec.node_graph): hand-checked routes, ring
channels and collective times on tests/data/topologies/tiny-graph-odd-link.yaml (2 hosts x 4 GPUs linked pairwise
at 100 GB/s, the odd link gpu2 - gpu3 at 50 GB/s, every latency 1 us, efficiency 1), bad graphs refused at their
line, the 4-GPU HGX preset against NCCL's view of that board, and a training step on the graph."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from simdist.analytic.ring import ring_time_s
from simdist.analytic.select import evaluate
from simdist.collectives.group import Group
from simdist.collectives.request import Request
from simdist.hardware import load_topology
from simdist.hardware.node_rings import node_rings
from simdist.hardware.placement import job_topology
from tests.cli_harness import run_cli

FIXTURE = Path(__file__).resolve().parent / "data" / "topologies" / "tiny-graph-odd-link.yaml"


@pytest.fixture(scope="module")
def odd():
    return load_topology(str(FIXTURE))


def test_routes_follow_the_listed_links(odd):
    # gpu2 -> gpu3: the direct NVLink (50 GB/s) is wider than the PCIe detour through sw1 (40 GB/s); 1 hop, 1 us
    r = odd.route(2, 3)
    assert (r.hops, r.bandwidth_Bps, r.latency_s) == (1, 50e9, pytest.approx(1e-6))
    assert odd.route_vertices(r) == ["n0/gpu2", "n0/gpu3"]
    # to the other host: gpu0 -> sw0 -> nic0 -> leaf0 -> nic0 -> sw0 -> gpu0, the 200 Gb/s NIC the bottleneck
    r = odd.route(0, 4)
    assert odd.route_vertices(r) == ["n0/gpu0", "n0/sw0", "n0/nic0", "leaf0", "n1/nic0", "n1/sw0", "n1/gpu0"]
    assert r.bandwidth_Bps == 25e9 and r.latency_s == pytest.approx(6e-6)
    # gpu2 and gpu3 sit under sw1 with nic1: their nearest NIC
    assert odd.node.nic_of_gpu == [0, 0, 1, 1]
    assert odd.nvlink_domain_size == 4


def test_ring_search_avoids_the_odd_link_and_runs_both_directions(odd):
    # Hand count: the rings of 4 peers that avoid gpu2 - gpu3 are 0-2-1-3 and its reverse 0-3-1-2, 100 GB/s each on
    # links of their own (200 GB/s together); a third ring shares a link with one of them or takes the odd one
    # (3 x 50 = 150 < 200), so the search stops at two.
    group = Group(odd, (0, 1, 2, 3))
    assert group.default_channels() == 2
    assert group.ring_orders(2) == [[0, 2, 1, 3], [0, 3, 1, 2]]
    # all_reduce of 800 MB: 2(P-1) = 6 steps of S / (P C) = 100 MB at 100 GB/s, plus 6 hops of 1 us
    t = ring_time_s(group, 800e6, group.ring_orders(2), 6)
    assert t == pytest.approx(6 * 100e6 / 100e9 + 6e-6, rel=1e-12)
    # two GPUs: one ring over their link, both directions used by it already
    assert Group(odd, (2, 3)).default_channels() == 1
    assert ring_time_s(Group(odd, (2, 3)), 100e6, [[0, 1]], 2) == pytest.approx(2 * 50e6 / 50e9 + 2e-6, rel=1e-12)


def test_a_crossbar_written_as_a_graph_keeps_one_ring_in_peer_order():
    # the NVSwitch template's answer: one ring in peer order (a second ring would halve the first one's share)
    dgx = load_topology("dgx-h100")
    assert node_rings(dgx.node, tuple(range(8))) == (tuple(range(8)),)


def test_the_collective_on_the_graph_prices_what_nccl_would():
    # hgx-h200-4gpu: 4 GPUs linked pairwise by 150 GB/s (6 NVLink4 links), efficiency 0.82 (NCCL's 20.6 of 25 GB/s
    # per link). NCCL's search finds two channel pairs over 0-1-2-3 and 0-3-2-1 (nChannels x bw = 4 x 60 of 123.6
    # per pair in its units); here two rings of 150 x 0.82 = 123 GB/s each: ring busbw 246 GB/s, against one ring's
    # 123 and the 8-GPU NVSwitch board's 369 (450 x 0.82).
    board = load_topology("hgx-h200-4gpu")
    group = Group(board, (0, 1, 2, 3))
    assert group.default_channels() == 2
    request = Request("all_reduce", group, 2**30)
    ring = evaluate(request, "ring", "Simple").predicted_s
    busbw = 2 * 3 / 4 * 2**30 / ring
    assert busbw == pytest.approx(2 * 150e9 * 0.82, rel=0.02)
    assert busbw < 0.8 * 450e9 * 0.82


def test_collective_and_run_commands_on_the_graph(tmp_path):
    out = run_cli(["collective", "--cluster", str(FIXTURE), "--op", "all_reduce", "--ranks", "8", "--bytes",
                  "64M", "--json"])
    assert out.code == 0, out.err
    row = json.loads(out.out)["rows"][0]
    # across the hosts a ring per NIC (2 x 25 GB/s): the bus bandwidth stays under the NICs' 50 GB/s; the engine
    # (detailed plan) equals the closed form uncontended
    assert row["algorithm"] == "ring" and 40 < row["busbw_GBps"] < 50
    assert row["time_s"] == pytest.approx(row["closed_form_s"], rel=1e-9)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({
        "name": "tiny on a graph", "cluster": {"preset": str(FIXTURE)},
        "model": {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 1024,
                  "vocab_size": 32000},
        "parallel": {"tp": 4, "dp": 2},
        "training": {"micro_batch_size": 1, "global_batch_size": 8}}))
    runs = {}
    for fidelity in ("closed_form", "engine"):
        out = run_cli(["run", str(scenario), "--fidelity", fidelity, "--json"])
        assert out.code == 0, out.err
        runs[fidelity] = json.loads(out.out)
    closed, engine = runs["closed_form"]["step_time_s"], runs["engine"]
    # the engine alone is the closed form; its four data-parallel all-reduces (one per tp peer) share the host's
    # two NICs, each NIC carrying two of them: contention the closed form (each collective alone) leaves out
    assert engine["simulation"]["uncontended_step_time_s"] == pytest.approx(closed, rel=1e-9)
    assert engine["step_time_s"] > closed and engine["contention_s"] > 0


def test_part_of_a_graph_node(odd):
    # the job's first two GPUs of each host: gpu0, gpu1 and their NICs
    job = job_topology(odd, num_nodes=2, gpus_per_node=2)
    assert job.num_gpus == 4 and job.route(0, 1).bandwidth_Bps == 100e9
    assert {lk.src for lk in job.node.links if lk.kind == "nvlink"} == {"gpu0", "gpu1"}


BASE = yaml.safe_load(FIXTURE.read_text())


@pytest.mark.parametrize(("change", "field", "words"), [
    (lambda d: d["node"]["links"].append({"ends": ["gpu0", "gpu9"], "kind": "nvlink", "bandwidth": "1 GB/s"}),
     "node.links[14].ends", "'gpu9', which is not a vertex"),
    (lambda d: d["node"]["links"].append({"ends": ["gpu1", "gpu0"], "kind": "nvlink", "bandwidth": "1 GB/s"}),
     "node.links[14].ends", "as link 0 does"),
    (lambda d: d["node"]["links"][5].update(reverse_bandwidth="10 GB/s"), "node.links[5].reverse_bandwidth",
     "without a reason"),
    (lambda d: d["node"].update(links=[lk for lk in d["node"]["links"] if "gpu3" not in lk["ends"]]), "node.links",
     "gpu3 has no link"),
    (lambda d: d["node"].update(links=[lk for lk in d["node"]["links"] if "nic1" not in lk["ends"]]), "node.links",
     "nic1 has no link"),
    (lambda d: d["node"].update(links=[lk for lk in d["node"]["links"] if lk["kind"] != "nvlink" and
                                       lk["ends"] != ["sw1", "cpu0"]]), "node.links", "gpu2, gpu3 cannot reach gpu0"),
    (lambda d: d["node"]["vertices"].append({"name": "gpu7", "kind": "cpu"}), "node.vertices[3].name",
     "a GPU's or NIC's own name"),
    (lambda d: d.update(host={"cpu_sockets": 1, "pcie": {"generation": 5}}), "host",
     "host and node both describe the node"),
    (lambda d: d["node"]["links"].append({"ends": ["nic0", "gpu3"], "kind": "pcie", "bandwidth": "1 GB/s"}),
     "node.links[14].ends", "a NIC hangs off"),
])
def test_bad_graphs_are_refused_at_their_line(tmp_path, change, field, words):
    data = json.loads(json.dumps(BASE))
    change(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    out = run_cli(["topo", "show", str(path)])
    assert out.code == 2, out.err
    assert field in out.err and words in out.err, out.err
    assert "Traceback" not in out.err and "bad.yaml:" in out.err


def test_a_gpu_without_a_nic_is_refused_only_when_the_job_spans_nodes(tmp_path):
    data = json.loads(json.dumps(BASE))
    # sw1 (gpu2, gpu3, nic1) loses its uplink and nic1: gpu2 and gpu3 still reach gpu0 over NVLink, no NIC
    data["node"]["links"] = [lk for lk in data["node"]["links"] if lk["ends"] not in (["sw1", "cpu0"],
                                                                                       ["nic1", "sw1"])]
    data["inter_node"]["nics_per_node"] = 1
    path = tmp_path / "nonic.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    out = run_cli(["topo", "show", str(path)])
    assert out.code == 2 and "gpu2 reaches no NIC" in out.err, out.err
    out = run_cli(["topo", "show", str(path), "--num-nodes", "1"])
    assert out.code == 0, out.err
