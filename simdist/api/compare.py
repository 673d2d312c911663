"""Hardware comparison (``simdist compare``): the best layout on each cluster, time, cost and energy to train.

Each cluster is a preset or a topology file with its own GPU count (``dgx-a100:1024``), or one count for all
(``--clusters A,B --gpus N``), or a size the comparison chooses from a common budget:
- ``budget_usd_per_hour``: as many whole nodes as the price per GPU-hour buys (equal spend per hour);
- ``budget_kw``: as many whole nodes as fit the power (GPUs at TDP x PUE, the energy column's assumption);
- ``days`` (with ``tokens``): a deadline; a cluster without a count gets the fewest nodes, doubling from one,
  whose best layout trains the tokens in time, and the answer is the cheapest cluster that makes it.
The model and training are a model preset's, or a base scenario's (its cluster replaced by each compared one).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from simdist.errors import LayoutError, LimitError, SpecError
from simdist.limits import GPUS
from simdist.units import ascii_int

DEADLINE_MAX_DOUBLINGS = 12
"""A deadline sizes a cluster by doubling its nodes from one: at most 2**12 nodes (each size is a search)."""


BUDGET_STEPS_DOWN = 8
"""Under a budget, a cluster whose affordable node count has no feasible layout (e.g. the global batch does not
split over it) tries up to this many fewer nodes."""


def parse_cluster_items(items: list[str]) -> list[tuple[str, int | None]]:
    """``NAME_OR_FILE[:GPUS]`` items of ``--cluster``."""
    out = []
    for item in items:
        name, sep, count = item.strip().rpartition(":")
        gpus = ascii_int(count.strip()) if sep else None
        if gpus is None:
            name = item.strip()
        if not name:
            raise SpecError(f"--cluster '{item}' names no cluster", field="--cluster",
                            fix="write PRESET_OR_FILE:GPUS, e.g. dgx-a100:1024 or my-roce.yaml:512")
        if gpus is not None and gpus < 1:
            raise SpecError(f"--cluster {item}: the GPU count must be at least 1", field="--cluster",
                            fix="write e.g. dgx-a100:1024")
        out.append((name, gpus))
    return out


def compare(model: str | None = None, clusters: list[str] | None = None, gpus: int | None = None,
            tokens: float | None = None, *, sized: list[str] | None = None, scenario: str | Path | None = None,
            assignments: list[str] | None = None, global_batch_size: int | None = None,
            prices: list[str] | None = None, pue: float = 1.0, seq_length: int | None = None,
            precision: str | None = None, workers: int = 1, dask: Any = None,
            budget_usd_per_hour: float | None = None, budget_kw: float | None = None, days: float | None = None,
            max_tp: int | None = None, max_pp: int = 64, max_cp: int = 2, max_vpp: int = 4, max_micro_batch: int = 8,
            schedules: tuple[str, ...] = ("1f1b", "interleaved_1f1b")) -> dict[str, Any]:
    """Best layout per cluster, time, cost and energy to train ``tokens`` tokens (``simdist compare``).

    ``clusters`` with ``gpus``: presets or files at one size; ``sized``: ``NAME_OR_FILE[:GPUS]`` items, each at
    its own size (or sized by the budget). ``scenario``: a base scenario file (model, training; ``assignments``
    applied) instead of ``model``; ``global_batch_size`` (default 1536 with a model preset), ``seq_length`` and
    ``precision`` override it. One of ``budget_usd_per_hour`` (needs a price for every cluster), ``budget_kw``
    or ``days`` sizes the clusters without a count (module doc). ``max_tp`` ... ``schedules`` bound each
    cluster's layout search as `search`'s do (a smaller space: a faster comparison).
    """
    from simdist.api.checks import number
    from simdist.api.search import _check_search_args
    from simdist.limits import COMPARE_CLUSTERS, PRICE, PUE, TOKENS
    from simdist.search.compare import parse_prices, size_cluster

    if tokens is None:
        raise SpecError("no --tokens given", field="--tokens", fix="give the tokens to train, e.g. 300e9")
    number(tokens, "--tokens", low=0.0, low_inclusive=False, high=TOKENS, example="300e9")
    number(pue, "--pue", low=1.0, high=PUE, example="1.2")
    if scenario is None and model is None:
        raise SpecError("no model given", field="--model", fix="give --model PRESET or a scenario file")
    if scenario is not None and model is not None:
        raise SpecError("--model given with a scenario file", field="--model",
                        fix="set the scenario's model with --set model.preset=..., or drop the scenario")
    _check_search_args(gpus=gpus or 1, global_batch_size=global_batch_size or 1, seq_length=seq_length,
                       workers=workers)
    entries: list[tuple[str, int | None]] = []
    if clusters:
        names = [c.strip() for c in clusters if c.strip()]
        entries += [(c, gpus) for c in names]
        if not names:
            raise SpecError("no cluster given", field="--clusters", fix="give e.g. dgx-a100,dgx-h100,gb200-nvl72")
    entries += parse_cluster_items(sized or [])
    entries = list(dict.fromkeys(entries))  # each once: each is a whole search
    if not entries:
        raise SpecError("no cluster given", field="--cluster",
                        fix="give --cluster dgx-a100:1024 --cluster dgx-h100:512, or --clusters A,B --gpus N")
    if len(entries) > COMPARE_CLUSTERS.value:
        raise SpecError(f"{len(entries)} clusters to compare, above the limit of {COMPARE_CLUSTERS.text()} "
                        f"({COMPARE_CLUSTERS.reason})", field="--clusters", fix="compare fewer clusters at once")
    budgets = [f for f, v in (("--budget-usd-per-hour", budget_usd_per_hour), ("--budget-kw", budget_kw),
                              ("--days", days)) if v is not None]
    if len(budgets) > 1:
        raise SpecError(f"{' and '.join(budgets)} given together", field=budgets[1],
                        fix="give one budget: a price per hour, a power, or a deadline")
    unsized = [name for name, g in entries if g is None]
    if unsized and not budgets:
        raise SpecError(f"no GPU count for {unsized[0]}", field="--cluster",
                        fix=f"write {unsized[0]}:GPUS, give --gpus, or size by a budget (--budget-usd-per-hour, "
                            "--budget-kw, --days)")
    if budgets and budgets[0] != "--days" and len(unsized) < len(entries):
        sized_one = next(name for name, g in entries if g is not None)
        raise SpecError(f"{sized_one} has a GPU count and {budgets[0]} sizes every cluster", field="--cluster",
                        fix=f"drop the counts (--cluster {sized_one}) or the budget")
    names = list(dict.fromkeys(name for name, _ in entries))
    for name in names:  # every cluster resolved and built before any is searched: a typo in the last is refused
        size_cluster(name, 1, field="--cluster")  # at once, not after the others' searches
        _gpu_figures(name)
    price_map = parse_prices(prices or [], names)
    for name, usd in price_map.items():
        number(usd, f"--price {name}", high=PRICE, example="2.5")
    if budget_usd_per_hour is not None:
        number(budget_usd_per_hour, "--budget-usd-per-hour", low=0.0, low_inclusive=False, example="20000")
        missing = [n for n in names if n not in price_map]
        if missing:
            raise SpecError(f"--budget-usd-per-hour needs the price of {missing[0]}", field="--price",
                            fix=f"give --price {missing[0]}=USD_per_GPU_hour")
    if budget_kw is not None:
        number(budget_kw, "--budget-kw", low=0.0, low_inclusive=False, example="1000")
    if days is not None:
        number(days, "--days", low=0.0, low_inclusive=False, example="30")
    bounds = {"max_tp": max_tp, "max_pp": max_pp, "max_cp": max_cp, "max_vpp": max_vpp,
              "max_micro_batch": max_micro_batch, "schedules": tuple(dict.fromkeys(schedules))}
    if scenario is None and assignments:
        raise SpecError("--set sets a scenario's fields, and compare --model has no scenario", field="--set",
                        fix="put the model and training in a scenario file and compare it (simdist compare "
                            "SCENARIO --cluster ...), or drop --set")
    base = {"scenario": scenario, "assignments": assignments or [], "model": model,
            "global_batch_size": global_batch_size, "seq_length": seq_length, "precision": precision,
            "bounds": bounds}
    budget = {"usd_per_hour": budget_usd_per_hour, "kw": budget_kw, "days": days}
    rows = _compare_rows(entries, base, budget, tokens=tokens, prices=price_map, pue=pue, workers=workers, dask=dask)
    from simdist.api.provenance import version

    doc: dict[str, Any] = {"model": model if model is not None else str(scenario), "gpus": gpus, "tokens": tokens,
                           "global_batch_size": global_batch_size or (_scenario_batch(rows) if scenario is not None
                                                                      else 1536),
                           "pue": pue, "energy_assumption": "every GPU at its TDP for the whole run, times the PUE "
                                                            "(1.0: GPUs only)",
                           "rows": rows, "simdist_version": version()}
    if scenario is not None:
        doc["scenario"] = str(scenario)
    if budgets:
        doc["budget"] = {k: v for k, v in budget.items() if v is not None}
        doc["answer"] = answer(rows, budget)
    return doc


def _scenario_batch(rows: list[dict[str, Any]]) -> int | None:
    return next((r["global_batch_size"] for r in rows if "global_batch_size" in r), None)


def _problem(name: str, num_gpus: int, base: dict[str, Any], *, rounded: bool) -> tuple[Any, Any]:
    """(ClusterSize, SearchProblem) of ``name`` at ``num_gpus`` GPUs (``rounded``: up to whole nodes, noted)."""
    from simdist.api.search import cluster_section, scenario_problem
    from simdist.search.compare import ClusterSize, size_cluster
    from simdist.search.space import SearchProblem

    size = size_cluster(name, num_gpus, field="--cluster")
    if size.gpus_used_per_node:  # part of each rack: the job's placement on the cluster
        return size, _placed_problem(name, size, base)
    if size.note and not rounded:
        raise LayoutError(f"{num_gpus} GPUs do not fill whole nodes of {name} ({size.gpus_per_node} GPUs per node)",
                          field="--cluster", fix=f"use a multiple of {size.gpus_per_node}, e.g. {size.num_gpus}")
    if base["scenario"] is not None:
        problem = scenario_problem(base["scenario"], _assignments(base), num_gpus=size.num_gpus,
                                   cluster=cluster_section(name), **base["bounds"])
        size = ClusterSize(name, size.gpus_per_node, size.num_nodes, size.num_gpus, size.note)
        return size, problem
    return size, SearchProblem(model=base["model"], cluster=name, num_nodes=size.num_nodes,
                               global_batch_size=base["global_batch_size"] or 1536, seq_length=base["seq_length"],
                               precision=base["precision"] or "bf16", **base["bounds"])


def _assignments(base: dict[str, Any]) -> list[str]:
    """The base scenario's assignments and the flags that override its fields (--global-batch, --seq, ...)."""
    return [*base["assignments"], *(f"{k}={v}" for k, v in (
        ("training.global_batch_size", base["global_batch_size"]), ("model.seq_length", base["seq_length"]),
        ("training.precision", base["precision"])) if v is not None)]


