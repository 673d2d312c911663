"""Benchmark of the topology layer (build, describe, routes, networkx, CLI) across cluster sizes.

Run from the repository root with the project's virtualenv active:

    python benchmarks/topology.py [--repeat N] [--max-gpus N] [--nx-max-gpus N] [--json]

Sizes: dgx-h100 at 8..16384 GPUs (num_nodes = GPUs / 8), gb200-nvl72 at 72, 1152 and 16416 GPUs
(num_nodes = racks of 72) and pcie-gen4-8gpu at 8 and 1024 GPUs. Times are medians of --repeat runs
(the machine this was written for is small and noisy: compare ratios, not absolute figures).

Figures per size:
- build ms: wall time of ``load_topology(preset, num_nodes=...)``: YAML read, pydantic validation,
  node graph, fabric arithmetic.
- build MiB / kept MiB: tracemalloc peak and retained memory of one build, measured in a fresh
  subprocess per size (after its imports and a 1-node warm-up build, so one-time lazy imports are
  not counted). RSS MiB: that subprocess's peak resident set size right after the build (interpreter
  + imports + build; Linux VmHWM, else getrusage); ``end_max_rss_mib`` in --json: the same at its end.
- describe ms: wall time of ``describe(t)`` on a freshly built topology (what ``simdist topo show``
  computes: counts, injection bandwidth, bisection, three example routes).
- cold / warm routes: lookups per second (and mean ns per lookup, Python loop included) of
  ``t.route(src, dst)`` for 100,000 random GPU pairs (src != dst, fixed seed). Cold = on a fresh
  topology, so every distinct pair is computed and cached; warm = the same pairs again, all from
  the cache. ``pairs`` is the number of distinct pairs (small clusters repeat pairs, so their cold
  figure is mostly cache hits). routes MiB: memory the route cache keeps after the cold pass.
- nx ms / nx MiB: ``t.to_networkx()`` wall time and tracemalloc peak (the slow optional path),
  only up to --nx-max-gpus GPUs (1024 by default).
- CLI: wall time of ``simdist topo show dgx-h100 --num-nodes {1,2048} --json > /dev/null`` as a
  subprocess (median of 3): interpreter start-up and imports included, the user-facing figure.
- 3-tier at 100k GPUs (issue 33's budget: <= 5 s whole process, < 1 GB): wall time and peak RSS of
  ``simdist collective --cluster llama3-24k --num-nodes 12500 --op all_reduce --ranks 100000 --bytes 1M
  --algorithm ring`` (100,000 GPUs in 33 pods: build the topology, route and price a 1 MB ring all-reduce),
  median of 3 subprocesses.
- multi-plane at 100k GPUs (issue 33's budget, the same): the same command on ``mpft-100k`` (8 planes, each a
  two-tier fat tree of 12,500 NICs; a ring between nodes stays on each NIC's plane). ``--only multi_plane`` (or
  ``three_tier``) runs that figure alone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

from simdist.hardware import describe, load_topology

CASES = ([("dgx-h100", g, g // 8) for g in (8, 64, 512, 1024, 4096, 16384)]
         + [("gb200-nvl72", g, g // 72) for g in (72, 1152, 16416)]
         + [("pcie-gen4-8gpu", g, g // 8) for g in (8, 1024)])
NUM_PAIRS = 100_000
SEED = 20240601

# Memory figures, run as `python -c CHILD preset num_nodes pairs seed nx` in a fresh interpreter.
CHILD = """
import json, random, resource, sys, tracemalloc
from simdist.hardware import load_topology
def rss():  # VmHWM: getrusage's ru_maxrss keeps the forking parent's peak across fork + exec on Linux
    try:
        return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
preset, (nodes, n_pairs, seed), nx = sys.argv[1], map(int, sys.argv[2:5]), sys.argv[5] == "1"
load_topology(preset, num_nodes=1)  # warm-up: lazy imports and first-use costs
tracemalloc.start()
t = load_topology(preset, num_nodes=nodes)
kept, peak = tracemalloc.get_traced_memory()
out = {"build_peak_mib": peak / 2**20, "build_kept_mib": kept / 2**20, "max_rss_mib": rss()}
rng = random.Random(seed)
n = t.num_gpus
pairs = [(s, (s + rng.randrange(1, n)) % n) for s in (rng.randrange(n) for _ in range(n_pairs))]
before = tracemalloc.get_traced_memory()[0]
for s, d in pairs:
    t.route(s, d)
out["routes_mib"] = (tracemalloc.get_traced_memory()[0] - before) / 2**20
if nx:
    tracemalloc.reset_peak()
    before = tracemalloc.get_traced_memory()[0]
    g = t.to_networkx()
    out["nx_peak_mib"] = (tracemalloc.get_traced_memory()[1] - before) / 2**20
