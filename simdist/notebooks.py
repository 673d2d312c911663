"""What the teaching notebooks (notebooks/*.ipynb) call beside `simdist.api`: numeric collectives, lecture
scenarios written as dicts, figure wrappers (plotly), committed measurements.

Kept out of the core API: ``from simdist import notebooks as nb``. Everything here is a thin layer over
`simdist.api` (a scenario dict goes through `api.run_document`, the path every scenario file takes) and the
report module's figures.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from simdist.api import RunOutput, run_document
from simdist.api.bubble import _pipeline_run
from simdist.api.collectives import CollectiveRow, curves_for_report
from simdist.api.search import SearchOutput
from simdist.errors import SpecError
from simdist.hardware import load_topology


def run_collective_on_data(op: str, inputs: list[list[float]], algorithm: str = "ring", *, cluster: str = "dgx-h100",
                           num_nodes: int | None = None, assignments: list[str] | None = None,
                           root: int = 0) -> list[list[float]]:
    """Run ``algorithm``'s plan of ``op`` on real numbers: ``inputs[r]`` is rank r's send buffer; returns
    each rank's receive buffer (sums for the reducing ops; layouts in `simdist.collectives.numeric`).

    The plan is the one the simulator times, built on the first ``len(inputs)`` GPUs of ``cluster``
    (``num_nodes`` defaults to as many nodes as the ranks need), so this shows what that plan computes.
    """
    import math

    import numpy as np

    from simdist.collectives.group import Group
    from simdist.collectives.numeric import run_plan
    from simdist.collectives.ops import op_info
    from simdist.collectives.registry import algorithm_for
    from simdist.collectives.request import Request

    op_info(op)
    if op == "barrier":
        raise SpecError("a barrier moves no data", field="op", fix="use a data-moving op, e.g. all_reduce")
    p = len(inputs)
    if p < 2:
        raise SpecError(f"{p} rank(s) given", field="inputs", fix="give one list of values per rank, 2 ranks or more")
    try:
        arrays = [np.asarray(x, dtype=float) for x in inputs]
    except (TypeError, ValueError):
        raise SpecError("inputs must be lists of numbers", field="inputs", fix="e.g. [[0, 1], [1, 2]]") from None
    n = len(arrays[0])
    if any(a.ndim != 1 or len(a) != n for a in arrays) or n == 0:
        raise SpecError("every rank needs the same number of values (at least one)", field="inputs",
                        fix="give equally long flat lists, one per rank")
    if not all(np.isfinite(a).all() for a in arrays):
        raise SpecError("inputs hold a non-finite value", field="inputs", fix="give finite numbers")
    if op in ("reduce_scatter", "scatter", "all_to_all") and n % p:
        raise SpecError(f"{op} cuts each buffer into {p} equal blocks, but it holds {n} values", field="inputs",
                        fix=f"give a multiple of {p} values per rank")
    topology = load_topology(cluster, assignments=assignments)
    if num_nodes is None and p > topology.num_gpus:
        num_nodes = math.ceil(p / topology.gpus_per_node)
    if num_nodes is not None:
        topology = load_topology(cluster, num_nodes=num_nodes, assignments=assignments)
    full = n * p if op in ("all_gather", "gather") else n
    # Assumption: float32 values size the plan (pieces and chunk counts); the numbers do not depend on it.
    request = Request(op, Group.first(topology, p), 4.0 * full, root=root)
    plan = algorithm_for(algorithm, request).build(request)
    return [out.tolist() for out in run_plan(plan, arrays)]


def lecture_mlp_spec(*, tp: int = 1, dp: int = 1, pp: int = 1, batch: int = 128, hidden: int = 1024,
                     layers: int = 4, microbatches: int = 1, schedule: str = "1f1b",
                     precision: str = "fp32") -> dict[str, Any]:
    """A scenario (as a dict, for `run_spec`) of the lecture's MLP cut over tp x dp x pp GPUs of one DGX H100
    node cut down to that many GPUs (one CPU socket, one PCIe switch, one NIC per GPU), column-parallel TP.

    ``batch`` is the global batch; each data-parallel rank runs ``microbatches`` micro-batches of
    batch / (dp x microbatches) rows.
    """
    rows, left = divmod(batch, dp * microbatches)
    if left or rows < 1:
        raise SpecError(f"batch {batch} does not split into {dp} ranks x {microbatches} micro-batches",
                        field="batch", fix=f"give a batch that is a multiple of {dp * microbatches}")
    gpus = tp * dp * pp
    model: dict[str, Any] = ({"preset": "cs336-mlp"} if (hidden, layers) == (1024, 4)
                             else {"kind": "mlp", "num_layers": layers, "hidden_size": hidden})
    return {
        "name": f"lecture MLP tp{tp} dp{dp} pp{pp}",
        "cluster": {"preset": "dgx-h100", "gpus_per_node": gpus,
                    "host": {"cpu_sockets": 1, "pcie_switches_per_socket": 1},
                    "inter_node": {"nics_per_node": gpus}},
        "model": model,
        "parallel": {"tp": tp, "dp": dp, "pp": pp, "tp_style": "column"},
        "training": {"micro_batch_size": rows, "global_batch_size": batch, "precision": precision},
        "schedule": schedule,
    }


def run_spec(spec: dict[str, Any], assignments: list[str] | None = None, *, out_dir: str | Path | None = None,
             strict: bool = False) -> RunOutput:
    """`api.run` on a scenario given as a dict (validated like a file's contents, with the same errors; relative
    paths in it start at the working directory)."""
    return run_document(spec, assignments, out_dir=out_dir, strict=strict)


def collective_chart(series: dict[str, list[CollectiveRow]], title: str = "Collective cost vs size") -> Any:
    """The busbw and time vs size figure (plotly) of `collective_curves`' sweeps, regions marked."""
    from simdist.report.collective_html import collective_figure

    return collective_figure(curves_for_report(series), title=title)


