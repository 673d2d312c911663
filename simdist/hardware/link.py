"""Directed links and routes: the vocabulary the engine and the closed forms share."""

from __future__ import annotations

from dataclasses import dataclass

from simdist.spec.topology import LinkKind


@dataclass(frozen=True, slots=True)
class Link:
    """One direction of a physical link. ``id`` is global and dense in [0, Topology.num_links)."""

    id: int
    src: str
    dst: str
    kind: LinkKind
    bandwidth_Bps: float
    latency_s: float
    efficiency: float

    @property
    def effective_bandwidth_Bps(self) -> float:
        return self.bandwidth_Bps * self.efficiency


@dataclass(frozen=True, slots=True)
class Route:
    """The links a message from GPU ``src`` to GPU ``dst`` crosses, in order.

    ``bandwidth_Bps`` is the nominal bottleneck, ``effective_bandwidth_Bps`` the bottleneck of
    bandwidth x efficiency, ``latency_s`` the sum of link latencies.
    """

    src: int
    dst: int
    links: tuple[int, ...]
    bandwidth_Bps: float
    effective_bandwidth_Bps: float
    latency_s: float

    @property
    def hops(self) -> int:
        return len(self.links)


@dataclass(frozen=True, slots=True)
class PathShape:
    """A route segment before it is placed: link ids plus its aggregate figures."""

    links: tuple[int, ...]
    bandwidth_Bps: float
    effective_bandwidth_Bps: float
    latency_s: float

    def shifted(self, offset: int) -> tuple[int, ...]:
        return tuple([link + offset for link in self.links])


def join(src: int, dst: int, parts: list[tuple[tuple[int, ...], PathShape]]) -> Route:
    """Concatenate placed segments (global link ids, shape) into one Route (a cold `Topology.route`'s inner loop:
    comparisons rather than min() calls, one tuple built at the end)."""
    links: list[int] = []
    bw = eff = float("inf")
    lat = 0.0
    for placed, shape in parts:
        links += placed
        if shape.bandwidth_Bps < bw:
            bw = shape.bandwidth_Bps
        if shape.effective_bandwidth_Bps < eff:
            eff = shape.effective_bandwidth_Bps
        lat += shape.latency_s  # in route order, as before: the same float sum
    return Route(src, dst, tuple(links), bw, eff, lat)
