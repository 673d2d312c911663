"""Issue 35's number and I/O examples, each one clear line and exit 2 (or a correct answer): link names read with
ASCII digits only, JSON with a 5,000-digit integer, calibration and fault values far outside any cluster, and
measurement times in the wrong unit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from simdist.units import ascii_int
from tests.cli_harness import run_cli

TINY = {"name": "tiny", "cluster": {"preset": "dgx-h100", "num_nodes": 2},
        "model": {"num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 512,
                  "vocab_size": 32000},
        "parallel": {"tp": 8, "dp": 2}, "training": {"micro_batch_size": 1, "global_batch_size": 2}}


def test_ascii_int_reads_only_ascii_digits():
    assert ascii_int("12") == 12 and ascii_int("007") == 7
    for text in ("¹", "1¹", "٣", "", "-1", "1e3", " 1", "9" * 19):
        assert ascii_int(text) is None


def _scenario(tmp_path, **extra) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**TINY, **extra}, allow_unicode=True))
    return str(path)


@pytest.mark.parametrize(("faults", "words"), [
    ({"failed_links": [{"src": "leaf0", "dst": "spine\u00b9"}]}, "no leaf-spine link leaf0 - spine\u00b9"),
    ({"degraded_links": [{"src": "n0/nic0", "dst": "leaf0", "bandwidth_fraction": 1e-300}]},
     "faults.degraded_links[0].bandwidth_fraction: bandwidth fraction 1e-300 is below 1e-06"),
])
def test_fault_values_outside_any_cluster_are_refused(tmp_path, faults, words):
    r = run_cli(["run", _scenario(tmp_path, faults=faults), "--fidelity", "closed_form"])
    assert r.one_line_error() and words in r.err, r.err


def test_a_report_with_a_5000_digit_integer_is_refused(tmp_path):
    report = tmp_path / "report.json"
    report.write_text('{"scenario": {"name": "x", "parallel": {"tp": ' + "9" * 5000 + "}}}")
    r = run_cli(["run", str(report)])
    assert r.one_line_error() and "too long" in r.err, r.err


def test_a_config_json_with_a_5000_digit_integer_is_refused(tmp_path):
    config = tmp_path / "config.json"
    config.write_text('{"hidden_size": ' + "1" * 5000 + "}")
    r = run_cli(["run", _scenario(tmp_path, model={"hf_config": str(config), "seq_length": 512})])
    assert r.one_line_error() and "too long" in r.err, r.err


@pytest.mark.parametrize(("field", "value", "words"), [
    ("bandwidth_factor", 1e-300, "below"), ("bandwidth_factor", 1e300, "above"),
    ("above_range_factor", 1e-300, "below"), ("latency", "1e9 us", "latency"),
])
def test_calibration_values_outside_any_cluster_are_refused(tmp_path, field, value, words):
    cal = {"topology": "dgx-h100", "gpu": "NVIDIA H100 80GB HBM3", "num_nodes": 1,
           "collectives": {"all_reduce": {"latency": "10 us", "bandwidth_factor": 0.9, field: value}}}
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(cal))
    r = run_cli(["run", _scenario(tmp_path), "--fidelity", "closed_form", "--calibration", str(path)])
    assert r.one_line_error() and words in r.err and field in r.err, r.err


def test_measurements_in_the_wrong_unit_are_refused(tmp_path):
    csv = tmp_path / "m.csv"
    csv.write_text("op,nbytes,num_ranks,time_s\n" + "".join(f"all_reduce,{2**k},8,1e-300\n" for k in range(10, 20)))
    out = tmp_path / "cal.yaml"
    r = run_cli(["calibrate", str(csv), "--topology", "dgx-h100", "--out", str(out)])
    assert r.one_line_error() and "time_s" in r.err and "below" in r.err, r.err
    assert not out.exists()


def test_json_documents_stay_exact(tmp_path):
    # a plain report still reads back (the one JSON reader changes nothing for good input)
    from simdist.files import loads_json

    assert loads_json(json.dumps({"a": [1, 2.5, "x"]})) == {"a": [1, 2.5, "x"]}
    with pytest.raises(ValueError, match="line 1"):
        loads_json("{")


@pytest.mark.parametrize("overrides", [{"gpu": "b200"}, {"num_nodes": 64}, {"inter_node": {"nic_bandwidth": "1 Gb/s"}},
                                       {"scale_up": {"bandwidth": "1 GB/s"}}])
def test_a_calibration_cannot_change_the_cluster(tmp_path, overrides):
    cal = {"topology": "dgx-h100", "overrides": overrides}
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(cal))
    r = run_cli(["run", _scenario(tmp_path), "--fidelity", "closed_form", "--calibration", str(path)])
    assert r.one_line_error() and "corrects the links' efficiency and latency only" in r.err, r.err


def test_a_calibration_of_efficiencies_still_applies(tmp_path):
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump({"topology": "dgx-h100", "overrides": {"scale_up": {"efficiency": 0.5},
                                                                          "inter_node": {"latency": "2 us"}}}))
    plain = run_cli(["run", _scenario(tmp_path), "--fidelity", "closed_form", "--json"])
    slow = run_cli(["run", _scenario(tmp_path), "--fidelity", "closed_form", "--json", "--calibration", str(path)])
    assert slow.code == 0, slow.err
    assert json.loads(slow.out)["step_time_s"] > json.loads(plain.out)["step_time_s"]


def test_a_fifo_as_calibration_is_read_once_and_never_waited_on(tmp_path):
    import os
    import threading

    fifo = tmp_path / "cal.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "w") as fh:
            fh.write("topology: dgx-h100\noverrides: {scale_up: {efficiency: 0.7}}\n")

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    r = run_cli(["run", _scenario(tmp_path), "--fidelity", "closed_form", "--calibration", str(fifo), "--json"],
                timeout_s=60)
    writer.join(5)
    assert r.code == 0, r.err
    assert json.loads(r.out)["step_time_s"] > 0


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_sigterm_while_writing_leaves_no_temporary(tmp_path, monkeypatch, signame):
    import os
    import signal

    out = tmp_path / "report"
    real_fsync = os.fsync

    def killed(fd):  # the signal lands while the report's temporary file is being written
        os.kill(os.getpid(), getattr(signal, signame))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", killed)
    before = signal.getsignal(getattr(signal, signame))
    r = run_cli(["run", _scenario(tmp_path), "--fidelity", "closed_form", "--out", str(out)])
    assert r.code == 128 + getattr(signal, signame) and f"terminated by {signame}" in r.err, r.err
    assert not out.exists() or not [p for p in out.iterdir()]  # nothing written, no .report.json.*.tmp
    assert signal.getsignal(getattr(signal, signame)) == before  # the handler before is back


@pytest.mark.parametrize("extra", [
    {"faults": {"stragglers": [{"rank": 99, "slower_by": 0.2}]}},
    {"faults": {"degraded_links": [{"src": "n0/nic0", "dst": "leaf9", "bandwidth_fraction": 0.5}]}},
    {"training": {"micro_batch_size": 1, "global_batch_size": 2, "tp_comm_overlap": True}},
])
def test_check_refuses_what_run_refuses(tmp_path, extra):
    path = _scenario(tmp_path, **extra)
    run = run_cli(["run", path, "--fidelity", "closed_form"])
    check = run_cli(["check", path])
    assert run.one_line_error() and check.one_line_error(), (run.err, check.err)
    assert check.err.splitlines()[-1] == run.err.splitlines()[-1]


def test_set_beside_model_is_applied_by_search_and_refused_by_compare():
    base = ["search", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "64", "--global-batch", "64",
            "--top", "1", "--json", "--rows", "1"]
    plain = run_cli(base)
    slow = run_cli([*base, "--set", "training.attention=materialized"])
    assert plain.code == 0 and slow.code == 0, slow.err
    a, b = json.loads(plain.out), json.loads(slow.out)
    assert b["scenario_resolved"]["training"]["attention"] == "materialized"
    assert b["ranked"][0]["step_time_s"] > a["ranked"][0]["step_time_s"]
    r = run_cli(["compare", "--model", "gpt3-175b", "--cluster", "dgx-a100:64", "--tokens", "1e9", "--set",
                 "training.recompute=full"])
    assert r.one_line_error() and "compare --model has no scenario" in r.err, r.err


def test_a_barrier_row_has_no_bandwidth():
    r = run_cli(["collective", "--cluster", "dgx-h100", "--op", "barrier", "--ranks", "8", "--bytes", "1M"])
    assert r.code == 0 and r.out.splitlines()[-1].split()[4:6] == ["-", "-"], r.out
    doc = json.loads(run_cli(["collective", "--cluster", "dgx-h100", "--op", "barrier", "--ranks", "8", "--bytes",
                              "1M", "--json"]).out)
    assert doc["rows"][0]["algbw_GBps"] is None and doc["rows"][0]["busbw_GBps"] is None
    assert doc["rows"][0]["time_s"] > 0


def test_a_leaf_cut_off_from_every_spine_is_named_once(tmp_path):
    extra = {"cluster": {"preset": "dgx-h100", "num_nodes": 4, "inter_node": {"fabric": "fat_tree",
                                                                             "switch_radix": 16}},
             "parallel": {"tp": 8, "dp": 4}, "training": {"micro_batch_size": 1, "global_batch_size": 4},
             "faults": {"failed_links": [{"src": "leaf0", "dst": f"spine{s}"} for s in range(8)]}}
    r = run_cli(["run", _scenario(tmp_path, **extra), "--fidelity", "closed_form"])
    assert r.one_line_error() and "leave leaf0 with no spine at all" in r.err, r.err


@pytest.mark.parametrize("budget", [["--budget-kw", "1e9"], ["--budget-usd-per-hour", "1e12", "--price",
                                                                 "dgx-a100=2"]])
def test_an_over_budget_names_the_budget_not_a_flag_compare_lacks(budget):
    r = run_cli(["compare", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--tokens", "1e9", *budget])
    assert r.one_line_error() and f"error: {budget[0]}:" in r.err and "--num-nodes" not in r.err, r.err


def test_mxfp8_on_another_gpus_nodes_is_refused_as_on_the_cluster(tmp_path):
    extra = {"cluster": {"preset": "dgx-b200", "num_nodes": 2},
             "training": {"micro_batch_size": 1, "global_batch_size": 2, "precision": "fp8", "fp8_recipe": "mxfp8"},
             "faults": {"heterogeneous_nodes": [{"nodes": [1], "gpu": "h100-sxm"}]}}
    r = run_cli(["run", _scenario(tmp_path, **extra), "--fidelity", "closed_form"])
    assert r.one_line_error() and "mxfp8 needs Blackwell" in r.err and "heterogeneous_nodes" in r.err, r.err
    extra["faults"]["heterogeneous_nodes"][0]["gpu"] = "b300"
    assert run_cli(["run", _scenario(tmp_path, **extra), "--fidelity", "closed_form"]).code == 0


def test_compare_prices_goodput_with_the_scenarios_checkpoints(tmp_path):
    extra = {"cluster": {"preset": "dgx-h100", "num_nodes": 2}, "parallel": {"tp": 8, "dp": 2},
             "training": {"micro_batch_size": 1, "global_batch_size": 2},
             "faults": {"checkpoint": {"write": "600 s", "interval": "1200 s", "restart": "900 s"}}}
    path = _scenario(tmp_path, **extra)
    run = json.loads(run_cli(["run", path, "--fidelity", "closed_form", "--json"]).out)["goodput"]["fraction"]
    r = run_cli(["compare", path, "--cluster", "dgx-h100:16", "--tokens", "1e9", "--json"])
    assert r.code == 0, r.err
    # write 600 s every 1,200 s: at most 2/3 of the time training, far below the default checkpoints' 0.99+
    assert json.loads(r.out)["rows"][0]["goodput"] == pytest.approx(run, rel=1e-9) and run < 0.67


def test_a_documented_alias_over_the_files_own_name(tmp_path):
    path = _scenario(tmp_path)  # parallel: {tp: 8, ...}
    same = run_cli(["check", path, "--set", "parallel.tensor_model_parallel_size=8"])
    assert same.code == 0, same.err
    other = run_cli(["check", path, "--set", "parallel.tensor_model_parallel_size=4"])
    assert other.one_line_error() and "tp (8) and tensor_model_parallel_size (4) name the same field" in other.err
    assert "unknown field" not in other.err


def test_zb_h1_with_full_recompute_simulates_every_rank(tmp_path):
    # the recompute's forward all-reduces and the backward's share a name under zb_h1 (both 'B0 all_reduce x4'):
    # each pairs with its own kind on the tp peer, so no collective waits for itself (no false deadlock)
    extra = {"model": {"num_layers": 8, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 512,
                       "vocab_size": 32000},
             "cluster": {"preset": "dgx-h100", "num_nodes": 1}, "parallel": {"tp": 2, "pp": 4},
             "training": {"micro_batch_size": 1, "global_batch_size": 8, "recompute": "full"}, "schedule": "zb_h1"}
    path = _scenario(tmp_path, **extra)
    full = run_cli(["run", path, "--simulate", "full", "--json"])
    reps = run_cli(["run", path, "--json"])
    assert full.code == 0 and reps.code == 0, full.err
    assert json.loads(full.out)["step_time_s"] == pytest.approx(json.loads(reps.out)["step_time_s"], rel=1e-9)


def test_a_skewed_dp_batch_split_is_in_the_work_estimate(tmp_path):
    extra = {"cluster": {"preset": "dgx-h100", "num_nodes": 2}, "parallel": {"tp": 8, "dp": 2},
             "training": {"micro_batch_size": 1, "global_batch_size": 4_000_000,
                          "dp_batch_split": [1, 3_999_999]}}
    r = run_cli(["run", _scenario(tmp_path, **extra)], timeout_s=30)
    assert r.one_line_error() and "3,999,999 micro-batch(es)" in r.err, r.err


def test_a_report_reads_files_outside_its_folder_only_when_trusted(tmp_path):
    fixture = Path(__file__).resolve().parent / "data" / "topologies" / "tiny-graph-odd-link.yaml"
    extra = {"cluster": {"file": str(fixture)}, "parallel": {"tp": 4, "dp": 2},
             "training": {"micro_batch_size": 1, "global_batch_size": 2}}
    out = tmp_path / "out"
    first = run_cli(["run", _scenario(tmp_path, **extra), "--fidelity", "closed_form", "--out", str(out)])
    assert first.code == 0, first.err
    refused = run_cli(["run", str(out / "report.json")])
    assert refused.one_line_error() and "outside the report's folder" in refused.err, refused.err
    assert "--trust-paths" in refused.err
    trusted = run_cli(["run", str(out / "report.json"), "--trust-paths", "--json"])
    assert trusted.code == 0 and f"reads {fixture}" in trusted.err, trusted.err
    assert json.loads(trusted.out)["step_time_s"] == json.loads((out / "report.json").read_text())["step_time_s"]
