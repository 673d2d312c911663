"""Closed form of the CollNet plans (simdist.collectives.collnet).

Every hop moves a piece of s = S / (k H) bytes in d = s / (rate factor x r), r the plan's one rate
(simdist.collectives.collnet.collnet_rate), and each connection sends its pieces in order, a piece's latency
overlapping the bytes of the one before: the max-plus recurrence of the pipelined tree
(simdist.analytic.tree), whose solution is the longest chain of hops plus the pipeline's tail,

    max over nodes n, heads h, peers i of (lat A into head h of n + lat B of n's head h) [max over nodes]
      + lat C to n's head h + lat D to i  + 4 d + (k - 1) d,

(A and D absent where a node has one peer: 2 d + (k - 1) d): NCCL's CollNetDirect model,
"2 * (min(1, ppn-1) * intraLat + ...) + interLat" plus size / bandwidth (src/graph/tuning.cc), with the
pipeline's fill. Exact (engine = this form) alone on the network: every connection carries one piece at a
time at a rate its links fit.
"""

from __future__ import annotations

import dataclasses

from simdist.analytic.registry import register_closed_form
from simdist.collectives.collnet import collnet_schedule
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request


def collnet_time_s(req: Request, proto: ProtocolCost) -> float:
    """Closed form of the plan simdist.collectives.collnet builds for ``req``."""
    return proto.base_latency_s + collnet_schedule(dataclasses.replace(req, protocol=proto)).time_s


register_closed_form("collnet", collnet_time_s)
