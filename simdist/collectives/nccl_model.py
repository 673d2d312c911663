"""NCCL's own cost constants as priors: protocol latencies and bandwidth limits (src/graph/tuning.cc).

Data: ``simdist/collectives/data/nccl_tuning_*.csv`` (NCCL v2.30.7-1 rows of
``validation/reference/nccl_tuning_*.csv``, source column kept). NCCL predicts a collective as
``baseLat + steps x hwLat + bytes / bw`` per (algorithm, protocol); simdist keeps the wire latency in
the topology's links (set to NCCL's LL figures, see simdist.hardware.link_defaults) and adds here what a
protocol costs beyond the wire:
- ``base_latency_s`` = baseLat[algorithm][protocol], once per collective;
- per transfer, by the path's class (nvlink / pcie / net): hwLat[class][algorithm][protocol] minus
  the wire latency the route already has (hwLat[class][Ring][LL]);
- NVLS pays its hwLat once (a multimem operation, not a per-step hop): added to the base latency;
- with one rank per node NCCL prices every network hop at the Tree's network hwLat ("latencies are fully
  exposed"), and so does simdist;
- PAT (one rank per node) pays NCCL's per-step interLat / 3.5 (the Tree's network hwLat) per transfer,
  its linear nRanks x 2.8 us in the start-up and its 0.75 bandwidth factor in the rate factor;
- NVLSTree pays NCCL's intraLat (hwLat[NVLINK][NVLSTree], 25 us) once in the start-up, as NVLS does, and its
  interLat (hwLat[NET][NVLSTree], 20.9 us) per network hop of the tree (NCCL: 2 log2i(nNodes) of them); its NVLink
  hops nothing beyond the wire; nvlsEfficiency and perChMaxNVLSTreeBws are in the plan's rate
  (simdist.collectives.nvls_tree), as they bound its NVLink and tree hops, not the protocol;
- NVLS across nodes (nvls_sharp: NVLS in each node, SHARP between them) pays NCCL's intraLat (hwLat[NVLINK][NVLS],
  25 us) once in the start-up and its interLat (hwLat[NET][NVLS], 18 us: tuning.cc "if (nNodes > 1) latency +=
  interLat") over its two network hops (up to the switches, back down: half each), its NVLink hops nothing beyond
  the wire; nvlsEfficiency is in the plan's rate (simdist.collectives.nvls_sharp), as it bounds its NVLink hops only
  (tuning.cc: min(intraBw, interBw), nvlsEfficiency in intraBw);
- CollNetDirect (SHARP) pays NCCL's interLat over its two network hops (half each), its intraLat per NVLink
  hop, 2 (ppn - 1) x 0.4 us in the start-up, and NCCL's 0.85 on Hopper and later as its rate factor;
- ``rate_factor``: payload per wire byte. LL moves 8-byte lines of 4 data + 4 flag bytes (0.5, and NCCL
  caps LL at llMaxBw); LL128 keeps 120 of every 128 bytes, NCCL applies 0.92 x busBw; Simple 1;
- NCCL's all_to_all (ncclSend/ncclRecv to every peer, simdist's direct) inside one NVLink domain reaches a smaller
  share of NVLink than the ring (`p2p_nvlink_share`, measured: ``data/nccl_p2p_nvlink.csv``), in the rate factor.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from importlib import resources

from simdist.collectives.ep_kernels import ep_kernel_share, inside_nvlink_domain
from simdist.collectives.group import Group
from simdist.collectives.protocols import ProtocolCost

PROTOCOLS = ("LL", "LL128", "Simple")

# simdist algorithm -> the NCCL algorithm whose constants it borrows.
# Assumption: direct (p2p), halving-doubling and hierarchical have no NCCL tuning entry of their own;
# they pay Ring's per-hop constants (NCCL's p2p path uses the same Simple/LL128/LL machinery).
NCCL_ALGORITHM = {"ring": "Ring", "tree": "Tree", "nvls": "NVLS", "direct": "Ring",
                  "halving_doubling": "Ring", "hierarchical": "Ring", "pat": "PAT",
                  "collnet": "CollNetDirect", "nvls_tree": "NVLSTree", "nvls_sharp": "NVLS"}

# Payload efficiency per protocol (tuning.cc: LL bw = busBw x 0.5 capped at llMaxBw, LL128 = 0.92 x busBw).
RATE_FACTOR = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}

_CLASS_TO_NCCL = {"nvlink": "NVLINK", "pcie": "PCI", "net": "NET"}

SIMPLE_ONLY = frozenset({"NVLS", "NVLSTree", "PAT", "CollNetDirect"})
"""NCCL algorithms that run the Simple protocol only (tuning.cc, ncclTopoTuneModel: NVLS and NVLSTree skip
p != Simple; PAT for AllGather/ReduceScatter likewise; CollNetDirect's LL and LL128 bandwidth is 0, "Not used")."""

COLLNET_ARITY_LATENCY_S = 0.4e-6
"""tuning.cc, CollNetDirect latency: "(nRanks/nNodes-1) * 0.4" us of "arity serialization", twice (into the
heads, out of them): added to the start-up."""
COLLNET_HOPPER_FACTOR = 0.85
"""tuning.cc: CollNetDirect "if (minCompCap >= 90) busBw *= .85"; the rate factor on Hopper and Blackwell."""

PAT_BANDWIDTH_FACTOR = 0.75
"""tuning.cc, ncclTopoTuneModel: "if (a == NCCL_ALGO_PAT) busBw *= .75"; simdist's PAT rate factor."""
PAT_LINEAR_LATENCY_S = 2.8e-6
"""tuning.cc: PAT latency "+ nRanks * 2.8" us ("still a linear part"), added to PAT's start-up per rank."""
PAT_STEP_LATENCY_DIVISOR = 3.5
"""tuning.cc: PAT's "log2i(nNodes) * (interLat / 3.5)", interLat the Tree's network hwLat at one rank per
node: a PAT step pays hwLat[NET][Tree][protocol] / 3.5."""

# The simdist algorithms NCCL itself runs for each op, i.e. what its tuner chooses among (NVIDIA/nccl
# src/graph/tuning.cc, ncclTopoTuneModel: "if (coll == ncclFuncBroadcast && a != NCCL_ALGO_RING) continue;",
# likewise Reduce; AllGather and ReduceScatter: Ring, NVLS, CollNetDirect (and PAT at one rank per node);
# AllReduce: every algorithm but PAT; NVLS across nodes is simdist's nvls_sharp, which needs SHARP as CollNet
# does). Ops NCCL has no collective kernel for (all_to_all, scatter, gather, send/recv) run as grouped
# ncclSend/ncclRecv, NCCL's p2p path: simdist's "direct".
# simdist's halving_doubling and hierarchical are not NCCL algorithms. Where an algorithm cannot run on a
# group (its Algorithm.check: PAT off one GPU per node, NVLS off an NVSwitch), the tuner skips it, as
# ncclTopoTuneModel zeroes its bandwidth. barrier is not an NCCL op (frameworks run a tiny all_reduce):
# None = any algorithm.
NCCL_RUNS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "nvls", "nvls_tree", "collnet", "nvls_sharp"),
    "all_gather": ("ring", "nvls", "pat"),
    "reduce_scatter": ("ring", "nvls", "pat"),
    "broadcast": ("ring",),
    "reduce": ("ring",),
    "all_to_all": ("direct",),
    "scatter": ("direct",),
    "gather": ("direct",),
    "send_recv": ("direct",),
}


