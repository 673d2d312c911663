"""Shared arithmetic of the closed forms: link loads of concurrent flows.

A set of flows that start together and share links max-min fairly lasts, bandwidth-wise,
max over links of (bytes crossing the link / link effective capacity) when every flow on the
most loaded link is held there (symmetric algorithms); that is the load term the closed forms use.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from simdist.collectives.group import Group
from simdist.hardware import batch
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


_LINK_INDEX: dict[int, tuple[np.ndarray, Topology, np.ndarray, np.ndarray]] = {}
"""By id of a route batch's links array: (that array, its topology, each entry's index among the distinct links,
their capacities). Groups are rebuilt for every protocol priced but share their route batches
(simdist.collectives.group), so every protocol and size of a collective sums over the same links (bounded; an
entry holds its array, so the id in its key stays that array's)."""


def batch_drain_time_s(group: Group, routes: RouteBatch, nbytes: np.ndarray, rate_factor: float = 1.0) -> float:
    """drain_time_s for a vectorised batch of routes (simdist.hardware.batch), same arithmetic."""
    hit = _LINK_INDEX.get(id(routes.links))
    if hit is None or hit[0] is not routes.links or hit[1] is not group.topology:
        ids, compact = np.unique(routes.links, return_inverse=True)  # as batch.link_loads
        if len(_LINK_INDEX) > 1024:
            _LINK_INDEX.clear()
        hit = _LINK_INDEX[id(routes.links)] = (routes.links, group.topology, compact.reshape(-1),
                                               batch.link_capacities(group.topology, ids))
    _, _, compact, capacity = hit
    if not len(capacity):
        return 0.0
    weights = np.repeat(np.asarray(nbytes, dtype=float), routes.hops)
    loads = np.bincount(compact, weights=weights, minlength=len(capacity))
    return float((loads / (capacity * rate_factor)).max())
