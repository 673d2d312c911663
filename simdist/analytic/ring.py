"""Closed forms of the ring algorithms (the plans of simdist.collectives.ring).

all_reduce over P peers, C channels, S bytes: 2(P-1) steps; in each, every ring edge of every channel
moves S/(P C) bytes (Thakur, Rabenseifner & Gropp 2005, sec. 4.1; NCCL's ring). Per step the
bandwidth term is the most loaded link's bytes / capacity (simdist.analytic.loads); the latency term
follows a chunk around the ring: the plan's dependency chains each cross 2(P-1) consecutive ring
edges, so latency = max over chains of the sum of their edges' latencies. The two terms add: the
detailed plan moves every hop of a channel at the channel's bottleneck rate (rate coupling,
simdist.collectives.ring.RingHop), so no step's latency hides behind another's bytes, and the
fast plan's flows pay the chain latency before their bytes; both equal this form uncontended (with
channels alike). It is NCCL's cost model, time = lat + nBytes / bw with lat summing the chain's intra-
and inter-node hop latencies (src/graph/tuning.cc), which the multi-node measurements support
(simdist.collectives.ring). With identical edges this is the textbook 2(P-1)(alpha + S/(P B)).
reduce_scatter and all_gather are one phase: (P-1) steps.
Pipelined broadcast/reduce along a chain, k pieces: (P - 2 + k) (alpha + S/(k B)) (Hockney model
of a pipelined chain; Thakur et al. 2005 sec. 4.2).
"""

from __future__ import annotations

import numpy as np

from simdist.analytic.loads import batch_drain_time_s
from simdist.analytic.registry import register_closed_form
from simdist.collectives.group import Group
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request
from simdist.collectives.ring import pipeline_pieces


def ring_time_s(group: Group, nbytes: float, orders: list[list[int]], steps: int,
                per_transfer_latency_s: float = 0.0, rate_factor: float = 1.0) -> float:
    """``steps`` ring steps (2(P-1) for all_reduce, P-1 for either half) over ``orders``.

    Vectorised over the ring edges of every channel (simdist.hardware.batch): the most loaded link of a
    step, and the slowest chain's latency from prefix sums of the edge latencies (O(P C)).
    """
    p = group.size
    if p == 1 or steps == 0:
        return 0.0
    channels = len(orders)
    piece = nbytes / (p * channels)
    src = np.array(orders, dtype=np.int64).reshape(channels, p)
    dst = np.roll(src, -1, axis=1)
    routes = group.paths(src.reshape(-1), dst.reshape(-1))
    step_bw = batch_drain_time_s(group, routes, np.full(len(src.reshape(-1)), piece), rate_factor)
    lat = routes.latency_s.reshape(channels, p) + per_transfer_latency_s
    # the chain starting at position j crosses edges j .. j + steps - 1 (mod P): full laps plus a window
    laps, rest = divmod(steps, p)
    prefix = np.concatenate((np.zeros((channels, 1)), np.cumsum(np.concatenate((lat, lat), axis=1), axis=1)),
                            axis=1)
    latency = float((laps * prefix[:, p:p + 1] + (prefix[:, rest:rest + p] - prefix[:, :p])).max())
    return latency + steps * step_bw


def chain_time_s(group: Group, nbytes: float, chain: list[int], pieces: int,
                 per_transfer_latency_s: float = 0.0, rate_factor: float = 1.0) -> float:
    """Pipelined chain of ``pieces`` over ``chain`` (peer order from the first sender to the last receiver)."""
    p = len(chain)
    if p < 2:
        return 0.0
    hops = [group.path(chain[i], chain[i + 1]) for i in range(p - 1)]
    per_piece = [h.latency_s + per_transfer_latency_s + nbytes / pieces / (h.effective_bandwidth_Bps * rate_factor)
                 for h in hops]
    # the first piece crosses every hop; each later piece follows one slowest-hop time behind
    return sum(per_piece) + (pieces - 1) * max(per_piece)


def ring_closed_form(req: Request, proto: ProtocolCost) -> float:
    """Closed form of the plan simdist.collectives.ring builds for ``req``."""
    p, group = req.num_peers, req.group
    lat, factor = proto.per_transfer_latency_s, proto.rate_factor
    if req.op in ("broadcast", "reduce"):
        order = group.ring_orders(1)[0]
        start = order.index(req.root)
        chain = [order[(start + i) % p] for i in range(p)]
        if req.op == "reduce":
            chain = chain[::-1]
        return proto.base_latency_s + chain_time_s(group, req.nbytes, chain, pipeline_pieces(req.nbytes), lat, factor)
    channels = req.num_channels()
    orders = group.ring_orders(channels)
    steps = {"reduce_scatter": p - 1, "all_gather": p - 1}.get(req.op, 2 * (p - 1))
    return proto.base_latency_s + ring_time_s(group, req.nbytes, orders, steps, lat, factor)


register_closed_form("ring", ring_closed_form)
