"""NVLS: NVLink SHARP, the NVSwitch (gen3+) reducing and multicasting in the network (NCCL 2.17+).

NCCL's NVLS all-reduce (NVIDIA/nccl src/device/all_reduce.h, RunWorkColl<ncclFuncAllReduce, T, RedOp,
NCCL_ALGO_NVLS, NCCL_PROTO_SIMPLE>; PTX ISA multimem.ld_reduce / multimem.st): the buffer is cut
into P segments, segment j owned by peer j. Peer j
reduces its segment with ``multimem.ld_reduce`` (the switch reads every GPU's copy, adds them and
returns the sum to j), then stores it with ``multimem.st`` (one write that the switch multicasts to
every GPU of the group, j included). Here, with ``SWITCH`` the switch's reduction engine:

- reduce_scatter: every peer pushes its copy of each segment to SWITCH (reduce transfers, the switch
  accumulates), then SWITCH sends the reduced segment j to peer j;
- all_gather: peer j pushes segment j to SWITCH once, SWITCH multicasts it to every peer (one
  SWITCH -> peer transfer each, j included, as multimem.st writes every GPU's copy);
- all_reduce: reduce_scatter then all_gather, segment by segment.

Per GPU the NVLink uplink carries S (pushes) + S/P (the store) and the downlink S/P (the reduced
segment) + S (the multicast): S (1 + 1/P) each way for all_reduce, against 2 S (P-1)/P for the ring.

Schedule. The P pushes of a segment may run at once (reductions into the switch's buffer commute).
# Assumption: each GPU port serves one transfer at a time, in a fixed order (the plan adds "previous
transfer on this port" dependencies): peer i pushes segments i, i+1, ... (mod P), so at any instant
the P GPUs push P different segments, and the buffer
is cut into k pipeline pieces so the downlink's multicast of piece q overlaps the uplink's pushes of
piece q+1. Every transfer then crosses exactly one port alone: it takes alpha + s / B, s = S / (k P),
and the collective takes (longest dependency chain) x (alpha + s / B), counted in simdist.analytic.nvls.

NVLS link efficiency: NCCL's nvlsEfficiency is applied by simdist.collectives.nccl_model.protocol_cost
as the NVLS protocol's rate factor, on top of the topology's link efficiency (see NVLS_EFFICIENCY).
"""

from __future__ import annotations

import math

import numpy as np

from simdist.collectives.group import Group
from simdist.collectives.nccl_model import bandwidth_caps
from simdist.collectives.plan import SWITCH, Plan, Transfer
from simdist.collectives.registry import Algorithm, register
from simdist.collectives.request import Request
from simdist.errors import SimdistError
from simdist.hardware.batch import link_capacities
from simdist.hardware.topology import Topology

NVLS_OPS = frozenset({"all_reduce", "reduce_scatter", "all_gather"})

NVLS_EFFICIENCY: dict[int, float] = {
    generation: bandwidth_caps()[("nvlsEfficiency", arch, "factor")]
    for generation, arch in ((4, "Hopper"), (5, "Blackwell"))
}
"""NCCL's nvlsEfficiency by NVLink generation (4 = Hopper 0.85, 5 = Blackwell 0.74), read from the
tuning data simdist.collectives.nccl_model uses (NVIDIA/nccl src/graph/tuning.cc). The plans do not
apply it: `nccl_model.protocol_cost` multiplies it into the NVLS protocol's rate factor, on top of the
topology's link efficiency (H200 8 GPUs: 472.5 GB/s busbw predicted vs 473-480 measured).
`nvls_rate_factor` is the other reading (nvlsEfficiency *replacing* the link efficiency: ~576 GB/s on
8 H100s, too fast against the measurements); kept to show why it was not taken."""

NVLS_PIECE_BYTES = 2 * 2**20
"""# Assumption: smallest pipeline piece of one segment (2 MiB): below it the per-transfer latency
(~0.3 us on an NVLink port) would cost more than 5% of the piece's time at 369 GB/s."""
NVLS_MAX_PIECES = 64
NVLS_MAX_TRANSFERS = 2**15
"""Caps on the pipeline depth, so that a plan stays a few 10^4 transfers (engine cost)."""


def nvls_link_efficiency(topology: Topology) -> float | None:
    """NCCL's nvlsEfficiency for this topology's NVLink generation (None: no NVLS or unknown)."""
    up = topology.spec.scale_up
    return NVLS_EFFICIENCY.get(up.nvlink_generation) if up is not None and up.nvls else None


