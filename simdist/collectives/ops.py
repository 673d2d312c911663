"""The collective operations and the nccl-tests conventions that size and score them.

``nbytes`` is always the size nccl-tests prints in its ``size`` column:
- all_reduce, broadcast, reduce: the buffer every rank holds;
- all_gather: the full output (n x the per-rank input); reduce_scatter: the full input (n x output);
- scatter, gather: the full buffer at the root; all_to_all: the bytes each rank sends in total
  (n blocks of nbytes / n, one to each rank, itself included);
- send_recv: the message; barrier: 0.

busbw = algbw x factor, algbw = nbytes / time (nccl-tests doc/PERFORMANCE.md): the factor makes the
figure comparable to the link speed whatever the rank count.
"""

from __future__ import annotations

from dataclasses import dataclass

from simdist.errors import SimdistError


@dataclass(frozen=True, slots=True)
class OpInfo:
    name: str
    rooted: bool  # has a root peer (broadcast, reduce, scatter, gather)
    reduces: bool  # combines contributions
    segmented: bool  # the buffer is cut into one segment per peer (scatter/gather family)

    def busbw_factor(self, num_peers: int) -> float:
        """nccl-tests busbw / algbw for ``num_peers`` ranks (doc/PERFORMANCE.md)."""
        n = num_peers
        if self.name == "all_reduce":
            return 2.0 * (n - 1) / n  # two ring phases of n-1 steps of S/n
        if self.name in ("all_gather", "reduce_scatter", "all_to_all", "scatter", "gather"):
            return (n - 1) / n
        return 1.0  # broadcast, reduce, send_recv, barrier


OPS: dict[str, OpInfo] = {
    "broadcast": OpInfo("broadcast", rooted=True, reduces=False, segmented=False),
    "reduce": OpInfo("reduce", rooted=True, reduces=True, segmented=False),
    "scatter": OpInfo("scatter", rooted=True, reduces=False, segmented=True),
    "gather": OpInfo("gather", rooted=True, reduces=False, segmented=True),
    "all_gather": OpInfo("all_gather", rooted=False, reduces=False, segmented=True),
    "reduce_scatter": OpInfo("reduce_scatter", rooted=False, reduces=True, segmented=True),
    "all_reduce": OpInfo("all_reduce", rooted=False, reduces=True, segmented=False),
    "all_to_all": OpInfo("all_to_all", rooted=False, reduces=False, segmented=True),
    "send_recv": OpInfo("send_recv", rooted=False, reduces=False, segmented=False),
    "barrier": OpInfo("barrier", rooted=False, reduces=False, segmented=False),
}


def op_info(name: str) -> OpInfo:
    try:
        return OPS[name]
    except KeyError:
        raise SimdistError(f"unknown collective '{name}'", field="--op", fix=f"use one of: {', '.join(OPS)}") from None


def algbw_Bps(nbytes: float, time_s: float) -> float:
    """nccl-tests algorithm bandwidth: size / time."""
    return nbytes / time_s if time_s > 0 else float("inf")


def busbw_Bps(op: str, num_peers: int, nbytes: float, time_s: float) -> float:
    """nccl-tests bus bandwidth: algbw x the op's factor."""
    return algbw_Bps(nbytes, time_s) * op_info(op).busbw_factor(num_peers)