def _placed_problem(name: str, size: Any, base: dict[str, Any]) -> Any:
    """The search problem of ``base`` on ``size.num_nodes`` nodes of ``name``, ``size.gpus_used_per_node`` GPUs of
    each (``cluster.placement``, as a scenario places a job on part of a cluster)."""
    from simdist.api.provenance import resolved_scenario
    from simdist.api.search import cluster_section, scenario_problem
    from simdist.search.evaluate import base_spec
    from simdist.search.space import SearchProblem, canonical_json

    placement = {"num_nodes": size.num_nodes, "gpus_per_node": size.gpus_used_per_node}
    section = {**cluster_section(name), "num_nodes": size.num_nodes, "placement": placement}
    if base["scenario"] is not None:
        return scenario_problem(base["scenario"], _assignments(base), cluster=section, **base["bounds"])
    whole = SearchProblem(model=base["model"], cluster=name, num_nodes=size.num_nodes,
                          global_batch_size=base["global_batch_size"] or 1536, seq_length=base["seq_length"],
                          precision=base["precision"] or "bf16", **base["bounds"])
    data = resolved_scenario(base_spec(whole), base_dir=Path.cwd())
    data["cluster"]["placement"] = placement
    return SearchProblem(model=whole.model, cluster=name, num_nodes=size.num_nodes,
                         global_batch_size=whole.global_batch_size, seq_length=whole.seq_length,
                         precision=whole.precision, base=canonical_json(data), **base["bounds"])


