"""Regenerate the nccl-tests sample files of this folder (run from the repository root).

    python tests/data/make_nccltests_samples.py

- all_reduce_perf_a100x8.txt: out-of-place time/algbw/busbw are the 20 rows of dataset
  mle_a100_node_nccltests in validation/reference/nccl_collectives_ml_engineering.csv (stas00/ml-engineering
  @ 744d01e1 network/README.md lines 1218-1241, 8x A100 NVSwitch, all_reduce_perf -b 32k -e 16G -f 2 -g 8
  -n 50). That source printed only those columns, so the in-place block (time x a fixed +-1.5 % wiggle,
  bandwidths recomputed), the header, the device lines and the footer are SYNTHETIC, laid out as the
  nccl-tests 2.13 era printed them (times %.2f / %.1f / %.0f by magnitude, no version line).
- all_reduce_perf_a100x8.json: the same rows in the nccl-tests -J format (src/util.cu, version 2).
- all_gather_perf_h200x8.txt: SYNTHETIC. An alpha-beta curve (14 us + size / B) whose 16 GiB busbw is the
  361.4 GB/s of dataset mle_h200_collectives_16GiB (same CSV), printed as nccl-tests 2.17 does (version
  and 'Collective test starting' lines, -c 0 so #wrong is N/A, redop none).
- all_reduce_perf_truncated.txt: the first rows of the A100 file and a row cut short (a killed job).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

HERE = Path(__file__).resolve().parent
REFERENCE = HERE.parents[1] / "validation" / "reference" / "nccl_collectives_ml_engineering.csv"
_PRE, _UNITS = ("size", "count", "type", "redop", "root"), ("(B)", "(elements)", "", "", "")
HEAD = ("# " + " " * 61 + "out-of-place" + " " * 23 + "in-place\n"
        "# " + "  ".join(f"{c:>{w}}" for c, w in zip(_PRE, (10, 12, 8, 6, 6), strict=True))
        + "     time   algbw   busbw #wrong" * 2 + "\n"
        "# " + "  ".join(f"{c:>{w}}" for c, w in zip(_UNITS, (10, 12, 8, 6, 6), strict=True))
        + "     (us)  (GB/s)  (GB/s)       " * 2 + "\n")


def _old_time(us: float) -> str:
    return f"{us:7.0f}" if us >= 10000 else f"{us:7.1f}" if us >= 100 else f"{us:7.2f}"


def _new_float(value: float, width: int) -> str:  # getFloatStr of nccl-tests 2.17 src/util.cu
    power, val = 0, 1
    while value >= val:
        power, val = power + 1, val * 10
    if power < width - 2:
        return f"{value:{width}.2f}"
    if power < width - 1:
        return f"{value:{width}.1f}"
    return f"{value:{width}.0f}"


def _devices(host: str, gpu: str, pid: int, buses: list[str]) -> str:
    return "".join(f"#  Rank {r:2d} Group  0 Pid {pid:6d} on {host:>10s} device {r:2d} [{b}] {gpu}\n"
                   for r, b in enumerate(buses))


def a100_rows() -> list[tuple[int, float, float, float, float, float, float]]:
    with REFERENCE.open(newline="") as fh:
        ref = [r for r in csv.DictReader(fh) if r["dataset"] == "mle_a100_node_nccltests"]
    rows = []
    for i, r in enumerate(ref):
        size, t = int(r["size_bytes"]), float(r["time_us"])
        t_ip = float(_old_time(t * (1 + 0.015 * math.sin(1.7 * i + 0.5))))
        alg_ip = size / t_ip / 1e3
        rows.append((size, t, float(r["algbw_GBps"]), float(r["busbw_GBps"]), t_ip, alg_ip, alg_ip * 2 * 7 / 8))
    return rows


def write_a100_text(rows) -> str:
    out = ["# Sample for simdist tests. Out-of-place columns: dataset mle_a100_node_nccltests of\n",
           "# validation/reference/nccl_collectives_ml_engineering.csv (stas00/ml-engineering @ 744d01e1\n",
           "# network/README.md lines 1218-1241). In-place columns, device lines and footer: SYNTHETIC.\n",
           "# $ ./build/all_reduce_perf -b 32k -e 16G -f 2 -g 8 -n 50\n",
           "# nThread 1 nGpus 8 minBytes 32768 maxBytes 17179869184 step: 2(factor) warmup iters: 5 iters: 50 "
           "agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n",
           _devices("a100-node01", "NVIDIA A100-SXM4-80GB", 41729,
                    ["0x07", "0x0f", "0x47", "0x4e", "0x87", "0x90", "0xb7", "0xbd"]), "#\n", HEAD]
    for size, t, alg, bus, t_ip, alg_ip, bus_ip in rows:
        out.append(f"{size:12d}  {size // 4:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}"
                   f"  {_old_time(t)}  {alg:6.2f}  {bus:6.2f}  {0:6d}  {_old_time(t_ip)}  {alg_ip:6.2f}  {bus_ip:6.2f}"
                   f"  {0:6d}\n")
    avg = sum(r[3] for r in rows) / len(rows)
    out.append(f"# Out of bounds values : 0 OK\n# Avg bus bandwidth    : {avg:g} \n#\n")
    return "".join(out)


def write_a100_json(rows) -> str:
    results = []
    for size, t, alg, bus, t_ip, alg_ip, bus_ip in rows:
        alg_ip, bus_ip = round(alg_ip, 2), round(bus_ip, 2)  # the text file's precision, so both parse alike
        results.append(
            f'{{"size":{size},"count":{size // 4},"type":"float","redop":"sum","root":"    -1",'
            f'"out_of_place":{{"time":{t:f},"alg_bw":{alg:f},"bus_bw":{bus:f},"nwrong":0.000000}},'
            f'"in_place":{{"time":{t_ip:f},"alg_bw":{alg_ip:f},"bus_bw":{bus_ip:f},"nwrong":0.000000}},'
            f'"actual_iterations":50,"experiment_name":""}}')
    args = ["./build/all_reduce_perf", "-b", "32k", "-e", "16G", "-f", "2", "-g", "8", "-n", "50", "-J", "out.json"]
    device = ('{"rank":0,"group":0,"pid":41729,"hostname":"a100-node01","device":0,"device_hex":"0x07",'
              '"device_info":"NVIDIA A100-SXM4-80GB"}')
    return ('{"version":2,"start_time":"2024-03-01 10:00:00","args":[' + ",".join(f'"{a}"' for a in args) + "],"
            '"env":["NCCL_DEBUG=WARN","CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"],"nccl_version":21803,'
            '"config":{"nthreads":1,"ngpus":8,"minimum_bytes":32768,"maximum_bytes":17179869184,"step_factor":2,'
            '"warmup_iters":5,"iterations":50,"aggregated_iterations":1,"validation":1,"graph":0,'
            '"blocking_collectives":"false","per_iter_timing":"false","parallel_init":"false",'
            f'"devices":[{device}]}},"results":[' + ",".join(results) + "],"
            '"out_of_bounds":{"count":0,"okay":"true"},"average_bus_bandwidth":{"bandwidth":105.1,'
            '"okay":"unchecked"},"errors":[],"end_time":"2024-03-01 10:01:30"}\n')


def write_h200_all_gather() -> str:
    n, alpha_us, peak_bus = 8, 14.0, 361.4e9
    size_max = 2**34
    t_max = size_max / (peak_bus * n / (n - 1))  # seconds at 16 GiB
    beta = size_max / (t_max - alpha_us * 1e-6)  # algbw asymptote, bytes/s
    out = ["# SYNTHETIC sample for simdist tests: alpha-beta all_gather (14 us + size / B), busbw at 16 GiB =\n",
           "# 361.4 GB/s as dataset mle_h200_collectives_16GiB of\n",
           "# validation/reference/nccl_collectives_ml_engineering.csv\n",
           "# nccl-tests version 2.17.6 nccl-headers=22703 nccl-library=22703\n",
           "# Collective test starting: all_gather_perf\n",
           "# nThread 1 nGpus 8 minBytes 1024 maxBytes 17179869184 step: 2(factor) warmup iters: 5 iters: 20 "
           "agg iters: 1 validation: 0 graph: 0 unalign: 0\n#\n# Using devices\n",
           _devices("h200-node07", "NVIDIA H200", 20311, [f"0000:{b}:00" for b in
                                                           ("1b", "3c", "4b", "5c", "9a", "bb", "cd", "dc")]),
           "NCCL version 2.27.3+cuda12.9\n#\n", HEAD]
    total = 0.0
    for i, exp in enumerate(range(10, 35)):
        size = 2**exp
        cells = []
        for wiggle in (1 + 0.02 * math.sin(2.3 * i), 1 + 0.02 * math.cos(1.1 * i)):
            t_us = (alpha_us + size / beta * 1e6) * wiggle
            t_txt = _new_float(t_us, 7)
            alg = size / float(t_txt) / 1e3
            cells.append(f"  {t_txt}  {_new_float(alg, 6)}  {_new_float(alg * (n - 1) / n, 6)}     N/A")
        total += size / float(cells[0].split()[0]) / 1e3 * (n - 1) / n
        out.append(f"{size:12d}  {size // 4 // n:12d}  {'float':>8s}  {'none':>6s}  {-1:6d}" + "".join(cells) + "\n")
    out.append(f"# Out of bounds values : 0 OK\n# Avg bus bandwidth    : {total / 25:g} \n#\n"
               "# Collective test concluded: all_gather_perf\n#\n")
    return "".join(out)


def main() -> None:
    rows = a100_rows()
    text = write_a100_text(rows)
    (HERE / "all_reduce_perf_a100x8.txt").write_text(text)
    (HERE / "all_reduce_perf_a100x8.json").write_text(write_a100_json(rows))
    (HERE / "all_gather_perf_h200x8.txt").write_text(write_h200_all_gather())
    lines = text.splitlines(keepends=True)
    first_row = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    truncated = "".join(lines[: first_row + 6]) + lines[first_row + 6][:78].rstrip() + "\n"
    (HERE / "all_reduce_perf_truncated.txt").write_text(truncated)


if __name__ == "__main__":
    main()
