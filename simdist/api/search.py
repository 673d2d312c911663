"""Layout search and hardware comparison (simdist search, simdist compare)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simdist.errors import LayoutError, SpecError
from simdist.hardware import preset_names

# --------------------------------------------------------------------------- layout search and hardware comparison
# (issue 7: `simdist search`, `simdist compare`; keep this section contiguous)
WALL_TIME_KEYS = ("sweep_s", "engine_s")
"""Measured wall times of a search: in its text table, not in its JSON (which identical inputs reproduce)."""


@dataclass
class SearchOutput:
    """A layout search: the JSON document, its text table, and the files written."""

    doc: dict[str, Any]
    text: str
    files: dict[str, Path]
    interrupted: bool


def search(model: str, cluster: str, gpus: int, global_batch_size: int, *, seq_length: int | None = None,
           precision: str = "bf16", max_tp: int | None = None, max_pp: int = 64, max_cp: int = 2, max_vpp: int = 4,
           max_micro_batch: int = 8, schedules: tuple[str, ...] = ("1f1b", "interleaved_1f1b"), top_k: int = 3,
           workers: int = 1, dask: Any = None, results_file: str | Path | None = None,
           html: str | Path | None = None, explain_pruned: bool = False, rows: int = 10,
           on_total: Any = None, on_progress: Any = None, zero3_fetch: str = "prefetch",
           zero_with_pp: bool = True) -> SearchOutput:
    """Rank every feasible layout of ``model`` on ``gpus`` GPUs of ``cluster`` (``simdist search``).

    ``zero3_fetch``: how ZeRO-3 layouts move parameters (training.zero3_fetch): prefetch or per_parameter.
    ``zero_with_pp``: also try ZeRO-2/3 with pipeline stages (simdist.search.space.SearchProblem.zero_with_pp).

    The closed form (simdist.analytic.step) ranks them; the engine re-simulates the ``top_k``. ``dask``: a
    scheduler address (or a distributed.Client) to evaluate on; ``results_file``: JSON lines written as results
    arrive and read back to resume.
    """
    from simdist.files import check_target, write_text
    from simdist.report.search_html import search_report_html
    from simdist.report.search_table import search_text
    from simdist.search.compare import size_cluster
    from simdist.search.executors import make_executor
    from simdist.search.rank import run_search
    from simdist.search.space import SearchProblem

    _check_search_args(gpus=gpus, global_batch_size=global_batch_size, seq_length=seq_length, top_k=top_k,
                       workers=workers, rows=rows)
    if html is not None:
        check_target(html, field="--html")
    if results_file is not None:
        check_target(results_file, field="--out")
    size = size_cluster(cluster, gpus) if cluster in _preset_set() else None
    if size is None:
        raise SpecError(f"unknown cluster '{cluster}'", field="--cluster",
                        fix=f"use a preset from: {', '.join(preset_names())}")
    if size.note:
        raise LayoutError(f"{gpus} GPUs do not fill whole nodes of {cluster} ({size.gpus_per_node} GPUs per node)",
                          field="--gpus", fix=f"use a multiple of {size.gpus_per_node}, e.g. {size.num_gpus}")
    problem = SearchProblem(model=model, cluster=cluster, num_nodes=size.num_nodes,
                            global_batch_size=global_batch_size, seq_length=seq_length, precision=precision,
                            max_tp=max_tp, max_pp=max_pp, max_cp=max_cp, max_vpp=max_vpp,
                            max_micro_batch=max_micro_batch, schedules=tuple(dict.fromkeys(schedules)),
                            zero3_fetch=zero3_fetch, zero_with_pp=zero_with_pp)
    with make_executor(workers=workers, dask=dask) as executor:
        outcome = run_search(problem, executor, top_k=top_k,
                             results_file=Path(results_file) if results_file is not None else None,
                             on_total=on_total, on_progress=on_progress, exact_top=rows)
    doc = outcome.to_dict(explain_pruned=explain_pruned)
    text = search_text(doc, top=rows, explain_pruned=explain_pruned)
    files: dict[str, Path] = {}
    if html is not None:
        w = outcome.winner
        page = search_report_html(doc, winner_graph=w.plan.graph if w else None, winner_trace=w.trace if w else None,
                                  winner_result=w.result if w else None, table_text=text)
        files["html"] = write_text(html, page, field="--html")
    # Wall times stay in the text; the JSON is a function of the inputs alone (byte-identical across runs).
    doc = {k: v for k, v in doc.items() if k not in WALL_TIME_KEYS}
    return SearchOutput(doc, text, files, outcome.interrupted)


def _preset_set() -> set[str]:
    return set(preset_names())


def _check_search_args(*, gpus: int, global_batch_size: int, seq_length: int | None, top_k: int = 0,
                       workers: int = 1, rows: int = 1) -> None:
    """The numbers of `search` / `compare` (SearchProblem.check bounds the rest of the space)."""
    from simdist.api.checks import whole
    from simdist.limits import GLOBAL_BATCH, SEARCH_GPUS, SEQ_LENGTH, TOP_K, WORKERS

    whole(gpus, "--gpus", limit=SEARCH_GPUS, example="1024")
    whole(global_batch_size, "--global-batch", limit=GLOBAL_BATCH, example="1536")
    if seq_length is not None:
        whole(seq_length, "--seq", limit=SEQ_LENGTH, example="2048")
    whole(top_k, "--top", minimum=0, limit=TOP_K, example="3")
    whole(workers, "--workers", limit=WORKERS, example="4")
    whole(rows, "--rows", minimum=0, example="10")


def compare(model: str, clusters: list[str], gpus: int, tokens: float, *, global_batch_size: int = 1536,
            prices: list[str] | None = None, pue: float = 1.0, seq_length: int | None = None, precision: str = "bf16",
            workers: int = 1, dask: Any = None) -> dict[str, Any]:
    """Best layout per cluster, time, cost and energy to train ``tokens`` tokens (``simdist compare``)."""
    from simdist.api.checks import number
    from simdist.limits import COMPARE_CLUSTERS, PRICE, PUE, TOKENS
    from simdist.search.compare import compare_clusters, parse_prices
    from simdist.search.executors import make_executor

    number(tokens, "--tokens", low=0.0, low_inclusive=False, high=TOKENS, example="300e9")
    number(pue, "--pue", low=1.0, high=PUE, example="1.2")
    _check_search_args(gpus=gpus, global_batch_size=global_batch_size, seq_length=seq_length, workers=workers)
    names = list(dict.fromkeys(c.strip() for c in clusters if c.strip()))  # each once: each is a whole search
    if len(names) > COMPARE_CLUSTERS.value:
        raise SpecError(f"{len(names)} clusters to compare, above the limit of {COMPARE_CLUSTERS.text()} "
                        f"({COMPARE_CLUSTERS.reason})", field="--clusters", fix="compare fewer clusters at once")
    if not names:
        raise SpecError("no cluster given", field="--clusters", fix="give e.g. dgx-a100,dgx-h100,gb200-nvl72")
    price_map = parse_prices(prices or [], names)
    for name, usd in price_map.items():
        number(usd, f"--price {name}", high=PRICE, example="2.5")
    with make_executor(workers=workers, dask=dask) as executor:
        rows = compare_clusters(model, names, gpus=gpus, tokens=tokens, global_batch_size=global_batch_size,
                                prices=price_map, executor=executor, pue=pue, seq_length=seq_length,
                                precision=precision)
    return {"model": model, "gpus": gpus, "tokens": tokens, "global_batch_size": global_batch_size, "pue": pue,
            "energy_assumption": "every GPU at its TDP for the whole run, times the PUE (1.0: GPUs only)",
            "rows": rows}
