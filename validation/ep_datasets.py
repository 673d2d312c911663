"""The MoE dispatch kernels' own benchmarks in the collective accuracy report (validation.accuracy_collectives):
HybridEP inside an NVLink domain and across H100 nodes (github.com/deepseek-ai/DeepEP docs/README_Hybrid-EP.md), each
predicted as simdist's all_to_all with the hybridep kernel (`ep_datasets`), and the inter-node shares
simdist.collectives.ep_kernels reads (`internode_shares`, stored in simdist/collectives/data/ep_internode_shares.csv
and rerun by tests/test_ep_kernels.py)."""

from __future__ import annotations

import csv
import statistics

from simdist.collectives.group import Group
from simdist.hardware.presets import load_topology
from simdist.plan.expert_parallel import expected_destination_ranks
from validation.collective_points import REPO, Dataset, Mapping, Point, measurement

EP_KERNELS_DATA = "simdist/collectives/data/ep_dispatch_kernels.csv"
HYBRIDEP_SOURCE = "github.com/deepseek-ai/DeepEP docs/README_Hybrid-EP.md @ 41cad94449628adfb1cd1cadd82aeda83d4fbf0f"


def _hybridep() -> Dataset:
    """HybridEP's own benchmark (github.com/deepseek-ai/DeepEP docs/README_Hybrid-EP.md), Torch-API rows at the SM
    count simdist prices by default (GB200: 32; B200: 16, the only one published): each rank dispatches 4096 tokens of
    hidden 7168 in BF16, top-8 of 8 experts per rank drawn uniformly, so it receives (and in the combine sends) the
    tokens of every rank that chose one of its experts, its own included: R = 4096 x E x 7168 x 2 bytes, E = P (1 -
    C(8P - 8, 8) / C(8P, 8)) the expected ranks a token reaches; the rate is R / time. Predicted as simdist's even
    all_to_all of R bytes a rank (each rank sends what it receives, on average) with the hybridep kernel."""
    points = []
    text = (REPO / EP_KERNELS_DATA).read_text(encoding="utf-8")
    for r in csv.DictReader(text.splitlines()):
        if r["library"] != "hybridep" or r["measured"] != "torch_api" or r["nodes"] != "1" or r["num_sms"] != (
                "16" if r["gpu"] == "B200" else "32"):
            continue
        ranks = int(r["ranks"])
        reached = expected_destination_ranks(8 * ranks, 8, ranks)
        nbytes = round(4096 * reached * 7168 * 2)
        for what, rate in (("dispatch BF16", r["dispatch_bf16_GBps"]), ("combine", r["combine_GBps"])):
            label = f"HybridEP {r['gpu']} {ranks} ranks {r['num_sms']} SMs {what}"
            m = measurement("all_to_all", nbytes, ranks, source=HYBRIDEP_SOURCE, label=label,
                             time_s=nbytes / (float(rate) * 1e9), nodes=1)
            cluster = "dgx-b200" if r["gpu"] == "B200" else "gb200-nvl72"
            points.append(Point(m, Mapping(cluster, ranks, kernel="hybridep"), label))
    return Dataset(
        "hybridep_dispatch_kernels", "HybridEP's dispatch and combine inside an NVLink domain (B200, GB200 NVL72)",
        EP_KERNELS_DATA,
        "the library's own benchmark (github.com/deepseek-ai/DeepEP tests/test_hybrid_ep.py: 4096 tokens per "
        "rank, hidden 7168, top-8, random uniform routing, 8 local experts; 'Torch API' timing, the call as "
        "Megatron-Core makes it); rates read from github.com/deepseek-ai/DeepEP docs/README_Hybrid-EP.md.",
        "`dgx-b200` (8 ranks) and `gb200-nvl72` (8-36 ranks of one rack), `--kernel hybridep`: a prior, not a "
        "check: simdist's HybridEP share of NVLink (simdist.collectives.ep_kernels) is these rows' mean, so the "
        "errors show only how the rows scatter about it (ranks, dispatch against combine).",
        tuple(points))


INTERNODE_CLUSTERS = {"H100": "dgx-h100"}
"""The preset each inter-node benchmark platform is priced on. # Assumption: the README's H100 nodes are DGX H100s
(8 GPUs on NVSwitch, a 400 Gb/s NIC each); it states the GPU only."""
BENCH_TOKENS, BENCH_HIDDEN, BENCH_TOPK, BENCH_LOCAL_EXPERTS = 4096, 7168, 8, 8
"""HybridEP's benchmark (github.com/deepseek-ai/DeepEP tests/test_hybrid_ep.py at the README's commit): tokens per
rank, hidden, top-k, local experts per rank."""


def _internode_rows() -> list[dict[str, str]]:
    text = (REPO / EP_KERNELS_DATA).read_text(encoding="utf-8")
    return [r for r in csv.DictReader(text.splitlines()) if r["nodes"] != "1" and r["measured"] == "torch_api"]


