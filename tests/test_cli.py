"""The command line as a user meets it: outputs, JSON contract, and one-line errors with exit 2."""

import json
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO


def test_topo_list(cli):
    code, out, err = cli("topo", "list")
    assert code == 0 and err == ""
    for name in ("dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72", "pcie-gen4-8gpu", "pcie-gen5-8gpu"):
        assert name in out


def test_topo_gpus_shows_rated_power_and_caps(cli):
    code, out, err = cli("topo", "gpus")
    assert code == 0 and err == ""
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert lines["h100-sxm"].endswith("80 GiB at 3.35 TB/s  700 W")
    assert lines["h100-sxm-hbm2e"].endswith("96 GiB at 2.4 TB/s  700 W capped at 500 W")


def test_topo_show_dgx_h100_two_nodes_json(cli):
    code, out, err = cli("topo", "show", "dgx-h100", "--num-nodes", "2", "--json")
    assert code == 0 and err == ""
    d = json.loads(out)  # exactly one JSON document
    assert d["num_gpus"] == 16
    assert d["nvlink"]["bandwidth_per_gpu_Bps"] == 450e9
    assert d["nics"] == {"kind": "infiniband", "per_node": 8, "bandwidth_Bps": 50e9}
    assert d["injection_bandwidth_per_gpu_Bps"]["inter_node"] == 50e9
    assert d["routes"]["intra_node"]["hops"] == 2
    assert d["routes"]["inter_node"]["vertices"][3] == "leaf0"


def test_topo_show_nvl72_json(cli):
    code, out, _ = cli("topo", "show", "gb200-nvl72", "--json")
    d = json.loads(out)
    assert code == 0
    assert d["num_gpus"] == 72 and d["nvlink_domain_size"] == 72 and d["num_nodes"] == 1
    assert "inter_node" not in d["routes"]


def test_topo_show_text_names_the_tiers(cli):
    code, out, _ = cli("topo", "show", "pcie-gen5-8gpu")
    assert code == 0
    assert "none (GPUs talk over PCIe)" in out
    assert "cpu_interconnect" in out and "bisection" in out


def test_topo_show_with_overrides(cli):
    code, out, _ = cli("topo", "show", "dgx-a100", "--num-nodes", "4", "--json",
                       "--set", "inter_node.kind=roce", "--set", "inter_node.nic_bandwidth=400 Gb/s")
    d = json.loads(out)
    assert code == 0
    assert d["nics"]["kind"] == "roce" and d["nics"]["bandwidth_Bps"] == 50e9
    assert d["fabric"]["efficiency"] == 0.96


