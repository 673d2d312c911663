"""``simdist search SCENARIO --grid key=v1,v2,...``: one layout search per combination of scenario fields.

Each ``--grid`` item names any scenario field by its dotted path (as ``--set`` does) and the values it takes,
comma-separated (quote a value that holds a comma); every value is read as YAML, as a ``--set`` value is. The
points are the product of the items' values, in the order written (the first item varies slowest). Each point
is a whole search (simdist.api.search.scenario_problem with the point's ``--set`` items added); the summary lists
the best layout of each.
"""

from __future__ import annotations

import csv
import itertools
from pathlib import Path
from typing import Any

from simdist.errors import LayoutError, SpecError

GRID_POINTS = 64
"""At most this many grid points (each is a whole layout search)."""


def grid_points(items: list[str]) -> list[dict[str, str]] | None:
    """The points of ``--grid`` items (each ``{field: value text}``), or None without any item."""
    if not items:
        return None
    axes: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpecError(f"grid item '{item}' is not key=v1,v2,...", field="--grid",
                            fix="write e.g. --grid cluster.inter_node.oversubscription=1,2,4")
        if key in axes:
            raise SpecError(f"grid field '{key}' given twice", field="--grid", fix="give each field once")
        parsed = next(csv.reader([values], skipinitialspace=True), [])
        cells = list(dict.fromkeys(v.strip() for v in parsed if v.strip()))
        if not cells:
            raise SpecError(f"grid field '{key}' has no value", field="--grid", fix=f"write e.g. {key}=1,2")
        axes[key] = cells
    count = 1
    for cells in axes.values():
        count *= len(cells)
    if count > GRID_POINTS:
        raise SpecError(f"the grid has {count} points, above the limit of {GRID_POINTS} (each is a whole search)",
                        field="--grid", fix="give fewer values")
    keys = list(axes)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*axes.values())]


def _point_path(path: str | Path | None, index: int, count: int) -> Path | None:
    """``results.jsonl`` -> ``results.2.jsonl`` for the third point (one file per point: one search each)."""
    if path is None:
        return None
    p = Path(path)
    return p if count == 1 else p.with_name(f"{p.stem}.{index}{p.suffix}")


def search_grid(scenario: str | Path, points: list[dict[str, str]], *, assignments: list[str],
                num_gpus: int | None, zero3_fetch: str | None, cluster: dict[str, Any] | None, bounds: dict[str, Any],
                results_file: str | Path | None, html: str | Path | None, top_k: int, workers: int, dask: Any,
                explain_pruned: bool, rows: int, on_total: Any, on_progress: Any) -> Any:
    """Search each point of the grid over the base scenario; Ctrl-C keeps the points that finished."""
    from simdist.api.search import SearchOutput, _search_one, scenario_problem
    from simdist.report.search_table import grid_text

    docs: list[dict[str, Any]] = []
    texts: list[str] = []
    files: dict[str, Path] = {}
    interrupted = False
    for i, point in enumerate(points):
        items = [*assignments, *(f"{k}={v}" for k, v in point.items())]
        try:
            problem = scenario_problem(scenario, items, num_gpus=num_gpus, zero3_fetch=zero3_fetch, cluster=cluster,
                                       **bounds)
        except SpecError as err:  # a value the field does not take: name the grid item
            raise SpecError(f"grid point {_label(point)}: {err.problem}", field="--grid", source=err.source,
                            fix=err.fix) from None
        try:
            out = _search_one(problem, top_k=top_k, workers=workers, dask=dask,
                              results_file=_point_path(results_file, i, len(points)),
                              html=_point_path(html, i, len(points)), explain_pruned=explain_pruned, rows=rows,
                              on_total=on_total, on_progress=on_progress)
        except LayoutError as err:  # no feasible layout at this point: say so, search the others
            docs.append({"values": point, "error": err.problem})
            texts.append(f"== {_label(point)}: {err.problem}\n")
            continue
        except KeyboardInterrupt:
            interrupted = True
            break
        docs.append({"values": point, **out.doc})
        texts.append(f"== {_label(point)}\n{out.text}")
        files.update({f"html {i}": f for f in out.files.values()})
        if out.interrupted:
            interrupted = True
            break
    doc = {"scenario": str(scenario), "grid": {k: list(dict.fromkeys(p[k] for p in points)) for k in points[0]},
           "num_points": len(points), "interrupted": interrupted, "points": docs, "summary": grid_summary(docs)}
    text = "".join(texts) + grid_text(doc)
    return SearchOutput(doc, text, files, interrupted)


def _label(point: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items())


def grid_summary(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The best layout of each grid point (the engine's figures where it ran), in the grid's order."""
    out = []
    for d in docs:
        row: dict[str, Any] = {"values": d["values"]}
        if "error" in d or not d.get("ranked"):
            row["error"] = d.get("error", "no layout evaluated")
            out.append(row)
            continue
        best = d["ranked"][0]
        engine = d["engine"][0] if d.get("engine") else {}
        row.update({"layout": best["key"], "step_time_s": best["step_time_s"], "tokens_per_s": best["tokens_per_s"],
                    "mfu": best["mfu"], "memory_per_gpu_bytes": best["memory_per_gpu_bytes"],
                    "engine_step_time_s": engine.get("engine_step_time_s"), "engine_mfu": engine.get("engine_mfu"),
                    "step_time_band_s": engine.get("step_time_band_s")})
        if d.get("placement"):
            row["placement"] = d["placement"]
        out.append(row)
    return out