def _internode_case(r: dict[str, str]) -> tuple[Group, str, float]:
    """(the group, the kernel, the bytes a rank moves) of an inter-node benchmark row: the README's IB bytes, a token
    counted once per node it reaches, its own node included (github.com/deepseek-ai/DeepEP tests/utils.py
    count_rdma_send_from_routing_map), T x (expected distinct nodes of its top-k experts) x hidden x 2 B: the bytes
    simdist's cross-domain flex all_to_all is sized with (simdist.plan.expert_parallel.expected_destination_ranks, the
    nodes as its groups)."""
    from simdist.collectives.ep_kernels import ep_kernel_name

    ranks, nodes = int(r["ranks"]), int(r["nodes"])
    reached = expected_destination_ranks(BENCH_LOCAL_EXPERTS * ranks, BENCH_TOPK, nodes)
    group = Group.first(load_topology(INTERNODE_CLUSTERS[r["gpu"]], num_nodes=nodes), ranks)
    return group, ep_kernel_name(r["library"], int(r["num_sms"])), BENCH_TOKENS * reached * BENCH_HIDDEN * 2.0


def internode_shares() -> list[tuple[str, str, int, int, float]]:
    """(library, GPU architecture, nodes, SMs, share) of every inter-node torch_api series of the EP kernels' data:
    simdist's all_to_all time of the benchmark case at share 1 over the published one, dispatch (BF16) and combine
    averaged (simdist.collectives.ep_kernels: the stored `data/ep_internode_shares.csv`, which tests rerun). The time
    is affine in the bytes, t = L + X / s at the share s it is priced with now; two sizes give L and X."""
    from simdist.analytic.select import evaluate
    from simdist.collectives.ep_kernels import ep_kernel_share
    from simdist.collectives.nccl_model import gpu_arch
    from simdist.collectives.request import Request

    out = []
    for r in _internode_rows():
        group, kernel, nbytes = _internode_case(r)
        now = ep_kernel_share(kernel, group)
        t1, t2 = (evaluate(Request("all_to_all", group, b, kernel=kernel), "direct", "Simple").predicted_s
                  for b in (nbytes, 2 * nbytes))
        latency, unshared = 2 * t1 - t2, now * (t2 - t1)
        shares = [unshared / (nbytes / (float(r[c]) * 1e9) - latency) for c in ("dispatch_bf16_GBps", "combine_GBps")]
        out.append((r["library"], gpu_arch(group.topology.gpu.name), int(r["nodes"]), int(r["num_sms"]),
                    round(statistics.fmean(shares), 3)))
    return out


def _hybridep_internode() -> Dataset:
    """HybridEP's inter-node rows (H100, 2-8 nodes) at the most SMs published (16), as Megatron-Core calls it."""
    points = []
    for r in _internode_rows():
        if r["library"] != "hybridep" or r["num_sms"] != "16":
            continue
        _, kernel, nbytes = _internode_case(r)
        ranks, nodes = int(r["ranks"]), int(r["nodes"])
        for what, rate in (("dispatch BF16", r["dispatch_bf16_GBps"]), ("combine", r["combine_GBps"])):
            label = f"HybridEP {r['gpu']} {ranks} ranks on {nodes} nodes {r['num_sms']} SMs {what}"
            m = measurement("all_to_all", round(nbytes), ranks, source=HYBRIDEP_SOURCE, label=label,
                             time_s=nbytes / (float(rate) * 1e9), nodes=nodes)
            points.append(Point(m, Mapping(INTERNODE_CLUSTERS[r["gpu"]], ranks, num_nodes=nodes, kernel=kernel),
                                label))
    return Dataset(
        "hybridep_internode_kernels", "HybridEP's dispatch and combine across nodes (H100, 2-8 nodes of 8 GPUs)",
        EP_KERNELS_DATA,
        "the library's own benchmark (github.com/deepseek-ai/DeepEP tests/test_hybrid_ep.py: 4096 tokens per rank, "
        "hidden 7168, top-8, random uniform routing, 8 local experts; 'Torch API' timing; its 'IB bandwidth' counts "
        "a token once per node it reaches, its own node included, the bytes predicted here); rates read from "
        "github.com/deepseek-ai/DeepEP docs/README_Hybrid-EP.md, 'H100 Platform'.",
        "`dgx-h100` on 2, 4 and 8 nodes, `--kernel hybridep:16`: a prior, not a check: simdist's share of its own "
        "all_to_all rate across nodes (simdist.collectives.ep_kernels.internode_share) is derived from these rows, so "
        "the errors show only how dispatch and combine scatter about it.",
        tuple(points))


def ep_datasets() -> list[Dataset]:
    """HybridEP inside an NVLink domain, then across nodes."""
    return [_hybridep(), _hybridep_internode()]
