"""`simdist topo import`: NCCL topology dumps and `nvidia-smi topo -m` text of 8-GPU NVSwitch and 4-GPU pairwise
boards (tests/data/machines, written from the formats' documentation) become topology files whose `topo show`
matches the description, and that price collectives as the matching presets do."""

from __future__ import annotations

from pathlib import Path

import pytest

from simdist.analytic.select import evaluate
from simdist.api.topology_import import import_topology
from simdist.collectives.group import Group
from simdist.collectives.request import Request
from simdist.hardware import load_topology
from simdist.hardware.summary import describe
from tests.cli_harness import run_cli

MACHINES = Path(__file__).resolve().parent / "data" / "machines"


@pytest.mark.parametrize("sample", ["dgx-h100.nccl-topo.xml", "dgx-h100.topo-m.txt"])
def test_an_nvswitch_board_imports_as_one_switch(sample):
    text, topology, assumptions = import_topology(MACHINES / sample, gpu="h100-sxm")
    d = describe(topology)
    # 8 GPUs, each with 18 NVLinks (NV18 / count 18) to the NVSwitches: one 450 GB/s port per GPU; 8 NICs
    assert d["gpus_per_node"] == 8 and d["vertices_by_kind"]["nvswitch"] == 1
    assert d["nvlink"]["bandwidth_per_gpu_Bps"] == 450e9 and d["nvlink_domain_size"] == 8
    assert d["nics"]["per_node"] == 8 and d["nics"]["bandwidth_Bps"] == 50e9
    assert d["routes"]["intra_node"]["vertices"] == ["n0/gpu0", "n0/nvswitch", "n0/gpu7"]
    assert d["vertices_by_kind"]["cpu"] == 2
    # GPU i's nearest NIC is NIC i (both under switch i in the dump; PIX in the matrix)
    nics = topology.node.nic_of_gpu
    assert nics[0] in (0, 1) and nics[7] in (6, 7) and len(set(nics)) == 8
    # the ring all_reduce of the bundled dgx-h100 preset, within the efficiency's rounding (NCCL's 20.6 / 25 =
    # 0.824 per link against the preset's 0.82)
    preset = load_topology("dgx-h100")
    times = [evaluate(Request("all_reduce", Group(t, tuple(range(8))), 2**30), "ring", "Simple").predicted_s
             for t in (topology, preset)]
    assert times[0] == pytest.approx(times[1], rel=0.01)
    assert "node:" in text and text.startswith("# Imported by `simdist topo import`")
    if sample.endswith(".txt"):  # the matrix gives no speeds: said so
        assert any("PCIe Gen5" in a for a in assumptions) and any("400 Gb/s" in a for a in assumptions)
    else:
        assert not any("400 Gb/s" in a for a in assumptions)  # the dump's NICs say 400000 Mb/s


@pytest.mark.parametrize("sample", ["hgx-h100-4gpu.nccl-topo.xml", "hgx-h100-4gpu.topo-m.txt"])
def test_a_four_gpu_board_imports_its_pairwise_links(sample):
    _, topology, _ = import_topology(MACHINES / sample, gpu="h100-sxm")
    d = describe(topology)
    # every pair: 6 NVLink4 links x 25 GB/s = 150 GB/s, direct, no NVSwitch
    assert "nvswitch" not in d["vertices_by_kind"]
    assert d["links_by_kind"]["nvlink"] == {"count": 12, "bandwidths_Bps": [150e9]}
    assert d["nvlink"]["links_per_gpu"] == 3 and d["nvlink"]["bandwidth_per_gpu_Bps"] == 450e9
    assert d["routes"]["intra_node"]["vertices"] == ["n0/gpu0", "n0/gpu3"]
    assert d["nics"]["per_node"] == 2
    # gpu0 and gpu1 share socket 0 with nic0; gpu2 and gpu3 socket 1 with nic1
    assert topology.node.nic_of_gpu == [0, 0, 1, 1]
    # the ring search runs two rings: the bundled 4-GPU board's channels and bus bandwidth
    board = load_topology("hgx-h200-4gpu")
    for t in (topology, board):
        assert Group(t, (0, 1, 2, 3)).default_channels() == 2


def test_cli_writes_the_file_and_topo_show_reads_it(tmp_path):
    out = tmp_path / "mine.yaml"
    r = run_cli(["topo", "import", str(MACHINES / "hgx-h100-4gpu.nccl-topo.xml"), "--out", str(out)])
    assert r.code == 0, r.err
    assert "assumed: GPU preset h100-sxm from the dump's compute capability sm 90" in r.out
    shown = run_cli(["topo", "show", str(out)])
    assert shown.code == 0 and "3 NVLink link(s) per GPU" in shown.out, shown.err
    # the file runs a collective and a two-node cluster once a fabric is laid over it
    r = run_cli(["collective", "--cluster", str(out), "--op", "all_gather", "--ranks", "8", "--num-nodes", "2",
                 "--bytes", "16M"])
    assert r.code == 0, r.err


