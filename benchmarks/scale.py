"""Simulation speed at scale: `simdist run` from 128 to 16,384 GPUs, and the bundled default scenario.

Run from the repository root with the project's virtualenv active:

    python benchmarks/scale.py [--repeat 3] [--max-gpus 16384] [--json]

Layouts (the speed issue's): Llama 3 405B with TP 8, PP 16 and DP 1..128 (128 to 16,384 H100s; 16 micro-batches
per replica as Llama 3's Table 4, 8 x 400 Gb/s RoCE per node, ZeRO-2, sequence parallelism, first and last stage
one layer lighter) and GPT-3 175B with TP 8, PP 8 and DP 1..256 (64 to 16,384 H100s, global batch 1,536).
Both are written by benchmarks/step.py's `scenario_text`.

Figures per point, medians of --repeat runs (the machine is shared and noisy: compare ratios):
- api s: `simdist.api.run` in this process (the CLI's work minus interpreter start-up and imports);
- cli s: the whole `simdist run SCENARIO --json` command in a fresh process (start-up included);
- peak MiB: the maximum resident set size of that process (ru_maxrss of the child);
- ops: ops in the simulated op graph; ranks: simulated ranks; step s: the simulated step time.
The summary prints time(16,384) / time(1,024) per model (target <= 1.5) three ways: the whole command, the api
column, and the api with the two sizes run alternately (max(--repeat, 5) times each; the steadiest of the three on
a shared machine); then the 16,384-GPU Llama 3 step's wall
time and memory (targets <= 5 s, <= 2 GiB) and the default scenario's (target <= 1 s).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from step import scenario_text  # noqa: E402 - the layouts live in benchmarks/step.py

MODELS = {"llama3-405b": 128, "gpt3-175b": 64}  # model -> smallest GPU count (DP 1)


def cli_run(path: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of `simdist run PATH --json` in a fresh process (os.wait4's rusage)."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "simdist", "run", str(path), "--json"],
                                stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            err.seek(0)
            raise SystemExit(err.read().decode())
    return wall, usage.ru_maxrss / 1024  # KiB on Linux


def cli_point(path: Path, repeat: int) -> dict:
    """Fresh-process figures. Run before this process imports simdist: Linux counts a forked child's
    pre-exec resident set in its ru_maxrss, so the parent must stay small for the child's peak to be its own."""
    runs = [cli_run(path) for _ in range(repeat)]
    return {"cli_s": statistics.median(w for w, _ in runs), "peak_mib": max(p for _, p in runs)}


def api_point(path: Path, repeat: int) -> dict:
    from simdist import api

    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = api.run(path)
        times.append(time.perf_counter() - t0)
    r = out.result
    return {"api_s": statistics.median(times), "ops": out.num_ops, "ranks": r["layout"]["simulated_ranks"],
            "step_s": r["step_time_s"], "mfu": r["mfu"], "exact": r["layout"]["reduction_exact"]}


def interleaved_ratio(small: Path, large: Path, repeat: int) -> float:
    """Median of time(large) / median of time(small), in this process, the two run alternately: drift of a
    shared machine (other jobs, caches, the collector's state) then hits both sizes alike."""
    from simdist import api

    times: dict[Path, list[float]] = {small: [], large: []}
    for _ in range(repeat):
        for path in (small, large):
            t0 = time.perf_counter()
            api.run(path)
            times[path].append(time.perf_counter() - t0)
    return statistics.median(times[large]) / statistics.median(times[small])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-gpus", type=int, default=16384)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    default_path = ROOT / "scenarios" / "default.yaml"
    with tempfile.TemporaryDirectory() as tmp:
        points = []
        for model, first in MODELS.items():
            gpus = first
            while gpus <= args.max_gpus:
                path = Path(tmp) / f"{model}-{gpus}.yaml"
                path.write_text(scenario_text(model, gpus))
                points.append((model, gpus, path))
                gpus *= 2
        # 1. fresh processes, while this one has not imported simdist (see cli_point)
        cli = {path: cli_point(path, args.repeat) for _, _, path in points}
        default_cli = cli_point(default_path, args.repeat)
        # 2. in this process
        from simdist import api

        api.run(default_path)  # warm-up: lazy imports
        for model, gpus, path in points:
            row = {"model": model, "gpus": gpus, **cli[path], **api_point(path, args.repeat)}
            rows.append(row)
            if not args.json:
                print(f"{model:12s} {gpus:6d} GPUs  ranks {row['ranks']:4d}  ops {row['ops']:6d}  "
                      f"api {row['api_s']:6.2f} s  cli {row['cli_s']:6.2f} s  peak {row['peak_mib']:7.1f} MiB  "
                      f"step {row['step_s']:7.2f} s  MFU {row['mfu']:.1%}"
                      f"{'' if row['exact'] else '  (reduction approximate)'}", flush=True)
        default = {"model": "default scenario", **default_cli, **api_point(default_path, args.repeat)}
        ratios = {}
        for model in MODELS:
            at = {r["gpus"]: r for r in rows if r["model"] == model}
            if 16384 in at and 1024 in at:
                path = {g: p for m, g, p in points if m == model}
                ratios[model] = {
                    "cli": at[16384]["cli_s"] / at[1024]["cli_s"],
                    "api": at[16384]["api_s"] / at[1024]["api_s"],
                    "api_interleaved": interleaved_ratio(path[1024], path[16384], max(args.repeat, 5)),
                }
    if args.json:
        print(json.dumps({"rows": rows, "default": default, "ratio_16384_over_1024": ratios}, indent=2))
        return 0
    print(f"default scenario: api {default['api_s']:.2f} s, cli {default['cli_s']:.2f} s, "
          f"peak {default['peak_mib']:.0f} MiB")
    for model, r in ratios.items():
        print(f"{model}: time(16384) / time(1024): simdist run {r['cli']:.2f}, api {r['api']:.2f}, "
              f"api with the two sizes run alternately {r['api_interleaved']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