def bubble_chart(rows: list[dict[str, Any]], title: str = "Pipeline bubble vs micro-batches") -> Any:
    """Simulated bubble and its formula against micro-batches (plotly), from `bubble_sweep`'s rows."""
    from simdist.report.bubble_html import bubble_figure

    return bubble_figure(rows, title)


def pipeline_timeline(schedule: str, *, num_stages: int, num_microbatches: int, vpp: int = 1,
                      forward_s: float = 1.0, backward_s: float = 2.0, stage_times: list[float] | None = None,
                      p2p_s: float = 0.0, title: str | None = None) -> Any:
    """The simulated pipeline (the one `bubble` measures) as a plotly Gantt chart, one row per stage."""
    from simdist.report.step_html import timeline_figure

    _, graph, trace = _pipeline_run(schedule, num_stages=num_stages, num_microbatches=num_microbatches, vpp=vpp,
                                    forward_s=forward_s, backward_s=backward_s, stage_times=stage_times,
                                    p2p_s=p2p_s)
    return timeline_figure(graph, trace, title=title or f"{schedule}: {num_stages} stages, {num_microbatches} "
                                                        f"micro-batches")


def rank_values_chart(stages: dict[str, list[list[float]]], title: str = "what each rank holds") -> Any:
    """Heatmaps (rank x element, values written in) of each named stage of a worked example."""
    from simdist.report.notebook_figures import rank_values_figure

    return rank_values_figure(stages, title)


def line_chart(x: list[float], series: dict[str, list[float]], *, title: str, x_title: str, y_title: str,
               log_x: bool = False, log_y: bool = False, y_format: str | None = None,
               dashed: list[str] | tuple[str, ...] = ()) -> Any:
    """A plotly line chart of sweeps (``dashed``: series drawn as dashed lines, e.g. a formula)."""
    from simdist.report.notebook_figures import line_figure

    return line_figure(x, series, title=title, x_title=x_title, y_title=y_title, log_x=log_x, log_y=log_y,
                       y_format=y_format, dashed=dashed)


def bar_chart(categories: list[str], series: dict[str, list[float]], *, title: str, y_title: str,
              stacked: bool = False, y_format: str | None = None) -> Any:
    """A plotly grouped (or stacked) bar chart."""
    from simdist.report.notebook_figures import bar_figure

    return bar_figure(categories, series, title=title, y_title=y_title, stacked=stacked, y_format=y_format)


def band_chart(labels: list[str], bands: list[dict[str, float]], predictions: list[float], *, title: str,
               x_title: str = "step time (s)") -> Any:
    """Prediction bands side by side (plotly): p10-p90 as a bar, p50 and the prediction as markers."""
    from simdist.report.notebook_figures import band_figure

    return band_figure(labels, bands, predictions, title=title, x_title=x_title)


def write_scenario(spec: dict[str, Any], path: str | Path) -> Path:
    """Write a scenario given as a dict (as `lecture_mlp_spec` returns) to a YAML file, for the commands that take
    a scenario file (`api.search`, `api.compare`, `api.run`): validated first, as `run_spec` validates it (its
    layout too), so a bad field is one clear error and nothing is written. Returns the path."""
    import yaml

    from simdist.api import scenario_of
    from simdist.files import write_text

    scenario_of(spec)
    return write_text(path, yaml.safe_dump(spec, sort_keys=False), field="path")


