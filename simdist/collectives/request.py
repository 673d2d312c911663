"""What a caller asks of a collective: the op, the group, the size, and op-specific details."""

from __future__ import annotations

from dataclasses import dataclass

from simdist.collectives.group import Group
from simdist.collectives.protocols import SIMPLE, ProtocolCost


@dataclass(frozen=True, slots=True, eq=False)
class Request:
    op: str
    group: Group
    nbytes: float
    """The nccl-tests size (see simdist.collectives.ops)."""
    root: int = 0
    channels: int | None = None
    """Rings/trees run in parallel; None: what NCCL would use (Group.default_channels)."""
    matrix: tuple[tuple[float, ...], ...] | None = None
    """all_to_all with uneven splits: matrix[i][j] = bytes peer i sends to peer j (nbytes ignored)."""
    protocol: ProtocolCost = SIMPLE
    """The protocol the plan will run with (its rate factor and per-transfer latency): fast plans whose
    flows are timed to land when the detailed plan's transfers do need it (simdist.analytic.select.
    priced_request sets it; the plan itself carries no protocol until the caller sets it)."""
    kernel: str = "nccl"
    """What runs an all_to_all: NCCL, or the flex dispatcher's DeepEP / HybridEP kernels (simdist.collectives.
    ep_kernels: the share of NVLink each reaches, in the protocol's rate factor)."""

    @property
    def num_peers(self) -> int:
        return self.group.size

    def num_channels(self) -> int:
        return self.channels if self.channels is not None else self.group.default_channels()
