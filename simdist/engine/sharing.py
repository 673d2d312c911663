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
    lengths = np.fromiter((len(links) for links in flow_links), dtype=np.int64, count=n)
    entries = np.fromiter((link for links in flow_links for link in links), dtype=np.int64, count=int(lengths.sum()))
    return max_min_rates_csr(entries, lengths, capacity, caps)


def _inputs(entries, lengths, capacity, caps):
    """Normalised arrays shared by both solvers: entries, lengths, caps (inf: none), remaining link
    capacity (a copy), and zero rates."""
    lengths = np.asarray(lengths, dtype=np.int64)
    caps = np.full(len(lengths), np.inf) if caps is None else np.asarray(caps, dtype=float)
    return (np.asarray(entries, dtype=np.int64), lengths, caps, np.asarray(capacity, dtype=float).copy(),
            np.zeros(len(lengths)))


def max_min_rates_csr(
    entries: np.ndarray,
    lengths: np.ndarray,
    capacity: np.ndarray,
    caps: np.ndarray | None = None,
) -> np.ndarray:
    """`max_min_rates` with the flows' links as arrays: flow f crosses the ``lengths[f]`` links that
    follow flow f-1's in ``entries`` (CSR without its index array).

    Progressive filling: every round, each link offers its remaining capacity split equally among
    the unfrozen flows crossing it; the flows whose bound (smallest offer, or their cap) is the
    lowest, within a relative 1e-12, freeze at that level and their links give it up. A round
    touches only the links at the level and the links of the flows it freezes (plus a scan of the
    links still offering), so thousands of distinct levels cost thousands of small rounds.
    """
    entries, lengths, caps, remaining, rates = _inputs(entries, lengths, capacity, caps)
    n, num_links = len(lengths), len(remaining)
    if n == 0:
        return rates
    indptr = np.concatenate(([0], np.cumsum(lengths)))
    # a flow without links (same GPU) is limited only by its cap
    frozen = lengths == 0
    rates[frozen] = caps[frozen]
    left = n - int(frozen.sum())
    # link -> flows crossing it (CSC), and how many unfrozen flows cross each link
    owner = np.repeat(np.arange(n, dtype=np.int64), lengths)
    by_link = owner[np.argsort(entries, kind="stable")]
    crossing = np.bincount(entries, minlength=num_links)
    link_ptr = np.concatenate(([0], np.cumsum(crossing)))
    counts = crossing.copy()
    repeats = len(np.unique(owner * num_links + entries)) < len(entries)  # a flow lists a link twice
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(counts > 0, remaining / np.maximum(counts, 1), np.inf)
    offering = np.flatnonzero(counts > 0)  # links that may still hold unfrozen flows
    capped = np.flatnonzero(~frozen & (caps < np.inf))
    capped = capped[np.argsort(caps[capped], kind="stable")]
    c = 0  # capped[c:] are the capped flows possibly unfrozen, by cap
    while left:
        offers = share[offering]
        level = offers.min() if offers.size else np.inf
        while c < len(capped) and frozen[capped[c]]:
            c += 1
        if c < len(capped):
            level = min(level, caps[capped[c]])
        limit = level * (1.0 + 1e-12)
        tight = offering[offers <= limit]
        if len(tight) == 1:
            newly = by_link[link_ptr[tight[0]]:link_ptr[tight[0] + 1]]
        else:
            newly = by_link[_segments(link_ptr[tight], crossing[tight])]
        if c < len(capped):
            stop = int(np.searchsorted(caps[capped], limit, side="right"))
            newly = np.concatenate((newly, capped[c:max(c, stop)]))
        newly = newly[~frozen[newly]]
        if len(tight) > 1 or repeats or c < len(capped):  # a flow may be listed more than once
            newly = np.unique(newly)
        rates[newly] = level
        frozen[newly] = True
        left -= len(newly)
        links = entries[_segments(indptr[newly], lengths[newly])]
        given = np.full(len(links), level)
        if 16 * len(links) < num_links:  # few links touched: work on those only
            touched, where = np.unique(links, return_inverse=True)
            where = where.reshape(-1)
            counts[touched] -= np.bincount(where, minlength=len(touched))
            remaining[touched] = np.maximum(remaining[touched] - np.bincount(where, weights=given,
                                                                             minlength=len(touched)), 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                share[touched] = np.where(counts[touched] > 0, remaining[touched] / np.maximum(counts[touched], 1),
                                          np.inf)
        else:  # the same arithmetic over every link (untouched ones lose 0)
            counts -= np.bincount(links, minlength=num_links)
            remaining = np.maximum(remaining - np.bincount(links, weights=given, minlength=num_links), 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                share = np.where(counts > 0, remaining / np.maximum(counts, 1), np.inf)
        if 2 * int((counts[offering] == 0).sum()) > len(offering):
            offering = offering[counts[offering] > 0]
    return rates


def _segments(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for every (s, n) of (starts, lengths)."""
    total = int(lengths.sum())
    ends = np.cumsum(lengths)
    return np.repeat(starts - (ends - lengths), lengths) + np.arange(total, dtype=np.int64)


def max_min_rates_local(
    entries: np.ndarray,
    lengths: np.ndarray,
    capacity: np.ndarray,
    caps: np.ndarray | None = None,
) -> np.ndarray:
    """The max-min fair rates of `max_min_rates_csr`, freezing many levels per round.

    A link whose fair share is no larger than the bound of any unfrozen flow crossing it (it is the
    tightest link of all its flows) keeps that share to the end: shares only grow as flows freeze at
    levels below them, and every flow that could freeze elsewhere first crosses a link at least as
    loose. So every round freezes the flows of all such links at once (each flow at its own bound),
    not only those at the lowest level: rounds follow chains of bottlenecks, not distinct levels.
    Same allocation as progressive filling; values may differ in the last bits and, where two bounds
    lie within a relative 1e-12, by that much (progressive filling merges such levels).
    """
    entries, lengths, caps, remaining, rates = _inputs(entries, lengths, capacity, caps)
    n, num_links = len(lengths), len(remaining)
    if n == 0:
        return rates
    linkless = lengths == 0
    rates[linkless] = caps[linkless]
    live = np.flatnonzero(~linkless)
    lens = lengths[live]
    owner = np.repeat(np.arange(len(live), dtype=np.int64), lens)  # position in live
    while live.size:
        counts = np.bincount(entries, minlength=num_links)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(counts > 0, remaining / np.maximum(counts, 1), np.inf)
        starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
        entry_share = share[entries]
        bound = np.minimum(np.minimum.reduceat(entry_share, starts), caps[live])
        # tightest link of all its flows: its share is within 1e-12 of every crossing flow's bound
        least = np.full(num_links, np.inf)
        np.minimum.at(least, entries, bound[owner])
        settled = share <= least * (1.0 + 1e-12)
        freeze = (np.add.reduceat(settled[entries].astype(np.int64), starts) > 0) | (caps[live] <= bound)
        rates[live[freeze]] = bound[freeze]
        hit = freeze[owner]
        remaining = np.maximum(remaining - np.bincount(entries[hit], weights=bound[owner[hit]], minlength=num_links),
                               0.0)
        keep = ~hit
        entries, live, lens = entries[keep], live[~freeze], lens[~freeze]
        owner = np.repeat(np.arange(len(live), dtype=np.int64), lens)
    return rates
