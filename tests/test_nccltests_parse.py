"""Measured collective times: nccl-tests text and -J JSON parsing, our CSV, and one-line errors.

Sample files (tests/data, provenance in tests/data/make_nccltests_samples.py): the A100 all_reduce file's
out-of-place columns are the mle_a100_node_nccltests rows of the reference CSV; the rest is synthetic.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from simdist.calibrate import Measurement, parse_nccltests_text, read_measurements, write_measurements_csv
from simdist.calibrate.nccltests import op_from_binary, op_from_row
from simdist.errors import SimdistError

DATA = Path(__file__).resolve().parent / "data"
AR_TEXT, AR_JSON = DATA / "all_reduce_perf_a100x8.txt", DATA / "all_reduce_perf_a100x8.json"
AG_TEXT, TRUNCATED = DATA / "all_gather_perf_h200x8.txt", DATA / "all_reduce_perf_truncated.txt"
HEADER = "#       size         count      type   redop    root" + "     time   algbw   busbw #wrong" * 2
ROW_8B = ("           8             2     float     sum      -1"
          "    10.50    0.00    0.00       0    10.20    0.00    0.00       0")


def _error(call, *args, **kwargs) -> str:
    with pytest.raises(SimdistError) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_all_reduce_text_sample_rows():
    rows = read_measurements(AR_TEXT)
    oop = [m for m in rows if not m.in_place]
    ip = [m for m in rows if m.in_place]
    assert len(rows) == 40 and len(oop) == 20 and len(ip) == 20
    kinds = {(m.op, m.num_ranks, m.num_nodes, m.dtype, m.algorithm) for m in rows}
    assert kinds == {("all_reduce", 8, 1, "float", None)}
    assert [m.nbytes for m in oop] == [2**e for e in range(15, 35)] == [m.nbytes for m in ip]
    # Out-of-place rows are the reference rows (us -> s, GB/s -> B/s)
    for m, (nbytes, us, alg, bus) in zip(
        (oop[0], oop[5], oop[12], oop[-1]),
        ((32768, 43.83, 0.75, 1.31), (1048576, 101.9, 10.29, 18.00), (134217728, 1327.6, 101.10, 176.92),
         (17179869184, 127997, 134.22, 234.89)),
        strict=True,
    ):
        assert (m.nbytes, m.source) == (nbytes, str(AR_TEXT))
        assert m.time_s == pytest.approx(us * 1e-6, rel=1e-12)
        assert m.algbw_Bps == pytest.approx(alg * 1e9, rel=1e-12)
        assert m.busbw_Bps == pytest.approx(bus * 1e9, rel=1e-12)
    assert ip[0].time_s == pytest.approx(44.15e-6, rel=1e-12) and ip[0].busbw_Bps == pytest.approx(1.30e9)
    assert ip[-1].time_s == pytest.approx(129884e-6, rel=1e-12)
    # nccl-tests doc/PERFORMANCE.md: algbw = size / time, all_reduce busbw = algbw x 2(n-1)/n
    for m in oop[8:]:
        assert m.algbw_Bps == pytest.approx(m.nbytes / m.time_s, rel=2e-3)
        assert m.busbw_Bps == pytest.approx(m.algbw_Bps * 2 * 7 / 8, rel=2e-3)


def test_all_gather_sample_newer_format():
    rows = read_measurements(AG_TEXT)
    assert len(rows) == 50
    assert {(m.op, m.num_ranks, m.nccl_version) for m in rows} == {("all_gather", 8, "2.27.3")}
    first = rows[0]
    assert (first.nbytes, first.in_place, first.time_s) == (1024, False, pytest.approx(14.00e-6))
    last_oop = [m for m in rows if not m.in_place][-1]
    assert last_oop.nbytes == 2**34 and last_oop.busbw_Bps == pytest.approx(368.59e9)
    for m in rows[20:]:  # all_gather busbw = algbw x (n-1)/n
        assert m.busbw_Bps == pytest.approx(m.algbw_Bps * 7 / 8, rel=2e-3)


def test_json_sample_parses_to_the_same_measurements():
    text_rows, json_rows = read_measurements(AR_TEXT), read_measurements(AR_JSON)
    assert json_rows[0].nccl_version == "2.18.3" and json_rows[0].source == str(AR_JSON)

    def strip(m: Measurement) -> Measurement:
        return dataclasses.replace(m, source="", nccl_version=None)

    assert [strip(m) for m in json_rows] == [strip(m) for m in text_rows]


def test_csv_round_trip(tmp_path):
    rows = read_measurements(AR_TEXT)[:6] + read_measurements(AG_TEXT)[-3:]
    rows[0] = dataclasses.replace(rows[0], label="node 1, run 2", algorithm="ring", num_nodes=None)
    path = tmp_path / "ours.csv"
    write_measurements_csv(rows, path)
    assert path.read_text().splitlines()[0].startswith("op,nbytes,num_ranks,time_s,")
    assert read_measurements(path) == rows


def test_minimal_csv_computes_bandwidths(tmp_path):
    path = tmp_path / "few.csv"
    path.write_text("# measured by hand\nop,nbytes,num_ranks,time_s,note\nall_reduce,1048576,8,1e-4,x\n"
                    "all_gather,1048576,4,2e-4,y\n")
    ar, ag = read_measurements(path)
    assert ar.algbw_Bps == pytest.approx(1048576 / 1e-4) and ar.busbw_Bps == pytest.approx(1048576 / 1e-4 * 1.75)
    assert ag.busbw_Bps == pytest.approx(1048576 / 2e-4 * 0.75)
    assert (ar.source, ar.in_place, ar.dtype) == (str(path), False, None)


def test_truncated_row_names_file_and_line():
    last_line = len(TRUNCATED.read_text().splitlines())
    message = _error(read_measurements, TRUNCATED)
    assert f"{TRUNCATED}:{last_line}:" in message and "truncated" in message


@pytest.mark.parametrize(
    ("content", "line", "words"),
    [
        ("op,nbytes,num_ranks\nall_reduce,8,8\n", 1, "time_s"),
        ("op,nbytes,num_ranks,time_s\nall_reduce,8,8,1e-5\nall_reduce,8MB,8,1e-5\n", 3, "nbytes"),
        ("op,nbytes,num_ranks,time_s\nallreduce,8,8,1e-5\n", 2, "unknown collective"),
        ("op,nbytes,num_ranks,time_s\nall_reduce,8,8,0\n", 2, "time_s"),
        ("op,nbytes,num_ranks,time_s\nall_reduce,8,8\n", 2, "fields"),
    ],
)
def test_csv_errors_name_file_and_line(tmp_path, content, line, words):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    message = _error(read_measurements, path)
    assert f"{path}:{line}:" in message and words in message and "fix:" in message


def test_missing_and_unknown_files(tmp_path):
    assert "no such measurement file" in _error(read_measurements, tmp_path / "nope.txt")
    odd = tmp_path / "notes.txt"
    odd.write_text("hello\nworld\n")
    message = _error(read_measurements, odd)
    assert str(odd) in message and "unknown measurement format" in message


def test_json_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(AR_JSON.read_text().replace('"time":101.900000', '"time":"oops"', 1))
    message = _error(read_measurements, bad)
    assert str(bad) in message and "results[5].out_of_place.time" in message
    bad.write_text('{"version": 2, "results": [')
    assert f"{bad}:1:" in _error(read_measurements, bad)
    bad.write_text('{"version": 2}')
    assert "no 'results' list" in _error(read_measurements, bad)


def test_older_format_mpirun_prefix_timestamps_and_two_nodes():
    text = "\n".join([
        "[1,0]<stdout>:# nThread 1 nGpus 1 minBytes 64 maxBytes 128 step: 2(factor) warmup iters: 5 iters: 20",
        "[1,0]<stdout>:# Using devices",
        *(f"[1,0]<stdout>:#  Rank {r:2d} Group  0 Pid  1{r:03d} on node-{r // 8} device {r % 8:2d} [0x1b] NVIDIA H100"
          for r in range(16)),
        "[1,0]<stdout>:node-0:1000:1000 [0] NCCL INFO NCCL_ALGO set by environment to Ring",
        "#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error",
        "[1,0]<stdout>:          64            16   float     sum    13.42    0.00    0.01  3e-08    13.45    0.00"
        "    0.01  3e-08  2024-01-01 10:00:00",
        "[1,0]<stdout>:node-0:1000:1000 [0] NCCL INFO comm 0x55 rank 0 nranks 16 - Init COMPLETE",
        "         128            32   float     sum    13.81    0.01    0.01  3e-08    13.21    0.01    0.01  3e-08",
        "# Avg bus bandwidth    : 0.01",
    ])
    rows = parse_nccltests_text(text, "broadcast_perf_2nodes.log")
    assert [(m.op, m.nbytes, m.in_place) for m in rows] == [
        ("broadcast", 64, False), ("broadcast", 64, True), ("broadcast", 128, False), ("broadcast", 128, True)]
    assert {(m.num_ranks, m.num_nodes, m.algorithm, m.dtype) for m in rows} == {(16, 2, "ring", "float")}
    assert rows[3].time_s == pytest.approx(13.21e-6)


def test_two_tests_in_one_file_and_in_place_only_rows():
    def test(binary: str, row: str) -> list[str]:
        return [f"# Collective test starting: {binary}", "# nThread 1 nGpus 4 minBytes 8 maxBytes 8", HEADER, row,
                f"# Collective test concluded: {binary}"]

    ar_row = ROW_8B
    rs_row = "          32             2     float     sum      -1" + " " * 32 + "    11.00    0.00    0.00     N/A"
    rows = parse_nccltests_text("\n".join(test("all_reduce_perf", ar_row) + test("reduce_scatter_perf", rs_row)), "x")
    assert [(m.op, m.nbytes, m.in_place, m.num_ranks) for m in rows] == [
        ("all_reduce", 8, False, 4), ("all_reduce", 8, True, 4), ("reduce_scatter", 32, True, 4)]
    assert rows[2].time_s == pytest.approx(11e-6)
    only = parse_nccltests_text("\n".join(test("all_reduce_perf", ar_row)), "x", op="all_gather", num_ranks=2,
                                in_place=False)
    assert [(m.op, m.num_ranks, m.in_place) for m in only] == [("all_gather", 2, False)]


def test_text_without_op_or_ranks_is_an_error():
    row = ROW_8B
    message = _error(parse_nccltests_text, "\n".join(["# nThread 1 nGpus 4", HEADER, row]), "results.txt")
    assert "results.txt:3:" in message and "which collective" in message
    message = _error(parse_nccltests_text, "\n".join(["# Collective test starting: all_reduce_perf", HEADER, row]), "r")
    assert "r:3:" in message and "number of ranks" in message


@pytest.mark.parametrize(
    ("name", "op"),
    [("./build/all_reduce_perf", "all_reduce"), ("alltoall_perf_mpi", "all_to_all"), ("sendrecv_perf", "send_recv"),
     ("AllReduce", "all_reduce"), ("reduce_scatter_perf", "reduce_scatter"), ("hypercube_perf", None)],
)
def test_op_from_binary(name, op):
    assert op_from_binary(name) == op


# --------------------------------------------------------------------------- recognised by content (issue 17)
def _without(text: str, word: str) -> str:
    return "\n".join(line for line in text.splitlines() if word not in line) + "\n"


def test_a_log_under_any_name_is_read_by_its_content(tmp_path):
    # The A100 sample with every mention of its binary removed (old nccl-tests print none), saved as node17.log.
    log = tmp_path / "node17.log"
    log.write_text(_without(AR_TEXT.read_text(), "all_reduce_perf"))
    assert "all_reduce" not in log.read_text()
    rows = read_measurements(log)
    assert len(rows) == 40 and {(m.op, m.num_ranks, m.device) for m in rows} == {
        ("all_reduce", 8, "NVIDIA A100-SXM4-80GB")}
    assert [m.time_s for m in rows] == [m.time_s for m in read_measurements(AR_TEXT)]
    # the -J file, its args gone, under a name that is neither .json nor a binary's
    data = json.loads(AR_JSON.read_text())
    data["args"] = []
    blob = tmp_path / "results.out"
    blob.write_text(json.dumps(data))
    rows = read_measurements(blob)
    assert len(rows) == 40 and {(m.op, m.device) for m in rows} == {("all_reduce", "NVIDIA A100-SXM4-80GB")}


@pytest.mark.parametrize(("size", "count", "dtype", "redop", "root", "ranks", "alg", "bus", "ops"), [
    # nccl-tests src/*.cu: count x element size = size for the whole-buffer tests, = size / ranks otherwise
    (1048576, 262144, "float", "sum", "-1", 8, 10.29, 18.00, ("all_reduce",)),  # busbw / algbw = 2 x 7/8
    (1048576, 262144, "float", "sum", "-1", 8, 10.00, 10.00, ("send_recv",)),  # busbw / algbw = 1
    (1048576, 262144, "float", "sum", "-1", 2, 10.00, 10.00, ("all_reduce", "send_recv")),  # 2 ranks: both 1
    (1048576, 262144, "float", "none", "0", 8, 10.0, 10.0, ("broadcast",)),
    (1048576, 262144, "float", "sum", "0", 8, 10.0, 10.0, ("reduce",)),
    (1048576, 32768, "float", "none", "-1", 8, 10.0, 8.75, ("all_gather", "all_to_all")),
    (1048576, 32768, "float", "sum", "-1", 8, 10.0, 8.75, ("reduce_scatter",)),
    (1048576, 32768, "float", "none", "0", 8, 10.0, 8.75, ("scatter", "gather")),
    (1048576, 131072, "bfloat16", "sum", "-1", 4, 10.0, 15.0, ("reduce_scatter",)),  # 2-byte elements, 4 ranks
    (1048576, 1000, "float", "sum", "-1", 8, 10.0, 10.0, ()),  # neither rule: cannot tell
    (1048576, 262144, "float", "sum", "-1", 1, 10.0, 10.0, ()),  # one rank: whole = share
])
def test_the_op_of_a_row(size, count, dtype, redop, root, ranks, alg, bus, ops):
    assert op_from_row(size, count, dtype, redop, root, ranks, alg, bus) == ops


def test_rows_that_print_alike_need_the_test_line(tmp_path):
    text = _without(AG_TEXT.read_text(), "all_gather_perf")  # all_gather rows read as all_to_all rows do
    log = tmp_path / "node03.log"
    log.write_text(text)
    message = _error(read_measurements, log)
    assert "all_gather or all_to_all" in message and "Collective test starting: all_gather_perf" in message
    named = tmp_path / "all_gather_perf_node03.log"  # the name may break a tie the content leaves ...
    named.write_text(text)
    assert {m.op for m in read_measurements(named)} == {"all_gather"}
    wrong = tmp_path / "broadcast_perf.log"  # ... but never overrules it
    wrong.write_text(text)
    assert "all_gather or all_to_all" in _error(read_measurements, wrong)


def test_devices_are_read_from_the_rank_lines():
    assert {m.device for m in read_measurements(AG_TEXT)} == {"NVIDIA H200"}
    assert {m.device for m in read_measurements(AR_JSON)} == {"NVIDIA A100-SXM4-80GB"}