def _gpu_figures(name: str) -> tuple[int, float]:
    """(GPUs per node, TDP in W) of a cluster preset or file (a one-node build)."""
    from simdist.errors import SimdistError
    from simdist.hardware import load_topology

    try:
        topology = load_topology(name, num_nodes=1)
    except SimdistError as err:
        raise err.located(field_prefix="--cluster") from None
    return topology.gpus_per_node, topology.gpu.tdp_w


def _compare_rows(entries: list[tuple[str, int | None]], base: dict[str, Any], budget: dict[str, Any], *,
                  tokens: float, prices: dict[str, float], pue: float, workers: int, dask: Any
                  ) -> list[dict[str, Any]]:
    from simdist.search.compare import compare_problems
    from simdist.search.executors import make_executor

    rows: list[dict[str, Any]] = []
    with make_executor(workers=workers, dask=dask) as executor:
        for name, gpus in entries:
            if gpus is None and budget["days"] is not None:
                rows.append(_deadline_row(name, base, tokens=tokens, days=budget["days"], prices=prices, pue=pue,
                                          executor=executor))
                continue
            how = ""
            if gpus is None:
                gpn, tdp = _gpu_figures(name)
                if budget["usd_per_hour"] is not None:
                    per_node = prices[name] * gpn
                    nodes = math.floor(budget["usd_per_hour"] / per_node) if per_node > 0 else 0
                    how = (f"{budget['usd_per_hour']:,.0f} USD/h buys {_nodes(nodes)} at {prices[name]:g} USD per "
                           f"GPU-hour")
                else:
                    # Assumption: a power budget counts the GPUs at TDP times the PUE, as the energy column does
                    # (host CPUs, NICs and switches are inside the PUE factor).
                    per_node = gpn * tdp * pue / 1e3
                    nodes = math.floor(budget["kw"] / per_node) if per_node > 0 else 0
                    how = (f"{budget['kw']:,.0f} kW powers {_nodes(nodes)} at {per_node:.2f} kW each (TDP x PUE "
                           f"{pue:g})")
                if nodes < 1:
                    rows.append({"cluster": name, "num_gpus": 0, "note": how, "error": "the budget buys no node"})
                    continue
                if nodes * gpn > GPUS.value:  # the budget's own flag, not --num-nodes (compare has none)
                    flag = "--budget-usd-per-hour" if budget["usd_per_hour"] is not None else "--budget-kw"
                    raise LimitError(f"{how}: {nodes * gpn:,} GPUs, above the limit of {GPUS.text()} "
                                     f"({GPUS.reason})", field=flag,
                                     fix=f"give a budget of at most {GPUS.value / (nodes * gpn):.3g} x this one")
                gpus = nodes * gpn
            size, problem = _problem(name, gpus, base, rounded=True)
            if how:  # a budget: the most nodes within it whose GPUs split the global batch (and fit)
                size, problem, row, how = _within_budget(name, size, problem, base, how, tokens=tokens, prices=prices,
                                                         pue=pue, executor=executor)
            else:
                row = compare_problems([(size, problem)], tokens=tokens, prices=prices, executor=executor,
                                       pue=pue)[0]
            row["label"] = f"{name} x {size.num_gpus}"
            row["global_batch_size"] = problem.global_batch_size
            if how:
                row["sized_by"] = how
            if budget["days"] is not None and "error" not in row:
                row["meets_deadline"] = row["time_to_train_days"] <= budget["days"]
            rows.append(row)
    return rows


