"""Shared arithmetic of the closed forms: link loads of concurrent flows.

A set of flows that start together and share links max-min fairly lasts, bandwidth-wise,
max over links of (bytes crossing the link / link effective capacity) when every flow on the
most loaded link is held there (symmetric algorithms); that is the load term the closed forms use.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from simdist.collectives.group import Group
from simdist.hardware.batch import RouteBatch
from simdist.hardware.link import Route
from simdist.hardware.topology import Topology


def link_loads(flows: Iterable[tuple[Route, float]]) -> dict[int, float]:
    """Bytes per directed link of ``(route, nbytes)`` flows."""
    load: dict[int, float] = {}
    for route, nbytes in flows:
        for link in route.links:
            load[link] = load.get(link, 0.0) + nbytes
    return load


def drain_time_s(topology: Topology, flows: Iterable[tuple[Route, float]], rate_factor: float = 1.0) -> float:
    """Time for concurrent flows to move their bytes: the most loaded link's bytes / capacity."""
    load = link_loads(flows)
    if not load:
        return 0.0
    return max(b / (topology.link(link).effective_bandwidth_Bps * rate_factor) for link, b in load.items())


def batch_drain_time_s(group: Group, routes: RouteBatch, nbytes: np.ndarray, rate_factor: float = 1.0) -> float:
    """drain_time_s for a vectorised batch of routes (simdist.hardware.batch), same arithmetic."""
    # each distinct link and its capacity, computed once per route batch (RouteBatch.link_index): groups are
    # rebuilt for every protocol priced but share their route batches (Topology.route_batches), so every protocol
    # and size of a collective sums over the same links
    _, compact = routes.link_index()
    capacity = routes.distinct_capacities_Bps(group.topology.layout)
    if not len(capacity):
        return 0.0
    weights = np.repeat(np.asarray(nbytes, dtype=float), routes.hops)
    loads = np.bincount(compact, weights=weights, minlength=len(capacity))
    return float((loads / (capacity * rate_factor)).max())
