"""Closed forms of the ring algorithms (the plans of simdist.collectives.ring).

all_reduce over P peers, C channels, S bytes: 2(P-1) steps; in each, every ring edge of every channel
moves S/(P C) bytes (Thakur, Rabenseifner & Gropp 2005, sec. 4.1; NCCL's ring). Per channel the
bandwidth term is steps x S/(P C) at the channel's rate, its share of its busiest link
(simdist.collectives.ring.channel_rates); the latency term follows a chunk around the ring: the plan's
dependency chains each cross 2(P-1) consecutive ring edges, so latency = max over the channel's
chains of the sum of their edges' latencies. The two terms add: the detailed plan moves every hop of
a channel at the channel's rate, in order on its connection (`Transfer.max_rate_Bps`, `after`), so
no step's latency hides behind another's bytes, and the fast plan's flows pay the chain latency
before their bytes; the collective ends with its slowest channel, and both plans equal this form
uncontended. (Channels of different rates, e.g. where two of them share a NIC, end at different
times: the slowest channel's rate and another channel's longer chain do not add; the earlier form that
added them: docs/validation-history.md.) It is NCCL's cost model, time = lat + nBytes / bw with lat summing the
chain's intra- and inter-node hop latencies (src/graph/tuning.cc), which the multi-node measurements support
(simdist.collectives.ring). With identical edges this is the textbook 2(P-1)(alpha + S/(P B)).
reduce_scatter and all_gather are one phase: (P-1) steps.
Pipelined broadcast/reduce along a chain, k pieces: (P - 2 + k) (alpha + S/(k B)) (Hockney model
of a pipelined chain; Thakur et al. 2005 sec. 4.2).
"""

from __future__ import annotations

import numpy as np

from simdist.analytic.registry import register_closed_form
from simdist.collectives.group import Group
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request
from simdist.collectives.ring import chain_latency_s, chain_order, channel_rates, pipeline_pieces, ring_steps


def ring_time_s(group: Group, nbytes: float, orders: list[list[int]], steps: int,
                per_transfer_latency_s: float = 0.0, rate_factor: float = 1.0) -> float:
    """``steps`` ring steps (2(P-1) for all_reduce, P-1 for either half) over ``orders``.

    Per channel: its slowest chain's latency (`chain_latency_s`, prefix sums of the edge latencies) plus
    steps x a step's wire time at the channel's rate (`channel_rates`: its share of its busiest link);
    the collective ends with its slowest channel. Vectorised over the ring edges of every channel
    (O(P C)).
    """
    p = group.size
    if p == 1 or steps == 0:
        return 0.0
    channels = len(orders)
    piece = nbytes / (p * channels)
    chains, rates = _size_free(group, orders, steps, per_transfer_latency_s)
    step_s = piece / rate_factor / rates
    return float((chains + steps * step_s).max())


def _size_free(group: Group, orders: list[list[int]], steps: int, per_transfer_latency_s: float
               ) -> tuple[np.ndarray, np.ndarray]:
    """(each channel's chain latency, its rate): what `ring_time_s` reads of the group, whatever the size, kept in
    the group's memo (shared by its protocols' priced copies: their extra latencies are in the key)."""
    key = ("ring form", tuple(map(tuple, orders)), steps, per_transfer_latency_s,
           tuple(sorted(group.extra_latency_by_class.items())))
    hit = group.memo.get(key)
    if hit is None:
        channels, p = len(orders), group.size
        src = np.array(orders, dtype=np.int64).reshape(channels, p)
        lat = group.paths(src.reshape(-1), np.roll(src, -1, axis=1).reshape(-1)).latency_s.reshape(channels, p)
        hit = group.memo[key] = (chain_latency_s(lat + per_transfer_latency_s, steps), channel_rates(group, orders))
    return hit


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
    group = req.group
    lat, factor = proto.per_transfer_latency_s, proto.rate_factor
    if req.op in ("broadcast", "reduce"):
        return proto.base_latency_s + chain_time_s(group, req.nbytes, chain_order(req), pipeline_pieces(req.nbytes),
                                                   lat, factor)
    orders = group.ring_orders(req.num_channels())
    return proto.base_latency_s + ring_time_s(group, req.nbytes, orders, ring_steps(req.op, req.num_peers), lat,
                                              factor)


register_closed_form("ring", ring_closed_form)
