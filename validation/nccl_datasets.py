"""The published NCCL measurements of the collective accuracy report (validation.accuracy_collectives), each table of
validation/reference/ mapped to the cluster, ranks, nodes, overrides and algorithm that predict it, with the reasons:
stas00/ml-engineering's sweeps and plateaus, NVIDIA's GTC bandwidth slides, the CS336 lecture's benchmarks and the
NCCL maintainers' statements in GitHub threads (`nccl_datasets`)."""

from __future__ import annotations

import statistics

from validation.accuracy_kernels import reference_rows
from validation.collective_points import (
    PLATEAU_BYTES,
    REFERENCE,
    Dataset,
    Mapping,
    NotCovered,
    Point,
    measurement,
    size_label,
)

MLE = "nccl_collectives_ml_engineering.csv"
GTC = "nccl_busbw_nvidia_gtc_slides.csv"
CS336 = "cs336_lecture_collective_benchmarks.csv"
REPORTS = "nccl_user_reports_issues.csv"

# ml-engineering rows: "(NCCL default)" -> the tuner's choice (auto); "NVLS" -> nvls; "Ring ..." -> ring.
_MLE_ALGORITHM = {"NVLS": "nvls", "Ring": "ring", "Ring (NCCL_NVLS_ENABLE=0)": "ring"}

EFA = ("inter_node.kind=roce", "inter_node.fabric=fat_tree")
"""AWS p6-b200: 8 EFA v4 adapters of 400 Gb/s per node (the source's system column). EFA is RDMA over
AWS's Ethernet fabric (SRD), so the RoCE link kind (0.96 efficiency: the GTC24 slide's 400 Gb RDMA bar)
is the closest; AWS does not describe its fabric as rail-optimized, hence a non-blocking fat tree."""

TORCH_HOST_OVERHEAD_S = (20e-6, 30e-6)
"""PyTorch's per-call host overhead, "some 20-30us" (stas00/ml-engineering network/benchmarks/
all_reduce_bench.py docstring), inside every call that sweep times from an idle device."""
TORCH_PER_CALL = frozenset({"mle_h200_node_all_reduce_bench", "mle_p6b200_1node", "mle_p6b200_4node"})

