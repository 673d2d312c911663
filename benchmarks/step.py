"""Benchmark of training-step simulation across scales: wall time and peak memory of `simdist run`.

Run from the repository root with the project's virtualenv active:

    python benchmarks/step.py [--repeat N] [--max-gpus N] [--models llama3-405b,gpt3-175b] [--json]

Layouts (bf16, sequence parallelism, dgx-h100 nodes with 8 x 400 Gb/s RoCE, 1F1B):
- llama3-405b: TP 8, PP min(16, GPUs/8), DP the rest (128 to 16,384 GPUs: the Llama 3 layout, Dubey et al.
  2024 Table 4, with DP 1..128); below 128 GPUs fewer stages. 16 micro-batches per replica, ZeRO-2.
- gpt3-175b: TP 8, PP min(8, GPUs/8), DP the rest (DP 1 to 256 at 64 to 16,384 GPUs), 1,536 global batch
  (rounded down to a multiple of DP).
8, 16, 32, ... GPUs up to --max-gpus (16,384 by default).

Figures per point (medians of --repeat runs; the machine is shared and noisy, compare ratios):
- ops: ops in the simulated op graph (representative ranks only: one per pipeline stage).
- plan / price / engine / metrics s: wall time of building the op graph, pricing its collectives, the
  SimPy run and the metrics, measured inside `simdist.predict.step.predict_step`'s phases; total s: the
  whole `simdist.api.run` (the CLI's work minus interpreter start-up).
- peak MiB: tracemalloc peak of one run in a fresh interpreter (after imports and a small warm-up run).
- step s: the simulated step time.
The summary prints time(16,384) / time(1,024) per model: the speed issue's target is <= 1.5.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, tracemalloc
sys.path.insert(0, "benchmarks")
from step import run_point
model, gpus = sys.argv[1], int(sys.argv[2])
run_point("gpt3-175b", 64)  # warm-up: lazy imports
tracemalloc.start()
run_point(model, gpus)
print(json.dumps({"peak_mib": tracemalloc.get_traced_memory()[1] / 2**20}))
"""


def scenario_text(model: str, gpus: int) -> str:
    if model == "llama3-405b":
        pp = max(1, min(16, gpus // 8))
        split = "even" if 126 % pp == 0 else "lighter_ends"
        dp = gpus // (8 * pp)
        batch = 16 * dp
        zero = 2
    elif model == "gpt3-175b":
        pp = max(1, min(8, gpus // 8))
        split = "even"
        dp = gpus // (8 * pp)
        batch = 1536 // dp * dp
        zero = 1
    else:
        raise SystemExit(f"unknown model {model}")
    return f"""
name: {model} on {gpus} H100
cluster: {{preset: dgx-h100, num_nodes: {max(1, gpus // 8)}, inter_node: {{kind: roce, nics_per_node: 8,
          nic_bandwidth: 400 Gb/s}}}}
model: {{preset: {model}}}
parallel: {{tp: 8, pp: {pp}, dp: {dp}, sequence_parallel: true, zero_stage: {zero}, pipeline_split: {split}}}
training: {{micro_batch_size: 1, global_batch_size: {batch}, recompute: selective, precision: bf16}}
schedule: 1f1b
"""


def run_point(model: str, gpus: int) -> dict:
    """One `simdist.api.run`, with the phases of predict_step timed separately."""
    from simdist import api
    from simdist.engine import graph as engine_graph
    from simdist.plan import step as plan_step
    from simdist.predict import price, step

    times: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times[name] = times.get(name, 0.0) + time.perf_counter() - t0
        return wrapper

    originals = (step.build_step, step.price_graph, step.run_graph, step.step_metrics)
    step.build_step = timed("plan_s", plan_step.build_step)
    step.price_graph = timed("price_s", price.price_graph)
    step.run_graph = timed("engine_s", engine_graph.run_graph)
    step.step_metrics = timed("metrics_s", originals[3])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "s.yaml"
            path.write_text(scenario_text(model, gpus))
            t0 = time.perf_counter()
            out = api.run(path)
            times["total_s"] = time.perf_counter() - t0
    finally:
        step.build_step, step.price_graph, step.run_graph, step.step_metrics = originals
        del originals
    return {**times, "step_s": out.result["step_time_s"], "mfu": out.result["mfu"],
            "fits": out.result["fits_in_memory"], "ops": out.num_ops}


def peak_mib(model: str, gpus: int) -> float:
    proc = subprocess.run([sys.executable, "-c", CHILD, model, str(gpus)], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    return json.loads(proc.stdout)["peak_mib"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-gpus", type=int, default=16384)
    parser.add_argument("--models", default="llama3-405b,gpt3-175b")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for model in args.models.split(","):
        gpus = 8
        while gpus <= args.max_gpus:
            runs = [run_point(model, gpus) for _ in range(args.repeat)]
            row = {"model": model, "gpus": gpus, "ops": runs[0]["ops"], "step_s": runs[0]["step_s"],
                   "mfu": runs[0]["mfu"], "fits": runs[0]["fits"]}
            for key in ("plan_s", "price_s", "engine_s", "metrics_s", "total_s"):
                row[key] = statistics.median(r.get(key, 0.0) for r in runs)
            row["peak_mib"] = peak_mib(model, gpus)
            rows.append(row)
            if not args.json:
                print(f"{model:12s} {gpus:6d} GPUs  ops {row['ops']:7d}  plan {row['plan_s']:6.2f}  "
                      f"price {row['price_s']:6.2f}  engine {row['engine_s']:6.2f}  metrics {row['metrics_s']:5.2f}  "
                      f"total {row['total_s']:6.2f} s  peak {row['peak_mib']:7.1f} MiB  step {row['step_s']:7.2f} s  "
                      f"MFU {row['mfu']:.1%}{'' if row['fits'] else '  (does not fit)'}", flush=True)
            gpus *= 2
    summary = {}
    for model in args.models.split(","):
        t = {r["gpus"]: r["total_s"] for r in rows if r["model"] == model}
        if 16384 in t and 1024 in t:
            summary[model] = t[16384] / t[1024]
    if args.json:
        print(json.dumps({"rows": rows, "ratio_16384_over_1024": summary}, indent=2))
    else:
        for model, ratio in summary.items():
            print(f"{model}: time(16384) / time(1024) = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
