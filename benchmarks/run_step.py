"""Benchmark of `simdist run` as a user runs it: whole process, fresh interpreter per run (issue 13, item 4).

Run from the repository root with the project's virtualenv active:

    python benchmarks/run_step.py [--repeat N] [--only SUBSTRING] [--save DIR] [--compare DIR] [--instructions]

Cases: every bundled scenario (``scenarios/*.yaml``), and the Llama 3 405B layout
(``scenarios/llama3-405b-16k.yaml``) at DP 1, 2, 4, ..., 128 on 16 x DP nodes, with 1F1B and with interleaved
1F1B of 7 virtual stages, and the interleaved layout of 8 (``scenarios/llama3-405b-interleaved.yaml``) at DP 1, 2,
4, ..., 64 (its DP 128 is the bundled scenario):

    simdist run scenarios/llama3-405b-16k.yaml --set parallel.dp=D --set cluster.num_nodes=$((16*D)) \
        --set schedule=1f1b      (or: --set schedule=interleaved_1f1b --set parallel.vpp=7)
    simdist run scenarios/llama3-405b-interleaved.yaml --set parallel.dp=D --set cluster.num_nodes=$((16*D))

Figures per case: wall seconds of the whole process (interpreter start-up, imports, the run, the JSON), its CPU
seconds (user + system: less sensitive to a loaded machine than wall time), and its peak resident memory (MB = 1e6
bytes, the kernel's ru_maxrss of that process), medians of --repeat runs, and PASS when wall time and memory are
within the target (3 s, 500 MB). The machine is shared and noisy: re-measure on a quiet one, or compare two trees
by ``--instructions`` (each case's instruction count under valgrind, which load does not move: the process started,
and all its processes; ``SIMDIST_PROCESSES=1`` keeps simdist in one).

Bytecode: the timed runs write and reuse Python's compiled bytecode (``__pycache__``, git-ignored) as Python does
by default and as ``pip install .`` (the README's install) leaves an installed package, PYTHONDONTWRITEBYTECODE
unset for them and the source compiled once before the first case (``python -m compileall``). ``--cold`` runs them
in the environment as given instead, simdist's ``__pycache__`` folders removed first: where it sets
PYTHONDONTWRITEBYTECODE (this machine does), every run compiles all of simdist's modules again (about 0.3 s of CPU
here), which no installed copy does.

``--save DIR`` keeps each case's ``--json`` output; ``--compare DIR`` checks every number in it against the output
saved before (relative 1e-9, strings equal), for changes that must not move the results.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 3.0
TARGET_MB = 500.0
REL = 1e-9


def cases() -> list[tuple[str, list[str]]]:
    """(name, simdist run arguments) of every case."""
    out = [(p.stem, [str(p.relative_to(ROOT))]) for p in sorted((ROOT / "scenarios").glob("*.yaml"))]
    layout = "scenarios/llama3-405b-16k.yaml"
    for schedule, extra in (("1f1b", []), ("interleaved_1f1b", ["--set", "parallel.vpp=7"])):
        dp = 1
        while dp <= 128:
            name = f"405b-{'1f1b' if schedule == '1f1b' else 'vpp7'}-dp{dp}"
            out.append((name, [layout, "--set", f"parallel.dp={dp}", "--set", f"cluster.num_nodes={16 * dp}",
                               "--set", f"schedule={schedule}", *extra]))
            dp *= 2
    dp = 1
    while dp <= 64:
        out.append((f"405b-vpp8-dp{dp}", ["scenarios/llama3-405b-interleaved.yaml", "--set", f"parallel.dp={dp}",
                                          "--set", f"cluster.num_nodes={16 * dp}"]))
        dp *= 2
    return out


class _Popen(subprocess.Popen):
    """A Popen that keeps the child's peak resident memory (wait4's rusage, KiB on Linux) when it reaps it."""

    peak_kib = math.nan
    cpu_s = math.nan

    def _try_wait(self, wait_flags):  # the hook CPython's Popen.wait reaps the child through
        try:
            pid, sts, usage = os.wait4(self.pid, wait_flags)
        except ChildProcessError:
            return self.pid, 0
        if pid:
            self.peak_kib = usage.ru_maxrss
            self.cpu_s = usage.ru_utime + usage.ru_stime
        return pid, sts


def child_env(cold: bool) -> dict[str, str]:
    """The timed runs' environment (module docstring: bytecode); not ``cold``: bytecode written and reused."""
    env = dict(os.environ)
    if not cold:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def compile_source(env: dict[str, str]) -> None:
    """Compile simdist's modules once, as an install does, so that no timed run pays for it."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "simdist")], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL)


def run_once(args: list[str], env: dict[str, str] | None = None) -> tuple[float, float, float, str]:
    """(wall s, peak RSS MB, CPU s, stdout) of one `simdist run ... --json` in a fresh interpreter."""
    t0 = time.perf_counter()
    proc = _Popen([sys.executable, "-m", "simdist", "run", *args, "--json"], cwd=ROOT, env=env,
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"simdist run {' '.join(args)} failed ({proc.returncode}): {err.strip()}")
    return wall, proc.peak_kib * 1024 / 1e6, proc.cpu_s, out


def instructions_of(args: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Instructions one `simdist run ... --json` executes (valgrind's callgrind, "Collected"): (the process started,
    every process of the run: the children simdist.predict.beside forks run beside it), counts that do not move with
    the machine's load, where wall and CPU seconds swing by a second between runs. About 100x slower than the run
    itself (4 minutes for a 4 s case)."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt install valgrind)")
    proc = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-m",
                           "simdist", "run", *args, "--json"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    first = re.search(r"==(\d+)==", proc.stderr)
    counts = {pid: float(n) for pid, n in re.findall(r"==(\d+)==\s*Collected\s*:\s*(\d+)", proc.stderr)}
    if proc.returncode != 0 or first is None or first.group(1) not in counts:
        raise SystemExit(f"simdist run {' '.join(args)} under valgrind failed ({proc.returncode})")
    return counts[first.group(1)], sum(counts.values())


def numbers_differ(a, b, path: str = "") -> list[str]:
    """Where two JSON values differ (numbers beyond REL relative, anything else not equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in one" for k in set(a) ^ set(b)]
        for k in a.keys() & b.keys():
            out += numbers_differ(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in numbers_differ(x, y, f"{path}[{i}]")]
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, int | float) or not isinstance(b, int | float):
        return [] if a == b else [f"{path}: {a!r} vs {b!r}"]
    if a == b or abs(a - b) <= REL * max(abs(a), abs(b)):
        return []
    return [f"{path}: {a!r} vs {b!r} ({abs(a - b) / max(abs(a), abs(b)):.2e} relative)"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    parser.add_argument("--save", type=Path, help="keep each case's JSON output in this folder")
    parser.add_argument("--compare", type=Path, help="compare each case's JSON with the one saved in this folder")
    parser.add_argument("--ignore", default="simulation.note,simulation.micro_batches,layout.note",
                        help="comma-separated JSON paths whose text may differ in --compare")
    parser.add_argument("--instructions", action="store_true",
                        help="also count each case's instructions once under valgrind (slow: use with --only)")
    parser.add_argument("--cold", action="store_true",
                        help="run in the environment as given (PYTHONDONTWRITEBYTECODE kept: every run compiles again)")
    args = parser.parse_args(argv)
    env = child_env(args.cold)
    if args.cold:
        for cache in (ROOT / "simdist").rglob("__pycache__"):
            shutil.rmtree(cache)
    else:
        compile_source(env)
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
    ignore = {f".{p}" for p in args.ignore.split(",") if p}
    failed = mismatched = 0
    print(f"{'case':24s} {'wall s':>7s} {'cpu s':>6s} {'peak MB':>8s}  {'step s':>10s}  "
          f"target {TARGET_S:g} s / {TARGET_MB:g} MB (wall); bytecode "
          f"{'as the environment says' if args.cold else 'cached (as installed)'}")
    for name, run_args in cases():
        if args.only not in name:
            continue
        runs = [run_once(run_args, env) for _ in range(args.repeat)]
        wall = statistics.median(r[0] for r in runs)
        peak = statistics.median(r[1] for r in runs)
        cpu = statistics.median(r[2] for r in runs)
        result = json.loads(runs[0][3])
        ok = wall <= TARGET_S and peak < TARGET_MB
        failed += not ok
        line = (f"{name:24s} {wall:7.2f} {cpu:6.2f} {peak:8.1f}  {result['step_time_s']:10.4f}  "
                f"{'PASS' if ok else 'FAIL'}")
        if args.instructions:
            own, every = instructions_of(run_args, env)
            line += f"  {own / 1e9:.2f} G instructions ({every / 1e9:.2f} G in all its processes)"
        if args.save:
            (args.save / f"{name}.json").write_text(runs[0][3])
        if args.compare and not (args.compare / f"{name}.json").is_file():
            line += f"  (nothing saved in {args.compare})"
        elif args.compare:
            before = json.loads((args.compare / f"{name}.json").read_text())
            diffs = [d for d in numbers_differ(before, result) if d.split(":")[0] not in ignore]
            mismatched += bool(diffs)
            line += "  same" if not diffs else f"  DIFFERS: {'; '.join(diffs[:3])}"
        print(line, flush=True)
    print(f"{failed} case(s) over target" + (f"; {mismatched} differ from {args.compare}" if args.compare else ""))
    return 1 if mismatched else 0


if __name__ == "__main__":
    raise SystemExit(main())