def test_schema(cli):
    for kind, field in (("topology", "inter_node"), ("scenario", "parallel")):
        code, out, _ = cli("schema", kind)
        assert code == 0 and field in json.loads(out)["properties"]


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["topo", "show", "dgx-h1000"], ["unknown topology preset 'dgx-h1000'", "dgx-h100", "gb200-nvl72"]),
        (["topo", "show", "dgx-h100", "--set", "inter_node.nic_bandwidth=-400 Gb/s"],
         ["--set", "inter_node.nic_bandwidth", "positive"]),
        (["topo", "show", "dgx-h100", "--set", "inter_node.nic_bandwidth=400"],
         ["inter_node.nic_bandwidth", "no unit", "GB/s"]),
        (["topo", "show", "dgx-h100", "--num-nodes", "2.5"], ["--num-nodes", "integer"]),
        (["topo", "show", "dgx-h100", "--set", "num_nodes=2.5"], ["num_nodes", "whole number"]),
        (["topo", "show", "dgx-h100", "--set", "scale_up.speed=9"], ["scale_up.speed", "unknown field", "bandwidth"]),
        (["topo", "show", "dgx-h100", "--bogus"], ["No such option"]),
        (["schema", "network"], ["unknown schema", "topology, scenario"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli, argv, needles):
    code, out, err = cli(*argv)
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1
    for needle in needles:
        assert needle in err


def test_disconnected_topology_file(cli, tmp_path):
    path = tmp_path / "two-islands.yaml"
    path.write_text(textwrap.dedent("""\
        name: two-islands
        gpu: h100-sxm
        num_nodes: 2
        gpus_per_node: 8
        host:
          cpu_sockets: 1
          pcie_switches_per_socket: 2
          pcie: {generation: 5}
        """))
    code, out, err = cli("topo", "show", str(path))
    assert code == 2 and out == ""
    assert "not connected" in err and "inter_node" in err and err.count("\n") == 1


def test_disconnected_hosts_inside_a_node(cli, tmp_path):
    path = tmp_path / "trays.yaml"
    path.write_text(textwrap.dedent("""\
        name: trays-without-nvlink
        gpu: gb200
        gpus_per_node: 8
        hosts_per_node: 2
        host:
          cpu_sockets: 1
          pcie_switches_per_socket: 0
          pcie: {generation: 5}
        """))
    code, _, err = cli("topo", "show", str(path))
    assert code == 2
    assert "not all connected" in err and "scale_up" in err


def test_unknown_field_in_a_file_names_file_and_line(cli, tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("name: t\ngpu: h100-sxm\ngpus_per_node: 8\nhost:\n  pcie: {generation: 5}\n"
                    "  cpu_interconnect: {bandwidth: 22 GB/s}\n  nvlink: 3\n")
    code, _, err = cli("topo", "show", str(path))
    assert code == 2
    assert f"{path}:7: host.nvlink: unknown field 'nvlink'" in err
    assert "cpu_sockets" in err  # lists the valid fields


def test_unknown_gpu_preset_lists_valid_ones(cli, tmp_path):
    path = tmp_path / "gpu.yaml"
    path.write_text("name: t\ngpu: h900\ngpus_per_node: 8\nhost:\n  cpu_sockets: 1\n  pcie: {generation: 5}\n")
    code, _, err = cli("topo", "show", str(path))
    assert code == 2 and f"{path}:2: gpu: unknown GPU preset 'h900'" in err and "h100-sxm" in err


def test_html_not_written_when_input_is_bad(cli, tmp_path):
    target = tmp_path / "out.html"
    code, _, _ = cli("topo", "show", "nope", "--html", str(target))
    assert code == 2 and not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_check_bundled_scenarios(cli):
    paths = sorted((REPO / "scenarios").glob("*.yaml"))
    assert paths
    for path in paths:
        code, out, err = cli("check", str(path), "--json")
        assert code == 0, err
        assert json.loads(out)["valid"] is True


def test_check_layout_that_does_not_fill_the_cluster(cli):
    code, out, err = cli("check", str(REPO / "scenarios" / "default.yaml"), "--set", "parallel.dp=2")
    assert code == 2 and out == ""
    assert "parallel" in err and "128 GPUs" in err and "has 64" in err and "set parallel.dp to 1" in err


def test_check_cluster_override_error_names_scenario_field(cli, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent("""\
        cluster:
          preset: dgx-a100
          num_nodes: 2
          inter_node: {kind: roce, nic_bandwidth: 400 Gbit}
        model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4}
        parallel: {tp: 8, dp: 2}
        training: {global_batch_size: 8}
        """))
    code, _, err = cli("check", str(path))
    assert code == 2
    assert f"{path}:4: cluster.inter_node.nic_bandwidth: cannot read bandwidth '400 Gbit'" in err


def test_check_unknown_cluster_preset_in_scenario(cli, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("cluster: {preset: dgx-z}\nmodel: {preset: gpt3-175b}\ntraining: {global_batch_size: 8}\n")
    code, _, err = cli("check", str(path))
    assert code == 2 and f"{path}:1: cluster.preset: unknown topology preset 'dgx-z'" in err


def test_console_entry_points_run():
    proc = subprocess.run([sys.executable, "-m", "simdist", "topo", "show", "dgx-h100", "--json"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["num_gpus"] == 8
    proc = subprocess.run([sys.executable, "-m", "simdist", "topo", "show", "nope"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_assumptions_are_listed_from_code_and_presets(cli):
    code, out, _ = cli("assumptions", "--json")
    items = json.loads(out)
    assert code == 0
    files = {item["file"] for item in items}
    assert "simdist/hardware/node.py" in files and "topologies/dgx-h100.yaml" in files
    assert {"gpus/a100-sxm-80gb.yaml", "gpus/cpu-core.yaml"} <= files  # the GPU presets are data too
    # the scanner does not match its own pattern (nor the quoted marker in docstrings)
    assert all(item["text"] and "(.*)" not in item["text"] and not item["text"].startswith("``") for item in items)
    crossbar = [i for i in items if "non-blocking crossbar" in i["text"]]
    assert crossbar and crossbar[0]["text"].endswith("carries its full NVLink bandwidth.")  # continuation joined
