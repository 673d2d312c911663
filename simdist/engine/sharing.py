"""Bandwidth sharing between concurrent flows: max-min fairness by progressive filling.

The sharing model of the engine (stated once, used everywhere): every active flow crossing a
directed link gets an equal share of that link's effective capacity (bandwidth x efficiency) unless
it is held lower elsewhere, in which case the others split what it leaves (max-min fair; Bertsekas
& Gallager, "Data Networks", sec. 6.5.2, progressive filling). A flow may also carry its own rate cap
(a protocol that moves less payload per byte on the wire).
"""

from __future__ import annotations

import numpy as np


def max_min_rates(
    flow_links: list[tuple[int, ...]],
    capacity: np.ndarray,
    caps: np.ndarray | None = None,
) -> np.ndarray:
    """Rates (bytes/s) of flows crossing links ``flow_links[f]`` of capacities ``capacity[link]``.

    ``capacity`` is indexed by the link ids appearing in ``flow_links`` (compact ids, see callers);
    ``caps`` are optional per-flow upper bounds (inf for none).
    """
    n = len(flow_links)
    rates = np.zeros(n)
    if n == 0:
        return rates
    lengths = np.fromiter((len(links) for links in flow_links), dtype=np.int64, count=n)
    entries = np.fromiter((link for links in flow_links for link in links), dtype=np.int64, count=int(lengths.sum()))
    owner = np.repeat(np.arange(n), lengths)
    caps = np.full(n, np.inf) if caps is None else np.asarray(caps, dtype=float)
    remaining = capacity.astype(float).copy()
    frozen = np.zeros(n, dtype=bool)
    # a flow without links (same GPU) is limited only by its cap
    linkless = lengths == 0
    rates[linkless] = caps[linkless]
    frozen |= linkless
    num_links = len(capacity)
    while not frozen.all():
        live = ~frozen[owner]
        counts = np.bincount(entries[live], minlength=num_links)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(counts > 0, remaining / np.maximum(counts, 1), np.inf)
        entry_share = np.where(live, share[entries], np.inf)
        flow_share = np.full(n, np.inf)
        np.minimum.at(flow_share, owner, entry_share)
        bound = np.minimum(flow_share, caps)
        level = bound[~frozen].min()
        newly = ~frozen & (bound <= level * (1.0 + 1e-12))
        rates[newly] = level
        frozen |= newly
        hit = newly[owner]
        remaining -= np.bincount(entries[hit], weights=np.full(int(hit.sum()), level), minlength=num_links)
        np.maximum(remaining, 0.0, out=remaining)
    return rates