tracemalloc.stop()
out["end_max_rss_mib"] = rss()
print(json.dumps(out))
"""


def timed(fn, repeat: int, setup=None) -> float:
    """Median wall seconds of ``fn(setup())`` (or ``fn()``) over ``repeat`` runs; setup is not timed."""
    samples = []
    for _ in range(repeat):
        args = (setup(),) if setup else ()
        start = time.perf_counter()
        fn(*args)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def random_pairs(num_gpus: int) -> list[tuple[int, int]]:
    rng = random.Random(SEED)  # same draw as CHILD: src uniform, dst uniform among the others
    return [(s, (s + rng.randrange(1, num_gpus)) % num_gpus)
            for s in (rng.randrange(num_gpus) for _ in range(NUM_PAIRS))]


def route_rates(preset: str, nodes: int, pairs: list[tuple[int, int]], repeat: int) -> dict:
    cold, warm, distinct = [], [], 0
    for _ in range(repeat):
        t = load_topology(preset, num_nodes=nodes)
        route = t.route
        for out in (cold, warm):  # first pass computes and caches, second one hits the cache
            start = time.perf_counter()
            for s, d in pairs:
                route(s, d)
            out.append(time.perf_counter() - start)
        distinct = len(t._routes)
    c, w = statistics.median(cold), statistics.median(warm)  # per-lookup figures include the loop
    return {"pairs": distinct, "cold_per_s": len(pairs) / c, "cold_ns": c / len(pairs) * 1e9,
            "warm_per_s": len(pairs) / w, "warm_ns": w / len(pairs) * 1e9}


def bench_case(preset: str, gpus: int, nodes: int, repeat: int, nx_max: int) -> dict:
    row: dict = {"preset": preset, "gpus": gpus, "nodes": nodes}
    row["build_ms"] = timed(lambda: load_topology(preset, num_nodes=nodes), repeat) * 1e3
    fresh = lambda: load_topology(preset, num_nodes=nodes)  # noqa: E731
    row["describe_ms"] = timed(describe, repeat, setup=fresh) * 1e3
    row.update(route_rates(preset, nodes, random_pairs(gpus), repeat))
    do_nx = gpus <= nx_max
    row["nx_ms"] = timed(lambda t: t.to_networkx(), repeat, setup=fresh) * 1e3 if do_nx else None
    argv = [preset, str(nodes), str(NUM_PAIRS), str(SEED), "1" if do_nx else "0"]
    child = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, check=True)
    row.update({"nx_peak_mib": None, **json.loads(child.stdout)})
    return row


def cli_seconds(num_nodes: int, runs: int = 3) -> float:
    exe = shutil.which("simdist", path=os.path.dirname(sys.executable)) or shutil.which("simdist")
    cmd = [*([exe] if exe else [sys.executable, "-m", "simdist"]), "topo", "show", "dgx-h100",
           "--num-nodes", str(num_nodes), "--json"]
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


THREE_TIER = ["collective", "--cluster", "llama3-24k", "--num-nodes", "12500", "--op", "all_reduce", "--ranks",
              "100000", "--bytes", "1M", "--algorithm", "ring"]
THREE_TIER_CHILD = """
import sys
from simdist.cli import main
sys.argv = ["simdist", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM")]
print("RSS_KIB", hwm[0].split()[1] if hwm else 0, file=sys.stderr)
"""


MULTI_PLANE = ["collective", "--cluster", "mpft-100k", "--num-nodes", "12500", "--op", "all_reduce", "--ranks",
               "100000", "--bytes", "1M", "--algorithm", "ring"]


def three_tier_seconds(runs: int = 3, argv: list[str] = THREE_TIER) -> dict:
    """Whole-process wall time and peak RSS of the 100k-GPU all-reduce ``argv`` (3-tier by default; medians of
    ``runs``)."""
    times, rss_mib = [], []
    for _ in range(runs):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", THREE_TIER_CHILD, *argv], capture_output=True, text=True,
                             check=True)
        times.append(time.perf_counter() - start)
        kib = [line.split()[1] for line in out.stderr.splitlines() if line.startswith("RSS_KIB")]
        rss_mib.append(int(kib[0]) / 1024 if kib else float("nan"))
    return {"seconds": statistics.median(times), "max_rss_mib": statistics.median(rss_mib)}


COLUMNS = [  # header, row key, format ("k" scales lookups/s to thousands)
    ("preset", "preset", "{}"), ("GPUs", "gpus", "{}"), ("nodes", "nodes", "{}"),
    ("build ms", "build_ms", "{:.2f}"), ("build MiB", "build_peak_mib", "{:.2f}"),
    ("kept MiB", "build_kept_mib", "{:.3f}"), ("RSS MiB", "max_rss_mib", "{:.0f}"),
    ("describe ms", "describe_ms", "{:.2f}"), ("pairs", "pairs", "{}"),
    ("cold k/s", "cold_per_s", "k{:.0f}"), ("cold ns", "cold_ns", "{:.0f}"),
    ("warm k/s", "warm_per_s", "k{:.0f}"), ("warm ns", "warm_ns", "{:.0f}"),
    ("routes MiB", "routes_mib", "{:.1f}"), ("nx ms", "nx_ms", "{:.1f}"), ("nx MiB", "nx_peak_mib", "{:.1f}"),
]


def cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    return fmt[1:].format(value / 1e3) if fmt.startswith("k") else fmt.format(value)


def render(doc: dict) -> str:
    table = [[h for h, _, _ in COLUMNS]] + [[cell(r, k, f) for _, k, f in COLUMNS] for r in doc["rows"]]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    pad = [str.ljust] + [str.rjust] * (len(COLUMNS) - 1)
    lines = ["  ".join(p(c, w) for p, c, w in zip(pad, row, widths, strict=True)) for row in table]
    m = doc["meta"]
    lines.append(f"\nmedians of {m['repeat']} runs; routes: {m['pairs']:,} random pairs (seed {m['seed']}); "
                 f"nx skipped ('-') above {m['nx_max_gpus']} GPUs; k/s = thousand lookups per second")
    ms = {k: v * 1e3 for k, v in doc["cli"].items()}
    lines.append(f"CLI `simdist topo show dgx-h100 --json` (median of 3): 1 node {ms['1_node_s']:.0f} ms, "
                 f"2048 nodes {ms['2048_nodes_s']:.0f} ms (difference {ms['difference_s']:+.0f} ms)")
    lines += hundred_k_lines(doc)
    r = doc.get("ratios")
    if r:
        lines.append(f"dgx-h100 16384 vs 1024 GPUs (16x): build time x{r['build_16384_over_1024']:.2f}, "
                     f"describe time x{r['describe_16384_over_1024']:.2f}")
    return "\n".join(lines)


def hundred_k_lines(doc: dict) -> list[str]:
    """The 100k-GPU whole-process figures of ``doc`` (3-tier, multi-plane), as `render` prints them."""
    lines = []
    tt = doc.get("three_tier")
    if tt:
        lines.append(f"3-tier, 100,000 GPUs (llama3-24k at 12,500 nodes), 1 MB ring all_reduce, whole process "
                     f"(median of 3): {tt['seconds']:.2f} s, peak RSS {tt['max_rss_mib']:.0f} MiB "
                     "(budget: <= 5 s, < 1 GB)")
    mp = doc.get("multi_plane")
    if mp:
        lines.append(f"multi-plane, 100,000 GPUs (mpft-100k: 8 planes of 12,500 NICs), 1 MB ring all_reduce, whole "
                     f"process (median of 3): {mp['seconds']:.2f} s, peak RSS {mp['max_rss_mib']:.0f} MiB "
                     "(budget: <= 5 s, < 1 GB)")
    return lines


def render_only(doc: dict) -> str:
    """The 100k-GPU lines alone (``--only``)."""
    return "\n".join(hundred_k_lines(doc))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per timed figure (median reported)")
    parser.add_argument("--max-gpus", type=int, default=None, help="skip sizes above this many GPUs")
    parser.add_argument("--nx-max-gpus", type=int, default=1024, help="largest size for to_networkx()")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--only", choices=["three_tier", "multi_plane"], default=None,
                        help="run only this 100k-GPU whole-process figure")
    args = parser.parse_args()
    if args.only:
        figure = three_tier_seconds(argv=THREE_TIER if args.only == "three_tier" else MULTI_PLANE)
        doc = {args.only: figure}
        print(json.dumps(doc, indent=2) if args.json else render_only(doc))
        return
    cases = [c for c in CASES if args.max_gpus is None or c[1] <= args.max_gpus]
    rows = [bench_case(*case, repeat=args.repeat, nx_max=args.nx_max_gpus) for case in cases]
    one, big = cli_seconds(1), cli_seconds(2048)
    by = {(r["preset"], r["gpus"]): r for r in rows}
    a, b = by.get(("dgx-h100", 1024)), by.get(("dgx-h100", 16384))
    ratios = {f"{k}_16384_over_1024": b[f"{k}_ms"] / a[f"{k}_ms"] for k in ("build", "describe")} if a and b else {}
    meta = {"python": sys.version.split()[0], "repeat": args.repeat, "pairs": NUM_PAIRS, "seed": SEED,
            "nx_max_gpus": args.nx_max_gpus}
    cli = {"1_node_s": one, "2048_nodes_s": big, "difference_s": big - one}
    doc = {"meta": meta, "rows": rows, "cli": cli, "ratios": ratios, "three_tier": three_tier_seconds(),
           "multi_plane": three_tier_seconds(argv=MULTI_PLANE)}
    print(json.dumps(doc, indent=2) if args.json else render(doc))


if __name__ == "__main__":
    main()