MLE_DATASETS: dict[str, tuple[str, Mapping, str, str]] = {
    # name: (title, mapping, harness, why)
    "mle_a100_node_nccltests": (
        "8x A100 SXM (DGX A100 class), nccl-tests all_reduce sweep",
        Mapping("dgx-a100", 8),
        "nccl-tests `all_reduce_perf -b 32k -e 16G -f 2 -g 8 -n 50`: one thread drives all 8 GPUs, time = mean "
        "of 50 back-to-back iterations; NCCL version not stated; the author removed columns and reformatted "
        "sizes (\"massaged\").",
        "8 NVLink3 GPUs on NVSwitch = the `dgx-a100` preset; NCCL's default algorithm = `auto`.",
    ),
    "mle_h200_node_all_reduce_bench": (
        "8x H200 SXM, torch all_reduce_bench.py sweep",
        Mapping("hgx-h200", 8),
        "all_reduce_bench.py (torch 2.9.1, NCCL 2.27.7, one process per GPU): 5 warmups, 20 trials of one "
        "dist.all_reduce timed with CUDA events from an idle device, so every call includes PyTorch's per-call "
        "host overhead (\"some 20-30us\", all_reduce_bench.py docstring); NCCL_DEBUG showed Ring/LL up to 1 MiB, "
        "NVLS/Simple from 2 MiB.",
        "8 NVLink4 GPUs on NVSwitch with NVLS = `hgx-h200`; NCCL's default = `auto`.",
    ),
    "mle_p6b200_1node": (
        "AWS p6-b200, 8x B200 one node, torch all_reduce_bench.py sweep",
        Mapping("dgx-b200", 8),
        "all_reduce_bench.py (torch 2.9.1, NCCL 2.27.7) as above, with AWS's aws-ofi-nccl tuner plugin "
        "choosing the algorithm instead of NCCL's own tuner.",
        "8 NVLink5 GPUs on NVSwitch with NVLS = `dgx-b200`; `auto` (the AWS tuner's choices are not stated).",
    ),
    "mle_p6b200_4node": (
        "AWS p6-b200 x4 (32x B200), 8x EFA 400 Gb/s per node, torch all_reduce_bench.py sweep",
        Mapping("dgx-b200", 32, 4, EFA, fidelity="fast"),
        "all_reduce_bench.py as above over 4 nodes; AWS tuner plugin; the text says Ring on p5en.",
        "`dgx-b200` x 4 nodes with the EFA override (" + ", ".join(f"`{a}`" for a in EFA) + "): EFA is RDMA "
        "over AWS's Ethernet fabric, closest to the RoCE link kind; AWS does not call it rail-optimized, hence a "
        "non-blocking fat tree; 8 x 400 Gb/s as the preset. `auto`.",
    ),
    "mle_h200_nvls_gpucount": (
        "8x H200, NVLS vs ring at 4-8 GPUs, 8 GiB",
        Mapping("hgx-h200", 8),
        "nccl-tests at 8 GiB, with NVLS (NCCL's default) and with NCCL_NVLS_ENABLE=0.",
        "`hgx-h200`, the first n GPUs; the algorithm column states what ran: NVLS -> `nvls`, Ring (either "
        "row) -> `ring`.",
    ),
    "mle_b200_nvls_gpucount": (
        "AWS p6-b200 (8x B200), NVLS vs ring at 4-8 GPUs, 8 GiB",
        Mapping("dgx-b200", 8),
        "nccl-tests at 8 GiB (NCCL 2.27.7), with NVLS (default) and with NCCL_NVLS_ENABLE=0.",
        "`dgx-b200`, the first n GPUs; NVLS -> `nvls`, Ring -> `ring` as stated per row.",
    ),
    "mle_h200_collectives_16GiB": (
        "8x H200, all_reduce / all_gather / reduce_scatter at 16 GiB",
        Mapping("hgx-h200", 8),
        "nccl-tests `-b 16G -e 16G -g 8 -z 1`.",
        "`hgx-h200`; NVLS -> `nvls`, Ring -> `ring` as stated per row.",
    ),
    "mle_h200_ring_vs_sharp_16GiB": (
        "8x H200, ring all_reduce at 16 GiB (torch)",
        Mapping("hgx-h200", 8),
        "all_reduce_bench.py with NCCL_NVLS_ENABLE=0 (NCCL 2.27.7).",
        "`hgx-h200`, `ring` (NVLS disabled).",
    ),
}


def _mle() -> list[Dataset]:
    rows = reference_rows(REFERENCE / MLE)
    out = []
    for name, (title, base, harness, why) in MLE_DATASETS.items():
        points = []
        for r in rows:
            if r["dataset"] != name:
                continue
            ranks, nodes = int(r["gpus"]), int(r["nodes"])
            algorithm = _MLE_ALGORITHM.get(r["algorithm"], "auto")
            mapping = Mapping(base.cluster, ranks, nodes if nodes > 1 else None, base.assignments, algorithm,
                              base.fidelity)
            nbytes = int(float(r["size_bytes"]))
            time_s = float(r["time_us"]) * 1e-6 if r["time_us"] else None
            m = measurement(r["collective"], nbytes, ranks, source=r["source"], label=name,
                             busbw_GBps=float(r["busbw_GBps"]), time_s=time_s, nodes=nodes,
                             algorithm=None if algorithm == "auto" else algorithm, version=r["nccl_version"])
            label = size_label(nbytes)
            if name in ("mle_h200_nvls_gpucount", "mle_b200_nvls_gpucount", "mle_h200_collectives_16GiB"):
                label = f"{r['collective']} {ranks} GPUs, {r['algorithm']}, {label}"
            points.append(Point(m, mapping, label))
        host = TORCH_HOST_OVERHEAD_S if name in TORCH_PER_CALL else None
        forced = ("ring", "Simple") if name == "mle_p6b200_4node" else None  # "Ring" per the source's text
        out.append(Dataset(name, title, MLE, harness, why, tuple(points), host, forced))
    return out


