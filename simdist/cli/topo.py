"""`simdist topo list|gpus|show|import`: the bundled topology presets, clusters, and topologies read from a machine."""

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
    """List the GPU presets (dense peak TFLOP/s, HBM, rated power and any power cap)."""
    gpus = api.gpu_presets()
    if as_json:
        _print_json(gpus)
        return
    lines = []
    for name, g in gpus.items():
        peak = g["peak"]
        fp8 = f"{peak['fp8'] / 1e12:g}" if peak["fp8"] else "-"
        power = f"  {g['tdp_w']:g} W" if g.get("tdp_w") else ""
        if power and g.get("power_limit_w"):
            power += f" capped at {g['power_limit_w']:g} W"
        lines.append(
            f"{name:<14} {g['name']:<22} bf16 {peak['bf16'] / 1e12:>6g}  fp8 {fp8:>6}  tf32 {peak['tf32'] / 1e12:>6g}  "
            f"fp32 {peak['fp32'] / 1e12:>5g} TFLOP/s  "
            f"{g['hbm_capacity'] / 2**30:g} GiB at {g['hbm_bandwidth'] / 1e12:g} TB/s{power}"
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


@topo_app.command("import")
def topo_import(
    path: Annotated[Path, typer.Argument(help="An NCCL topology dump (NCCL_TOPO_DUMP_FILE), `nvidia-smi topo -m` "
                                              "output or `ibnetdiscover` output, told apart by content.")],
    out: Annotated[Path | None, typer.Option("--out", help="Write the topology file here (default: print it).")] = None,
    name: Annotated[str | None, typer.Option("--name", help="The topology's name (default: the file's stem).")] = None,
    gpu: Annotated[str | None, typer.Option(
        "--gpu", help="GPU preset (see `simdist topo gpus`); required for nvidia-smi output, else guessed from the "
                      "dump's sm.")] = None,
    nic_kind: Annotated[str, typer.Option("--nic-kind", help="infiniband, roce or ethernet.")] = "infiniband",
    nic_bandwidth: Annotated[str | None, typer.Option(
        "--nic-bandwidth", help="Per NIC, e.g. '400 Gb/s' (default: the dump's speed, else 400 Gb/s).")] = None,
    pcie_generation: Annotated[int | None, typer.Option("--pcie-generation", help="PCIe generation for nvidia-smi "
                                                                                  "output (default by GPU).")] = None,
    node: Annotated[str | None, typer.Option(
        "--node", help="With ibnetdiscover output: the preset or topology file whose node (server) the fabric "
                       "joins.")] = None,
) -> None:
    """Write a topology file from the machine's own description: its node as a graph (GPUs, NVLink, PCIe switches,
    sockets, NICs) from an NCCL dump or nvidia-smi, or its fabric (leaves, spines, cores, speeds) from ibnetdiscover
    over the node of --node; what the description did not say stated as '# Assumption:' lines."""
    from simdist.api.topology_import import import_topology
    from simdist.hardware.summary import describe
    from simdist.report.topology_text import render_topology

    if out is not None:
        check_target(out, field="--out")
    text, topology, assumptions = import_topology(path, name=name, gpu=gpu, nic_kind=nic_kind,
                                                  nic_bandwidth=nic_bandwidth, pcie_generation=pcie_generation,
                                                  node=node)
    if out is None:
        emit(text.rstrip())
        return
    write_atomically(out, text, field="--out")
    summary = render_topology(describe(topology))
    emit(summary + f"\nwrote {out}" + "".join(f"\n  assumed: {a}" for a in assumptions))
