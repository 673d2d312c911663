"""Run a layout search: enumerate, prune, rank every feasible layout by the closed form, re-simulate the top k.

The sweep runs on any executor (simdist.search.executors) in batches; results are written to a results file
as they arrive (simdist.search.results) and ranked by throughput, ties broken by enumeration order, so the
ranking is the same whichever executor ran it. Ctrl-C stops the sweep and keeps what finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simdist.analytic.step import analytic_step
from simdist.errors import LayoutError, SimdistError
from simdist.predict.step import StepPrediction, predict_step
from simdist.search.evaluate import candidate_spec, context, evaluate_batch
from simdist.search.executors import Executor
from simdist.search.prune import RULES, Pruned, why_pruned
from simdist.search.space import Candidate, SearchProblem, base_order, placement_orders, raw_candidates
from simdist.search.sweep import sweep


@dataclass(slots=True)
class SearchOutcome:
    problem: SearchProblem
    num_gpus: int
    gpus_per_node: int
    candidates: int
    """Layouts enumerated (before pruning)."""
    feasible: int
    pruned: list[Pruned]
    ranked: list[dict[str, Any]]
    """Closed-form results, best first."""
    bounded: list[dict[str, Any]] = field(default_factory=list)
    """Layouts a lower bound rules out of the top (slower than the last ranked one shown, and dominated on
    memory and throughput): their bound, not their closed form (simdist.search.sweep)."""
    engine: list[dict[str, Any]] = field(default_factory=list)
    """The top k re-simulated by the engine: closed form and engine side by side."""
    interrupted: bool = False
    evaluated_now: int = 0
    resumed: int = 0
    sweep_s: float = 0.0
    engine_s: float = 0.0
    executor: str = ""
    winner: StepPrediction | None = None
    placement: dict[str, Any] | None = None
    """Where the mesh axis order is searched: the winner against the same layout in the base scenario's order."""

    def pruned_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(RULES, 0)
        for p in self.pruned:
            counts[p.rule] += 1
        return {k: v for k, v in counts.items() if v}

    def to_dict(self, *, explain_pruned: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "problem": self.problem.as_dict(), "num_gpus": self.num_gpus, "candidates": self.candidates,
            "feasible": self.feasible, "evaluated": len(self.ranked), "evaluated_now": self.evaluated_now,
            "resumed": self.resumed, "bounded_count": len(self.bounded),
            "interrupted": self.interrupted,
            "pruned_counts": self.pruned_counts(), "executor": self.executor, "sweep_s": self.sweep_s,
            "engine_s": self.engine_s, "ranked": self.ranked, "bounded": self.bounded, "engine": self.engine,
        }
        if explain_pruned:
            out["pruned"] = [{"key": p.candidate.key, "rule": p.rule, "reason": p.reason} for p in self.pruned]
        if self.placement is not None:
            out["placement"] = self.placement
        out["infeasible_cells"] = self.infeasible_cells()
        return out

    def infeasible_cells(self) -> dict[str, str]:
        """"tp,pp" -> why no layout of that (tp, pp) is feasible: the rule that pruned most of them, with the count
        (the search heatmap's grey cells)."""
        feasible = {(r["layout"]["tp"], r["layout"]["pp"]) for r in (*self.ranked, *self.bounded)}
        rules: dict[tuple[int, int], dict[str, int]] = {}
        for p in self.pruned:
            cell = (p.candidate.tp, p.candidate.pp)
            if cell not in feasible:
                counts = rules.setdefault(cell, {})
                counts[p.rule] = counts.get(p.rule, 0) + 1
        return {f"{t},{pp}": ", ".join(f"{rule} {n}" for rule, n in sorted(c.items(), key=lambda kv: -kv[1]))
                for (t, pp), c in sorted(rules.items())}