# GTC slide bars -> (cluster, ranks, nodes, overrides, algorithm, why). None: not covered, with the reason.
_PCIE_2X4 = ("host.cpu_sockets=1", "host.pcie_switches_per_socket=2")
_ONE_NIC = ("inter_node.nics_per_node=1",)
_GTC_MAP: dict[tuple[str, str, str], tuple[Mapping, str] | str] = {
    ("all_reduce", "intra-node", "PCIe Gen4"): (
        Mapping("pcie-gen4-8gpu", 8, assignments=_PCIE_2X4),
        "PCIe Gen4 preset; 2x4 GPUs under one CPU (the only PCIe layout the slides state, GTC25 slide 13): a "
        "ring crossing a CPU interconnect would be capped by it (xGMI/UPI 16-22 GB/s), below the bar"),
    ("all_reduce", "intra-node", "PCIe Gen5"): (
        Mapping("pcie-gen5-8gpu", 8, assignments=_PCIE_2X4), "PCIe Gen5 preset, 2x4 GPUs as above"),
    ("all_reduce", "intra-node", "PCI Gen 6"): (
        Mapping("pcie-gen5-8gpu", 8, assignments=(*_PCIE_2X4, "host.pcie.generation=6")),
        "no Gen6 preset: the Gen5 box with `host.pcie.generation=6`, 2x4 GPUs as above"),
    ("all_reduce", "intra-node", "NVLink2 (V100)"): "no V100 / NVLink2 preset",
    ("all_reduce", "intra-node", "NVLink3 (A100)"): (Mapping("dgx-a100", 8), "NCCL default on A100 = `auto`"),
    ("all_reduce", "intra-node", "NVLink4 (H100)"): (
        Mapping("dgx-h100", 8, algorithm="ring"), "the slide's non-SHARP NVLink bar: NVLS off, so `ring`"),
    ("all_reduce", "intra-node", "NVLink4 SHARP (H100)"): (Mapping("dgx-h100", 8, algorithm="nvls"), "NVLink SHARP"),
    ("all_reduce", "intra-node", "NVLink5 (B200)"): (
        Mapping("dgx-b200", 8, algorithm="ring"), "non-SHARP NVLink bar: `ring`"),
    ("all_reduce", "intra-node", "NVLink5 SHARP (B200)"): (Mapping("dgx-b200", 8, algorithm="nvls"), "NVLink SHARP"),
    ("all_reduce", "multi-node", "100GbE, TCP/IP sockets"): (
        Mapping("dgx-h100", 32, 4, (*_ONE_NIC, "inter_node.nic_bandwidth=100 Gb/s", "inter_node.kind=ethernet"),
                fidelity="fast"),
        "one 100 GbE NIC per node, kernel TCP (`ethernet`); 4 nodes x 8 GPUs as the GTC25 multi-node bars "
        "(GTC24 states no size; the plateau hardly depends on it); the GPU does not matter behind one NIC"),
    ("all_reduce", "multi-node", "200Gb RDMA (IB/RoCE)"): (
        Mapping("dgx-h100", 32, 4, (*_ONE_NIC, "inter_node.nic_bandwidth=200 Gb/s"), fidelity="fast"),
        "one 200 Gb/s RDMA NIC per node, 4 x 8 GPUs as above"),
    ("all_reduce", "multi-node", "400Gb RDMA (IB/RoCE)"): (
        Mapping("dgx-h100", 32, 4, _ONE_NIC, fidelity="fast"), "one 400 Gb/s RDMA NIC per node, 4 x 8 GPUs"),
    ("all_reduce", "multi-node", "2x200Gb RDMA (IB/RoCE)"): (
        Mapping("dgx-h100", 32, 4, ("inter_node.nics_per_node=2", "inter_node.nic_bandwidth=200 Gb/s"),
                fidelity="fast"),
        "two 200 Gb/s NICs per node, 32 GPUs as the slide states"),
    ("all_reduce", "multi-node", "NVL3 + 8x 200Gb RDMA (DGX A100)"): (
        Mapping("dgx-a100", 32, 4, fidelity="fast"), "4 DGX A100 (32 GPUs), `auto`"),
    ("all_reduce", "multi-node", "NVL4 + 8x 400Gb RDMA (DGX H100)"): (
        Mapping("dgx-h100", 32, 4, fidelity="fast"),
        "4 DGX H100 (32 GPUs), `auto` (NCCL runs NVLS across nodes only with IB SHARP, the other bar)"),
    ("all_reduce", "multi-node", "SHARP 8x 400Gb RDMA (DGX H100)"): (
        Mapping("dgx-h100", 32, 4, ("inter_node.sharp=true",), fidelity="fast"),
        "4 DGX H100 (32 GPUs) whose InfiniBand switches reduce (`inter_node.sharp=true`), `auto`: NCCL's NVLS across "
        "nodes (`nvls_sharp`: NVLS in each node, SHARP between them), which NCCL enables only with CollNet/SHARP"),
    ("all_reduce", "multi-node", "NVLink (GB200 NVL72)"): (
        Mapping("gb200-nvl72", 32, algorithm="ring", fidelity="fast"),
        "32 GPUs of one NVL72 NVLink domain; the non-SHARP bar: `ring`"),
    ("all_reduce", "multi-node", "NVLink5 SHARP (GB200 NVL72)"): (
        Mapping("gb200-nvl72", 32, algorithm="nvls"), "32 GPUs of one NVL72 domain, NVLink SHARP"),
    ("alltoall", "intra-node", "PCI Gen5, 2x4 GPUs"): (
        Mapping("pcie-gen5-8gpu", 8, assignments=_PCIE_2X4), "PCIe Gen5 preset with the stated 2x4 GPUs"),
    ("alltoall", "intra-node", "PCI Gen6, 2x4 GPUs"): (
        Mapping("pcie-gen5-8gpu", 8, assignments=(*_PCIE_2X4, "host.pcie.generation=6")),
        "the Gen5 box with `host.pcie.generation=6`, 2x4 GPUs"),
    ("alltoall", "intra-node", "NVLink3 (A100)"): (Mapping("dgx-a100", 8), "`dgx-a100`"),
    ("alltoall", "intra-node", "NVLink4 (H100)"): (Mapping("dgx-h100", 8), "`dgx-h100`"),
    ("alltoall", "intra-node", "NVLink5 (B200)"): (Mapping("dgx-b200", 8), "`dgx-b200`"),
    ("alltoall", "multi-node", "2x 200Gb RDMA (IB/RoCE)"): (
        Mapping("dgx-h100", 32, 4, ("inter_node.nics_per_node=2", "inter_node.nic_bandwidth=200 Gb/s"),
                fidelity="fast"), "two 200 Gb/s NICs per node, 32 GPUs"),
    ("alltoall", "multi-node", "2x 400Gb RDMA (IB/RoCE)"): (
        Mapping("dgx-h100", 32, 4, ("inter_node.nics_per_node=2",), fidelity="fast"),
        "two 400 Gb/s NICs per node, 32 GPUs"),
    ("alltoall", "multi-node", "8x 200Gb RDMA (DGX A100)"): (
        Mapping("dgx-a100", 32, 4, fidelity="fast"), "4 DGX A100"),
    ("alltoall", "multi-node", "8x 400Gb RDMA (DGX H100)"): (
        Mapping("dgx-h100", 32, 4, fidelity="fast"), "4 DGX H100"),
    ("alltoall", "multi-node", "NVLink5 (GB200 NVL72)"): (
        Mapping("gb200-nvl72", 32, fidelity="fast"), "32 GPUs of one NVL72 domain"),
}


