"""Plain-text rendering of a topology description (`simdist topo show` without --json)."""

from __future__ import annotations

from typing import Any

from simdist.units import format_bandwidth, format_bytes, format_time


def render_topology(d: dict[str, Any]) -> str:
    lines = [f"{d['name']}: {d['description']}" if d["description"] else d["name"]]
    gpu = d["gpu"]
    lines.append(
        f"  GPUs            {d['num_gpus']} = {d['num_nodes']} nodes x {d['gpus_per_node']} {gpu['name']}"
        + (f" ({d['hosts_per_node']} hosts per node)" if d["hosts_per_node"] > 1 else "")
    )
    lines.append(
        f"  GPU             {gpu['peak_flops']['bf16'] / 1e12:.4g} TFLOP/s bf16 dense, "
        f"{format_bytes(gpu['hbm_capacity_bytes'])} HBM at {format_bandwidth(gpu['hbm_bandwidth_Bps'])}"
    )
    nv = d["nvlink"]
    if nv and d.get("node_graph"):
        switches = nv["num_switches_per_node"]
        lines.append(
            f"  NVLink domain   {d['nvlink_domain_size']} GPUs, {nv['links_per_gpu']} NVLink link(s) per GPU, "
            f"{format_bandwidth(nv['bandwidth_per_gpu_Bps'])} per GPU per direction in all, "
            f"{f'{switches} NVSwitch vertices' if switches else 'no NVSwitch'} (efficiency {nv['efficiency']:.2f}; "
            "the node is given as a graph)"
        )
    elif nv:
        lines.append(
            f"  NVLink domain   {d['nvlink_domain_size']} GPUs, NVLink{nv['generation']} "
            f"{format_bandwidth(nv['bandwidth_per_gpu_Bps'])} per GPU per direction via "
            f"{nv['num_switches_per_node']} NVSwitch (efficiency {nv['efficiency']:.2f}, "
            f"NVLS {'yes' if nv['nvls'] else 'no'})"
        )
    else:
        lines.append("  NVLink domain   none (GPUs talk over PCIe)")
    nics = d["nics"]
    if nics:
        lines.append(
            f"  NICs            {nics['per_node']} x {format_bandwidth(nics['bandwidth_Bps'])} {nics['kind']} per node"
        )
    fab = d["fabric"]
    if fab:
        lines.append(
            f"  fabric          {fab['shape']}, {fab['num_leaves']} leaves ({fab['nics_per_leaf']} NIC ports each)"
            + (f", {fab['num_spines']} spines, oversubscription {fab['oversubscription']:g}"
               if fab["num_spines"] else "")
            + (f"; 3 tiers: {fab['num_pods']} pods of {fab['leaves_per_pod']} leaves, {fab['num_cores']} cores, "
               f"pod oversubscription {fab['pod_oversubscription']:g}" if fab.get("num_cores") else "")
            + (f"; {fab['planes']} planes of {fab['leaves_per_plane']} leaves and {fab['spines_per_plane']} spines "
               "(NIC i on plane i mod planes; cross-plane traffic relayed over NVLink: PXN)"
               if fab.get("planes", 1) > 1 else "")
            + ("; adaptive routing (every flow spread over the spines: one modelled spine per pod)"
               if fab.get("routing") == "adaptive" else "")
        )
    inj = ", ".join(f"{k} {format_bandwidth(v)}" for k, v in d["injection_bandwidth_per_gpu_Bps"].items())
    lines.append(f"  per-GPU inject  {inj}")
    bis = d["bisection"]
    lines.append(f"  bisection       {format_bandwidth(bis['bandwidth_Bps'])} per direction ({bis['cut']})")
    lines.append("  links by kind   " + ", ".join(
        f"{kind} {v['count']} x {'/'.join(format_bandwidth(b) for b in v['bandwidths_Bps'])}"
        for kind, v in d["links_by_kind"].items()
    ))
    lines.append("  vertices        " + ", ".join(f"{k} {v}" for k, v in d["vertices_by_kind"].items()))
    for label, r in d["routes"].items():
        lines.append(
            f"  route {label.replace('_', '-')}: rank {r['src_rank']} -> {r['dst_rank']}, {r['hops']} hops, "
            f"{format_bandwidth(r['bandwidth_Bps'])} bottleneck, {format_time(r['latency_s'])}"
        )
        lines.append(f"      {' -> '.join(r['vertices'])}")
    return "\n".join(lines)