def nccl_algorithms(op: str) -> tuple[str, ...] | None:
    """The simdist algorithms NCCL's tuner chooses among for ``op`` (None: NCCL has no such op)."""
    return NCCL_RUNS.get(op)


def _rows(name: str) -> list[dict[str, str]]:
    text = (resources.files("simdist.collectives") / "data" / name).read_text(encoding="utf-8")
    return list(csv.DictReader(text.splitlines()))


@cache
def latency_table() -> dict[tuple[str, str, str, str], float]:
    """(table, algorithm, protocol, link) -> microseconds; link is '' for baseLat."""
    return {(r["table"], r["algorithm"], r["protocol"], r["hw_link"]): float(r["value"])
            for r in _rows("nccl_tuning_latency_constants.csv")}


@cache
def bandwidth_caps() -> dict[tuple[str, str, str], float]:
    """(table prefix, arch, index) -> value, e.g. ('llMaxBws', 'Hopper', 'nNodes=1') -> 141.0 GB/s."""
    out = {}
    for r in _rows("nccl_tuning_bandwidth_caps.csv"):
        table = r["table"].split(" ")[0]
        arch = r["arch_or_cpu"].split(" / ")[0]
        out[(table, arch, r["index"])] = float(r["value"])
    return out


@cache
def _p2p_nvlink_shares() -> dict[str, float]:
    """GPU architecture -> NCCL all_to_all busbw / all_reduce (ring) busbw on NVLink, the mean over its platforms."""
    by_arch: dict[str, list[float]] = {}
    for r in _rows("nccl_p2p_nvlink.csv"):
        by_arch.setdefault(r["arch"], []).append(float(r["all_to_all_busbw_GBps"]) / float(r["all_reduce_busbw_GBps"]))
    return {arch: sum(v) / len(v) for arch, v in by_arch.items()}