def _gtc() -> tuple[list[Dataset], list[NotCovered]]:
    groups: dict[str, list[Point]] = {}
    why: dict[str, list[str]] = {}
    skipped = []
    for r in reference_rows(REFERENCE / GTC):
        key = (r["collective"], r["scope"], r["interconnect"])
        target = _GTC_MAP[key]
        label = f"{r['talk']} {r['interconnect']}"
        if isinstance(target, str):
            skipped.append(NotCovered(f"{GTC}: {label} ({r['collective']})", target))
            continue
        mapping, reason = target
        op = "all_to_all" if r["collective"] == "alltoall" else r["collective"]
        name = f"gtc_{'alltoall' if op == 'all_to_all' else 'allreduce'}_plateaus"
        m = measurement(op, PLATEAU_BYTES, mapping.num_ranks, source=r["source"], label=label,
                         busbw_GBps=float(r["busbw_GBps"]), nodes=mapping.num_nodes,
                         algorithm=None if mapping.algorithm == "auto" else mapping.algorithm)
        groups.setdefault(name, []).append(Point(m, mapping, label))
        line = f"{r['interconnect']}: {mapping.describe()} - {reason}"
        if line not in why.setdefault(name, []):
            why[name].append(line)
    harness = ("NVIDIA GTC24 S62129 / GTC25 S72583 slide bars (nccl-tests bus bandwidth, read off the images; "
               "plateau values, size not stated), GTC25: 8 GPUs intra-node, 32 GPUs multi-node.")
    titles = {"gtc_allreduce_plateaus": "NVIDIA GTC24/25 all_reduce busbw plateaus per fabric",
              "gtc_alltoall_plateaus": "NVIDIA GTC25 all_to_all busbw plateaus per fabric"}
    datasets = [Dataset(name, titles[name], GTC, harness,
                        f"Each bar at {size_label(PLATEAU_BYTES)}:\n" + "\n".join(f"- {w}" for w in why[name]),
                        tuple(points)) for name, points in groups.items()]
    return datasets, skipped