def nvls_port_rate(group: Group, heads: np.ndarray, copies: int = 1) -> float:
    """The rate (wire bytes/s) every NVLink hop of a multi-node NVLS plan can keep on ``group``'s switch ports, times
    nvlsEfficiency: each GPU's uplink carries its push of every one of the H segments and, where it is a head, the
    store of its own segments (``heads``: [N, H] head peers); its downlink the H segments it gets back (the reduced
    sum where a head, the multicast otherwise); ``copies`` of all that at once (NVLS-Tree's two trees).
    (simdist.collectives.nvls_tree, nvls_sharp.)"""
    t = group.topology
    h = heads.shape[1]
    ports = np.asarray([t.nvswitch_ports(r) for r in group.ranks], dtype=np.int64)  # [P, (up, down)]
    caps = link_capacities(t, ports.reshape(-1)).reshape(-1, 2)
    heads_of = np.bincount(heads.reshape(-1), minlength=group.size)
    up = caps[:, 0] / (copies * (h + heads_of))
    down = caps[:, 1] / (copies * h)
    return float(min(up.min(), down.min())) * nvls_link_efficiency(t)


def nvls_rate_factor(topology: Topology) -> float | None:
    """nvlsEfficiency / the NVLink port's efficiency: the rate factor that turns the topology's ring
    efficiency into NCCL's NVLS one (1.037 on dgx-h100, 0.925 on gb200-nvl72); None without NVLS."""
    eff = nvls_link_efficiency(topology)
    if eff is None:
        return None
    return eff / topology.link(topology.nvswitch_ports(0)[0]).efficiency


def _transfers_per_piece(op: str, p: int) -> int:
    return {"reduce_scatter": p * (p + 1), "all_gather": p * (p + 1)}.get(op, p * (2 * p + 2))


