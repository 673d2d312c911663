"""Issue 35, item 3: the topology file a calibration names is resolved relative to the calibration, read only inside
its folder unless --trust-paths (as a report.json's files: simdist.api.provenance.confined_path), and reported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.cli_harness import REPO, run_cli

TOPOLOGY = REPO / "tests" / "data" / "topologies" / "tiny-pcie-fat-tree.yaml"
SCENARIO = {"name": "s", "model": {"num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 512,
                                   "vocab_size": 32000},
            "parallel": {"tp": 4, "dp": 2}, "training": {"micro_batch_size": 1, "global_batch_size": 2}}


def _measurements(path: Path) -> Path:
    rows = [f"all_reduce,{2**k},{r},{2e-5 + 2**k / 1e10 * (1.0 + 0.02 * (k % 3))!r}\n"
            for r in (2, 4) for k in range(10, 27)]
    path.write_text("op,nbytes,num_ranks,time_s\n" + "".join(rows))
    return path


@pytest.fixture
def layout(tmp_path):
    """tmp/topo/t.yaml (the topology), tmp/m.csv, and tmp/cal/cal.yaml fitted on it (``simdist calibrate``)."""
    (tmp_path / "topo").mkdir()
    shutil.copy(TOPOLOGY, tmp_path / "topo" / "t.yaml")
    _measurements(tmp_path / "m.csv")
    r = run_cli(["calibrate", "m.csv", "--topology", "topo/t.yaml", "--out", "cal/cal.yaml"], cwd=tmp_path)
    assert r.code == 0, r.err
    return tmp_path


def test_calibrate_writes_the_topology_relative_to_the_calibration(layout):
    assert yaml.safe_load((layout / "cal" / "cal.yaml").read_text())["topology"] == "../topo/t.yaml"


def test_validate_reads_a_topology_outside_the_calibrations_folder_only_when_trusted(layout):
    elsewhere = layout / "topo"  # another working folder: the path is the calibration's, not the cwd's
    refused = run_cli(["validate", "../m.csv", "--calibration", "../cal/cal.yaml"], cwd=elsewhere)
    assert refused.one_line_error() and "outside the calibration's folder" in refused.err, refused.err
    assert "error: --trust-paths:" in refused.err and "../topo/t.yaml (topology)" in refused.err
    trusted = run_cli(["validate", "../m.csv", "--calibration", "../cal/cal.yaml", "--trust-paths"], cwd=elsewhere)
    assert trusted.code == 0, trusted.err
    assert f"note: ../cal/cal.yaml reads {layout / 'cal' / '..' / 'topo' / 't.yaml'} (topology)" in trusted.err


def test_a_topology_beside_the_calibration_is_read_from_any_folder(layout):
    shutil.copy(TOPOLOGY, layout / "cal" / "t.yaml")
    cal = layout / "cal" / "cal.yaml"
    cal.write_text(cal.read_text().replace("topology: ../topo/t.yaml", "topology: t.yaml"))
    r = run_cli(["validate", str(layout / "m.csv"), "--calibration", str(cal), "--json"], cwd=layout / "topo")
    assert r.code == 0 and f"reads {layout / 'cal' / 't.yaml'} (topology)" in r.err, r.err
    assert json.loads(r.out)["topology"] == str(layout / "cal" / "t.yaml")


def test_run_applies_a_calibration_of_the_scenarios_own_topology_file(layout):
    # the scenario names the file itself: the calibration makes simdist read nothing new (no --trust-paths needed)
    (layout / "s.yaml").write_text(yaml.safe_dump({**SCENARIO, "cluster": {"file": "topo/t.yaml"}}))
    plain = run_cli(["run", "s.yaml", "--fidelity", "closed_form", "--json"], cwd=layout)
    tuned = run_cli(["run", "s.yaml", "--fidelity", "closed_form", "--json", "--calibration", "cal/cal.yaml"],
                    cwd=layout)
    assert plain.code == 0 and tuned.code == 0, tuned.err
    assert json.loads(tuned.out)["step_time_s"] != json.loads(plain.out)["step_time_s"]


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_calibration_naming_another_file_outside_is_refused_by_run_and_check(layout, command):
    (layout / "s.yaml").write_text(yaml.safe_dump({**SCENARIO, "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                                                   "parallel": {"tp": 8}, "training": {"micro_batch_size": 1,
                                                                                       "global_batch_size": 1},
                                                   "calibration": "cal/cal.yaml"}))
    argv = [command, "s.yaml"] + (["--fidelity", "closed_form"] if command == "run" else [])
    refused = run_cli(argv, cwd=layout)
    assert refused.one_line_error() and "outside the calibration's folder" in refused.err, refused.err
    trusted = run_cli([*argv, "--trust-paths"], cwd=layout)  # read, reported, and then not this cluster's topology
    assert trusted.one_line_error() and "reads" in trusted.err, trusted.err
    assert "was fitted for topology 'tiny-pcie-fat-tree', not 'dgx-h100'" in trusted.err
