"""Registry entry of the ring algorithms (simdist.collectives.ring)."""

from __future__ import annotations

from simdist.collectives.plan import Plan
from simdist.collectives.registry import Algorithm, register
from simdist.collectives.request import Request
from simdist.collectives.ring import ring_all_reduce, ring_chain


def _build(req: Request) -> Plan:
    p, n = req.num_peers, req.nbytes
    if req.op in ("broadcast", "reduce"):
        order = req.group.ring_orders(1)[0]
        return ring_chain(req.op, p, n, req.root, order=order)
    channels = req.num_channels()
    orders = req.group.ring_orders(channels)
    if req.op == "reduce_scatter":
        return ring_all_reduce(p, n, channels, orders, phases=(True, False), op="reduce_scatter")
    if req.op == "all_gather":
        return ring_all_reduce(p, n, channels, orders, phases=(False, True), op="all_gather")
    return ring_all_reduce(p, n, channels, orders, op=req.op)  # all_reduce, barrier


register(Algorithm(
    name="ring",
    ops=frozenset({"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "barrier"}),
    build=_build,
    summary="ring over all peers, one ring per channel (NCCL's default for large messages)",
))
