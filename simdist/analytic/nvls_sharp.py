"""Closed form of the NVLS-SHARP plans (simdist.collectives.nvls_sharp).

Every hop moves a piece of s = S / (H k) bytes in d = s / (rate factor x r), r the plan's one rate
(simdist.collectives.nvls_sharp.nvls_sharp_rate), and each connection sends its pieces in order, a piece's latency
overlapping the bytes of the one before: the max-plus recurrence of the pipelined tree (simdist.analytic.tree),
whose solution is the longest chain of hops plus the pipeline's tail,

    max over segments h, nodes n, peers i of
      max over nodes m [max over peers p of m (lat A of p) + lat B to head h of m + lat U of that head]
      + lat V to head h of n + lat D of it + lat E to i + 6 d + (k - 1) d,

(the E hop absent for the head itself: 5 d): NCCL's NVLS model across nodes, "intraLat + interLat" plus size /
bandwidth (src/graph/tuning.cc, ncclTopoTuneModel), with the pipeline's fill. Exact (engine = this form) alone on
the network: every connection carries one piece at a time at a rate its links fit.
"""

from __future__ import annotations

import dataclasses

from simdist.analytic.registry import register_closed_form
from simdist.collectives.nvls_sharp import nvls_sharp_schedule
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request


def nvls_sharp_time_s(req: Request, proto: ProtocolCost) -> float:
    """Closed form of the plan simdist.collectives.nvls_sharp builds for ``req``."""
    return proto.base_latency_s + nvls_sharp_schedule(dataclasses.replace(req, protocol=proto)).time_s


register_closed_form("nvls_sharp", nvls_sharp_time_s)
