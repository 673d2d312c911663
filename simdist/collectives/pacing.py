"""Planned rates: each transfer's share of the links it meets the plan's other transfers on.

Every plan gives its transfers a rate bound (`Transfer.max_rate_Bps`, wire bytes/s) computed from its
own transfers that may be on a link at the same time, such that on every link the bounds of those
transfers add up to at most the link's capacity. Alone on the network every transfer then moves at
exactly its bound (max-min sharing with feasible bounds gives every flow its bound), so the plan's time
is the longest path through its dependencies with every transfer taking latency + wire bytes / bound:
the closed forms (simdist.analytic) compute that path. Next to other traffic a transfer gets less, never
more, so the engine is never faster than the closed form (docs/architecture.md, "One shared-link mechanism").

Two sharing rules, by what the transfers are:
- pipelined hops (ring and tree channels, NCCL's primitives): each connection carries one step at a time
  and every hop of a channel moves at the channel's bottleneck, its share of its busiest link among the
  connections crossing it (`edge_shares`; NCCL prices a ring or tree graph at one bandwidth per channel,
  src/graph/search.cc bwIntra/bwInter, src/graph/tuning.cc busBw = nChannels x bw);
- concurrent blocks of a step (direct, halving-doubling): a block's share of the busiest link of its route
  in proportion to its bytes (`proportional_rates`), so that the blocks on that link drain together in
  (the link's bytes) / capacity, the alpha-beta model of concurrent messages (Hockney 1994) and the least
  time in which the link can carry them.
"""

from __future__ import annotations

import math

import numpy as np

from simdist.collectives.group import Group
from simdist.hardware.batch import RouteBatch, link_capacities


def _route_min(routes: RouteBatch, per_entry: np.ndarray) -> np.ndarray:
    """Per route, the least of ``per_entry`` over its links (inf for a route without links)."""
    hops = routes.hops
    out = np.full(len(hops), math.inf)
    nonempty = hops > 0
    if nonempty.any():
        out[nonempty] = np.minimum.reduceat(per_entry, routes.indptr[:-1][nonempty])
    return out


def _compact(group: Group, routes: RouteBatch) -> tuple[np.ndarray, np.ndarray]:
    """(each route entry's index among the distinct links, those links' effective capacities)."""
    ids, compact = np.unique(routes.links, return_inverse=True)
    return compact.reshape(-1), link_capacities(group.topology, ids)


def edge_shares(group: Group, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Per connection ``src[i] -> dst[i]`` (peers), the least over the links of its route of
    capacity / (connections crossing the link): its share where every connection carries one step at a
    time (inf for a route without links)."""
    routes = group.paths(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64))
    if not len(routes.links):
        return np.full(len(routes.hops), math.inf)
    compact, capacity = _compact(group, routes)
    share = capacity / np.bincount(compact, minlength=len(capacity))
    return _route_min(routes, share[compact])


def proportional_rates(group: Group, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Rate bounds of concurrent blocks ``src[i] -> dst[i]`` of ``nbytes[i]``: the least over the links
    of a block's route of capacity x nbytes[i] / (bytes of all the blocks crossing the link). A block's
    wire time is then (its busiest link's bytes) / capacity whatever the protocol's rate factor (it
    scales bytes and loads alike). Blocks of no bytes, or on routes without links, get inf."""
    nbytes = np.asarray(nbytes, dtype=float)
    routes = group.paths(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64))
    out = np.full(len(nbytes), math.inf)
    if not len(routes.links):
        return out
    compact, capacity = _compact(group, routes)
    load = np.bincount(compact, weights=np.repeat(nbytes, routes.hops), minlength=len(capacity))
    with np.errstate(divide="ignore"):
        per_byte = _route_min(routes, (capacity / load)[compact])  # inf where a link carries no bytes
    moving = nbytes > 0
    out[moving] = nbytes[moving] * per_byte[moving]
    return out