def _cs336() -> Dataset:
    rows = reference_rows(REFERENCE / CS336)
    runs: dict[tuple[str, str, int], list[dict[str, str]]] = {}
    for r in rows:
        runs.setdefault((r["run"], r["op"], int(r["world_size"])), []).append(r)
    points = []
    for (run, op_text, ranks), rs in runs.items():
        op = "reduce_scatter" if op_text.startswith("reduce_scatter") else op_text
        per_rank_bytes = int(rs[0]["tensor_bytes_output"])
        # nccl-tests size: all_reduce = the buffer; reduce_scatter = the full input (ranks x the output)
        nbytes = per_rank_bytes * (ranks if op == "reduce_scatter" else 1)
        durations = []
        for r in rs:
            text = r["duration_ms"]
            lo, _, hi = text.partition("-")
            durations.append((float(lo) + float(hi or lo)) / 2)  # "12-13" (rounded to ms): the midpoint
        time_s = statistics.mean(durations) * 1e-3  # the ranks' own timings of the same call
        m = measurement(op, nbytes, ranks, source=rs[0]["source"], label=f"{run} {op_text} ws={ranks}",
                         time_s=time_s, nodes=1)
        points.append(Point(m, Mapping("dgx-h100", ranks), f"{run}: {op} {ranks} GPUs, {size_label(nbytes)}"))
    return Dataset(
        "cs336_lecture", "Stanford CS336 lecture benchmark (H100 SXM node, 2-4 GPUs)", CS336,
        "torch.distributed, one timed call after one warm-up; time.time() around the call, "
        "torch.cuda.synchronize() and a barrier, so host overheads and the barrier are in the time; 2024 runs "
        "print milliseconds rounded to 1 ms (\"12-13\": the midpoint). Per-rank durations are averaged. The "
        "lecture's own GiB/s formula differs from nccl-tests, so the times are compared (the table's busbw is "
        "computed from them by nccl-tests' formula).",
        "4 (or 2) GPUs of an 8-GPU NV18 H100 node = the first ranks of `dgx-h100`; `auto`. reduce_scatter_tensor "
        "with an output of N floats per rank has the nccl-tests size ranks x N x 4 bytes.",
        tuple(points))


H20_AS_H100 = "dgx-h100"
"""No H20 preset: an H20 node is a DGX H100 for collectives (the same 900 GB/s NVLink 4 on NVSwitch gen3 with NVLS,
NVIDIA's H20 product brief; NCCL prices both as Hopper), and NVIDIA/nccl#1244's 16 CX7 NDR NICs over 2 nodes are the
preset's 8 x 400 Gb/s per node. The H20's lower compute does not enter a collective's time."""


