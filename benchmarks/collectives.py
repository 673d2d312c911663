"""Benchmark of collective simulation across scales: ring all_reduce and all_to_all on dgx-h100.

Run from the repository root with the project's virtualenv active:

    python benchmarks/collectives.py [--repeat N] [--max-ranks N] [--detailed-max N] [--api-max-ranks N]
                                     [--protocol P] [--json]

Points: ring all_reduce of 1 GiB at 8, 16, ..., 16384 ranks and all_to_all of 1 GiB at 8 .. 1024 ranks,
dgx-h100 with num_nodes = ranks / 8; fast fidelity at every size, detailed up to --detailed-max ranks
(64 by default, where ``--fidelity auto`` switches; all_to_all detailed up to 4 x that). Times are
medians of --repeat runs (the machine this was written for has 2 cores and is noisy: compare ratios).

Figures per point:
- flows: transfers in the plan.
- plan ms / sim ms / engine ms: wall time of building the plan (``build`` or ``build_fast`` of the
  registered algorithm, on a request priced with --protocol, LL128 by default: what auto picks for
  1 GiB at these sizes) and of ``simulate`` on it (the fluid solver for dependency-free plans, the
  SimPy engine otherwise); engine = plan + sim. The topology is built beforehand (not timed).
- engine MiB: tracemalloc peak of plan + simulate, measured in a fresh subprocess per point (after
  its imports and a small warm-up run, so one-time lazy imports are not counted).
- api s: wall time of ``simdist.api.collective(..., algorithm=ring|direct, fidelity=...)`` with
  protocol auto, the CLI's work minus start-up: it also prices every protocol with the closed forms
  (simdist.analytic), so above --api-max-ranks (1024 for the ring, 128 for all_to_all by default) it
  is skipped ('-'). api MiB: its tracemalloc peak, in a fresh subprocess.
- sim us: the simulated completion time.

The summary gives time(16384) / time(1024) of the fast ring (16x the ranks): ~16 means linear.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time

RING_RANKS = [8 << k for k in range(12)]  # 8 .. 16384
A2A_RANKS = [8 << k for k in range(8)]  # 8 .. 1024
NBYTES = 2**30
API_LIMITS = {"all_reduce": 1024, "all_to_all": 128}

# One point in a fresh interpreter: `python -c CHILD op ranks fidelity protocol what` -> JSON on stdout.
CHILD = """
import json, sys, tracemalloc
sys.path.insert(0, "benchmarks")
from collectives import engine_run, api_run
op, ranks, fidelity, protocol, what = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
run = engine_run if what == "engine" else api_run
run(op, 16, fidelity, protocol)  # warm-up: lazy imports, caches of small objects
tracemalloc.start()
run(op, ranks, fidelity, protocol)
print(json.dumps({"peak_mib": tracemalloc.get_traced_memory()[1] / 2**20}))
"""


def algorithm_of(op: str) -> str:
    return "ring" if op == "all_reduce" else "direct"


def engine_run(op: str, ranks: int, fidelity: str, protocol: str) -> dict:
    """Build and simulate one plan; wall times of both phases."""
    from simdist.analytic.select import priced_request
    from simdist.collectives.group import Group
    from simdist.collectives.nccl_model import protocol_cost
    from simdist.collectives.registry import algorithm_for
    from simdist.collectives.request import Request
    from simdist.engine.simulate import simulate
    from simdist.hardware import load_topology

    topology = load_topology("dgx-h100", num_nodes=max(1, ranks // 8))
    group = Group.first(topology, ranks)
    request = Request(op, group, NBYTES)
    priced = protocol_cost(algorithm_of(op), protocol, group)
    request = priced_request(request, priced)
    algo = algorithm_for(algorithm_of(op), request)
    build = algo.build_fast if fidelity == "fast" and algo.build_fast is not None else algo.build
    start = time.perf_counter()
    plan = build(request)
    built = time.perf_counter()
    cost = priced.cost
    plan = dataclasses.replace(plan, base_latency_s=cost.base_latency_s, rate_factor=cost.rate_factor,
                               protocol=cost.name)
    (run,) = simulate([(plan, request.group)])
    done = time.perf_counter()
    return {"flows": plan.num_transfers, "plan_s": built - start, "sim_s": done - built, "time_s": run.time_s}


def api_run(op: str, ranks: int, fidelity: str, protocol: str) -> dict:
    """`simdist.api.collective` as the CLI calls it (protocol auto)."""
    from simdist import api

    start = time.perf_counter()
    (row,) = api.collective("dgx-h100", op, ranks, [NBYTES], algorithm=algorithm_of(op), fidelity=fidelity,
                            num_nodes=max(1, ranks // 8))
    return {"api_s": time.perf_counter() - start, "api_time_s": row.time_s, "api_protocol": row.protocol}


def child(op: str, ranks: int, fidelity: str, protocol: str, what: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, op, str(ranks), fidelity, protocol, what],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["peak_mib"]


def bench_point(op: str, ranks: int, fidelity: str, args: argparse.Namespace) -> dict:
    runs = [engine_run(op, ranks, fidelity, args.protocol) for _ in range(args.repeat)]
    row = {"op": op, "ranks": ranks, "nodes": max(1, ranks // 8), "fidelity": fidelity,
           "flows": runs[0]["flows"], "time_s": runs[0]["time_s"],
           "plan_s": statistics.median(r["plan_s"] for r in runs),
           "sim_s": statistics.median(r["sim_s"] for r in runs),
           "engine_s": statistics.median(r["plan_s"] + r["sim_s"] for r in runs),
           "engine_peak_mib": child(op, ranks, fidelity, args.protocol, "engine"),
           "api_s": None, "api_peak_mib": None}
    limit = args.api_max_ranks if args.api_max_ranks is not None else API_LIMITS[op]
    if ranks <= limit:
        api = [api_run(op, ranks, fidelity, args.protocol) for _ in range(args.repeat)]
        row["api_s"] = statistics.median(r["api_s"] for r in api)
        row["api_protocol"] = api[0]["api_protocol"]
        row["api_peak_mib"] = child(op, ranks, fidelity, args.protocol, "api")
    return row


COLUMNS = [  # header, key, format
    ("op", "op", "{}"), ("ranks", "ranks", "{}"), ("fidelity", "fidelity", "{}"), ("flows", "flows", "{}"),
    ("plan ms", "plan_s", "m{:.1f}"), ("sim ms", "sim_s", "m{:.1f}"), ("engine ms", "engine_s", "m{:.1f}"),
    ("engine MiB", "engine_peak_mib", "{:.1f}"), ("api s", "api_s", "{:.2f}"), ("api MiB", "api_peak_mib", "{:.1f}"),
    ("sim us", "time_s", "u{:.1f}"),
]


def cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    if fmt[0] in "mu":
        return fmt[1:].format(value * (1e3 if fmt[0] == "m" else 1e6))
    return fmt.format(value)


def render(doc: dict) -> str:
    table = [[h for h, _, _ in COLUMNS]] + [[cell(r, k, f) for _, k, f in COLUMNS] for r in doc["rows"]]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    pad = [str.ljust] * 3 + [str.rjust] * (len(COLUMNS) - 3)
    lines = ["  ".join(p(c, w) for p, c, w in zip(pad, row, widths, strict=True)) for row in table]
    m = doc["meta"]
    lines.append(f"\n1 GiB, dgx-h100, num_nodes = ranks / 8; engine = plan + simulate with protocol {m['protocol']}; "
                 f"medians of {m['repeat']} runs; MiB = tracemalloc peak in a fresh subprocess; api s = "
                 f"simdist.api.collective (protocol auto, closed forms included), '-' = skipped")
    for key, text in doc["ratios"].items():
        lines.append(f"{key}: x{text:.2f}  (16x the ranks; 16 = linear)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per timed figure (median reported)")
    parser.add_argument("--max-ranks", type=int, default=None, help="skip sizes above this many ranks")
    parser.add_argument("--detailed-max", type=int, default=64, help="largest ring size run at detailed fidelity")
    parser.add_argument("--api-max-ranks", type=int, default=None,
                        help="largest size timed through simdist.api.collective (default 1024 ring, 128 all_to_all)")
    parser.add_argument("--protocol", default="LL128", help="protocol pricing the engine runs (LL, LL128, Simple)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    args = parser.parse_args()
    fits = lambda r: args.max_ranks is None or r <= args.max_ranks  # noqa: E731
    points = [("all_reduce", r, f) for r in RING_RANKS if fits(r)
              for f in (("detailed", "fast") if r <= args.detailed_max else ("fast",))]
    points += [("all_to_all", r, f) for r in A2A_RANKS if fits(r)
               for f in (("detailed", "fast") if r <= 4 * args.detailed_max else ("fast",))]
    rows = []
    for op, ranks, fidelity in points:
        rows.append(bench_point(op, ranks, fidelity, args))
        print(f"  {op} {ranks} {fidelity}: engine {rows[-1]['engine_s']:.3f} s", file=sys.stderr, flush=True)
    by = {(r["op"], r["ranks"], r["fidelity"]): r for r in rows}
    ratios = {}
    a, b = by.get(("all_reduce", 1024, "fast")), by.get(("all_reduce", 16384, "fast"))
    if a and b:
        ratios["fast ring engine time 16384 / 1024 ranks"] = b["engine_s"] / a["engine_s"]
        ratios["fast ring simulate time 16384 / 1024 ranks"] = b["sim_s"] / a["sim_s"]
        ratios["fast ring engine memory 16384 / 1024 ranks"] = b["engine_peak_mib"] / a["engine_peak_mib"]
    meta = {"python": sys.version.split()[0], "repeat": args.repeat, "protocol": args.protocol, "bytes": NBYTES}
    doc = {"meta": meta, "rows": rows, "ratios": ratios}
    print(json.dumps(doc, indent=2) if args.json else render(doc))


if __name__ == "__main__":
    main()