@pytest.mark.parametrize(("content", "args", "words"), [
    ("hello\n", [], "neither an NCCL topology dump"),
    ("<system version='1'><cpu>\n<pci></system>\n", [], "not well-formed XML at line 2"),
    ("<?xml version='1.0'?>\n<system version='1'></system>\n", [], "no <cpu> element"),
    ("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\t X \n", [], "nvidia-smi topo -m does not name the GPU"),
    ("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\t X \n", ["--gpu", "h900"], "h900"),
    ("\tGPU0\tGPU1\nGPU0\t X \tNV4\nGPU1\tNV4\n", ["--gpu", "h100-sxm"], "row GPU1 has 1 cells for 2 columns"),
    # an edited cell is named, row and column, with what nvidia-smi writes there
    ("\tGPU0\tGPU1\nGPU0\t X \tQQ\nGPU1\tNV4\t X \n", ["--gpu", "h100-sxm"],
     "row GPU0, column GPU1: 'QQ' is not a connection nvidia-smi writes"),
    # a billion-laughs entity bomb and an external entity: expat refuses both (nothing expanded, nothing read)
    ("<?xml version='1.0'?>\n<!DOCTYPE l [<!ENTITY a 'aaaaaaaaaa'>" + "".join(
        f"<!ENTITY {chr(98 + i)} '{('&' + chr(97 + i) + ';') * 10}'>" for i in range(8))
     + "]>\n<system version='1'><cpu numaid='0' d='&i;'/></system>\n", ["--gpu", "h100-sxm"], "not well-formed XML"),
    ("<?xml version='1.0'?>\n<!DOCTYPE x [<!ENTITY e SYSTEM 'file:///etc/passwd'>]>\n"
     "<system version='1'><cpu numaid='0' d='&e;'/></system>\n", ["--gpu", "h100-sxm"], "external entity"),
])
def test_bad_descriptions_exit_2_with_one_line(tmp_path, content, args, words):
    path = tmp_path / "machine.txt"
    path.write_text(content)
    out = tmp_path / "never.yaml"
    r = run_cli(["topo", "import", str(path), "--out", str(out), *args])
    assert r.one_line_error() and words in r.err, r.err
    assert not out.exists()


# ----------------------------------------------------------------------------- ibnetdiscover: the fabric
def test_ibnetdiscover_fabric_over_a_preset_node():
    text, topology, notes = import_topology(MACHINES / "rails-2to1.ibnetdiscover.txt", node="dgx-h100")
    f = topology.fabric
    # 4 hosts of 2 HCAs, HCA i of every host on leaf i, each leaf 4 HCAs down and 2 NDR links up
    assert (topology.num_nodes, f.nics_per_node, f.shape) == (4, 2, "rail_optimized")
    assert (f.num_leaves, f.down_ports, f.num_spines, f.oversubscription) == (2, 4, 2, 2.0)
    assert f.nic_bandwidth_Bps == 50e9 and topology.gpus_per_node == 8
    assert any("dgx-h100" in n for n in notes) and "rail_optimized" in text


def _ibnet_three_tier() -> str:
    """ibnetdiscover text of tests/data/topologies/tiny-three-tier.yaml's fabric: 8 hosts of one HDR HCA, 2 per
    leaf, pods of 2 leaves under 2 spines, spine s of each pod linked to core s."""
    blocks: dict[str, list[str]] = {}
    kinds: dict[str, str] = {}

    def link(a: str, b: str) -> None:
        pa, pb = len(blocks.setdefault(a, [])) + 1, len(blocks.setdefault(b, [])) + 1
        blocks[a].append(f'[{pa}]\t"{b}"[{pb}]\t\t# "{b}" lid 1 4xHDR')
        blocks[b].append(f'[{pb}]\t"{a}"[{pa}]\t\t# "{a}" lid 1 4xHDR')

    hcas = [f"H-00000000000{h:04x}" for h in range(8)]
    leaves = [f"S-00000000001{i:04x}" for i in range(4)]
    spines = [f"S-00000000002{i:04x}" for i in range(4)]
    cores = [f"S-00000000003{i:04x}" for i in range(2)]
    for h, g in enumerate(hcas):
        kinds[g] = f"node{h} mlx5_0"
        link(g, leaves[h // 2])
    for leaf in range(4):
        for s in range(2):
            link(leaves[leaf], spines[(leaf // 2) * 2 + s])
    for pod in range(2):
        for s in range(2):
            link(spines[pod * 2 + s], cores[s])
    out = []
    for guid, ports in blocks.items():
        head = "Ca" if guid.startswith("H-") else "Switch"
        out.append(f'{head}\t{len(ports)} "{guid}"\t\t# "{kinds.get(guid, "switch " + guid)}"')
        out += [*ports, ""]
    return "\n".join(out)


def test_ibnetdiscover_three_tiers_match_the_fixture(tmp_path):
    path = tmp_path / "fabric.txt"
    path.write_text(_ibnet_three_tier())
    fixture = str(Path(__file__).resolve().parent / "data" / "topologies" / "tiny-three-tier.yaml")
    _, topology, _ = import_topology(path, node=fixture)
    expected = load_topology(fixture).fabric
    f = topology.fabric
    assert (f.num_leaves, f.down_ports, f.num_spines, f.leaves_per_pod, f.num_pods, f.cores_per_group) == (
        expected.num_leaves, expected.down_ports, expected.num_spines, expected.leaves_per_pod, expected.num_pods,
        expected.cores_per_group)
    assert (f.oversubscription, f.pod_oversubscription, f.shape) == (1.0, 2.0, "fat_tree")
    assert f.core_bandwidth_Bps == expected.core_bandwidth_Bps


def test_ibnetdiscover_needs_the_node(tmp_path):
    r = run_cli(["topo", "import", str(MACHINES / "rails-2to1.ibnetdiscover.txt")])
    assert r.one_line_error() and "--node" in r.err, r.err
    bad = tmp_path / "bad.txt"
    bad.write_text('Switch\t4 "S-01"\t# "leaf"\n[1]\t"H-02"[1]\t# "h mlx5_0" lid 3\n')
    r = run_cli(["topo", "import", str(bad), "--node", "dgx-h100"])
    assert r.one_line_error() and "without a width and speed" in r.err, r.err