def enumerate_feasible(problem: SearchProblem) -> tuple[list[Candidate], list[Pruned], int, int, int]:
    """(feasible candidates in enumeration order, pruned, enumerated count, GPUs, GPUs per node)."""
    problem.check()
    ctx = context(problem)
    topo, model = ctx.topology, ctx.model
    feasible: list[Candidate] = []
    pruned: list[Pruned] = []
    n = 0
    for c in raw_candidates(problem, num_gpus=topo.num_gpus, gpus_per_node=topo.gpus_per_node,
                            num_layers=model.num_layers, num_experts=model.num_experts):
        n += 1
        why = why_pruned(problem, c, ctx)
        if why is None:
            feasible.append(c)
        else:
            pruned.append(why)
    if not feasible:
        if not pruned:
            raise LayoutError(f"no layout of {topo.num_gpus} GPUs fits the bounds (tp <= "
                              f"{problem.max_tp or topo.gpus_per_node}, pp <= {problem.max_pp})", field="--gpus",
                              fix="raise --max-tp / --max-pp or change --gpus")
        last = max(pruned, key=lambda p: RULES.index(p.rule))
        killed = sum(1 for p in pruned if p.rule == last.rule)
        raise LayoutError(
            f"no feasible layout among {n} candidates: the last {killed} were pruned by the {last.rule} constraint "
            f"(e.g. {last.candidate.key}: {last.reason})", field="--gpus",
            fix="add GPUs, raise the global batch, or allow more recompute/ZeRO (see --explain-pruned)")
    return feasible, pruned, n, topo.num_gpus, topo.gpus_per_node


def resimulate(problem: SearchProblem, row: dict[str, Any]) -> tuple[dict[str, Any], StepPrediction | None]:
    """The engine path (simdist.predict.step.predict_step) on a ranked row; its figures beside the closed form."""
    c = Candidate.from_dict(row["layout"])
    ctx = context(problem)
    out: dict[str, Any] = {"key": c.key, "layout": row["layout"], "closed_form_step_time_s": row["step_time_s"],
                           "closed_form_tokens_per_s": row["tokens_per_s"]}
    try:
        spec = candidate_spec(problem, ctx.base, c)
        prediction = predict_step(spec, ctx.topology)
    except SimdistError as err:
        out["engine_error"] = err.one_line()
        return out, None
    r = prediction.result
    out.update({"engine_step_time_s": r["step_time_s"], "engine_tokens_per_s": r["tokens_per_s"],
                "engine_mfu": r["mfu"], "bubble_fraction": r["bubble_fraction"],
                "memory_per_gpu_bytes": r["memory_per_gpu_bytes"], "fits_in_memory": r["fits_in_memory"],
                "closed_form_error": row["step_time_s"] / r["step_time_s"] - 1 if r["step_time_s"] > 0 else 0.0,
                # the engine's run samples the band already (simdist.predict.bands): no extra cost here
                "step_time_band_s": r["step_time_band_s"]})
    return out, prediction


def closed_form_band(problem: SearchProblem, row: dict[str, Any]) -> dict[str, float]:
    """The prediction band (p10, p50, p90: simdist.predict.bands.step_band) of a ranked row's closed-form step,
    for a row the engine did not re-simulate (about 30 closed-form evaluations: use it for the rows shown)."""
    from simdist.predict.bands import step_band
    from simdist.search.evaluate import step_config

    ctx = context(problem)
    cfg = step_config(problem, Candidate.from_dict(row["layout"]), ctx)
    # the band of the contention-free step (the pricer it perturbs), scaled by what the contention estimate adds
    alone = analytic_step(cfg, ctx.pricer, compiled=True).step_time_s if problem.contention else row["step_time_s"]
    band, _ = step_band(cfg, ctx.pricer, alone)
    scale = row["step_time_s"] / alone if alone > 0 else 1.0
    return {q: v * scale for q, v in band.items()}