def p2p_nvlink_share(group: Group) -> float:
    """The share of the ring's NVLink bandwidth NCCL's all_to_all reaches on ``group`` (1 where it does not apply).

    NCCL runs all_to_all as concurrent ncclSend/ncclRecv to every peer (its p2p path: per-peer channels and
    P2P chunks, not the ring's pipelined channels); nccl-tests on NVLink measure its busbw at 0.87-0.94 of the
    all_reduce ring's on the same GPUs (``data/nccl_p2p_nvlink.csv``: A100 210/232 = 0.905, H100 320/370 = 0.865,
    B200 640/700 = 0.914, 32 GPUs of a GB200 NVL72 640/680 = 0.941; Blackwell takes the mean of its two, 0.928),
    while the topology's NVLink efficiency is the ring's (NCCL's per-link figure). Applied to groups inside one
    NVLink domain whose routes are NVLink only.
    # Assumption: a group spanning nodes is bound by its NICs, where the same slides show NCCL's all_to_all at the
    # NIC rate (48 of 50 GB/s a NIC on 4 DGX H100, as the ring), so its NVLink hops keep the ring's efficiency;
    # GPUs without a row (none today) keep 1. The flex dispatcher's DeepEP / HybridEP kernels pay their own
    # measured shares instead (simdist.collectives.ep_kernels).
    """
    if not inside_nvlink_domain(group):
        return 1.0
    return _p2p_nvlink_shares().get(gpu_arch(group.topology.gpu.name), 1.0)


def gpu_arch(gpu_name: str) -> str:
    """NCCL's architecture bucket of a GPU name."""
    name = gpu_name.upper()
    if name.startswith(("B200", "GB200", "B300", "GB300")):
        return "Blackwell"
    if name.startswith(("H100", "H200", "GH200")):
        return "Hopper"
    # Assumption: A100 and Ada cards (L40S, sm89) use NCCL's Ampere rows.
    return "Ampere"


def supports(algorithm: str, protocol: str) -> bool:
    """Whether NCCL runs ``algorithm`` with ``protocol`` (NVLS: Simple only)."""
    nccl = NCCL_ALGORITHM[algorithm]
    if nccl in SIMPLE_ONLY:
        return protocol == "Simple"
    return protocol in PROTOCOLS


@dataclass(frozen=True, slots=True)
class PricedProtocol:
    cost: ProtocolCost
    latency_by_class_s: dict[str, float]


