"""Closed form of the pipelined tree plans (simdist.collectives.tree).

Every hop of tree t moves a piece of s bytes in d_t = s / (rate factor x r_t), r_t the tree's planned
rate (its share of its busiest link among all the trees' connections, simdist.collectives.tree.
tree_rates), and each connection sends its pieces in order, a piece's latency overlapping the bytes of
the one before. A connection's j-th piece then lands at

    f(e, j) = max(max over the hops feeding e of f(e', j) + lat_e, f(e, j - 1)) + d_t,

a max-plus recurrence whose solution is the longest chain of hops: f(e, k - 1) = max over chains
e_0 -> ... -> e_m = e of (sum of their latencies) + (m + k) d_t (each chain visits m + 1 hops and k
pieces, a piece behind the first adding d_t without a latency). For all_reduce a chain climbs from a
leaf to the root and descends to a leaf, so a tree takes

    max over leaves a of (latency up from a + depth_a d_t) + max over leaves b of (latency down to b
    + depth_b d_t) + (k - 1) d_t,

reduce the first term, broadcast the second (each plus (k - 1) d_t): NCCL's tree model, latency
2 x depth x hop latency plus size / bandwidth (src/graph/tuning.cc: "2 * ((nRanks/nNodes-1) *
intraLat + log2i(nNodes) * interLat)"), with the pipeline's fill; Sanders, Speck & Traeff 2009 sec. 2
(depth + k - 1 piece steps). The collective ends with its slowest tree, after the protocol's start-up.
`simdist.collectives.tree.tree_schedule` evaluates this per connection (the fast plan times its flows
with it), vectorised over the trees and their levels.

Exact (engine = this form) alone on the network: the planned rates hold since every connection carries
one piece at a time; the engine is never faster (before the hops carried the tree's rate:
docs/validation-history.md).
"""

from __future__ import annotations

import dataclasses

from simdist.analytic.registry import register_closed_form
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request
from simdist.collectives.tree import tree_schedule


def tree_time_s(req: Request, proto: ProtocolCost) -> float:
    """Closed form of the plan simdist.collectives.tree builds for ``req``."""
    if req.num_peers < 2:
        return proto.base_latency_s
    return proto.base_latency_s + tree_schedule(dataclasses.replace(req, protocol=proto)).time_s


register_closed_form("tree", tree_time_s)