def _nvls_tree_floor() -> Dataset:
    """NVIDIA/nccl#1244: 2 nodes x 8 H20, NCCL 2.21.5, NCCL_ALGO=NVLSTree, out-of-place times at 4, 64 and 512 B."""
    (row,) = [r for r in reference_rows(REFERENCE / REPORTS) if r["thread"] == "NVIDIA/nccl#1244"]
    points = []
    for nbytes, time_us in ((4, 47.54), (64, 46.30), (512, 46.58)):  # the row's reported_numbers
        label = f"16x H20 NVLSTree {nbytes}B"
        m = measurement("all_reduce", nbytes, 16, source=row["source_url"], label=label, time_s=time_us * 1e-6,
                         nodes=2, algorithm="nvls_tree", version="2.21.5")
        points.append(Point(m, Mapping(H20_AS_H100, 16, 2, algorithm="nvls_tree"), label))
    return Dataset(
        "nccl_issue_1244_nvls_tree_floor", "NVIDIA/nccl#1244: NVLSTree latency floor, 2 nodes x 8 H20", REPORTS,
        "nccl-tests all_reduce_perf (user report, excerpt): NCCL 2.21.5 with NCCL_ALGO=NVLSTree, 2 nodes x 8 H20, 16 "
        "CX7 NDR NICs; out-of-place time per all-reduce, ~46-48 us from 4 B to 512 B.",
        f"`{H20_AS_H100}` (no H20 preset: the H20's NVLink 4 and NVSwitch are the H100's, the "
        "NICs 8 x 400 Gb/s per node as the preset), 16 ranks on 2 nodes, `nvls_tree` as the run forced. Below 1 MiB: "
        "reported only. It checks the latency of NCCL's NVLSTree model (tuning.cc: 25 us + 2 log2(nNodes) x 20.9 us "
        "= 66.8 us at 2 nodes), which simdist pays with its wire latencies: the measured floor lies ~20 us below "
        "NCCL's own model, and the constants are kept as NCCL states them, not fitted to it.",
        tuple(points))


def _reports() -> Dataset:
    points = []
    for r in reference_rows(REFERENCE / REPORTS):
        if r["thread"] != "NVIDIA/nccl-tests#212":
            continue
        for algorithm, busbw in (("ring", 370.0), ("nvls", 480.0)):
            label = f"8x H100 {algorithm} (maintainer: ~{busbw:.0f} GB/s)"
            m = measurement("all_reduce", PLATEAU_BYTES, 8, source=r["source_url"], label=label, busbw_GBps=busbw,
                             nodes=1, algorithm=algorithm)
            points.append(Point(m, Mapping("dgx-h100", 8, algorithm=algorithm), label))
    return Dataset(
        "nccl_maintainer_h100", "NCCL maintainer statement: H100 ring ~370, NVLS ~480 GB/s busbw", REPORTS,
        "sjeaugey (NVIDIA), NVIDIA/nccl-tests#212: ~370 GB/s busbw with NCCL_ALGO=RING, NVLS peak ~480 GB/s on "
        f"8 GPUs at large sizes (predicted at {size_label(PLATEAU_BYTES)}).",
        "`dgx-h100`, 8 ranks, `ring` and `nvls`.", tuple(points))


NOT_COVERED_FIXED: tuple[NotCovered, ...] = (
    NotCovered(f"{MLE}: mle_h100_32rank_example",
               "32 H100 ranks over 4 nodes whose inter-node fabric the source does not state ('use only "
               "qualitatively'): no mapping to a fabric can be justified"),
    NotCovered(f"{MLE}: mle_mi300x_p2p_effect", "AMD MI300X with RCCL: out of scope (no AMD presets)"),
    NotCovered(f"{REPORTS}: other rows",
               "consumer PCIe cards without presets (RTX 2080Ti/4090/5090, DGX Spark), a partially NVLinked "
               "A100 box, an H800 (no preset), vague figures (A100 '~200 GB/s'), latency floors below 1 MiB "
               "other than NVIDIA/nccl#1244's NVLSTree floor (predicted above) and nvbandwidth p2p: informative, "
               "not predicted"),
)


def nccl_datasets() -> tuple[list[Dataset], list[NotCovered]]:
    """Every NCCL dataset, and what the references hold that is not predicted (with the reason)."""
    gtc, skipped = _gtc()
    return [*_mle(), *gtc, _cs336(), _reports(), _nvls_tree_floor()], [*skipped, *NOT_COVERED_FIXED]
