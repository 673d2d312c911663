"""`simdist schema|check|collective|run|assumptions`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from simdist import api
from simdist.cli import (
    CalibrationOption,
    JsonOption,
    SetOption,
    _print_json,
    app,
    check_target,
    emit,
    write_atomically,
)
from simdist.errors import SimdistError, note


@app.command("schema")
def schema_cmd(kind: Annotated[str, typer.Argument(help="topology, scenario or calibration")]) -> None:
    """Print the JSON schema of a topology, scenario or calibration file (every field described)."""
    _print_json(api.schema(kind))


@app.command("check")
def check(
    scenario: Annotated[Path, typer.Argument(help="A scenario YAML file.")],
    assignments: SetOption = None,
    as_json: JsonOption = False,
    trust_paths: Annotated[bool, typer.Option(
        "--trust-paths", help="the scenario's calibration may read the topology file it names outside its own "
                              "folder (as simdist run --trust-paths)")] = False,
) -> None:
    """Validate a scenario as `simdist run` does before it simulates: its fields, its cluster, its calibration, the
    layout, the execution fields and the faults."""
    from simdist.spec.load import read_yaml

    loaded = api.check_document(read_yaml(scenario), assignments or [], base_dir=scenario.parent,
                                source=str(scenario), trust_paths=trust_paths)
    p = loaded.spec.parallel
    result = {
        "scenario": str(scenario),
        "name": loaded.spec.name,
        "cluster": loaded.topology.spec.name,
        "num_gpus": loaded.topology.num_gpus,
        "layout": {"tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "vpp": p.vpp},
        "valid": True,
    }
    if as_json:
        _print_json(result)
    else:
        emit(f"{scenario}: ok - {loaded.spec.name or 'unnamed'}: tp{p.tp} pp{p.pp} dp{p.dp} cp{p.cp} on "
             f"{loaded.topology.num_gpus} GPUs of {loaded.topology.spec.name}")


@app.command("collective")
def collective_cmd(
    cluster: Annotated[str, typer.Option("--cluster", help="Topology preset or file.")],
    op: Annotated[str, typer.Option("--op", help="all_reduce, all_gather, reduce_scatter, broadcast, reduce, "
                                                 "all_to_all, scatter, gather, send_recv, barrier.")],
    ranks: Annotated[int, typer.Option("--ranks", help="Number of ranks (the first GPUs of the cluster).")],
    sizes: Annotated[str, typer.Option("--bytes", help="Sizes: 8:8G:x2 (nccl-tests -b:-e:-f), or 1M,64M.")] = "8:8G:x2",
    algorithm: Annotated[str, typer.Option("--algorithm", help="auto, or a name; several: ring,tree,auto.")] = "auto",
    protocol: Annotated[str, typer.Option("--protocol", help="auto, LL, LL128 or Simple.")] = "auto",
    fidelity: Annotated[str, typer.Option("--fidelity", help="auto, detailed or fast.")] = "auto",
    num_nodes: Annotated[int | None, typer.Option("--num-nodes", min=1, help="Number of nodes.")] = None,
    root: Annotated[int, typer.Option("--root", help="Root rank of rooted collectives.")] = 0,
    kernel: Annotated[str, typer.Option("--kernel", help="all_to_all: nccl, or the MoE flex dispatcher's deepep or "
                                                         "hybridep kernels (deepep:24: on 24 SMs).")] = "nccl",
    assignments: SetOption = None,
    as_json: JsonOption = False,
    html: Annotated[Path | None, typer.Option("--html", help="Write a busbw/time chart per algorithm.")] = None,
    compare: Annotated[Path | None, typer.Option("--compare", help="Overlay measurements: our CSV, or "
                                                                     "nccl-tests output (text or -J JSON).")] = None,
    calibration: CalibrationOption = None,
) -> None:
    """Simulate a collective over a size sweep and report time, algbw and busbw as nccl-tests does."""
    from simdist.units import parse_size_list

    try:
        size_list = parse_size_list(sizes)
    except SimdistError as err:
        raise err.located(field_prefix="--bytes") from None
    names = list(dict.fromkeys(a.strip() for a in algorithm.split(",") if a.strip()))
    if not names:
        raise SimdistError("no algorithm given", field="--algorithm", fix="use auto or e.g. ring")
    if html is not None:
        check_target(html, field="--html")
    measured = None
    if compare is not None:
        from simdist.calibrate.measurements import read_measurements

        measured = _matching(read_measurements(compare), op, ranks, compare)
    series = {name: api.collective(cluster, op, ranks, size_list, algorithm=name, protocol=protocol,
                                   num_nodes=num_nodes, assignments=assignments or [], fidelity=fidelity,
                                   root=root, calibration=calibration, kernel=kernel)
              for name in names}
    if html is not None:
        # The algorithms asked for; auto alone is drawn with the algorithms it chooses from (the why of its
        # choice), its label naming what it chose at each size.
        extra = {} if names != ["auto"] else api.collective_curves(cluster, op, ranks, size_list, num_nodes=num_nodes,
                                      assignments=assignments or [], fidelity=fidelity, root=root,
                                      protocol=protocol, skip=set(series), calibration=calibration,
                                      kernel=kernel)
        from simdist.report.collective_html import collective_figure_html

        curves = {**series, **extra}
        title = f"{op} on {ranks} ranks of {cluster}" + (f" x {num_nodes} nodes" if num_nodes else "")
        write_atomically(html, collective_figure_html(api.curves_for_report(curves), measured, title=title))
    if as_json:
        doc: dict[str, Any] = {"cluster": cluster, "num_nodes": num_nodes, "op": op, "num_ranks": ranks,
                               "rows": [row.to_dict() for rows in series.values() for row in rows]}
        if measured is not None:
            doc["compare"] = api.compare_rows(series, measured)
            from simdist.api.collectives import compare_summary

            doc["compare_summary"] = compare_summary(doc["compare"])
        _print_json(doc)
        return
    lines = [f"# {op} on {ranks} ranks of {cluster}" + (f" ({num_nodes} nodes)" if num_nodes else ""),
             f"# {'size':>12} {'algorithm':>16} {'proto':>6} {'time(us)':>11} {'algbw(GB/s)':>12} "
             f"{'busbw(GB/s)':>12}  fidelity"]
    for rows in series.values():
        for r in rows:
            bw = ("-" if v is None else f"{v:.2f}" for v in (r.algbw_GBps, r.busbw_GBps))  # barrier: no payload
            lines.append(f"  {int(r.nbytes):>12} {r.algorithm:>16} {r.protocol:>6} {r.time_s * 1e6:>11.2f} "
                         f"{next(bw):>12} {next(bw):>12}  {r.fidelity}")
    if measured is not None:
        lines += _compare_lines(api.compare_rows(series, measured), next(iter(series)))
    if html is not None:
        lines.append(f"wrote {html}")
    emit("\n".join(lines))


def _compare_lines(rows: list[dict[str, Any]], algorithm: str) -> list[str]:
    """Measured against predicted busbw by size, nccl-tests' out-of-place and in-place columns side by side
    (labelled), then the error summary of each column."""
    from simdist.api.collectives import compare_summary

    by_size: dict[float, dict[bool, dict[str, Any]]] = {}
    for r in rows:
        by_size.setdefault(r["bytes"], {})[r["in_place"]] = r
    columns = [flag for flag in (False, True) if any(flag in cells for cells in by_size.values())]
    names = {False: "out-of-place", True: "in-place"}
    out = [f"# measured vs predicted busbw (GB/s; predicted: {algorithm}), nccl-tests columns side by side",
           f"# {'size':>12}" + "".join(f" | {names[flag] + ' measured':>21} {'predicted':>9} {'error':>7}"
                                       for flag in columns)]
    for nbytes, cells in sorted(by_size.items()):
        line = f"  {int(nbytes):>12}"
        for flag in columns:
            c = cells.get(flag)
            line += (f" | {c['measured_busbw_GBps']:>21.2f} {c['predicted_busbw_GBps']:>9.2f} {c['error_pct']:>+6.1f}%"
                     if c else f" | {'-':>21} {'-':>9} {'-':>7}")
        out.append(line)
    for name, s in compare_summary(rows).items():
        out.append(f"error summary, {name.replace('_', '-')}: mean |error| {s['mape_pct']:.1f}% (signed "
                   f"{s['mean_error_pct']:+.1f}%) over {s['num_sizes']} sizes; worst {s['worst_error_pct']:+.1f}% "
                   f"at {int(s['worst_bytes'])} bytes")
    return out


def _matching(measured: list[Any], op: str, ranks: int, path: Path) -> list[Any]:
    """The measurements of ``op`` on ``ranks`` ranks; none is an error naming what the file holds, some others a
    note (a comparison with another op or rank count would be meaningless)."""
    keep = [m for m in measured if m.op == op and m.num_ranks == ranks]
    series = sorted({(m.op, m.num_ranks) for m in measured})
    held = ", ".join(f"{o} on {n} ranks" for o, n in series[:6]) + (", ..." if len(series) > 6 else "")
    if not keep:
        raise SimdistError(f"{path} holds {held}, not {op} on {ranks} ranks", field="--compare",
                           fix="compare with a measurement of the same op and rank count, or change --op/--ranks")
    if len(keep) < len(measured):
        note(f"--compare: using the {len(keep)} measurements of {op} on {ranks} ranks in {path}; ignoring "
             f"{len(measured) - len(keep)} of other ops or rank counts ({held})")
    return keep


@app.command("run")
def run_cmd(
    scenario: Annotated[Path, typer.Argument(help="A scenario YAML file (see scenarios/), or a report.json of "
                                                  "`simdist run --out` to run its resolved scenario again.")],
    assignments: SetOption = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write report.json, trace.json, report.html here.")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 2 if the layout does not fit in memory.")] = False,
    as_json: JsonOption = False,
    calibration: CalibrationOption = None,
    simulate: Annotated[str | None, typer.Option(
        "--simulate", help="auto | representatives (one rank per stage, the others' traffic folded onto shared "
                           "links; a long steady state fast-forwarded) | full (every rank, every micro-batch); "
                           "default auto (a report.json: the one it recorded)"
    )] = None,
    fidelity: Annotated[str | None, typer.Option(
        "--fidelity", help="engine (collectives share links) | closed_form (the same step, every collective "
                           "alone; search ranks by it with a contention estimate added); default engine (a "
                           "report.json: the one it recorded)")] = None,
    trust_paths: Annotated[bool, typer.Option(
        "--trust-paths", help="a report.json may read the files it names (cluster file, hf_config, calibration, "
                              "moe_routing_file), and a calibration the topology file it names, outside their own "
                              "folders")] = False,
) -> None:
    """Predict one training step: step time, throughput, MFU, bubble, breakdown, memory, links."""
    output = api.run(scenario, assignments or [], out_dir=out, strict=strict, calibration=calibration,
                     simulate=simulate, fidelity=fidelity, trust_paths=trust_paths)
    if as_json:
        _print_json(output.result)
        return
    text = output.text.rstrip()
    if output.files:
        text += (f"\nreport: {output.files['report.html']}  (trace: {output.files['trace.json']}, "
                 f"json: {output.files['report.json']})")
    emit(text)


@app.command("assumptions")
def assumptions_cmd(as_json: JsonOption = False) -> None:
    """List the modelling assumptions (``# Assumption:`` comments) in the code and presets."""
    found = api.assumptions()
    if as_json:
        _print_json(found)
        return
    emit("\n".join(f"{item['file']}:{item['line']}: {item['text']}" for item in found))
