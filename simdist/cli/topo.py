"""`simdist topo list|gpus|show`: the bundled topology presets and clusters."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from simdist import api
from simdist.cli import (
    JsonOption,
    SetOption,
    _print_json,
    check_target,
    emit,
    topo_app,
    write_atomically,
)


@topo_app.command("list")
def topo_list(as_json: JsonOption = False) -> None:
    """List the bundled topology presets."""
    presets = api.topology_presets()
    if as_json:
        _print_json(presets)
        return
    width = max(len(p["name"]) for p in presets)
    emit("\n".join(f"{p['name']:<{width}}  {p['gpus_per_node']:>3} GPUs/node  {p['description']}" for p in presets))


@topo_app.command("gpus")
def topo_gpus(as_json: JsonOption = False) -> None:
    """List the GPU presets (dense peak TFLOP/s, HBM)."""
    gpus = api.gpu_presets()
    if as_json:
        _print_json(gpus)
        return
    lines = []
    for name, g in gpus.items():
        peak = g["peak"]
        fp8 = f"{peak['fp8'] / 1e12:g}" if peak["fp8"] else "-"
        lines.append(
            f"{name:<14} {g['name']:<22} bf16 {peak['bf16'] / 1e12:>6g}  fp8 {fp8:>6}  tf32 {peak['tf32'] / 1e12:>6g}  "
            f"fp32 {peak['fp32'] / 1e12:>5g} TFLOP/s  "
            f"{g['hbm_capacity'] / 2**30:g} GiB at {g['hbm_bandwidth'] / 1e12:g} TB/s"
        )
    emit("\n".join(lines))


@topo_app.command("show")
def topo_show(
    name: Annotated[str, typer.Argument(help="A preset name (see `simdist topo list`) or a topology YAML file.")],
    num_nodes: Annotated[
        int | None, typer.Option("--num-nodes", min=1, help="Number of nodes (racks for gb200-nvl72).")
    ] = None,
    assignments: SetOption = None,
    as_json: JsonOption = False,
    html: Annotated[Path | None, typer.Option("--html", help="Write an interactive plotly drawing to FILE.")] = None,
) -> None:
    """Describe a cluster: GPUs, links by kind, per-GPU bandwidth per tier, bisection, example routes."""
    if html is not None:
        check_target(html, field="--html")
    topology, summary = api.topology_summary(name, num_nodes=num_nodes, assignments=assignments or [])
    if html is not None:
        from simdist.report.topology_html import topology_figure_html

        write_atomically(html, topology_figure_html(topology))
    if as_json:
        _print_json(summary)
        return
    from simdist.report.topology_text import render_topology

    emit(render_topology(summary).rstrip() + (f"\nwrote {html}" if html is not None else ""))