def protocol_cost(algorithm: str, protocol: str, group: Group, op: str | None = None,
                  kernel: str = "nccl") -> PricedProtocol:
    """What ``protocol`` adds to ``algorithm`` on ``group``'s paths (see the module docstring); ``op``: the
    collective (an all_to_all inside an NVLink domain pays its kernel's share of NVLink: NCCL's `p2p_nvlink_share`,
    or DeepEP's / HybridEP's, simdist.collectives.ep_kernels)."""
    table = latency_table()
    nccl = NCCL_ALGORITHM[algorithm]
    base = table[("baseLat", nccl, protocol, "")] * 1e-6
    per_class: dict[str, float] = {}
    if algorithm == "nvls_sharp":
        # tuning.cc: NVLS latency "intraLat", "if (nNodes > 1) ... += interLat": intraLat once, interLat over the
        # two network hops (half each, as CollNetDirect's); NVLink hops nothing beyond the wire
        base += table[("hwLat", "NVLS", protocol, "NVLINK")] * 1e-6
        wire = table[("hwLat", "Ring", "LL", "NET")]
        per_class = {"nvlink": 0.0, "pcie": 0.0,
                     "net": max(0.0, table[("hwLat", "NVLS", protocol, "NET")] / 2 - wire) * 1e-6}
    elif nccl == "NVLS":
        base += table[("hwLat", "NVLS", protocol, "NVLINK")] * 1e-6
    elif nccl == "NVLSTree":
        # tuning.cc: "intraLat + 2 * log2i(nNodes) * interLat": intraLat once, interLat per network hop of the tree
        base += table[("hwLat", "NVLSTree", protocol, "NVLINK")] * 1e-6
        wire = table[("hwLat", "Ring", "LL", "NET")]
        per_class = {"nvlink": 0.0, "pcie": 0.0,
                     "net": max(0.0, table[("hwLat", "NVLSTree", protocol, "NET")] - wire) * 1e-6}
    elif nccl == "PAT":
        # one rank per node: NCCL prices a step at the Tree's network latency / 3.5, plus 2.8 us per rank
        base += group.size * PAT_LINEAR_LATENCY_S
        for cls, link in _CLASS_TO_NCCL.items():
            wire = table[("hwLat", "Ring", "LL", link)]
            step = table[("hwLat", "Tree" if link == "NET" else "PAT", protocol, link)]
            step /= PAT_STEP_LATENCY_DIVISOR if link == "NET" else 1.0
            per_class[cls] = max(0.0, step - wire) * 1e-6
    else:
        # "With ppn=1 latencies are fully exposed, use the Tree network latency" (tuning.cc): one rank per node
        exposed = group.size > 1 and group.num_nodes == group.size
        for cls, link in _CLASS_TO_NCCL.items():
            wire = table[("hwLat", "Ring", "LL", link)]
            hw = table[("hwLat", "Tree" if exposed and link == "NET" else nccl, protocol, link)]
            if nccl == "CollNetDirect" and link == "NET":
                hw /= 2  # NCCL's one interLat, for the two network hops (up to the switches, back down)
            per_class[cls] = max(0.0, hw - wire) * 1e-6
        if nccl == "CollNetDirect":
            base += 2 * (group.size / group.num_nodes - 1) * COLLNET_ARITY_LATENCY_S
    factor = RATE_FACTOR[protocol]
    if algorithm == "nvls":
        # NCCL scales NVLS bandwidth by nvlsEfficiency (Hopper 0.85, Blackwell 0.74; tuning.cc) on top
        # of its per-link NVLink model (20.6 x 18 = 370.8 of 450 GB/s on Hopper), which the topology's
        # link efficiency already carries: NVLS moves S(1 + 1/P) per port at efficiency x nvlsEfficiency.
        # Checks: H200 8 GPUs -> 2 x 450 x 0.82 x 0.85 x 7/9 = 488 GB/s busbw (measured 473-480),
        # B200 -> 2 x 900 x 0.80 x 0.74 x 7/9 = 829 (measured 838); nccl_collectives_ml_engineering.csv.
        factor *= bandwidth_caps().get(("nvlsEfficiency", gpu_arch(group.topology.gpu.name), "factor"), 1.0)
    if algorithm == "direct" and op == "all_to_all":
        factor *= ep_kernel_share(kernel, group)
    if nccl == "PAT":
        factor *= PAT_BANDWIDTH_FACTOR
    if nccl == "CollNetDirect" and gpu_arch(group.topology.gpu.name) in ("Hopper", "Blackwell"):
        factor *= COLLNET_HOPPER_FACTOR
    if protocol == "LL":
        # NCCL caps LL bandwidth at llMaxBw (tuning.cc): one node indexes by GPU arch.
        nodes = group.num_nodes
        key = "nNodes=1" if nodes == 1 else ("nNodes=2" if nodes == 2 else "nNodes>=3")
        # Assumption: rows are read by GPU architecture for multi-node groups too (the table's
        # multi-node columns of older NCCL were indexed by CPU vendor; Hopper/Blackwell rows exist).
        cap = bandwidth_caps().get(("llMaxBws", gpu_arch(group.topology.gpu.name), key))
        nominal = group.path(0, 1).effective_bandwidth_Bps if group.size > 1 else 0.0
        if cap and nominal > 0:
            factor = min(factor, cap * 1e9 / nominal)
    return PricedProtocol(ProtocolCost(protocol, base, 0.0, factor), per_class)


