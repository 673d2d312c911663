"""Closed form of the NVLS-Tree plans (simdist.collectives.nvls_tree).

Every hop moves a piece of s = S / (2 H k) bytes in d = s / (rate factor x r), r the plan's one rate
(simdist.collectives.nvls_tree.nvls_tree_rate), and each connection sends its pieces in order, a piece's latency
overlapping the bytes of the one before: the max-plus recurrence of the pipelined tree (simdist.analytic.tree),
whose solution is the longest chain of hops plus the pipeline's tail,

    max over trees t, segments h, nodes n, peers i of
      [A into S_m, B to head h of m, U up from m ... to the root, W down from the root ... to n]
      + lat D of n's head h + lat E to i + (hops on the chain) d + (k - 1) d,

NCCL's NVLSTree model, "intraLat + 2 * log2i(nNodes) * interLat" plus size / bandwidth (src/graph/tuning.cc,
ncclTopoTuneModel), with the pipeline's fill. Exact (engine = this form) alone on the network: every connection
carries one piece at a time at a rate its links fit.
"""

from __future__ import annotations

import dataclasses

from simdist.analytic.registry import register_closed_form
from simdist.collectives.nvls_tree import nvls_tree_schedule
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request


def nvls_tree_time_s(req: Request, proto: ProtocolCost) -> float:
    """Closed form of the plan simdist.collectives.nvls_tree builds for ``req``."""
    return proto.base_latency_s + nvls_tree_schedule(dataclasses.replace(req, protocol=proto)).time_s


register_closed_form("nvls_tree", nvls_tree_time_s)
