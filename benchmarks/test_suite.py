"""Benchmark of the test suite: the README's test command (``python -m pytest``) against its 8-minute target.

Run from the repository root with the project's virtualenv active:

    python benchmarks/test_suite.py [--repeat N] [--marker EXPR] [--slowest K] [--json]

Each run is ``python -m pytest -p no:cacheprovider --durations=K [-m EXPR]`` in a subprocess. Printed, as
medians over --repeat runs (default 3; the suite takes minutes, so ``--repeat 1`` for a quick look):
- wall s: the whole command, interpreter start-up and collection included (the target: under 480 s on 2 cores);
- CPU s: user + system time of the run and every process it waited for (notebook kernels, CLI subprocesses,
  gloo ranks): the part of the wall time that does not depend on what else the machine runs;
- load: the 1-minute load average when the run ended (above the core count, the wall time is inflated);
- the outcome line of pytest and, from the last run, its K slowest tests.
``--marker "not slow"`` measures the quick subset (tests marked ``slow`` in tests/ take seconds each).
No test asserts on time (tests/test_no_wall_clock.py): figures like these belong here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

TARGET_S = 480.0


def run_once(marker: str | None, slowest: int) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--durations={slowest}"]  # -q: addopts
    if marker:
        cmd += ["-m", marker]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = proc.stdout.splitlines()
    outcome = next((ln.strip("= ") for ln in reversed(lines) if re.search(r"\d+ (passed|failed)", ln)), "")
    durations = [ln for ln in lines if re.match(r"\s*\d+\.\d+s (call|setup|teardown)", ln)][:slowest]
    return {"wall_s": wall, "cpu_s": cpu, "load": os.getloadavg()[0], "returncode": proc.returncode,
            "outcome": outcome, "slowest": durations}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--marker", default=None, help='a pytest -m expression, e.g. "not slow"')
    parser.add_argument("--slowest", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs = [run_once(args.marker, args.slowest) for _ in range(max(1, args.repeat))]
    summary = {
        "command": "python -m pytest" + (f" -m {args.marker!r}" if args.marker else ""),
        "cores": os.cpu_count(),
        "runs": len(runs),
        "median_wall_s": statistics.median(r["wall_s"] for r in runs),
        "median_cpu_s": statistics.median(r["cpu_s"] for r in runs),
        "target_s": TARGET_S,
        "load_at_end": [round(r["load"], 2) for r in runs],
        "outcomes": [r["outcome"] for r in runs],
        "slowest_last_run": runs[-1]["slowest"],
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{summary['command']} on {summary['cores']} cores, median of {len(runs)}:")
    print(f"  wall {summary['median_wall_s']:.0f} s (target {TARGET_S:.0f} s), CPU {summary['median_cpu_s']:.0f} s, "
          f"load at end {', '.join(map(str, summary['load_at_end']))}")
    for outcome in summary["outcomes"]:
        print(f"  {outcome}")
    print("  slowest (last run):")
    for line in summary["slowest_last_run"]:
        print(f"    {line.strip()}")


if __name__ == "__main__":
    main()
