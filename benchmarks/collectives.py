"""Benchmark of collective simulation: the whole-process targets, fast-plan agreement, and scaling.

Run from the repository root with the project's virtualenv active:

    python benchmarks/collectives.py [--repeat N] [--max-ranks N] [--detailed-max N] [--api-max-ranks N]
                                     [--protocol P] [--no-targets] [--no-agreement] [--no-scaling] [--json]

Targets (issue 13, whole process: `simdist collective ...` in a fresh interpreter under /usr/bin/time):
wall seconds, CPU seconds (user + sys) and peak resident memory, medians of --repeat runs, for
- auto all_reduce over 1,440 ranks of 20 gb200-nvl72 racks, six sizes 512M..16G (target <= 10 s);
- auto all_reduce and --algorithm tree over 16,384 ranks of 2,048 dgx-h100 (target <= 5 s);
- all_to_all of 1M over 4,096 ranks of 512 dgx-h100 (target <= 5 s and < 1 GB).
The machine this was written on has 2 cores shared with other jobs: CPU seconds are the steadier
figure; wall seconds include waiting for a core.

Agreement: per algorithm and op, a group's fast plan alone in the engine / the closed form, and the
detailed plan's / the closed form where it runs (1.000000 = equal; both must be >= 1 and equal where the
detailed run is uncontended).

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
import shutil
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


TARGETS = [  # name, CLI arguments, target wall seconds, target peak MB (None: none)
    ("auto all_reduce, 1440 ranks (20 gb200-nvl72), 512M..16G",
     ["--cluster", "gb200-nvl72", "--num-nodes", "20", "--op", "all_reduce", "--ranks", "1440",
      "--bytes", "512M,1G,2G,4G,8G,16G"], 10.0, None),
    ("auto all_reduce, 16384 ranks (2048 dgx-h100), 1G",
     ["--cluster", "dgx-h100", "--num-nodes", "2048", "--op", "all_reduce", "--ranks", "16384", "--bytes", "1G"],
     5.0, None),
    ("tree all_reduce, 16384 ranks (2048 dgx-h100), 1G",
     ["--cluster", "dgx-h100", "--num-nodes", "2048", "--op", "all_reduce", "--ranks", "16384", "--bytes", "1G",
      "--algorithm", "tree"], 5.0, None),
    ("all_to_all, 4096 ranks (512 dgx-h100), 1M",
     ["--cluster", "dgx-h100", "--num-nodes", "512", "--op", "all_to_all", "--ranks", "4096", "--bytes", "1M"],
     5.0, 1000.0),
]


def run_target(args: list[str]) -> dict:
    """One whole-process run of ``simdist collective ARGS --json``: wall, CPU seconds, peak MB, rows."""
    cmd = [sys.executable, "-m", "simdist", "collective", *args, "--json"]
    timer = shutil.which("time") if sys.platform.startswith("linux") else None
    timer = "/usr/bin/time" if timer is None and shutil.which("/usr/bin/time") else timer
    start = time.perf_counter()
    if timer:
        out = subprocess.run([timer, "-f", "%U %S %M", *cmd], capture_output=True, text=True, check=True)
        user, system, kb = out.stderr.strip().splitlines()[-1].split()
        cpu, peak_mb = float(user) + float(system), float(kb) / 1e3
    else:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        cpu, peak_mb = float("nan"), float("nan")
    wall = time.perf_counter() - start
    doc = json.loads(out.stdout)
    rows = doc["rows"] if isinstance(doc, dict) and "rows" in doc else doc
    return {"wall_s": wall, "cpu_s": cpu, "peak_mb": peak_mb, "rows": rows}


def bench_targets(repeat: int) -> list[dict]:
    out = []
    for name, args, target_s, target_mb in TARGETS:
        runs = [run_target(args) for _ in range(repeat)]
        row = {"name": name, "command": "simdist collective " + " ".join(args),
               "wall_s": statistics.median(r["wall_s"] for r in runs),
               "cpu_s": statistics.median(r["cpu_s"] for r in runs),
               "peak_mb": statistics.median(r["peak_mb"] for r in runs), "target_s": target_s,
               "target_mb": target_mb,
               "picked": sorted({f"{r['algorithm']}/{r['protocol']}/{r['fidelity']}" for r in runs[0]["rows"]}),
               "engine_over_closed_form": max(r["time_s"] / r["closed_form_s"] for r in runs[0]["rows"])}
        out.append(row)
        print(f"  {name}: {row['wall_s']:.1f} s wall, {row['cpu_s']:.1f} s CPU", file=sys.stderr, flush=True)
    return out


AGREEMENT = [  # preset, nodes, ranks, op, algorithm, bytes, detailed too
    ("dgx-h100", 1, 8, "all_reduce", "nvls", 2**30, True),
    ("gb200-nvl72", 1, 72, "all_reduce", "nvls", 2**30, False),
    ("dgx-h100", 4, 32, "all_reduce", "ring", 2**28, True),
    ("dgx-h100", 4, 32, "broadcast", "ring", 2**26, True),
    ("dgx-h100", 4, 32, "all_reduce", "tree", 2**24, True),
    ("dgx-h100", 2048, 16384, "all_reduce", "tree", 2**30, False),
    ("dgx-h100", 4, 32, "all_reduce", "halving_doubling", 2**26, True),
    ("dgx-h100", 128, 1024, "all_reduce", "halving_doubling", 2**30, False),
    ("dgx-h100", 4, 32, "all_reduce", "hierarchical", 2**28, True),
    ("dgx-h100", 128, 1024, "all_reduce", "hierarchical", 2**30, False),
    ("dgx-h100", 4, 32, "all_to_all", "direct", 2**28, True),
    ("dgx-h100", 4, 32, "all_gather", "direct", 2**26, True),
    ("dgx-h100", 128, 1024, "all_to_all", "direct", 2**30, False),
    ("dgx-h100", 512, 4096, "all_to_all", "direct", 2**20, False),
]


def bench_agreement() -> list[dict]:
    """Fast (and detailed) engine time / closed form, each plan alone, protocol Simple."""
    from simdist.analytic.registry import closed_form
    from simdist.collectives.group import Group
    from simdist.collectives.protocols import SIMPLE
    from simdist.collectives.registry import algorithm_for
    from simdist.collectives.request import Request
    from simdist.engine.simulate import simulate
    from simdist.hardware import load_topology

    out = []
    for preset, nodes, ranks, op, name, nbytes, detailed in AGREEMENT:
        group = Group.first(load_topology(preset, num_nodes=nodes), ranks)
        request = Request(op, group, nbytes)
        algo = algorithm_for(name, request)
        closed = closed_form(name)(request, SIMPLE)
        start = time.perf_counter()
        fast = algo.build_fast(request)
        fast_s = simulate([(fast, group)])[0].time_s
        row = {"case": f"{name} {op} {ranks} ranks ({nodes} {preset}) {nbytes / 2**20:g} MiB",
               "fast_flows": fast.num_transfers, "fast_ratio": fast_s / closed,
               "fast_wall_s": time.perf_counter() - start, "detailed_ratio": None}
        if detailed:
            row["detailed_ratio"] = simulate([(algo.build(request), group)])[0].time_s / closed
        out.append(row)
        print(f"  {row['case']}: fast/closed {row['fast_ratio']:.6f}", file=sys.stderr, flush=True)
    return out


def render_targets(rows: list[dict], repeat: int) -> str:
    lines = [f"Targets (whole process, medians of {repeat}; CPU = user + sys):"]
    for r in rows:
        mark = "ok" if r["wall_s"] <= r["target_s"] and (r["target_mb"] is None or r["peak_mb"] < r["target_mb"]) \
            else "OVER (wall; see CPU)"
        mem = f", target < {r['target_mb']:.0f} MB" if r["target_mb"] else ""
        lines.append(f"  {r['name']}: {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU, {r['peak_mb']:.0f} MB peak "
                     f"(target <= {r['target_s']:.0f} s{mem}) {mark}; picked {', '.join(r['picked'])}; "
                     f"engine / closed form <= {r['engine_over_closed_form']:.9f}")
        lines.append(f"    {r['command']}")
    return "\n".join(lines)


def render_agreement(rows: list[dict]) -> str:
    lines = ["Fast plan alone / closed form (and detailed / closed form), protocol Simple:"]
    for r in rows:
        det = "-" if r["detailed_ratio"] is None else f"{r['detailed_ratio']:.9f}"
        lines.append(f"  {r['case']}: fast {r['fast_ratio']:.9f} ({r['fast_flows']} flows, "
                     f"{r['fast_wall_s']:.2f} s), detailed {det}")
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
    parser.add_argument("--no-targets", action="store_true", help="skip the whole-process target runs")
    parser.add_argument("--no-agreement", action="store_true", help="skip fast-plan / closed-form agreement")
    parser.add_argument("--no-scaling", action="store_true", help="skip the scaling table")
    args = parser.parse_args()
    targets = [] if args.no_targets else bench_targets(args.repeat)
    agreement = [] if args.no_agreement else bench_agreement()
    if args.no_scaling:
        doc = {"targets": targets, "agreement": agreement}
        print(json.dumps(doc, indent=2) if args.json else
              "\n\n".join(x for x in (render_targets(targets, args.repeat) if targets else "",
                                       render_agreement(agreement) if agreement else "") if x))
        return
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
    doc = {"meta": meta, "rows": rows, "ratios": ratios, "targets": targets, "agreement": agreement}
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    parts = [render_targets(targets, args.repeat) if targets else "",
             render_agreement(agreement) if agreement else "", render(doc)]
    print("\n\n".join(x for x in parts if x))


if __name__ == "__main__":
    main()
