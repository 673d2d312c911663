"""Links as a shared resource in SimPy: flows arrive, share bandwidth max-min fairly, and finish.

A transfer pays its latency first (nothing is on the wire yet), then moves its bytes as a flow
whose rate is recomputed whenever a flow starts or ends (simdist.engine.sharing). Uncontended, a
transfer of S bytes over a route of latency alpha and bottleneck B takes alpha + S / B exactly, the
alpha-beta model the closed forms use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from simdist.engine.sharing import max_min_rates

# Flows whose remaining bytes fall below this fraction of their size at an event are complete
# (floating-point residue of rate x time).
_DONE_FRACTION = 1e-12


def _done(f: Flow, now: float) -> bool:
    """Complete: what remains is below the done fraction, or moves in less time than the clock
    resolves at ``now`` (now + remaining / rate == now: waiting for it would never advance time)."""
    return f.remaining <= f.nbytes * _DONE_FRACTION or (f.rate > 0 and now + f.remaining / f.rate <= now)


@dataclass(slots=True, eq=False)
class Flow:
    links: tuple[int, ...]
    nbytes: float
    remaining: float
    cap: float
    done: simpy.Event
    rate: float = 0.0


@dataclass(slots=True)
class LinkLoad:
    """Bytes carried per directed link over a simulation (for per-link load reports)."""

    bytes_by_link: dict[int, float] = field(default_factory=dict)

    def add(self, links: tuple[int, ...], nbytes: float) -> None:
        for link in links:
            self.bytes_by_link[link] = self.bytes_by_link.get(link, 0.0) + nbytes


class FlowNetwork:
    """Directed links of given effective capacity (bytes/s), shared by the flows crossing them."""

    def __init__(self, env: simpy.Environment, capacity_of) -> None:
        self.env = env
        self._capacity_of = capacity_of  # link id -> effective bytes/s
        self._flows: list[Flow] = []
        self._last = 0.0
        self._wakeup: simpy.Event = env.event()
        self.load = LinkLoad()
        env.process(self._run())

    def flow(self, links: tuple[int, ...], nbytes: float, cap: float = float("inf")) -> simpy.Event:
        """Start moving ``nbytes`` over ``links`` now; the event fires when the last byte arrives.

        Rates are re-shared once per instant, after every flow starting at that instant has joined
        (the driver process wakes after them), so a ring step of P flows costs one re-share, not P.
        """
        done = self.env.event()
        if nbytes <= 0:
            done.succeed()
            return done
        self._advance()
        self._flows.append(Flow(links, nbytes, nbytes, cap, done))
        self.load.add(links, nbytes)
        if not self._wakeup.triggered:
            self._wakeup.succeed()
        return done

    def _advance(self) -> None:
        elapsed = self.env.now - self._last
        if elapsed > 0:
            for f in self._flows:
                f.remaining -= f.rate * elapsed
        self._last = self.env.now

    def _reshare(self) -> None:
        flows = self._flows
        if not flows:
            return
        ids: dict[int, int] = {}
        compact = [tuple(ids.setdefault(link, len(ids)) for link in f.links) for f in flows]
        capacity = np.fromiter((self._capacity_of(link) for link in ids), dtype=float, count=len(ids))
        caps = np.fromiter((f.cap for f in flows), dtype=float, count=len(flows))
        rates = max_min_rates(compact, capacity, caps)
        for f, r in zip(flows, rates, strict=True):
            f.rate = float(r)

    def _run(self):
        env = self.env
        while True:
            self._wakeup = env.event()
            if self._flows:
                horizon = min(f.remaining / f.rate for f in self._flows)
                yield env.timeout(horizon) | self._wakeup
            else:
                yield self._wakeup
            self._advance()
            finished = [f for f in self._flows if _done(f, env.now)]
            if finished:
                self._flows = [f for f in self._flows if not _done(f, env.now)]
            self._reshare()
            for f in finished:
                f.done.succeed()
