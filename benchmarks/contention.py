"""How the search's closed form ranks contended layouts against the engine (issue 32, item 2).

Run from the repository root with the project's virtualenv active:

    python benchmarks/contention.py [--limit N] [--out rows.csv]

A grid of GPT-3 175B layouts on 16 DGX A100 over RoCE (scenarios/gpt3-175b-roce.yaml): tp x pp x dp of 128 GPUs,
every distinct mesh axis order, leaf-spine oversubscription 1-4, 8 or 4 NICs per node, with and without a failed
leaf-spine link. For each the engine's step (simdist.predict.step.predict_step: collectives on shared links, max-min
fair) and two closed forms: alone (simdist.analytic.step with CommPricer: what `run --fidelity closed_form` reports)
and with the contention estimate search ranks by (simdist.search.contention.ContendedPricer). Printed: Spearman's
rank correlation of each closed form with the engine, the median and p90 of |closed form / engine - 1|, and the
bias (median of closed form / engine - 1).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from simdist import api
from simdist.analytic.step import CommPricer, analytic_step
from simdist.errors import SimdistError
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.predict.step import predict_step
from simdist.search.contention import ContendedPricer
from simdist.search.space import placement_orders

SCENARIO = "scenarios/gpt3-175b-roce.yaml"
MESHES = ((8, 8, 2), (4, 8, 4), (8, 4, 4), (4, 4, 8), (8, 2, 8), (2, 8, 8), (4, 2, 16))
"""(tp, pp, dp) over 128 GPUs."""


def grid() -> list[list[str]]:
    out = []
    for (tp, pp, dp), over, nics, failed in itertools.product(MESHES, (1, 2, 3, 4), (8, 4), (False, True)):
        for order in placement_orders({"tp": tp, "cp": 1, "dp": dp, "pp": pp}, ("tp", "cp", "dp", "pp")):
            sets = [f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.dp={dp}",
                    f"cluster.inter_node.oversubscription={over}", f"cluster.inter_node.nics_per_node={nics}",
                    f"parallel.order={order or 'tp-cp-dp-pp'}"]
            if failed:
                sets.append("faults.failed_links=[{src: leaf0, dst: spine0}]")
            out.append(sets)
    return out


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=0, help="the first N layouts of the grid only")
    ap.add_argument("--out", type=Path, help="write every layout's three step times as CSV")
    a = ap.parse_args()
    points = grid()[:a.limit or None]
    rows = []
    t0 = time.perf_counter()
    for sets in points:
        try:
            sc = api.load_scenario(SCENARIO, sets)
            cfg = step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
            alone = analytic_step(cfg, CommPricer(sc.topology)).step_time_s
            contended = analytic_step(cfg, ContendedPricer(sc.topology, cfg.mesh, CommPricer(sc.topology))).step_time_s
            engine = predict_step(sc.spec, sc.topology).result["step_time_s"]
        except SimdistError as err:
            print(f"skipped {' '.join(sets)}: {err.one_line()}")
            continue
        rows.append((" ".join(sets), alone, contended, engine))
    wall = time.perf_counter() - t0
    r = np.array([x[1:] for x in rows])
    print(f"{len(rows)} layouts ({wall:.0f} s); engine step {r[:, 2].min():.3f}-{r[:, 2].max():.3f} s")
    for name, col in (("closed form alone", 0), ("closed form + contention", 1)):
        ratio = r[:, col] / r[:, 2] - 1
        print(f"{name:26s} Spearman {spearman(r[:, col], r[:, 2]):.3f}, median |ratio - 1| "
              f"{statistics.median(np.abs(ratio)):.2%}, p90 {np.quantile(np.abs(ratio), 0.9):.2%}, bias (median "
              f"ratio - 1) {statistics.median(ratio):+.2%}")
    if a.out is not None:
        with open(a.out, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["sets", "closed_form_alone_s", "closed_form_contended_s", "engine_s"])
            w.writerows(rows)


if __name__ == "__main__":
    main()