def goodput(num_gpus: int, num_params: float, *, gpus_per_node: int = 8, nics_per_node: int = 8,
            checkpoint: dict[str, str] | None = None) -> dict[str, Any]:
    """The run JSON's ``goodput`` (simdist.predict.goodput: failure rates per GPU, NIC and host from Llama 3's
    interruptions; Young/Daly checkpointing) for ``num_gpus`` GPUs in hosts of ``gpus_per_node``, without
    simulating a step. ``checkpoint``: a scenario's ``faults.checkpoint`` section (``write``, ``restart``,
    ``interval``, e.g. ``{"write": "5 min"}``; default: the data file's costs, the Young/Daly optimum interval)."""
    import math

    from simdist.predict.goodput import goodput as goodput_of
    from simdist.spec.faults import CheckpointSpec
    from simdist.spec.load import Document, validate

    for name, value in (("num_gpus", num_gpus), ("gpus_per_node", gpus_per_node), ("nics_per_node", nics_per_node)):
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "nics_per_node" else 1):
            raise SpecError(f"{name} {value!r} is not a count", field=name, fix="give a whole number, e.g. 8")
    spec = validate(CheckpointSpec, Document(data=checkpoint or {}, source="checkpoint", lines={}),
                    prefix="faults.checkpoint")
    hosts = math.ceil(num_gpus / gpus_per_node)
    return goodput_of(num_gpus=num_gpus, num_hosts=hosts, num_nics=hosts * nics_per_node, num_params=num_params,
                      checkpoint=spec)


MEASUREMENT_DIRS = ("validation/reference", "tests/data")  # relative to the source checkout


def measurement_file(name: str) -> Path:
    """The path of a committed measurement file, by name: ``validation/reference/NAME`` (measured reference
    data) or ``tests/data/NAME`` (nccl-tests samples), whatever the working directory: from the installed
    wheel (which bundles both folders) or else the source checkout."""
    from importlib import resources

    bundled = Path(str(resources.files("simdist"))) / "_bundled" / "measurements"
    root = bundled if bundled.is_dir() else Path(__file__).resolve().parents[1]
    for folder in MEASUREMENT_DIRS:
        path = root / folder / name
        if path.is_file():
            return path
    known = sorted(p.name for folder in MEASUREMENT_DIRS if (root / folder).is_dir()
                   for p in (root / folder).iterdir() if p.suffix in (".csv", ".txt", ".json"))
    raise SpecError(f"no measurement file '{name}' in {' or '.join(MEASUREMENT_DIRS)}", field="name",
                    fix=f"use one of: {', '.join(known)}" if known else "run from a source checkout of simdist")


def read_step_measurements(path: str | Path) -> list[dict[str, Any]]:
    """The rows of an MLP step CSV (``python -m validation.mlp``'s output) as dicts: ``cut``, ``world_size``,
    ``time_s`` (median of the per-step maximum over ranks), ... (schema: simdist.calibrate.steps)."""
    from simdist.calibrate.steps import read_step_measurements as read_steps

    return [dataclasses.asdict(m) for m in read_steps(path)]


def search_heatmap(out: SearchOutput) -> Any:
    """The search report's tp x pp heatmap (plotly) of the best closed-form tokens/s of a `search`."""
    from simdist.report.search_html import heatmap_figure

    return heatmap_figure(out.doc["ranked"], out.doc.get("bounded", []))


def search_pareto(out: SearchOutput) -> Any:
    """The search report's memory per GPU vs tokens/s scatter with its Pareto front (plotly), of a `search`."""
    from simdist.report.search_html import pareto_figure

    return pareto_figure(out.doc["ranked"])


def compare_chart(result: dict[str, Any], title: str | None = None) -> Any:
    """Days, cost and energy to train per cluster (plotly bars), from `compare`'s result."""
    from simdist.report.notebook_figures import compare_figure

    return compare_figure(result["rows"], title or f"{result['model']} on {result['gpus']} GPUs: "
                                                   f"{result['tokens']:.3g} tokens, best layout per cluster")


def validation_chart(result: dict[str, Any], title: str | None = None) -> Any:
    """Measured vs calibrated and uncalibrated predictions, with their errors (plotly), from `validate`'s result."""
    from simdist.report.notebook_figures import prediction_figure

    mape, uncal = result["mape_pct"]["all"], result["uncalibrated_mape_pct"]["all"]
    return prediction_figure(result["rows"], title or (
        f"{result['topology']}, holdout {result['holdout']}: MAPE {mape:.1f} % calibrated, {uncal:.1f} % uncalibrated"))
