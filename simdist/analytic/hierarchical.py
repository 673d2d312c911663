"""Closed form of the hierarchical all_reduce (the plans of simdist.collectives.hierarchical).

A phase is a set of concurrent rings (one per node inside nodes, one per local position across them),
each a ring half whose hops move at the ring's rate, in order on their connection, as a ring channel's
(simdist.collectives.ring; Thakur, Rabenseifner & Gropp 2005 sec. 4.1). The plan starts a phase on a
peer once its own previous phase is done there, so rings of a phase may start at different times: a
ring's edge i lands its last step at (m - 1) d + the longest chain of hop latencies from a starting edge
j (itself started once both its ends were ready) forward to i, evaluated per edge with prefix and suffix
maxima (simdist.collectives.hierarchical.ring_half_lands), and a peer's next phase starts when its edges
in and out have landed. With N identical nodes of L peers, intra-node bandwidth B and latency alpha,
cross-node B_n and alpha_n, and no shared links this is the textbook

    all_reduce = 2 (L-1) (alpha + S/(L B)) + 2 (N-1) (alpha_n + S/(L N B_n)),

reduce_scatter and all_gather half of it. Exact (engine = this form) whenever the rings' rates hold:
alone on the network, except where rings of different phases, run by peers that drift apart, meet on a
link (a PCIe switch's uplink shared by intra- and inter-node traffic); the engine is never faster.
(Before, the rings' hops were free to run ahead, later steps' latency hid behind earlier steps' bytes,
and this form summed the phases as if every peer started each together: the engine was faster.)
"""

from __future__ import annotations

import dataclasses

from simdist.analytic.registry import register_closed_form
from simdist.collectives.hierarchical import hierarchical_schedule, node_groups
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request


def hierarchical_closed_form(req: Request, proto: ProtocolCost) -> float:
    """Closed form of the plan simdist.collectives.hierarchical builds for ``req``."""
    node_groups(req.group)
    times = hierarchical_schedule(dataclasses.replace(req, protocol=proto))
    return proto.base_latency_s + max((float(t.lands.max()) for t in times), default=0.0)


register_closed_form("hierarchical", hierarchical_closed_form)
