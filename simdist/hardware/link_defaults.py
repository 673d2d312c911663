"""Default latency and efficiency of each link kind, where a topology file leaves them out.

``efficiency`` is achieved / nominal bandwidth of a link under a bulk transfer (protocol overhead,
flow control); ``latency_s`` is the one-way latency a message pays on that link (wire, switch
traversal, NIC processing), so that a route's latency is the sum over its links. Calibration
(`simdist calibrate`) replaces these priors with fitted values.

The latency split per link is chosen so that a route's sum equals NCCL's own per-step estimate for
that path (NCCL src/graph/tuning.cc hwLat, LL protocol, the closest to raw hardware latency; copied in
``validation/reference/nccl_tuning_latency_constants.csv``):
  NVLink GPU->NVSwitch->GPU: 2 links x 0.3 us = 0.6 us = hwLat[NVLINK][Ring][LL]
  PCIe   GPU->switch->GPU:    2 links x 0.5 us = 1.0 us = hwLat[PCI][Ring][LL]
  network GPU->PCIe->NIC->leaf->NIC->PCIe->GPU: 4 x 0.5 + 2 x 0.35 = 2.7 us = hwLat[NET][Ring][LL]
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LinkDefaults:
    latency_s: float
    efficiency: float


LINK_DEFAULTS: dict[str, LinkDefaults] = {
    # Assumption: 0.3 us per NVLink hop (see module docstring). Efficiency is set per NVLink
    # generation in each preset file (measured ring busbw / nominal), this is only the fallback:
    # NCCL models 20.6 GB/s x 18 links = 370.8 of 450 GB/s on Hopper (nccl topo.h SM90_NVLINK_BW) -> 0.82.
    "nvlink": LinkDefaults(latency_s=0.3e-6, efficiency=0.82),
    # Assumption: 0.5 us per PCIe hop. Efficiency: measured H2D 55.43 GB/s of 63 GB/s nominal on a
    # PCIe Gen5 x16 H200 node = 0.88 (hardware_interconnect_specs.csv, ml-engineering network/README.md).
    "pcie": LinkDefaults(latency_s=0.5e-6, efficiency=0.88),
    # Assumption: inter-socket links carry the rate NCCL assumes for P2P across sockets (topo.h
    # *_QPI_BW / AMD_BW), already an achieved figure, hence efficiency 1; 0.5 us like a PCIe hop.
    "cpu_interconnect": LinkDefaults(latency_s=0.5e-6, efficiency=1.0),
    # 400 Gb RDMA (IB/RoCE) all-reduce busbw 48 GB/s of 50 GB/s; 200 Gb RDMA 24 of 25 (NVIDIA GTC24
    # S62129 slide 12, nccl_busbw_nvidia_gtc_slides.csv); CX-7 NDR "up to 48-49 GB/s per NIC"
    # (nccl-tests#267) -> 0.96. Latency: Assumption, 0.35 us per fabric link (module docstring).
    "infiniband": LinkDefaults(latency_s=0.35e-6, efficiency=0.96),
    # Same GTC24 slide groups RoCE with IB (RDMA) -> 0.96. Assumption: Ethernet switches add
    # ~0.15 us per hop over IB's cut-through forwarding -> 0.5 us per fabric link.
    "roce": LinkDefaults(latency_s=0.5e-6, efficiency=0.96),
    # 100GbE TCP/IP sockets all-reduce busbw 10 GB/s of 12.5 GB/s (GTC24 slide 12) -> 0.80.
    # Assumption: the kernel TCP stack costs ~5 us per link traversal (vs ~0.5 us with RDMA).
    "ethernet": LinkDefaults(latency_s=5.0e-6, efficiency=0.80),
}

# PCIe nominal rate per direction of an x16 link, GB/s: transfer rate x lanes x encoding / 8 bits.
# Gen3 8 GT/s, Gen4 16, Gen5 32 with 128b/130b encoding; Gen6 64 GT/s PAM4 with 242/256 FLIT
# efficiency (PCI-SIG base specs; reference table hardware_interconnect_specs.csv gives ~15.75, 31,
# 63, 121 GB/s for x16).
PCIE_GT_PER_S = {3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
PCIE_ENCODING = {3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}


def pcie_bandwidth_Bps(generation: int, lanes: int) -> float:
    """Nominal PCIe bandwidth per direction in bytes/s: Gen5 x16 -> 63.0e9."""
    return PCIE_GT_PER_S[generation] * 1e9 * lanes * PCIE_ENCODING[generation] / 8.0
