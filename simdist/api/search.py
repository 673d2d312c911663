"""Layout search and hardware comparison (simdist search, simdist compare)."""

from __future__ import annotations

import errno
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simdist.errors import LayoutError, OutputError, SimdistError, SpecError
from simdist.search.space import DEFAULT_MEMORY_HEADROOM

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


def search(model: str | None = None, cluster: str | None = None, gpus: int | None = None,
           global_batch_size: int | None = None, *, scenario: str | Path | None = None,
           assignments: list[str] | None = None, grid: list[str] | None = None, seq_length: int | None = None,
           precision: str | None = None, max_tp: int | None = None, max_pp: int = 64, max_cp: int = 2,
           max_vpp: int = 4, max_micro_batch: int = 8, schedules: tuple[str, ...] = ("1f1b", "interleaved_1f1b"),
           top_k: int = 3, workers: int = 1, dask: Any = None, results_file: str | Path | None = None,
           html: str | Path | None = None, explain_pruned: bool = False, rows: int = 10,
           on_total: Any = None, on_progress: Any = None, zero3_fetch: str | None = None,
           zero_with_pp: bool = True, placement: bool = False, framework_layouts: bool = True,
           memory_headroom: str | float = DEFAULT_MEMORY_HEADROOM, contention: bool = True) -> SearchOutput:
    """Rank every feasible layout of a model on a cluster (``simdist search``).

    Either ``model`` (a preset) on ``gpus`` GPUs of ``cluster`` (a preset or a topology file) with
    ``global_batch_size``, or ``scenario``: a scenario file (its cluster, model and training, after
    ``assignments``; ``gpus``, ``global_batch_size``, ``seq_length`` and ``precision`` override them when given)
    whose layout the search replaces. ``grid``: ``key=v1,v2,...`` items (any scenario field; a scenario is
    needed): one search per combination of their values, and a summary of the best of each
    (simdist.api.search_grid). ``placement``: also search the mesh axis order (parallel.order).

    ``zero3_fetch``: how ZeRO-3 layouts move parameters (training.zero3_fetch): prefetch or per_parameter.
    ``zero_with_pp``: also try ZeRO-2/3 with pipeline stages (simdist.search.space.SearchProblem.zero_with_pp).
    ``framework_layouts``: keep to the layouts the scenario's framework runs (simdist.search.framework_layouts).
    ``memory_headroom``: bytes (or text with a unit, "4 GiB") a layout leaves free per GPU beyond its modelled peak.
    ``contention``: rank by the closed form with its contention estimate (simdist.search.contention).

    The closed form (simdist.analytic.step) ranks them; the engine re-simulates the ``top_k``. ``dask``: a
    scheduler address (or a distributed.Client) to evaluate on; ``results_file``: JSON lines written as results
    arrive and read back to resume.
    """
    from simdist.files import check_target

    _check_search_args(gpus=gpus if gpus is not None else 1,
                       global_batch_size=global_batch_size if global_batch_size is not None else 1,
                       seq_length=seq_length, top_k=top_k, workers=workers, rows=rows)
    if html is not None:
        check_target(html, field="--html")
    if results_file is not None:
        check_target(results_file, field="--out")
    bounds = {"max_tp": max_tp, "max_pp": max_pp, "max_cp": max_cp, "max_vpp": max_vpp,
              "max_micro_batch": max_micro_batch, "schedules": tuple(dict.fromkeys(schedules)),
              "zero_with_pp": zero_with_pp, "placement": placement, "framework_layouts": framework_layouts,
              "memory_headroom_bytes": _headroom(memory_headroom), "contention": contention}
    run = {"top_k": top_k, "workers": workers, "dask": dask, "explain_pruned": explain_pruned, "rows": rows,
           "on_total": on_total, "on_progress": on_progress}
    if scenario is None:
        if grid:
            raise SpecError("--grid varies the fields of a scenario", field="--grid",
                            fix="give a scenario file: simdist search SCENARIO --grid key=v1,v2")
        missing = [flag for flag, v in (("--model", model), ("--cluster", cluster), ("--gpus", gpus),
                                        ("--global-batch", global_batch_size)) if v is None]
        if missing:
            raise SpecError(f"no {' or '.join(missing)} given", field=missing[0],
                            fix="give --model, --cluster, --gpus and --global-batch, or a scenario file")
        assert model is not None and cluster is not None and gpus is not None and global_batch_size is not None
        problem = preset_problem(model, cluster, gpus, global_batch_size, seq_length=seq_length,
                                 precision=precision or "bf16", zero3_fetch=zero3_fetch or "prefetch", **bounds)
        if assignments:  # --set on the scenario the flags describe, as on a scenario file's
            problem = scenario_problem(_preset_document(problem), assignments, zero3_fetch=zero3_fetch, **bounds)
        return _search_one(problem, results_file=results_file, html=html, **run)
    from simdist.api.search_grid import grid_points, search_grid

    if model is not None:
        raise SpecError("--model given with a scenario file", field="--model",
                        fix="set the scenario's model with --set (e.g. --set model.preset=llama3-70b), or drop the "
                            "scenario")
    extra = _scenario_flags(gpus, global_batch_size, seq_length, precision)
    section = cluster_section(cluster) if cluster is not None else None
    points = grid_points(grid or [])
    if points is None:
        problem = scenario_problem(scenario, [*(assignments or []), *extra.assignments], num_gpus=gpus,
                                   zero3_fetch=zero3_fetch, cluster=section, **bounds)
        return _search_one(problem, results_file=results_file, html=html, **run)
    return search_grid(scenario, points, assignments=[*(assignments or []), *extra.assignments], num_gpus=gpus,
                       zero3_fetch=zero3_fetch, cluster=section, bounds=bounds, results_file=results_file, html=html,
                       **run)


def cluster_section(cluster: str) -> dict[str, Any]:
    """``--cluster NAME|FILE`` as a scenario's ``cluster:`` section (a file's path absolute: the scenario may live
    elsewhere)."""
    if Path(cluster).suffix in (".yaml", ".yml"):
        return {"file": str(Path(cluster).resolve())}
    return {"preset": cluster}


@dataclass(frozen=True, slots=True)
class _Flags:
    assignments: list[str]


def _scenario_flags(gpus: int | None, global_batch_size: int | None, seq_length: int | None,
                    precision: str | None) -> _Flags:
    """The flags that set a base scenario's fields, as ``--set`` items (``--gpus``: sized in scenario_problem)."""
    out = []
    if global_batch_size is not None:
        out.append(f"training.global_batch_size={global_batch_size}")
    if seq_length is not None:
        out.append(f"model.seq_length={seq_length}")
    if precision is not None:
        out.append(f"training.precision={precision}")
    return _Flags(out)


def preset_problem(model: str, cluster: str, gpus: int, global_batch_size: int, *, seq_length: int | None,
                   precision: str, zero3_fetch: str, field: str = "--cluster", **bounds: Any) -> Any:
    """The search problem of ``model`` (a preset) on ``gpus`` GPUs of ``cluster`` (a preset or topology file)."""
    from simdist.search.compare import size_cluster
    from simdist.search.space import SearchProblem

    size = size_cluster(cluster, gpus, field=field)
    if size.note:
        raise LayoutError(f"{gpus} GPUs do not fill whole nodes of {cluster} ({size.gpus_per_node} GPUs per node)",
                          field="--gpus", fix=f"use a multiple of {size.gpus_per_node}, e.g. {size.num_gpus}")
    return SearchProblem(model=model, cluster=cluster, num_nodes=size.num_nodes, global_batch_size=global_batch_size,
                         seq_length=seq_length, precision=precision, zero3_fetch=zero3_fetch, **bounds)


def _preset_document(problem: Any) -> Any:
    """The scenario ``--model --cluster --gpus --global-batch`` stand for, as a document `scenario_problem` reads
    (``--set`` then applies to it as to a file's)."""
    from simdist.api.provenance import resolved_scenario
    from simdist.search.evaluate import base_spec
    from simdist.spec.load import Document

    data = resolved_scenario(base_spec(problem), base_dir=Path.cwd())
    data["name"] = f"{problem.model} on {problem.cluster}"
    return Document(data=data, source="--model")


def scenario_problem(scenario: str | Path | Any, assignments: list[str], *, num_gpus: int | None = None,
                     zero3_fetch: str | None = None, cluster: dict[str, Any] | None = None, **bounds: Any) -> Any:
    """The search problem over a base scenario file (or a `Document`: `_preset_document`): its cluster
    (``cluster``: another one, as the scenario's ``cluster:`` section), model and training after ``assignments``;
    ``num_gpus``: the cluster's size (whole nodes). The scenario's own layout is not checked: the search replaces
    it."""
    from simdist.api import scenario_assignments, scenario_cluster
    from simdist.api.provenance import resolved_scenario
    from simdist.search.space import SearchProblem, canonical_json
    from simdist.spec.load import Document, read_yaml

    if isinstance(scenario, Document):
        doc, path = scenario, Path.cwd() / "model.yaml"
    else:
        path = Path(scenario)
        doc = read_yaml(path)
    if cluster is not None:  # compare: the scenario's cluster section replaced, not merged
        data = dict(doc.data)
        data["cluster"] = cluster
        doc = type(doc)(data=data, source=doc.source, lines=doc.lines)
    items = scenario_assignments(assignments)
    doc = doc.with_assignments(items) if items else doc
    spec, topology = scenario_cluster(doc, path.parent)
    if num_gpus is not None:
        gpn = topology.gpus_per_node
        if num_gpus % gpn:
            raise LayoutError(f"{num_gpus} GPUs do not fill whole nodes of the scenario's cluster ({gpn} GPUs per "
                              "node)", field="--gpus", fix=f"use a multiple of {gpn}")
        doc = doc.with_assignments([f"cluster.num_nodes={num_gpus // gpn}"])
        spec, topology = scenario_cluster(doc, path.parent)
    resolved = resolved_scenario(spec, base_dir=path.parent)
    resolved["cluster"]["num_nodes"] = topology.num_nodes
    c = spec.cluster
    label = str(c.preset) if c.preset is not None else Path(str(c.file)).name
    m = spec.model
    model = m.preset or (Path(str(m.hf_config)).parent.name or "hf_config" if m.hf_config else f"{path.stem} model")
    return SearchProblem(model=model, cluster=label, num_nodes=topology.num_nodes,
                         global_batch_size=spec.training.global_batch_size, seq_length=m.seq_length,
                         precision=spec.training.precision, zero3_fetch=zero3_fetch or spec.training.zero3_fetch,
                         base=canonical_json(resolved), **bounds)


_WRITE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})
"""Errors of a write (not of the search): a results log that cannot grow."""


def _search_one(problem: Any, *, top_k: int, workers: int, dask: Any, results_file: str | Path | None,
                html: str | Path | None, explain_pruned: bool, rows: int, on_total: Any, on_progress: Any
                ) -> SearchOutput:
    """One search problem: ranked, its table, its HTML."""
    from simdist.files import os_fix, os_reason, write_text
    from simdist.report.search_html import search_report_html
    from simdist.report.search_table import search_text
    from simdist.search.executors import make_executor
    from simdist.search.rank import run_search

    try:
        with make_executor(workers=workers, dask=dask) as executor:
            outcome = run_search(problem, executor, top_k=top_k,
                                 results_file=Path(results_file) if results_file is not None else None,
                                 on_total=on_total, on_progress=on_progress, exact_top=rows)
    except OSError as err:
        if results_file is None or err.errno not in _WRITE_ERRORS:
            raise
        # The results log (simdist.search.results) is appended to batch by batch: what it held before the failed
        # batch stays readable (--resume drops a torn last line).
        raise OutputError(f"cannot write {results_file}: {os_reason(err)}; the results written before are kept",
                          field="--out", fix=os_fix(err, "free space") + f", then --resume {results_file}") from None
    doc = search_document(outcome, explain_pruned=explain_pruned)
    text = search_text(doc, top=rows, explain_pruned=explain_pruned)
    files: dict[str, Path] = {}
    if html is not None:
        w = outcome.winner
        page = search_report_html(doc, winner_graph=w.plan.graph if w else None, winner_trace=w.trace if w else None,
                                  winner_result=w.result if w else None)
        files["html"] = write_text(html, page, field="--html")
    # Wall times stay in the text; the JSON is a function of the inputs alone (byte-identical across runs).
    doc = {k: v for k, v in doc.items() if k not in WALL_TIME_KEYS}
    return SearchOutput(doc, text, files, outcome.interrupted)


def search_document(outcome: Any, *, explain_pruned: bool) -> dict[str, Any]:
    """A search's JSON: the outcome's, with the resolved base scenario, the version and a hash of the inputs."""
    import hashlib
    import json

    from simdist.api.provenance import cluster_title, version
    from simdist.search.evaluate import context

    doc = outcome.to_dict(explain_pruned=explain_pruned)
    doc["cluster_title"] = cluster_title(context(outcome.problem).topology)
    problem = dict(doc["problem"])
    base = problem.pop("base", None)
    doc["problem"] = problem
    if base is not None:
        doc["scenario_resolved"] = base
    doc["simdist_version"] = version()
    text = json.dumps({"problem": problem, "base": base}, sort_keys=True, separators=(",", ":"))
    doc["inputs_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    return doc


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


def _headroom(value: str | float) -> float:
    """``--memory-headroom`` in bytes: a size with its unit ("2 GiB"), or a number of bytes; 0 for none."""
    from simdist.units import parse_bytes

    if isinstance(value, str) and value.strip() in ("0", "0.0"):
        return 0.0
    try:
        out = float(value) if not isinstance(value, str) else parse_bytes(value)
    except (SimdistError, ValueError):
        raise SpecError(f"--memory-headroom {value!r} is not a size", field="--memory-headroom",
                        fix="give a size with its unit, e.g. '4 GiB', or 0") from None
    if not math.isfinite(out) or out < 0:
        raise SpecError(f"--memory-headroom {value!r} must be a size >= 0", field="--memory-headroom",
                        fix="give e.g. '4 GiB', or 0")
    return out
