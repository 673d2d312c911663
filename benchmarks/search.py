"""Benchmark of the layout search: closed-form configurations per second, and the engine re-simulation of the top k.

Run from the repository root with the project's virtualenv active:

    python benchmarks/search.py [--model gpt3-175b] [--cluster dgx-a100] [--gpus 1024] [--global-batch 1536]
                                [--workers 1] [--top 3] [--min-configs 10000]

Figures:
- cold: the first sweep over the feasible layouts (collective prices computed and cached);
- warm: the same sweep again (cached prices and chunk costs): the per-configuration cost of the closed form;
- 10k: --min-configs evaluations (the feasible set repeated) with --workers processes, wall time;
- engine: simdist.predict.step.predict_step on the top k, seconds each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simdist.search.evaluate import evaluate_batch
from simdist.search.executors import make_executor
from simdist.search.rank import BATCH, enumerate_feasible, resimulate
from simdist.search.space import SearchProblem


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt3-175b")
    ap.add_argument("--cluster", default="dgx-a100")
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--global-batch", type=int, default=1536)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--min-configs", type=int, default=10_000)
    a = ap.parse_args()
    problem = SearchProblem(a.model, a.cluster, a.gpus // 8, a.global_batch)
    t = time.perf_counter()
    feasible, pruned, n, *_ = enumerate_feasible(problem)
    enum_s = time.perf_counter() - t
    print(f"{n} layouts enumerated, {len(feasible)} feasible, {len(pruned)} pruned in {enum_s:.2f} s")
    t = time.perf_counter()
    rows = evaluate_batch(problem, feasible)
    cold = time.perf_counter() - t
    t = time.perf_counter()
    evaluate_batch(problem, feasible)
    warm = time.perf_counter() - t
    print(f"closed form cold: {cold:.2f} s ({len(feasible) / cold:,.0f} configs/s)")
    print(f"closed form warm: {warm:.3f} s ({len(feasible) / warm:,.0f} configs/s, {warm / len(feasible) * 1e6:.0f} us "
          "per config)")
    many = (feasible * (a.min_configs // len(feasible) + 1))[:a.min_configs]
    jobs = [(problem, many[i:i + BATCH]) for i in range(0, len(many), BATCH)]
    t = time.perf_counter()
    with make_executor(workers=a.workers) as ex:
        for _ in ex.run(evaluate_batch, jobs):
            pass
    big = time.perf_counter() - t
    print(f"{len(many):,} configs on {a.workers} worker(s) (cold caches per worker): {big:.2f} s "
          f"({len(many) / big:,.0f} configs/s)")
    rows.sort(key=lambda r: -r["tokens_per_s"])
    for row in rows[:a.top]:
        t = time.perf_counter()
        out, _ = resimulate(problem, row)
        print(f"engine {row['key']}: {time.perf_counter() - t:.2f} s, closed form {row['step_time_s']:.3f} s vs engine "
              f"{out.get('engine_step_time_s', float('nan')):.3f} s")


if __name__ == "__main__":
    main()
