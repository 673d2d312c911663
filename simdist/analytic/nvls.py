"""Closed forms of the NVLS plans (simdist.collectives.nvls).

In those plans every transfer crosses one GPU port (GPU -> NVSwitch or NVSwitch -> GPU) alone, as each
port serves its transfers one at a time; so each takes tau = alpha + s / B (alpha: the port's latency
plus the protocol's per-transfer latency; B: the port's effective bandwidth times the protocol's rate
factor, as the engine puts s / factor bytes on the wire; s = S / (k P)), and the collective takes
L tau, L the longest dependency chain in transfers (the alpha-beta model of a pipelined schedule,
Hockney 1994; Thakur, Rabenseifner & Gropp 2005 sec. 4.2 for pipelined chains):

- reduce_scatter: each uplink pushes k P segments back to back, the last reduced segment returns
  after the last push: L = k P + 1;
- all_gather: the first store, then each downlink receives k P multicast segments: L = k P + 1;
- all_reduce, k = 1: P pushes, the return, the store, P multicast segments: L = 2 P + 2;
  k >= 2: the uplink runs RS(0), then RS(q) + store(q-1) per piece (P + 1 slots), the downlink
  R(q) + multicast(q-1) likewise; the tail adds the last two multicasts: L = k (P + 1) + 2 P - 1.

Exact (engine = closed form) when every port of the group has the same latency and bandwidth, as on
any one NVSwitch node; otherwise tau is the slowest port's, an upper bound.
"""

from __future__ import annotations

from simdist.analytic.registry import register_closed_form
from simdist.collectives.nvls import nvls_chain_length, nvls_pieces, nvls_time_s
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request

__all__ = ["nvls_chain_length", "nvls_closed_form", "nvls_time_s"]


def nvls_closed_form(req: Request, proto: ProtocolCost) -> float:
    """Closed form of the plan simdist.collectives.nvls builds for ``req``."""
    k = nvls_pieces(req.op, req.num_peers, req.nbytes)
    return proto.base_latency_s + nvls_time_s(req.group, req.op, req.nbytes, k, proto.per_transfer_latency_s,
                                              proto.rate_factor)


register_closed_form("nvls", nvls_closed_form)