def nvls_pieces(op: str, num_peers: int, nbytes: float) -> int:
    """Pipeline pieces k: segments of at least NVLS_PIECE_BYTES, at most the caps."""
    p = num_peers
    cap = max(1, min(NVLS_MAX_PIECES, NVLS_MAX_TRANSFERS // _transfers_per_piece(op, p)))
    return max(1, min(cap, math.floor(nbytes / (p * NVLS_PIECE_BYTES))))


class _Ports:
    """Emits transfers, each after the previous transfer on the same GPU port (one at a time)."""

    def __init__(self) -> None:
        self.transfers: list[Transfer] = []
        self.last: dict[tuple[str, int], int] = {}

    def emit(self, src: int, dst: int, nbytes: float, chunk: int, reduce: bool, deps: list[int | None]) -> int:
        port = ("up", src) if dst == SWITCH else ("down", dst)
        after = sorted({d for d in (*deps, self.last.get(port)) if d is not None})
        self.transfers.append(Transfer(src, dst, nbytes, chunk, reduce, tuple(after)))
        self.last[port] = len(self.transfers) - 1
        return self.last[port]


def nvls_plan(op: str, num_peers: int, nbytes: float, pieces: int | None = None) -> Plan:
    """The NVLS plan for ``op`` (all_reduce, reduce_scatter, all_gather) on P peers of one switch."""
    if op not in NVLS_OPS:
        raise ValueError(f"nvls does not implement {op}")
    p = num_peers
    k = pieces if pieces is not None else nvls_pieces(op, p, nbytes)
    s = nbytes / (k * p)
    ports = _Ports()
    reduced: dict[int, int] = {}  # chunk -> its SWITCH-to-owner transfer (reduce-scatter result)
    stored: dict[int, int] = {}  # chunk -> its owner-to-SWITCH store (all-gather input)

    def reduce_scatter(q: int) -> None:
        pushes: dict[int, list[int | None]] = {}
        for m in range(p):
            for i in range(p):
                c = q * p + (i + m) % p
                pushes.setdefault(c, []).append(ports.emit(i, SWITCH, s, c, True, []))
        for j in range(p):
            c = q * p + j
            reduced[c] = ports.emit(SWITCH, j, s, c, False, pushes[c])

    def store(q: int) -> None:
        for j in range(p):
            c = q * p + j
            stored[c] = ports.emit(j, SWITCH, s, c, False, [reduced.get(c)])

    def multicast(q: int) -> None:
        for i in range(p):
            for m in range(p):
                c = q * p + (i + m) % p
                ports.emit(SWITCH, i, s, c, False, [stored[c]])

    if p > 1:
        if op == "reduce_scatter":
            for q in range(k):
                reduce_scatter(q)
        elif op == "all_gather":
            for q in range(k):
                store(q)
                multicast(q)
        else:
            # uplink order: RS(0), RS(1), store(0), RS(2), store(1), ..., store(k-1);
            # downlink order: R(0), R(1), multicast(0), R(2), multicast(1), ..., multicast(k-1)
            reduce_scatter(0)
            for q in range(1, k):
                reduce_scatter(q)
                store(q - 1)
                multicast(q - 1)
            store(k - 1)
            multicast(k - 1)
    return Plan(op=op, algorithm="nvls", num_peers=p, nbytes=nbytes, transfers=tuple(ports.transfers),
                num_chunks=k * p, chunk_segment=tuple(c % p for c in range(k * p)))


def nvls_chain_length(op: str, num_peers: int, pieces: int) -> int:
    """L: transfers on the longest dependency chain of the NVLS plan (simdist.analytic.nvls)."""
    p, k = num_peers, pieces
    if p < 2:
        return 0
    if op in ("reduce_scatter", "all_gather"):
        return k * p + 1
    return 2 * p + 2 if k == 1 else k * (p + 1) + 2 * p - 1


def nvls_time_s(group: Group, op: str, nbytes: float, pieces: int,
                per_transfer_latency_s: float = 0.0, rate_factor: float = 1.0) -> float:
    """Time of the NVLS plan of ``op`` with ``pieces`` pipeline pieces on ``group`` (one NVSwitch):
    L x tau, tau = a transfer's latency + s / (port bandwidth x rate factor) at the slowest port."""
    p = group.size
    if p < 2:
        return 0.0
    s = nbytes / (pieces * p)
    ports = [group.path(i, SWITCH) for i in range(p)] + [group.path(SWITCH, i) for i in range(p)]
    # the engine puts s / rate_factor bytes on the wire (simdist.engine.executor)
    tau = max(r.latency_s + per_transfer_latency_s + s / (r.effective_bandwidth_Bps * rate_factor) for r in ports)
    return nvls_chain_length(op, p, pieces) * tau


def port_transfers(op: str, num_peers: int, pieces: int) -> tuple[int, int]:
    """Transfers of ``op``'s plan through each GPU's (uplink, downlink): per piece P pushes and a store up,
    a reduced segment and P multicast segments down (all_reduce); one half each for the halves."""
    p, k = num_peers, pieces
    if op == "reduce_scatter":
        return k * p, k
    if op == "all_gather":
        return k, k * p
    return k * (p + 1), k * (p + 1)


def nvls_fast(req: Request) -> Plan:
    """Fast fidelity: one flow per GPU port (up to the switch, down from it) carrying all the port's
    segments, from the end of its latency at the steady rate that lands it when the detailed plan ends
    (`nvls_time_s`, with the request's protocol). A port serves one flow, as it serves one transfer at
    a time, so alone the plan takes the detailed plan's time; next to other traffic each port's bytes
    are spread over the whole collective."""
    check_nvls(req)
    p, proto = req.num_peers, req.protocol
    k = nvls_pieces(req.op, p, req.nbytes)
    end = nvls_time_s(req.group, req.op, req.nbytes, k, proto.per_transfer_latency_s, proto.rate_factor)
    s = req.nbytes / (k * p)
    transfers = []
    for count, upward in zip(port_transfers(req.op, p, k), (True, False), strict=True):
        for i in range(p):
            a, b = (i, SWITCH) if upward else (SWITCH, i)
            latency = req.group.path(a, b).latency_s + proto.per_transfer_latency_s
            wire = count * s / proto.rate_factor
            rate = wire / (end - latency) if wire > 0 and end > latency else math.inf
            extra = 0.0 if wire > 0 else max(end - latency, 0.0)
            transfers.append(Transfer(a, b, count * s, -1, a != SWITCH and req.op != "all_gather", (), extra, rate))
    return Plan(op=req.op, algorithm="nvls", num_peers=p, nbytes=req.nbytes, transfers=tuple(transfers),
                num_chunks=0, verifiable=False)


def detailed_size(req: Request) -> int:
    """Transfers of the detailed plan (per piece and port, as `port_transfers` counts them)."""
    up, down = port_transfers(req.op, req.num_peers, nvls_pieces(req.op, req.num_peers, req.nbytes))
    return req.num_peers * (up + down)


def check_nvls(req: Request) -> None:
    """NVLS needs NVSwitch gen3+ with NVLink SHARP and a group inside one NVLink domain."""
    t = req.group.topology
    up = t.spec.scale_up
    if up is None or not up.nvls:
        have = "no NVSwitch" if up is None else f"an NVSwitch (NVLink {up.nvlink_generation}) without NVLS"
        raise SimdistError(
            f"nvls needs an NVSwitch with NVLink SHARP (H100/H200/B200/NVL72); {t.spec.name} has {have} "
            f"(dgx-a100's NVSwitch gen2 and PCIe boxes have none)",
            field="--algorithm", fix="use --algorithm ring or auto")
    nodes = req.group.by_node()
    if len(nodes) > 1:
        raise SimdistError(
            f"nvls reduces inside one NVLink domain, but the group spans {len(nodes)} nodes "
            f"({t.gpus_per_node} GPUs each)",
            field="--algorithm", fix="use --algorithm ring or auto, or ranks within one node")


def _build(req: Request) -> Plan:
    check_nvls(req)
    return nvls_plan(req.op, req.num_peers, req.nbytes)


register(Algorithm(
    name="nvls",
    ops=NVLS_OPS,
    build=_build,
    check=check_nvls,
    build_fast=nvls_fast,
    detailed_size=detailed_size,
    summary="NVLink SHARP: the NVSwitch reduces and multicasts (one NVLink domain, NVSwitch gen3+)",
))
