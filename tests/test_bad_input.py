"""Issue 17's examples: each ends in one line and exit 2, or in a correct answer; nothing written half-way."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys

import pytest

from simdist import api
from simdist.errors import LimitError, SimdistError, SpecError
from simdist.limits import LIMITS, limits_table
from tests.cli_harness import REPO, run_cli

SCENARIO = """\
name: tiny
cluster: {preset: dgx-a100, num_nodes: 1}
model: {num_layers: 4, hidden_size: 256, num_attention_heads: 4, seq_length: 128, vocab_size: 1024}
parallel: {tp: 2, pp: 2, dp: 2}
training: {global_batch_size: 8, micro_batch_size: 1}
"""

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))


def _strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# --------------------------------------------------------------------------- bounded work
def test_a_billion_nodes_is_refused_with_the_numbers(tmp_path):
    r = run_cli(["topo", "show", "dgx-h100", "--num-nodes", "1000000000"])
    assert r.one_line_error(), r.err
    assert "8,000,000,000 GPUs" in r.err and "GiB" in r.err and "1,048,576 GPUs" in r.err
    assert "at most 131,072 nodes" in r.err and r.err.startswith("error: --num-nodes")


def test_a_billion_gpus_per_node_in_a_file_is_refused(tmp_path):
    text = (REPO / "topologies" / "dgx-h100.yaml").read_text().replace("gpus_per_node: 8", "gpus_per_node: 1000000000")
    (tmp_path / "t.yaml").write_text(text)
    r = run_cli(["topo", "show", tmp_path / "t.yaml"])
    assert r.one_line_error() and "gpus_per_node" in r.err and "1,024 GPUs per node" in r.err, r.err
    assert "t.yaml:" in r.err  # the file and line


def test_a_node_too_large_to_route_is_refused():
    r = run_cli(["topo", "show", "dgx-h100", "--set", "gpus_per_node=1024", "--set",
                 "inter_node.nics_per_node=2048"])
    assert r.one_line_error() and "route-search visits" in r.err, r.err


def test_a_hundred_million_micro_batches_answered_in_closed_form():
    r = run_cli(["bubble", "--schedule", "1f1b", "--stages", "4", "--microbatches", "100000000", "--json"])
    assert r.code == 0, r.err
    doc = _strict_json(r.out)
    m, k = 100_000_000, 4
    assert doc["simulated"] is False and doc["bubble_fraction"] == (k - 1) / (m + k - 1)
    assert doc["makespan_s"] == (m + k - 1) * 3.0


@pytest.mark.parametrize("schedule, k, m, v", [("gpipe", 3, 5, 1), ("1f1b", 4, 2, 1), ("1f1b", 5, 9, 1),
                                               ("interleaved_1f1b", 4, 8, 3), ("interleaved_1f1b", 2, 6, 2)])
def test_the_closed_form_equals_the_simulation_where_both_run(schedule, k, m, v):
    from simdist.api.bubble import _closed_form, _pipeline_costs

    simulated = api.bubble(schedule, num_stages=k, num_microbatches=m, vpp=v, forward_s=0.7, backward_s=1.3)
    closed = _closed_form(schedule, k, m, v, _pipeline_costs(k, 0.7, 1.3, None, 0.0))
    assert closed["bubble_fraction"] == pytest.approx(simulated["bubble_fraction"], rel=1e-12, abs=1e-15)
    assert closed["makespan_s"] == pytest.approx(simulated["makespan_s"], rel=1e-12)


def test_a_large_pipeline_that_has_no_closed_form_is_refused():
    r = run_cli(["bubble", "--schedule", "zb_h1", "--stages", "4", "--microbatches", "100000000"])
    assert r.one_line_error() and "100,000 ops" in r.err and "closed form" in r.err, r.err
    r = run_cli(["bubble", "--schedule", "1f1b", "--stages", "4", "--microbatches", "100000000", "--p2p-time", "0.1"])
    assert r.one_line_error(), r.err


def test_schedule_with_a_hundred_thousand_stages_is_refused():
    r = run_cli(["schedule", "--schedule", "1f1b", "--stages", "100000", "--microbatches", "4"])
    assert r.one_line_error() and "4,096 stages" in r.err, r.err
    r = run_cli(["schedule", "--schedule", "1f1b", "--stages", "64", "--microbatches", "10000"])
    assert r.one_line_error() and "50,000 steps" in r.err, r.err


def test_a_billion_sizes_is_refused_before_listing_them():
    r = run_cli(["collective", "--cluster", "dgx-h100", "--op", "all_reduce", "--ranks", "8", "--bytes", "1:1G:+1"])
    assert r.one_line_error() and "1,073,741,824" in r.err and "4,096" in r.err, r.err


def test_a_sweep_of_microbatch_counts_is_counted_first():
    r = run_cli(["bubble", "--schedule", "1f1b", "--stages", "4", "--sweep-microbatches", "1:100000000"])
    assert r.one_line_error() and "4,096" in r.err, r.err


def test_hidden_size_1e30_is_refused(tmp_path):
    (tmp_path / "s.yaml").write_text(SCENARIO.replace("hidden_size: 256", "hidden_size: " + "1" + "0" * 30))
    r = run_cli(["run", tmp_path / "s.yaml", "--json"])
    assert r.one_line_error() and "model.hidden_size" in r.err and "s.yaml:3" in r.err, r.err


def test_a_step_with_too_many_micro_batches_is_fast_forwarded_or_refused_before_simulating(tmp_path):
    (tmp_path / "s.yaml").write_text(SCENARIO.replace("global_batch_size: 8", "global_batch_size: 16000000"))
    # Representatives: the steady state repeats, so a few micro-batches are simulated and the rest fast-forwarded.
    r = run_cli(["run", tmp_path / "s.yaml", "--json"])
    assert r.code == 0, r.err
    sim = json.loads(r.out)["simulation"]
    assert "fast-forward" in sim["micro_batches"] and "extended to 8000000" in sim["micro_batches"], sim
    # Every rank and every micro-batch: 768 million ops, refused before anything is built.
    r = run_cli(["run", tmp_path / "s.yaml", "--simulate", "full"])
    assert r.one_line_error() and "8,000,000 micro-batch" in r.err and "2,500,000 ops" in r.err, r.err
    assert "768,000,000 ops" in r.err, r.err


def test_physical_bounds_on_topology_fields():
    for assignment, reason in (("scale_up.bandwidth=1e30 GB/s", "1 PB/s"), ("scale_up.bandwidth=1 B/s", "below"),
                               ("inter_node.latency=10 s", "above 1 s"), ("inter_node.oversubscription=1e9", "1024"),
                               ("inter_node.oversubscription=.nan", "finite"), ("gpu.hbm_capacity=1e30 GiB", "64 TiB"),
                               ("inter_node.switch_radix=1", "greater than or equal to 2")):
        if assignment.startswith("gpu."):
            assignment = "gpu={name: x, form_factor: sxm, peak: {fp32: 1 TFLOP/s, tf32: 1 TFLOP/s, bf16: 1 " \
                         "TFLOP/s, fp16: 1 TFLOP/s}, hbm_capacity: 1e30 GiB, hbm_bandwidth: 1 TB/s}"
        r = run_cli(["topo", "show", "dgx-h100", "--set", assignment])
        assert r.one_line_error() and reason in r.err, (assignment, r.err)


# --------------------------------------------------------------------------- safe YAML
def test_billion_laughs_in_a_scenario_a_topology_and_a_cluster_file(tmp_path):
    (tmp_path / "s.yaml").write_text(SCENARIO + BOMB)
    (tmp_path / "t.yaml").write_text((REPO / "topologies" / "dgx-a100.yaml").read_text() + BOMB)
    (tmp_path / "c.yaml").write_text(SCENARIO.replace("preset: dgx-a100", "file: t.yaml"))
    for argv in (["check", tmp_path / "s.yaml"], ["topo", "show", tmp_path / "t.yaml"],
                 ["check", tmp_path / "c.yaml"], ["run", tmp_path / "s.yaml", "--set", f"x={BOMB.splitlines()[1]}"]):
        r = run_cli(argv, timeout_s=30)
        assert r.one_line_error() and ("aliases expand" in r.err or "unknown field" in r.err), (argv, r.err)
    assert "100,000" in run_cli(["check", tmp_path / "s.yaml"]).err


def test_duplicate_keys_and_recursive_aliases_name_their_lines(tmp_path):
    (tmp_path / "s.yaml").write_text(SCENARIO + "schedule: 1f1b\nschedule: gpipe\n")
    r = run_cli(["check", tmp_path / "s.yaml"])
    assert r.one_line_error() and "key 'schedule' is given twice (lines 6 and 7)" in r.err and "s.yaml:7" in r.err
    (tmp_path / "r.yaml").write_text(SCENARIO + "x: &r [*r]\n")
    assert "recursive alias" in run_cli(["check", tmp_path / "r.yaml"]).err
    (tmp_path / "d.yaml").write_text(SCENARIO + "x: " + "[" * 100 + "]" * 100 + "\n")
    assert "nested deeper" in run_cli(["check", tmp_path / "d.yaml"]).err


def test_a_calibration_file_goes_through_the_same_loader(tmp_path):
    (tmp_path / "cal.yaml").write_text("topology: dgx-h100\ntopology: dgx-a100\n")
    r = run_cli(["collective", "--cluster", "dgx-h100", "--op", "all_reduce", "--ranks", "8", "--bytes", "1M",
                 "--calibration", tmp_path / "cal.yaml"])
    assert r.one_line_error() and "given twice" in r.err, r.err


def test_input_files_that_are_not_files(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    for path, needle in ((tmp_path, "it is a folder"), (tmp_path / "fifo", "mapping"), ("/dev/zero", "larger than")):
        r = run_cli(["check", path], timeout_s=30)
        assert r.one_line_error() and needle in r.err, (path, r.err)


# --------------------------------------------------------------------------- output targets
def test_run_out_with_report_html_blocked_writes_nothing(tmp_path):
    (tmp_path / "s.yaml").write_text(SCENARIO)
    out = tmp_path / "out"
    (out / "report.html").mkdir(parents=True)
    r = run_cli(["run", tmp_path / "s.yaml", "--out", out])
    assert r.one_line_error() and "report.html: it is a folder" in r.err, r.err
    assert _files(out) == ["report.html"]


def test_run_out_failing_mid_write_writes_nothing(tmp_path, monkeypatch):
    (tmp_path / "s.yaml").write_text(SCENARIO)
    real = os.fsync
    seen = []

    def fail_third(fd):
        seen.append(fd)
        if len(seen) == 3:
            raise OSError(28, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fsync", fail_third)
    r = run_cli(["run", tmp_path / "s.yaml", "--out", tmp_path / "out"])
    assert r.one_line_error() and "no space left" in r.err, r.err
    assert not (tmp_path / "out").exists() and _files(tmp_path) == ["s.yaml"]


@pytest.mark.parametrize("where, needle", [("dir", "it is a folder"), ("file-parent", "not a folder"),
                                           ("fifo", "exists as a FIFO")])
def test_html_targets_of_every_command(tmp_path, where, needle):
    (tmp_path / "s.yaml").write_text(SCENARIO)
    target = {"dir": tmp_path, "file-parent": tmp_path / "s.yaml" / "x.html", "fifo": tmp_path / "f"}[where]
    if where == "fifo":
        os.mkfifo(target)
    before = _files(tmp_path)
    for argv in (["topo", "show", "dgx-h100", "--html", target],
                 ["bubble", "--schedule", "1f1b", "--stages", "2", "--sweep-microbatches", "1:4", "--html", target],
                 ["collective", "--cluster", "dgx-h100", "--op", "all_reduce", "--ranks", "8", "--bytes", "1M",
                  "--html", target],
                 ["search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8",
                  "--html", target],
                 ["compare", "--model", "llama3-8b", "--clusters", "dgx-h100", "--gpus", "8", "--tokens", "1e9",
                  "--html", target],
                 ["calibrate", REPO / "tests" / "data" / "all_reduce_perf_a100x8.txt", "--topology", "dgx-a100",
                  "--out", target],
                 ["run", tmp_path / "s.yaml", "--out", target / "sub" if where != "dir" else tmp_path / "s.yaml"]):
        r = run_cli(argv)
        assert r.one_line_error() and (needle in r.err or "not a folder" in r.err), (argv, r.err)
        assert _files(tmp_path) == before, argv


def test_a_missing_parent_is_created(tmp_path):
    target = tmp_path / "new" / "deeper" / "bubble.html"
    r = run_cli(["bubble", "--schedule", "1f1b", "--stages", "2", "--sweep-microbatches", "1:4", "--html", target])
    assert r.code == 0 and target.is_file() and not [p for p in tmp_path.rglob("*.tmp")], r.err


# --------------------------------------------------------------------------- unparsed numbers
@pytest.mark.parametrize("sizes", ["8:8G:xabc", "8:8G:x", "8:8G:x1", "8:8G:xnan", "8:8G:+", "8:8G:+0", "1:2",
                                   "", "8:4", "-1", "1e400", "8:8G:x1.0000001"])
def test_unparsed_sizes(sizes):
    r = run_cli(["collective", "--cluster", "dgx-h100", "--op", "all_reduce", "--ranks", "8", "--bytes", sizes])
    assert r.one_line_error() and "--bytes" in r.err, (sizes, r.err)


def test_the_harness_parses_sizes_with_the_same_parser():
    for sizes in ("8:8G:xabc", "8:8G:x"):
        proc = subprocess.run([sys.executable, "-m", "validation.collectives", "--bytes", sizes, "--out", os.devnull],
                              capture_output=True, text=True, cwd=REPO, timeout=120)
        assert proc.returncode == 2 and proc.stderr.startswith("error: --bytes: cannot read size range factor")
        assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- resume files
SEARCH = ["search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8",
          "--top", "0", "--json"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    path = tmp_path_factory.mktemp("search") / "r.jsonl"
    r = run_cli([*SEARCH, "--out", path])
    assert r.code == 0, r.err
    return path, _strict_json(r.out)


def test_a_torn_last_line_is_dropped_with_a_note_and_the_search_continues(results, tmp_path):
    path, full = results
    lines = path.read_text().splitlines(keepends=True)
    torn = tmp_path / "r.jsonl"
    torn.write_text("".join(lines[:5]) + lines[5][:40])  # killed mid-write
    r = run_cli([*SEARCH, "--resume", torn])
    assert r.code == 0 and "note: " in r.err and "r.jsonl:6: dropped the incomplete last line" in r.err, r.err
    assert _strict_json(r.out)["ranked"] == full["ranked"]
    # truncated, then completed: a valid file again, its five whole rows kept first; branch and bound, resuming
    # from other rows, may evaluate other layouts exactly than the uninterrupted run did (simdist.search.sweep: what
    # it reports does not depend on a resume, which rows it evaluates on the way does), each as that run did
    completed = torn.read_text().splitlines()
    assert all(json.loads(line) for line in completed) and completed[:5] == path.read_text().splitlines()[:5]
    full_rows = {json.loads(line).get("key"): line for line in path.read_text().splitlines()}  # the header: None
    shared = [line for line in completed if json.loads(line).get("key") in full_rows]
    assert len(shared) > 5 and all(line == full_rows[json.loads(line).get("key")] for line in shared)
    r = run_cli([*SEARCH, "--resume", torn])
    assert r.code == 0 and "note" not in r.err and _strict_json(r.out)["ranked"] == full["ranked"]


def test_a_complete_last_line_without_its_newline_is_kept(results, tmp_path):
    path, full = results
    text = path.read_text()
    cut = tmp_path / "r.jsonl"
    cut.write_text(text[: text.index("\n", text.index("\n") + 1)])  # line 2 complete, no newline
    r = run_cli([*SEARCH, "--resume", cut])
    assert r.code == 0 and "note" not in r.err and _strict_json(r.out)["ranked"] == full["ranked"]
    completed = cut.read_text().splitlines()
    assert completed[:2] == text.splitlines()[:2]  # the kept line, then a newline before the new rows
    assert set(text.splitlines()) <= set(completed)


@pytest.mark.parametrize("damage, needle", [
    (b"\xff\xfe\x00binary\n", "line 2 holds bytes that are not text"),
    (b"42\n", "line 2 is a JSON int, not an object"),
    (b"[1, 2]\n", "line 2 is a JSON list, not an object"),
    (b'"text"\n', "line 2 is a JSON str"),
    (b'{"key": "x"}\n', "line 2 is a result row without layout"),
    (b"{not json}\n", "line 2 is not JSON"),
])
def test_damaged_lines_are_one_error_naming_the_line(results, tmp_path, damage, needle):
    path, _ = results
    lines = path.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "r.jsonl"
    bad.write_bytes(lines[0] + damage + b"".join(lines[1:]))
    r = run_cli([*SEARCH, "--resume", bad])
    assert r.one_line_error() and needle in r.err and "r.jsonl:2" in r.err, r.err


def test_a_row_whose_key_does_not_match_its_layout(results, tmp_path):
    path, _ = results
    lines = path.read_text().splitlines(keepends=True)
    row = json.loads(lines[1])
    row["key"] = "tp9-" + row["key"]
    bad = tmp_path / "r.jsonl"
    bad.write_text(lines[0] + json.dumps(row) + "\n")
    r = run_cli([*SEARCH, "--resume", bad])
    assert r.one_line_error() and "does not match its layout" in r.err, r.err


# --------------------------------------------------------------------------- silently accepted before
def test_cluster_with_preset_and_file(tmp_path):
    (tmp_path / "s.yaml").write_text(SCENARIO.replace("preset: dgx-a100", "preset: dgx-a100, file: x.yaml"))
    r = run_cli(["check", tmp_path / "s.yaml"])
    assert r.one_line_error() and "preset or its file, not both" in r.err, r.err


@pytest.mark.parametrize("flag, value, needle", [("--seq", "0", "--seq 0"), ("--max-tp", "0", "--max-tp 0"),
                                                  ("--max-pp", "-1", "--max-pp"), ("--max-vpp", "100000", "4,096"),
                                                  ("--workers", "100000", "256"), ("--top", "-1", "--top"),
                                                  ("--gpus", "0", "--gpus"), ("--global-batch", "0", "--global-batch"),
                                                  ("--max-micro-batch", "0", "--max-micro-batch"),
                                                  ("--rows", "-3", "--rows")])
def test_search_flags(flag, value, needle):
    r = run_cli([*SEARCH, flag, value])
    assert r.one_line_error() and needle in r.err, r.err


@pytest.mark.parametrize("flag, value", [("--tokens", "nan"), ("--tokens", "inf"), ("--tokens", "0"),
                                         ("--tokens", "-5"), ("--pue", "nan"), ("--pue", "inf"), ("--pue", "0.5"),
                                         ("--gpus", "-8"), ("--price", "dgx-h100=nan")])
def test_compare_flags(flag, value):
    r = run_cli(["compare", "--model", "llama3-8b", "--clusters", "dgx-h100", "--gpus", "8", "--tokens", "1e9",
                 flag, value, "--json"])
    assert r.one_line_error() and flag in r.err and r.out == "", r.err


def test_collective_compare_with_another_op_or_rank_count():
    sample = REPO / "tests" / "data" / "all_reduce_perf_a100x8.txt"
    r = run_cli(["collective", "--cluster", "dgx-a100", "--op", "all_gather", "--ranks", "8", "--bytes", "1M",
                 "--compare", sample])
    assert r.one_line_error() and "holds all_reduce on 8 ranks, not all_gather on 8 ranks" in r.err, r.err
    r = run_cli(["collective", "--cluster", "dgx-a100", "--op", "all_reduce", "--ranks", "4", "--bytes", "1M",
                 "--compare", sample])
    assert r.one_line_error() and "not all_reduce on 4 ranks" in r.err, r.err
    r = run_cli(["collective", "--cluster", "dgx-a100", "--op", "all_reduce", "--ranks", "8", "--bytes", "1M",
                 "--compare", sample, "--json"])
    assert r.code == 0 and _strict_json(r.out)["compare"], r.err


def test_a_mixed_measurement_file_is_a_note(tmp_path):
    (tmp_path / "m.csv").write_text("op,nbytes,num_ranks,time_s\nall_reduce,1048576,8,0.0001\n"
                                    "all_gather,1048576,8,0.0001\n")
    r = run_cli(["collective", "--cluster", "dgx-a100", "--op", "all_reduce", "--ranks", "8", "--bytes", "1M",
                 "--compare", tmp_path / "m.csv"])
    assert r.code == 0 and "note: --compare: using the 1 measurements of all_reduce on 8 ranks" in r.err, r.err


@pytest.mark.parametrize("key", ["ffn_config", "attn_layer_period", "interleave_moe_layer_step"])
def test_an_unmodelled_hugging_face_config_key_is_refused(tmp_path, key):
    # DBRX's nested experts, Jamba's Mamba layers, Llama 4's MoE pattern: never read as a dense model.
    config = {"hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 4, "intermediate_size": 512,
              "max_position_embeddings": 128, "vocab_size": 1024, "num_local_experts": 8, "num_experts_per_tok": 2,
              key: {"moe_num_experts": 16} if key == "ffn_config" else 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "s.yaml").write_text(SCENARIO.replace(
        "model: {num_layers: 4, hidden_size: 256, num_attention_heads: 4, seq_length: 128, vocab_size: 1024}",
        "model: {hf_config: config.json}"))
    r = run_cli(["run", tmp_path / "s.yaml"])
    assert r.one_line_error() and f"model.hf_config.{key}" in r.err and "not modelled" in r.err, r.err
    del config[key]  # the Mixtral-style experts themselves are read
    (tmp_path / "config.json").write_text(json.dumps(config))
    # (an MoE model on tp 2 trains with sequence parallelism: Megatron-Core's MoELayer refuses tp > 1 without it)
    assert run_cli(["check", tmp_path / "s.yaml", "--set", "parallel.sequence_parallel=true"]).code == 0


@pytest.mark.parametrize("argv", [
    ["bubble", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--forward-time", "nan"],
    ["bubble", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--backward-time", "inf"],
    ["bubble", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--forward-time", "1e-300"],
    ["bubble", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--p2p-time", "-1"],
    ["bubble", "--schedule", "1f1b", "--stages", "0", "--microbatches", "8"],
    ["bubble", "--schedule", "1f1b", "--stages", "4", "--microbatches", "-8"],
    ["bubble", "--schedule", "1f1b", "--stages", "2", "--microbatches", "8", "--stage-times", "1,nan"],
    ["collective", "--cluster", "dgx-h100", "--op", "all_reduce", "--ranks", "-8", "--bytes", "1M"],
    ["collective", "--cluster", "dgx-h100", "--op", "all_reduce", "--ranks", "0", "--bytes", "1M"],
    ["collective", "--cluster", "dgx-h100", "--op", "broadcast", "--ranks", "8", "--bytes", "1M", "--root", "-1"],
    ["collective", "--cluster", "dgx-h100", "--op", "all_reduce", "--ranks", "8", "--num-nodes", "0"],
    ["topo", "show", "dgx-h100", "--num-nodes", "-1"],
    ["schema", "nope"],
])
def test_every_option_refuses_negative_zero_nan_inf(argv):
    r = run_cli(argv)
    assert r.one_line_error(), (argv, r.err)


# --------------------------------------------------------------------------- output streams
@pytest.mark.parametrize("argv", [
    ["topo", "show", "dgx-h100", "--json"], ["topo", "gpus", "--json"], ["schema", "calibration"],
    ["bubble", "--schedule", "zb_h1", "--stages", "4", "--microbatches", "8", "--json"],
    ["collective", "--cluster", "dgx-h100", "--op", "all_reduce", "--ranks", "8", "--bytes", "1M,1G", "--json"],
    [*SEARCH], ["assumptions", "--json"],
])
def test_json_outputs_are_strict(argv):
    r = run_cli(argv)
    assert r.code == 0, r.err
    _strict_json(r.out)


class _SigintWhileWriting(io.StringIO):
    """stdout that receives a real SIGINT in the middle of a document, as a Ctrl-C would arrive."""

    def write(self, text):
        half = len(text) // 2
        super().write(text[:half])
        # raise_signal is thread-directed (the C library's raise): the signal is taken by this thread before the
        # call returns. os.kill(getpid()) is process-directed and may be taken by another thread of the test process
        # (numpy's, pytest-xdist's), its Python handler then running later, after the block that holds it back.
        signal.raise_signal(signal.SIGINT)
        return super().write(text[half:]) + half


def test_sigint_while_printing_leaves_a_complete_document_or_none():
    out = _SigintWhileWriting()
    # as in a `simdist` process: SIGINT raises KeyboardInterrupt (a pytest-xdist worker may have set it otherwise)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        r = run_cli(["schema", "scenario"], stdout=out)
    finally:
        signal.signal(signal.SIGINT, before)
    assert r.code == 130, r.err
    _strict_json(out.getvalue())  # the whole document, then exit 130


class _ClosedPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self):  # where simdist points stdout at /dev/null afterwards
        raise OSError("no descriptor")


def test_a_closed_pipe_ends_quietly():
    r = run_cli(["schema", "scenario"], stdout=_ClosedPipe())
    assert r.code == 0 and r.err == ""


def test_a_reader_gone_before_the_output_in_a_real_pipe():
    # the reader closes before simdist writes (it is still starting up): its write meets EPIPE, as `| head -c 10`
    # does for any output longer than what head reads and the pipe buffers
    proc = subprocess.Popen([sys.executable, "-m", "simdist", "assumptions", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and "Traceback" not in err and "Exception ignored" not in err, err


def test_ctrl_c_in_each_phase_of_search_keeps_what_finished(monkeypatch, tmp_path):
    from simdist.search import rank

    results = tmp_path / "r.jsonl"
    # during the enumeration: nothing finished; say how to resume
    real_enumerate = rank.enumerate_feasible
    monkeypatch.setattr(rank, "enumerate_feasible", lambda p: (_ for _ in ()).throw(KeyboardInterrupt))
    r = run_cli([*SEARCH, "--out", results])
    assert r.code == 130 and r.out == "" and f"--resume {results}" in r.err, r.err
    monkeypatch.setattr(rank, "enumerate_feasible", real_enumerate)
    # during the engine's re-simulation: the ranking is printed, then exit 130
    monkeypatch.setattr(rank, "resimulate", lambda problem, row: (_ for _ in ()).throw(KeyboardInterrupt))
    r = run_cli([*SEARCH[:-3], "--top", "2", "--json", "--out", results])
    assert r.code == 130 and "interrupted" in r.err and f"--resume {results}" in r.err, r.err
    doc = _strict_json(r.out)
    assert doc["interrupted"] and doc["ranked"] and doc["engine"] == []


def test_ctrl_c_in_compare_is_not_a_partial_answer(monkeypatch):
    from simdist.search import rank

    monkeypatch.setattr(rank, "sweep", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    r = run_cli(["compare", "--model", "llama3-8b", "--clusters", "dgx-h100", "--gpus", "8", "--tokens", "1e9"])
    assert r.code == 130 and r.out == "" and "interrupted" in r.err


# --------------------------------------------------------------------------- the limits, documented
def test_docs_limits_md_is_generated_from_simdist_limits():
    assert (REPO / "docs" / "limits.md").read_text() == limits_table()
    assert all(lim.reason for lim in LIMITS.values())


def test_limit_errors_are_simdist_errors():
    assert issubclass(LimitError, SimdistError) and issubclass(SpecError, SimdistError)


def test_every_limit_is_enforced_somewhere():
    import re

    from simdist import limits

    names = [k for k, v in vars(limits).items() if isinstance(v, limits.Limit)]
    sources = "\n".join(p.read_text() for p in (REPO / "simdist").rglob("*.py") if p.name != "limits.py")
    sources += (REPO / "simdist" / "limits.py").read_text().split("def check_work")[1]
    unused = [n for n in names if not re.search(rf"\b{n}\b", sources)]
    assert unused == [] and len(names) == len(LIMITS)


@pytest.mark.parametrize("redirect, code", [(">&-", 0), ("2>&-", 2), (">&- 2>&-", 2)])
def test_closed_standard_streams(redirect, code):
    command = "topo list" if code == 0 else "topo show nope"
    proc = subprocess.run(f"{sys.executable} -m simdist {command} {redirect}", shell=True, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == code and "Traceback" not in proc.stderr, proc.stderr


def test_a_narrow_output_encoding_escapes_instead_of_failing(tmp_path):
    (tmp_path / "s.yaml").write_text(SCENARIO.replace("name: tiny", "name: ünï"), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "simdist", "check", tmp_path / "s.yaml"], capture_output=True,
                          cwd=REPO, timeout=120, env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0 and b"\\xfcn\\xef" in proc.stdout, proc.stderr


@pytest.mark.slow
def test_search_and_collective_work_bounds():
    r = run_cli([*SEARCH, "--gpus", "1048576"])
    assert r.one_line_error() and "65,536 GPUs" in r.err, r.err
    r = run_cli(["collective", "--cluster", "dgx-h100", "--num-nodes", "128", "--op", "all_reduce", "--ranks", "1024"])
    assert r.one_line_error() and "31,744 rank-sizes" in r.err and "--algorithm ring" in r.err, r.err
    r = run_cli(["compare", "--model", "llama3-8b", "--clusters", ",".join(["dgx-h100", "dgx-a100"] * 10),
                 "--gpus", "8",
                 "--tokens", "1e9", "--json",  # a small space: the duplicates, not the layouts, are the point
                 "--max-pp", "1", "--max-cp", "1", "--max-vpp", "1", "--max-micro-batch", "1", "--schedules", "1f1b"])
    assert r.code == 0 and [row["cluster"] for row in _strict_json(r.out)["rows"]] == ["dgx-h100", "dgx-a100"], r.err
    r = run_cli(["compare", "--model", "llama3-8b", "--clusters", ",".join(f"c{i}" for i in range(17)), "--gpus", "8",
                 "--tokens", "1e9"])
    assert r.one_line_error() and "17 clusters" in r.err, r.err


def test_duplicate_schedules_are_searched_once():
    once = _strict_json(run_cli([*SEARCH, "--schedules", "1f1b"]).out)
    twice = _strict_json(run_cli([*SEARCH, "--schedules", "1f1b,1f1b"]).out)
    assert once["candidates"] == twice["candidates"] and once["ranked"] == twice["ranked"]
