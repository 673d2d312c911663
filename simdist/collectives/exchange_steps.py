"""Collectives as steps of concurrent exchanges (halving-doubling, PAT): plans, planned rates, schedules.

A step is a set of exchanges that run at once; an exchange moves some chunks from one peer to another,
all together like one message (one transfer per chunk in the detailed plan, one flow in the fast plan).
An exchange starts once both its peers have finished their previous step, as MPI's blocking sendrecv
does, and its transfers move at the exchange's planned rate: its share of the busiest link of its route
among the step's exchanges, in proportion to its bytes (simdist.collectives.pacing.proportional_rates),
the alpha-beta model of concurrent messages (Hockney 1994). The closed forms of such plans are the
recurrence of `steps_schedule` (simdist.analytic.halving_doubling, simdist.analytic.pat).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple

import numpy as np

from simdist.collectives.group import Group
from simdist.collectives.pacing import proportional_rates
from simdist.collectives.plan import Plan, Transfer
from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request


@dataclass(frozen=True, slots=True)
class Exchange:
    """One message of a step: ``chunks`` from ``src`` to ``dst`` (one transfer per chunk)."""

    src: int
    dst: int
    chunks: tuple[int, ...]
    reduce: bool


class Step(NamedTuple):
    """A step's exchanges as arrays: ``src[e]`` sends ``chunks[e]`` chunks to ``dst[e]``."""

    src: np.ndarray
    dst: np.ndarray
    chunks: np.ndarray
    reduce: bool


def exchange_rates(group: Group | None, step: list[Exchange] | Step, size: float) -> np.ndarray:
    """Planned rate of each exchange's transfers (one per chunk, ``size`` bytes each): a transfer's share
    of the busiest link of its route among the step's transfers, in proportion to its bytes
    (simdist.collectives.pacing.proportional_rates); inf without a group (a plan to verify)."""
    if isinstance(step, Step):
        src, dst, count = step.src, step.dst, step.chunks.astype(float)
    else:
        src = np.fromiter((ex.src for ex in step), dtype=np.int64, count=len(step))
        dst = np.fromiter((ex.dst for ex in step), dtype=np.int64, count=len(step))
        count = np.fromiter((len(ex.chunks) for ex in step), dtype=float, count=len(step))
    if group is None:
        return np.full(len(src), math.inf)
    # an exchange's chunks share its route: its rate split evenly among them
    return proportional_rates(group, src, dst, count * size) / np.maximum(count, 1.0)


def _unit_rates(group: Group, steps: list[Step]) -> list[np.ndarray]:
    """`exchange_rates` of every step, kept in the group's memo (the rates are shares of link capacity in
    proportion to the exchanges' bytes, so every size and protocol of the group has the same ones); keyed by the
    steps list, which the entry holds so that its id stays its own."""
    key = ("exchange_rates", id(steps))
    hit = group.memo.get(key)
    if hit is None or hit[0] is not steps:
        hit = group.memo[key] = (steps, [exchange_rates(group, step, 1.0) for step in steps])
    return hit[1]


def steps_schedule(group: Group, proto: ProtocolCost, steps: list[Step], size: float
                   ) -> list[tuple[Step, np.ndarray, np.ndarray, np.ndarray]]:
    """Per step, uncontended: (the step, when each exchange starts, its latency (protocol's included),
    its transfers' rate). An exchange starts once both its peers finished their previous step and lands
    after its latency plus one chunk's wire time at its rate (its chunks travel together)."""
    ready = np.zeros(group.size)  # when each peer finished its last step
    out = []
    for step, rates in zip(steps, _unit_rates(group, steps), strict=True):
        latency = group.paths(step.src, step.dst).latency_s + proto.per_transfer_latency_s
        start = np.maximum(ready[step.src], ready[step.dst])
        wire_s = size / proto.rate_factor / rates if size > 0 else np.zeros(len(step.src))
        end = start + latency + wire_s
        ready = ready.copy()
        np.maximum.at(ready, step.src, end)
        np.maximum.at(ready, step.dst, end)
        out.append((step, start, latency, rates))
    return out


def steps_time_s(group: Group, proto: ProtocolCost, steps: list[Step], size: float) -> float:
    """When the last exchange of ``steps`` lands, uncontended (without the protocol's start-up)."""
    end = 0.0
    for _, start, latency, rates in steps_schedule(group, proto, steps, size):
        wire_s = size / proto.rate_factor / rates if size > 0 else 0.0
        end = max(end, float((start + latency + wire_s).max()))
    return end


def steps_fast(req: Request, algorithm: str, steps: list[Step], size: float) -> Plan:
    """Fast fidelity: one flow per exchange carrying its chunks, starting when the exchange does
    uncontended (`steps_schedule`, with the request's protocol: an extra latency) at the exchange's rate,
    so it lands when the exchange does and alone the plan takes the detailed plan's time; next to other
    traffic the flows share links as the exchanges do, without holding up the steps after them."""
    transfers: list[Transfer] = []
    for step, start, _, rates in steps_schedule(req.group, req.protocol, steps, size):
        n = len(step.src)
        transfers.extend(map(Transfer, step.src.tolist(), step.dst.tolist(), (step.chunks * size).tolist(),
                             repeat(-1, n), repeat(step.reduce, n), repeat((), n), start.tolist(),
                             (rates * step.chunks).tolist()))
    return Plan(op=req.op, algorithm=algorithm, num_peers=req.num_peers, nbytes=req.nbytes,
                transfers=tuple(transfers), num_chunks=0, verifiable=False)


def steps_plan(op: str, algorithm: str, num_peers: int, steps: list[list[Exchange]], num_chunks: int,
               segment: tuple[int, ...], nbytes: float, group: Group | None = None) -> Plan:
    """The detailed plan of ``steps``: one transfer per chunk of every exchange, each depending on every
    transfer of either peer's previous step; with ``group`` every transfer carries its planned rate
    (`exchange_rates`)."""
    size = nbytes / num_chunks
    transfers: list[Transfer] = []
    last: dict[int, list[int]] = {}  # peer -> transfers of the last step it took part in
    for step in steps:
        touched: dict[int, list[int]] = {}
        rates = exchange_rates(group, step, size).tolist()
        for ex, rate in zip(step, rates, strict=True):
            deps = tuple(sorted(set(last.get(ex.src, ())) | set(last.get(ex.dst, ()))))
            for chunk in ex.chunks:
                transfers.append(Transfer(ex.src, ex.dst, size, chunk, ex.reduce, deps, max_rate_Bps=rate))
                touched.setdefault(ex.src, []).append(len(transfers) - 1)
                touched.setdefault(ex.dst, []).append(len(transfers) - 1)
        last.update(touched)
    return Plan(op=op, algorithm=algorithm, num_peers=num_peers, nbytes=nbytes,
                transfers=tuple(transfers), num_chunks=num_chunks, chunk_segment=segment)
