"""Protocol costs a plan carries: NCCL's LL, LL128 and Simple trade latency for payload efficiency.

The numbers come from NCCL's tuning model (src/graph/tuning.cc; see simdist.collectives.nccl_model);
this module only defines the vocabulary that plans, the engine and the closed forms share.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProtocolCost:
    name: str = "simple"
    base_latency_s: float = 0.0
    """Paid once when the collective starts (NCCL baseLat)."""
    per_transfer_latency_s: float = 0.0
    """Added to every transfer's route latency (NCCL hwLat of the protocol beyond the wire's)."""
    rate_factor: float = 1.0
    """Payload per byte on the wire (LL 0.5, LL128 0.92, Simple 1): scales every transfer's rate."""


SIMPLE = ProtocolCost()
"""No protocol overhead: the plain alpha-beta model of the topology's links."""