NVLS_CHANNELS = {4: 16, 5: 32}
"""NCCL's NVLS channels by NVLink generation (src/transport/nvls.cc: NVLS_NCHANNELS_SM90 16, NVLS_NCHANNELS_SM100 32
across nodes)."""


def nvls_tree_chunk_bytes(nbytes: float, num_nodes: int, num_heads: int, nvlink_generation: int) -> int:
    """NCCL's NVLSTree chunk (a pipeline piece): NCCL_NVLS_CHUNKSIZE's 128 KiB, capped at 64 KiB from 4 nodes on
    (src/transport/nvls.cc, ncclNvlsTuning: treeMaxChunkSize), halved down to 32 KiB for small buffers against the
    concurrent operations nvlsChannels x nHeads (src/enqueue.cc, the NCCL_ALGO_NVLS_TREE chunk rules: 64 KiB below
    4 chunks per operation, 32 KiB below 1).
    # Assumption: the Hopper defaults on Blackwell too (ncclNvlsTreeSm100Tuning's own sizes are not modelled)."""
    chunk = 128 * 1024 if num_nodes < 4 else 64 * 1024
    ops = NVLS_CHANNELS.get(nvlink_generation, 16) * num_heads
    if nbytes < 4 * ops * chunk and chunk > 65536:
        chunk = 65536
    if nbytes < ops * chunk and chunk > 32768:
        chunk = 32768
    return chunk


NVLS_CHUNK_BYTES = 128 * 1024
"""NCCL_NVLS_CHUNKSIZE's default (src/transport/nvls.cc, ncclNvlsTuning: comm->nvlsChunkSize)."""
NVLS_SLOW_CHUNK_BYTES = 32 * 1024
NVLS_SLOW_ALGBW_Bps = 150e9
"""src/enqueue.cc, the NCCL_ALGO_NVLS chunk rules: with nNodes > 1 and NCCL's NVLS all-reduce bandwidth below 150
GB/s (comm->bandwidths, the algorithm bandwidth), the chunk is capped at 32 KiB."""


def nvls_sharp_chunk_bytes(nbytes: float, num_heads: int, algbw_Bps: float, nvlink_generation: int) -> int:
    """NCCL's NVLS chunk across nodes (a pipeline piece of simdist.collectives.nvls_sharp): NVLS_CHUNK_BYTES, 32 KiB
    where the algorithm bandwidth is below 150 GB/s, halved for small buffers against the concurrent operations
    nChannels x nHeads (src/enqueue.cc, the NCCL_ALGO_NVLS chunk rules: 64 KiB below 64 chunks per operation, 32 KiB
    below 8, 16 KiB below 2).
    # Assumption: nChannels = min(nvlsChannels, comm->nChannels) (enqueue.cc) is nvlsChannels (NVLS_CHANNELS): the
    # ring's channels are at least as many on NVSwitch nodes; the Hopper chunk on Blackwell too
    # (ncclNvlsTreeSm100Tuning's sizes are not modelled).
    # Assumption: NCCL's model bandwidth is read as the plan's own algorithm bandwidth (``algbw_Bps``)."""
    chunk = NVLS_CHUNK_BYTES if algbw_Bps >= NVLS_SLOW_ALGBW_Bps else NVLS_SLOW_CHUNK_BYTES
    ops = NVLS_CHANNELS.get(nvlink_generation, 16) * num_heads
    for times, smaller in ((64, 65536), (8, 32768), (2, 16384)):
        if nbytes < times * ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk
