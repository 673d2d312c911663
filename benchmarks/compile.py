"""Benchmark of the first run after an install: the README's default search in a fresh process whose numba cache
is empty, with the kernels shipped compiled (simdist.precompiled) and without them, and where the compiling goes.

Run from the repository root with the project's virtualenv active:

    python benchmarks/compile.py [--runs 1]

Figures (issue 32: the README's default search <= 10 s wall, the first run after an install included):
- shipped: the whole process's wall time (from the parent's start of it to its exit) of that search run as a user
  runs it (`python -m simdist search ...`), with numba's on-disk cache pointed at an empty directory
  (NUMBA_CACHE_DIR), as after `pip install`: the command line asks numba for its portable CPU target and loads
  every kernel from simdist/numba_cache;
- compiling: the same search in an instrumented process (its compile events below; it exits through the
  interpreter's teardown, about 1 s more than the command line's exit) with NUMBA_CPU_NAME set to this machine's
  CPU (as a user who names their own, or where the shipped cache does not match: another numba, Python or
  platform), where numba compiles every kernel;
- per compiled function of the compiling run: numba's own compile events ("numba:compile", numba.core.event),
  seconds from the start of a dispatcher's compilation to its end, callees compiled inside it included (so `timed`
  contains `run` and `observe`), the library's functions only (numba's own overloads left out), indented under the
  function whose compilation compiled them; their top-level sum is the compiling on the critical path (one
  process, one core);
- LLVM: the seconds numba held its LLVM lock (optimisation and machine code), of that sum.
Compare with `python benchmarks/search.py --readme` (the same search with a warm cache).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llvmlite import binding

REPO = Path(__file__).resolve().parents[1]
SEARCH = ["search", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "1024", "--global-batch", "1536"]

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from numba.core import event
events, depth, llvm = [], [0], [0.0, 0.0]

class Compile(event.Listener):
    def __init__(self):
        self.started = {}
    def on_start(self, e):
        self.started[id(e.data["dispatcher"]), str(e.data["args"])] = (time.perf_counter(), depth[0])
        depth[0] += 1
    def on_end(self, e):
        start, level = self.started.pop((id(e.data["dispatcher"]), str(e.data["args"])))
        depth[0] -= 1
        func = e.data["dispatcher"].py_func
        if func.__module__.startswith("simdist"):
            events.append((func.__module__ + "." + func.__qualname__, start - t0, time.perf_counter() - start, level))

class Lock(event.Listener):
    def on_start(self, e):
        llvm[1] = time.perf_counter()
    def on_end(self, e):
        llvm[0] += time.perf_counter() - llvm[1]

event.register("numba:compile", Compile())
event.register("numba:llvm_lock", Lock())
sys.argv = ["simdist", *json.loads(sys.argv[1])]
from simdist.cli import app
try:
    app()
except SystemExit:
    pass
print(json.dumps({"whole_s": time.perf_counter() - t0, "events": events, "llvm_s": llvm[0]}), file=sys.stderr)
"""


def shipped_run() -> float:
    """The search as a user runs it, in a fresh process with an empty numba cache; its wall time."""
    with tempfile.TemporaryDirectory() as cache:
        env = {key: value for key, value in os.environ.items() if not key.startswith("NUMBA_CPU_")}
        env.update(NUMBA_CACHE_DIR=cache)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "simdist", *SEARCH], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)
        return time.perf_counter() - start


def cold_run(cpu: str) -> dict:
    """One search in a fresh instrumented process with an empty numba cache, numba's target CPU ``cpu``; its
    figures, with the process's wall time as its parent saw it (``process_s``)."""
    with tempfile.TemporaryDirectory() as cache:
        env = {key: value for key, value in os.environ.items() if key != "NUMBA_CPU_FEATURES"}
        env.update(NUMBA_CACHE_DIR=cache, NUMBA_CPU_NAME=cpu)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(SEARCH)], cwd=REPO, env=env, text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
        process_s = time.perf_counter() - start
    return {**json.loads(proc.stderr.strip().splitlines()[-1]), "process_s": process_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="cold processes to run (median reported)")
    args = parser.parse_args(argv)
    shipped = [shipped_run() for _ in range(args.runs)]
    print(f"README default search, first run (empty numba cache), kernels shipped compiled: "
          f"{statistics.median(shipped):.2f} s wall (median of {len(shipped)}: "
          f"{', '.join(format(s, '.2f') for s in shipped)})")
    host = binding.get_host_cpu_name()
    runs = [cold_run(host) for _ in range(args.runs)]
    print(f"README default search, first run (empty numba cache), compiling for this CPU ({host}): "
          f"{statistics.median(r['process_s'] for r in runs):.2f} s wall (median of {len(runs)}: "
          f"{', '.join(format(r['process_s'], '.2f') for r in runs)})")
    last = runs[-1]
    top = [(name, s) for name, _, s, level in last["events"] if level == 0]
    print(f"compiling on the critical path: {sum(s for _, s in top):.2f} s, of which LLVM {last['llvm_s']:.2f} s")
    for name, _, s, level in sorted(last["events"], key=lambda e: e[1]):  # in the order they started
        if s >= 0.05:
            print(f"  {'  ' * level}{name}: {s:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
