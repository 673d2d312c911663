"""Training-step outputs: the Chrome/Perfetto trace, the HTML report and the terminal tables."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pytest

from simdist.plan.opgraph import STREAMS, Comm, Op, OpGraph
from simdist.report.step_html import op_group, step_report_html, timeline_figure
from simdist.report.step_table import format_percent, render_text, step_tables
from simdist.report.step_trace import chrome_trace, write_chrome_trace
from simdist.units import GiB


@dataclass(frozen=True, slots=True)
class FakeTrace:
    """Stand-in for simdist.engine.graph.GraphTrace (same attributes)."""

    start_s: tuple[float, ...]
    end_s: tuple[float, ...]
    makespan_s: float


def tiny() -> tuple[OpGraph, FakeTrace]:
    """Two pipeline stages (rank 0 stage 0, rank 1 stage 1), TP all-reduce and a PP send; times by hand."""
    g = OpGraph()
    f0 = g.add(Op("fwd s0 mb0", 0, "compute", "forward", 1e-3, stage=0, microbatch=0, chunk=0))
    ar = g.add(Op("tp ar s0 mb0", 0, "tp", "comm", stage=0, microbatch=0, chunk=0,
                  comm=Comm("all_reduce", (0, 2, 4, 6), 64 * 2**20, "tp")))
    send = g.add(Op("pp send mb0", 0, "pp", "comm", stage=0, microbatch=0,
                    comm=Comm("send_recv", (0, 1), 8 * 2**20, "pp")))
    f1 = g.add(Op("fwd s1 mb0", 1, "compute", "forward", 1e-3, stage=1, microbatch=0, chunk=0))
    b1 = g.add(Op("bwd s1 mb0", 1, "compute", "backward", 2e-3, stage=1, microbatch=0, chunk=0))
    g.depend(ar, f0)
    g.depend(send, ar)
    g.depend(f1, send)
    g.depend(b1, f1)
    starts = (0.0, 1e-3, 1.25e-3, 1.5e-3, 2.5e-3)
    ends = (1e-3, 1.25e-3, 1.5e-3, 2.5e-3, 4.5e-3)
    return g, FakeTrace(starts, ends, 4.5e-3)


SAMPLE = {
    "name": "GPT-3 175B, TP8 PP8 DP16 on 128 DGX A100",
    "scenario": "scenarios/gpt3-175b.yaml",
    "step_time_s": 12.345,
    "tokens_per_s": 254_812.0,
    "model_tflops_per_gpu": 178.1234,
    "hardware_tflops_per_gpu": 236.9,
    "mfu": 0.5712,
    "hfu": 0.7593,
    "bubble_fraction": 0.0987,
    "memory_per_gpu_bytes": 63.5 * GiB,
    "fits_in_memory": True,
    "breakdown": {"compute_s": 8.0, "recompute_s": 2.0, "exposed_comm_s": {"tp": 0.5, "cp": 0.0, "pp": 0.25,
                                                                           "dp": 0.3},
                  "bubble_s": 1.2, "optimizer_s": 0.095},
    "memory": [
        {"stage": 0, "rank": 0, "params_bytes": 5 * GiB, "grads_bytes": 5 * GiB, "optimizer_bytes": 30 * GiB,
         "activations_bytes": 20 * GiB, "other_bytes": 3.5 * GiB, "total_bytes": 63.5 * GiB,
         "capacity_bytes": 80 * GiB, "fits": True},
        {"stage": 7, "rank": 7, "params_bytes": 6 * GiB, "grads_bytes": 6 * GiB, "optimizer_bytes": 36 * GiB,
         "activations_bytes": 4 * GiB, "other_bytes": 1 * GiB, "total_bytes": 53 * GiB,
         "capacity_bytes": 80 * GiB, "fits": True},
    ],
    "links": [
        {"link": "nic/node3/0->leaf1", "kind": "nic", "src": "node3/nic0", "dst": "leaf1", "bytes": 1.2345e12,
         "utilization": 0.4213},
        {"link": "nvlink/node0/gpu0", "kind": "nvlink", "src": "node0/gpu0", "dst": "node0/nvswitch0",
         "bytes": 2.0e12, "utilization": 0.6789},
    ],
    "layout": {"tp": 8, "pp": 8, "dp": 16, "cp": 1, "vpp": 1, "num_gpus": 1024, "num_microbatches": 96,
               "schedule": "1f1b", "representative_ranks": [0, 8, 16],
               "note": "showing representative ranks 0, 8, 16 (one per stage); other ranks behave alike"},
    "collectives": [
        {"axis": "tp", "op": "all_reduce", "nbytes": 100663296.0, "num_ranks": 8, "algorithm": "ring",
         "protocol": "simple", "time_s": 0.000412, "count": 1536},
    ],
}


# --- Chrome trace -----------------------------------------------------------------------------------------


def test_chrome_trace_events_sit_on_rank_and_stream_with_times_in_us():
    g, tr = tiny()
    doc = chrome_trace(g, tr)
    assert doc["displayTimeUnit"] == "ms"
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(g.ops)
    by_name = {e["name"]: e for e in xs}
    for i, op in enumerate(g.ops):
        e = by_name[op.name]
        assert e["pid"] == op.rank
        assert e["tid"] == STREAMS.index(op.stream)
        assert e["ts"] == pytest.approx(tr.start_s[i] * 1e6, rel=1e-12)
        assert e["dur"] == pytest.approx((tr.end_s[i] - tr.start_s[i]) * 1e6, rel=1e-12)
        assert e["args"]["kind"] == op.kind and e["args"]["microbatch"] == op.microbatch
        assert e["args"]["stage"] == op.stage and e["args"]["chunk"] == op.chunk
    assert {e["tid"] for e in xs} == {0, 1, 3}  # compute, tp, pp
    ar = by_name["tp ar s0 mb0"]["args"]
    assert ar["op"] == "all_reduce" and ar["axis"] == "tp" and ar["group_size"] == 4 and ar["nbytes"] == 64 * 2**20
    assert by_name["bwd s1 mb0"]["dur"] == pytest.approx(2000.0)
    assert "op" not in by_name["fwd s0 mb0"]["args"]


def test_chrome_trace_metadata_names_processes_and_threads():
    g, tr = tiny()
    meta = [e for e in chrome_trace(g, tr)["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert procs == {0: "rank 0 (stage 0)", 1: "rank 1 (stage 1)"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert threads == {(0, 0): "compute", (0, 1): "tp", (0, 3): "pp", (1, 0): "compute"}
    labelled = chrome_trace(g, tr, rank_labels={1: "rank 1 = ranks 1..15"})
    names = {e["pid"]: e["args"]["name"] for e in labelled["traceEvents"] if e["name"] == "process_name"}
    assert names[1] == "rank 1 = ranks 1..15" and names[0] == "rank 0 (stage 0)"


def test_chrome_trace_link_counters_and_strict_json(tmp_path):
    g, tr = tiny()
    counters = [{"name": "nic0", "points": [(0.0, 0.0), (1e-3, 0.75), (2e-3, 0.0)]}]
    doc = chrome_trace(g, tr, link_counters=counters)
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc
    names = [e for e in doc["traceEvents"] if e["name"] == "process_name"]
    (links_pid,) = [e["pid"] for e in names if e["args"]["name"] == "links"]
    assert links_pid not in {op.rank for op in g.ops}
    cs = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert [(e["pid"], e["name"], e["ts"], e["args"]["utilization"]) for e in cs] == [
        (links_pid, "nic0", 0.0, 0.0), (links_pid, "nic0", pytest.approx(1000.0), 0.75),
        (links_pid, "nic0", pytest.approx(2000.0), 0.0)]
    path = write_chrome_trace(tmp_path / "out" / "step.trace.json", g, tr, link_counters=counters)
    assert json.loads(path.read_text()) == json.loads(json.dumps(doc))


def test_chrome_trace_rejects_a_trace_of_another_graph_and_skips_unset_ops():
    g, tr = tiny()
    with pytest.raises(ValueError, match="graph has 5 ops"):
        chrome_trace(g, FakeTrace(tr.start_s[:3], tr.end_s[:3], tr.makespan_s))
    partial = FakeTrace((math.nan, *tr.start_s[1:]), tr.end_s, tr.makespan_s)
    names = [e["name"] for e in chrome_trace(g, partial)["traceEvents"] if e["ph"] == "X"]
    assert "fwd s0 mb0" not in names and len(names) == 4


# --- HTML ---------------------------------------------------------------------------------------------------


def _plain(page: str) -> str:
    """Undo the unicode escapes plotly writes into its JSON ("/", "<", ">")."""
    return page.replace("\\u002f", "/").replace("\\u003c", "<").replace("\\u003e", ">")


def test_timeline_has_one_bar_trace_per_kind_with_times_in_ms():
    g, tr = tiny()
    fig = timeline_figure(g, tr)
    groups = {t.meta["group"]: t for t in fig.data if t.meta["role"] == "timeline"}
    assert set(groups) == {"forward", "backward", "comm tp", "comm pp"}
    fwd = groups["forward"]
    assert fwd.orientation == "h"
    assert list(fwd.y) == ["rank 0 / compute", "rank 1 / compute"]
    assert np.allclose(fwd.base, [0.0, 1.5]) and np.allclose(fwd.x, [1.0, 1.0])
    assert np.allclose(groups["backward"].x, [2.0])
    assert list(fig.layout.yaxis.categoryarray) == ["rank 0 / compute", "rank 0 / tp", "rank 0 / pp",
                                                    "rank 1 / compute"]
    assert fig.layout.barmode == "overlay"  # stacked side-by-side bars would misplace ops in time
    assert op_group(g.ops[1]) == "comm tp" and op_group(g.ops[0]) == "forward"


def test_html_page_is_self_contained_with_all_sections():
    g, tr = tiny()
    page = _plain(step_report_html(g, tr, SAMPLE))
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("Plotly.newPlot") == 4  # timeline, breakdown, memory, links
    assert "<script src=" not in page  # plotly.js is inlined, not fetched
    assert "GPT-3 175B, TP8 PP8 DP16 on 128 DGX A100" in page
    assert "57.1 %" in page and "showing representative ranks 0, 8, 16" in page
    assert '"orientation":"h"' in page and '"barmode":"stack"' in page
    assert "exposed comm dp" in page and "rank 1 / compute" in page
    assert "nic/node3/0->leaf1 (nic)" in page and "<td>ring</td>" in page and "<td>96 MiB</td>" in page


def test_html_handles_a_20000_op_graph():
    g = OpGraph()
    starts, ends = [], []
    kinds = ("forward", "backward", "recompute")
    for i in range(20_000):
        rank, slot = i % 16, i // 16
        if i % 4 == 3:
            g.add(Op(f"dp {i}", rank, "dp", "comm", microbatch=slot, comm=Comm("all_reduce", (rank, rank + 16),
                                                                              1e6, "dp")))
        else:
            g.add(Op(f"op {i}", rank, "compute", kinds[i % 3], 1e-4, stage=rank // 4, microbatch=slot))
        starts.append(slot * 1e-4)
        ends.append(slot * 1e-4 + 9e-5)
    tr = FakeTrace(tuple(starts), tuple(ends), ends[-1])
    fig = timeline_figure(g, tr)
    assert sum(len(t.x) for t in fig.data if t.meta["role"] == "timeline") == 20_000
    assert len(fig.data) <= 5
    page = _plain(step_report_html(g, tr, SAMPLE))
    assert "rank 15 / dp" in page and "rank 0 / compute" in page


# --- terminal tables --------------------------------------------------------------------------------------------


def test_text_tables_show_human_figures():
    text = render_text(SAMPLE)
    assert len(step_tables(SAMPLE)) == 5
    assert "\x1b[" not in text  # plain text
    assert max(len(line) for line in text.splitlines()) <= 120
    for figure in ("12.35 s", "254,812 tokens/s", "178.1 TFLOP/s", "236.9 TFLOP/s", "57.1 %", "75.9 %", "9.9 %",
                   "63.50 GiB", "yes"):
        assert figure in text, figure
    # breakdown: 8 s of 12.345 s = 64.8 %; bubble 1.2 s = 9.7 %; optimizer 95 ms
    assert "64.8 %" in text and "1.2 s" in text and "9.7 %" in text and "95 ms" in text
    # memory per stage: 36 GiB optimizer, 80 GiB capacity
    assert "36.00 GiB" in text and "80.00 GiB" in text
    # links: 2e12 B over 12.345 s = 162 GB/s average, 67.9 % busy
    assert "162 GB/s" in text and "67.9 %" in text
    assert text.index("nvlink/node0/gpu0") < text.index("nic/node3/0->leaf1")  # busiest first
    assert "exposed comm cp      0 s" in text
    assert "showing representative ranks" in text and "412 us" in text


def test_text_tables_mark_a_layout_that_does_not_fit_and_missing_values():
    bad = {**SAMPLE, "fits_in_memory": False, "mfu": None}
    text = render_text(bad)
    assert "NO" in text and "n/a" in text
    assert format_percent(0.5712) == "57.1 %" and format_percent(float("nan")) == "n/a"


def test_busiest_links_rank_by_how_full_not_by_bytes(tmp_path) -> None:
    # Two DGX H100 hosts with one 100 Gb/s NIC each, TP 8 inside a host and DP 2 across: every NVLink port carries
    # the tensor-parallel traffic (more bytes than the NIC, at a small share of 900 GB/s), the NIC the gradient
    # all-reduce (fewer bytes, at a larger share of 12.5 GB/s). The table lists the fullest links: the NIC first.
    from simdist import api

    path = tmp_path / "links.yaml"
    path.write_text("name: links\n"
                    "cluster: {preset: dgx-h100, num_nodes: 2,\n"
                    "          inter_node: {nics_per_node: 1, nic_bandwidth: 100 Gb/s}}\n"
                    "model: {preset: llama3-8b, seq_length: 2048}\n"
                    "parallel: {tp: 8, dp: 2, sequence_parallel: true}\n"
                    "training: {micro_batch_size: 1, global_batch_size: 8}\n")
    result = api.run(path, fidelity="closed_form").result
    rows = result["links"]
    step_s = result["step_time_s"]
    assert [r["utilization"] for r in rows] == sorted((r["utilization"] for r in rows), reverse=True)
    top = rows[0]
    assert (top["kind"], top["src"], top["dst"]) == ("infiniband", "n0/nic0", "leaf0")
    assert top["utilization"] == pytest.approx(top["bytes"] / (100e9 / 8 * 0.96 * step_s), rel=1e-9)
    # every link the step's collectives use: an NVLink port carries more bytes than the NIC, which still ranks first
    from simdist.plan.step import collective_runs
    from simdist.predict.price import price_runs
    from simdist.predict.step import _links, checked_step

    scenario = api.load_scenario(path)
    _, cfg, _ = checked_step(scenario.spec, scenario.topology)
    runs = collective_runs(cfg)
    every = _links(runs, price_runs(runs, scenario.topology), scenario.topology, step_s, top=10**6)
    assert every[:len(rows)] == rows
    assert top["bytes"] < max(r["bytes"] for r in every if r["kind"] == "nvlink")
