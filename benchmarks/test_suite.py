"""Benchmark of the test suite: the README's test command (its pytest passes) against its 8-minute target.

Run from the repository root with the project's virtualenv active:

    python benchmarks/test_suite.py [--repeat N] [--serial | --marker EXPR] [--slowest K] [--json]

The command timed is the pytest part of README.md's quick-start test line (the fenced block after
``<!-- quickstart: tests -->``, as .ci/run reads it): every ``python -m pytest ...`` step of it, joined by ``&&``
and run with bash, each step given ``-p no:cacheprovider --durations=K``. ``--serial`` times a plain
``python -m pytest`` (everything in one process) instead, ``--marker EXPR`` ``python -m pytest -m EXPR``.
Printed, as medians over --repeat runs (default 3; the suite takes minutes, so ``--repeat 1`` for a quick look):
- wall s: the whole command, interpreter start-ups and collections included (the target: under 480 s on 2 cores);
- CPU s: user + system time of the run and every process it waited for (xdist workers, notebook kernels, CLI
  subprocesses, gloo ranks): the part of the wall time that does not depend on what else the machine runs;
- load: the 1-minute load average when the run ended (above the core count, the wall time is inflated);
- the outcome line of each pytest pass and, from the last run, its K slowest tests (of all passes).
No test asserts on time (tests/test_no_wall_clock.py): figures like these belong here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_S = 480.0
README = Path(__file__).resolve().parents[1] / "README.md"
PYTEST = "python -m pytest"


def readme_test_steps() -> list[str]:
    """The ``python -m pytest ...`` steps of README.md's quick-start test line, in order."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = lines.index("<!-- quickstart: tests -->")
    fence = next(i for i in range(start, len(lines)) if lines[i].startswith("```bash"))
    steps = [s.strip() for s in lines[fence + 1].split("&&") if s.strip().startswith(PYTEST)]
    if not steps:
        sys.exit(f"{README}: no '{PYTEST}' step in the quick-start test command")
    return steps


def command(serial: bool, marker: str | None, slowest: int) -> str:
    """The shell command timed: the README's pytest steps, each with no cache and --durations (-q: addopts)."""
    if marker is not None:
        steps = [f"{PYTEST} -m {shlex.quote(marker)}"]
    else:
        steps = [PYTEST] if serial else readme_test_steps()
    extra = f" -p no:cacheprovider --durations={slowest}"
    return " && ".join(f"{sys.executable} -m pytest{extra}{step[len(PYTEST):]}" for step in steps)


def run_once(cmd: str, slowest: int) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = proc.stdout.splitlines()
    outcomes = [ln.strip("= ") for ln in lines if re.search(r"\d+ (passed|failed|error)", ln) and " in " in ln]
    timed = [ln.strip() for ln in lines if re.match(r"\s*\d+\.\d+s (call|setup|teardown)", ln)]
    durations = sorted(timed, key=lambda ln: -float(ln.split("s ", 1)[0]))[:slowest]
    return {"wall_s": wall, "cpu_s": cpu, "load": os.getloadavg()[0], "returncode": proc.returncode,
            "outcome": "; ".join(outcomes), "slowest": durations}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--serial", action="store_true", help="time a plain `python -m pytest` (one process)")
    which.add_argument("--marker", default=None, help='time `python -m pytest -m EXPR`, e.g. "not slow"')
    parser.add_argument("--slowest", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cmd = command(args.serial, args.marker, args.slowest)
    runs = [run_once(cmd, args.slowest) for _ in range(max(1, args.repeat))]
    summary = {
        "command": cmd,
        "cores": os.cpu_count(),
        "runs": len(runs),
        "median_wall_s": statistics.median(r["wall_s"] for r in runs),
        "median_cpu_s": statistics.median(r["cpu_s"] for r in runs),
        "target_s": TARGET_S,
        "load_at_end": [round(r["load"], 2) for r in runs],
        "returncodes": [r["returncode"] for r in runs],
        "outcomes": [r["outcome"] for r in runs],
        "slowest_last_run": runs[-1]["slowest"],
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{summary['command']} on {summary['cores']} cores, median of {len(runs)}:")
    print(f"  wall {summary['median_wall_s']:.0f} s (target {TARGET_S:.0f} s), CPU {summary['median_cpu_s']:.0f} s, "
          f"load at end {', '.join(map(str, summary['load_at_end']))}")
    for code, outcome in zip(summary["returncodes"], summary["outcomes"], strict=True):
        print(f"  exit {code}: {outcome}")
    print("  slowest (last run):")
    for line in summary["slowest_last_run"]:
        print(f"    {line.strip()}")


if __name__ == "__main__":
    main()