def _nodes(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def _within_budget(name: str, size: Any, problem: Any, base: dict[str, Any], how: str, *, tokens: float,
                   prices: dict[str, float], pue: float, executor: Any) -> tuple[Any, Any, dict[str, Any], str]:
    """The most nodes (at most ``size``'s) with a feasible layout: counts whose GPUs no tp x cp x pp of the space
    splits the global batch over are skipped by arithmetic (simdist.search.space.splits_the_batch), and up to
    BUDGET_STEPS_DOWN searched counts that still have none (memory) step down further."""
    from simdist.search.compare import compare_problems
    from simdist.search.evaluate import context
    from simdist.search.space import splits_the_batch

    gpn, afford = size.gpus_per_node, size.num_nodes
    layers = context(problem).model.num_layers
    row: dict[str, Any] = {"cluster": name, "num_gpus": 0, "note": "", "error": "no node count within the budget "
                           "has a feasible layout"}
    searched = 0
    for nodes in range(afford, 0, -1):
        if searched >= BUDGET_STEPS_DOWN:
            break
        if nodes != afford:
            size, problem = _problem(name, nodes * gpn, base, rounded=True)
        if not splits_the_batch(problem, num_gpus=nodes * gpn, gpus_per_node=gpn, num_layers=layers):
            continue
        searched += 1
        row = compare_problems([(size, problem)], tokens=tokens, prices=prices, executor=executor, pue=pue)[0]
        if "error" not in row:
            if nodes != afford:
                how += (f"; using {nodes}, the most with a feasible layout (global batch "
                        f"{problem.global_batch_size} over data-parallel replicas)")
            break
    return size, problem, row, how


def _deadline_row(name: str, base: dict[str, Any], *, tokens: float, days: float, prices: dict[str, float],
                  pue: float, executor: Any) -> dict[str, Any]:
    """The fewest nodes of ``name`` (doubling from one) whose best layout trains ``tokens`` within ``days``."""
    from simdist.search.compare import compare_problems

    gpn, _ = _gpu_figures(name)
    tried: list[str] = []
    last: dict[str, Any] | None = None
    for k in range(DEADLINE_MAX_DOUBLINGS + 1):
        nodes = 2**k
        size, problem = _problem(name, nodes * gpn, base, rounded=True)
        row = compare_problems([(size, problem)], tokens=tokens, prices=prices, executor=executor, pue=pue)[0]
        if "error" in row:
            tried.append(f"{nodes} nodes: {row['error']}")
            continue
        last = row
        tried.append(f"{nodes} nodes: {row['time_to_train_days']:.1f} days")
        if row["time_to_train_days"] <= days:
            row.update({"label": f"{name} x {size.num_gpus}", "global_batch_size": problem.global_batch_size,
                        "meets_deadline": True, "sized_by": f"fewest nodes (doubling) that make {days:g} days: "
                                                            + "; ".join(tried)})
            return row
    out = last or {"cluster": name, "num_gpus": 0, "note": "", "error": "no feasible layout at any size"}
    if last is not None:
        out.update({"label": f"{name} x {last['num_gpus']}", "meets_deadline": False,
                    "sized_by": "no size up to " + f"{2**DEADLINE_MAX_DOUBLINGS} nodes makes the deadline: "
                                + "; ".join(tried[-3:])})
    return out


def answer(rows: list[dict[str, Any]], budget: dict[str, Any]) -> dict[str, Any]:
    """The comparison's answer: under a price or power budget, the cluster that trains soonest; under a deadline,
    the cheapest that makes it (by cost where every candidate has a price, else by GPU-hours)."""
    ok = [r for r in rows if "error" not in r]
    if budget["days"] is not None:
        making = [r for r in ok if r.get("meets_deadline")]
        if not making:
            return {"question": f"cheapest cluster that trains in {budget['days']:g} days", "cluster": None,
                    "reason": "no compared cluster makes the deadline"}
        priced = all(r["cost_usd"] is not None for r in making)
        best = min(making, key=lambda r: (r["cost_usd"] if priced else r["gpu_hours"], r["time_to_train_s"]))
        return {"question": f"cheapest cluster that trains in {budget['days']:g} days", "cluster": best["label"],
                "by": "cost_usd" if priced else "gpu_hours",
                "cost_usd": best["cost_usd"], "gpu_hours": best["gpu_hours"],
                "time_to_train_days": best["time_to_train_days"]}
    what = (f"{budget['usd_per_hour']:,.0f} USD per hour" if budget["usd_per_hour"] is not None
            else f"{budget['kw']:,.0f} kW")
    if not ok:
        return {"question": f"fastest cluster for {what}", "cluster": None, "reason": "no cluster has a layout"}
    best = min(ok, key=lambda r: r["time_to_train_s"])
    return {"question": f"fastest cluster for {what}", "cluster": best["label"],
            "time_to_train_days": best["time_to_train_days"], "cost_usd": best["cost_usd"]}