def run_search(problem: SearchProblem, executor: Executor, *, top_k: int = 3, results_file: Path | None = None,
               on_total: Callable[[int], None] | None = None, on_progress: Callable[..., None] | None = None,
               exact_top: int = 10) -> SearchOutcome:
    """Enumerate, prune, rank by the closed form (`sweep`: the best ``max(exact_top, top_k)`` exactly, the
    rest bounded), re-simulate the top k with the engine."""
    feasible, pruned, n, num_gpus, gpn = enumerate_feasible(problem)
    if on_total:
        on_total(len(feasible))
    t0 = time.perf_counter()
    done, bounded, interrupted, new, resumed = sweep(problem, feasible, executor, results_file=results_file,
                                                     on_progress=on_progress, exact_top=max(exact_top, top_k, 1))
    sweep_s = time.perf_counter() - t0
    order = {c.key: i for i, c in enumerate(feasible)}
    ranked = sorted(done.values(), key=lambda r: (-r["tokens_per_s"], order[r["key"]]))
    rest = sorted(bounded.values(), key=lambda r: (r["step_time_lower_bound_s"], order[r["key"]]))
    outcome = SearchOutcome(problem, num_gpus, gpn, n, len(feasible), pruned, ranked, bounded=rest,
                            interrupted=interrupted,
                            evaluated_now=new, resumed=resumed, sweep_s=sweep_s, executor=executor.name)
    if interrupted:
        return outcome  # Ctrl-C: report what finished, skip the engine
    t1 = time.perf_counter()
    try:
        for i, row in enumerate(ranked[:top_k]):
            summary, prediction = resimulate(problem, row)
            outcome.engine.append(summary)
            if i == 0:
                outcome.winner = prediction
    except KeyboardInterrupt:  # Ctrl-C while re-simulating: keep the sweep and what was re-simulated
        outcome.interrupted = True
    if problem.placement and ranked and not outcome.interrupted:
        try:
            outcome.placement = placement_gain(problem, ranked[0], done, engine=outcome.engine)
        except KeyboardInterrupt:
            outcome.interrupted = True
    outcome.engine_s = time.perf_counter() - t1
    return outcome


def placement_gain(problem: SearchProblem, winner: dict[str, Any], done: dict[str, dict[str, Any]], *,
                   engine: list[dict[str, Any]]) -> dict[str, Any]:
    """Every placement (mesh axis order, `placement_orders`) of the winning layout, and how much the best gains
    over the base scenario's order (the default placement).

    The closed form prices each collective alone on its links, so it hardly tells orders apart (latency terms);
    where the placement matters, through links shared by concurrent groups (an oversubscribed fabric, ECMP), only
    the engine sees it. So with the engine on (``engine``: the re-simulated top k) every order of the winner is
    re-simulated and the best is chosen by the engine; without it, by the closed form.
    """
    c = Candidate.from_dict(winner["layout"])
    default_order = "-".join(base_order(problem))
    sizes = {"tp": c.tp, "cp": c.cp, "dp": c.dp, "pp": c.pp}
    same = [Candidate.from_dict({**winner["layout"], "order": o}) for o in placement_orders(sizes, base_order(problem))]
    # the orders `simdist run` would refuse for this layout (a mixture-of-experts model's expert layers need the dense
    # ones' pipeline groups: pp outermost) are no placement of it
    ctx = context(problem)
    same = [k for k in same if k.key == c.key or k.key in done or why_pruned(problem, k, ctx) is None]
    missing = [k for k in same if k.key not in done]
    rows = {**{k.key: done[k.key] for k in same if k.key in done},
            **{r["key"]: r for r in (evaluate_batch(problem, missing) if missing else [])}}
    simulated = {e["key"]: e for e in engine}
    by_engine = bool(engine)
    orders = []
    for k in same:
        row = rows[k.key]
        item: dict[str, Any] = {"order": k.order or default_order, "key": k.key, "step_time_s": row["step_time_s"]}
        if by_engine:
            e = simulated.get(k.key) or resimulate(problem, row)[0]
            if "engine_step_time_s" in e:
                item["engine_step_time_s"] = e["engine_step_time_s"]
        orders.append(item)
    figure = "engine_step_time_s" if by_engine and all("engine_step_time_s" in o for o in orders) else "step_time_s"
    best = min(orders, key=lambda o: o[figure])  # ties: the default order (first)
    default = orders[0]
    out: dict[str, Any] = {"order": best["order"], "default_order": default_order, "chosen_by":
                           "engine" if figure == "engine_step_time_s" else "closed_form",
                           "step_time_s": best["step_time_s"], "default_step_time_s": default["step_time_s"],
                           "gain": default["step_time_s"] / best["step_time_s"] - 1 if best["step_time_s"] > 0
                           else 0.0, "orders": orders}
    if figure == "engine_step_time_s":
        out.update({"engine_step_time_s": best[figure], "default_engine_step_time_s": default[figure],
                    "engine_gain": default[figure] / best[figure] - 1 if best[figure] > 0 else 0.0})
    if len(orders) == 1:
        out["note"] = "every order places this layout's ranks alike"
    elif best is default:
        out["note"] = "the default order is the best placement of the winning layout"
    return out
