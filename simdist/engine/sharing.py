"""Bandwidth sharing between concurrent transfers: weighted max-min fairness, the engine's one solver.

The sharing model of the engine (stated once, used by `simdist.engine.links` for collectives and for the
collectives of a training step, and by its fast path `simdist.engine.fluid`): a link's effective capacity
(bandwidth x efficiency) is shared max-min fairly *per flow, in bandwidth* (Bertsekas & Gallager, "Data
Networks", sec. 6.5.2, max-min fairness and progressive filling), weighted: a transfer that drives ``w``
flows across a link counts ``w`` times there.

A transfer here is anything whose flows move together at one rate ``r`` (bytes/s of each of its flows): a
plain transfer of a detailed plan is one flow on every link of its route (weight 1); a collective of a
training step drives several flows (one per channel and route) and crosses link ``l`` with weight
``w[l]`` = its flows there (where its flows carry equal bytes; `job_flows`). On
every link the transfers crossing it use ``sum w[l] r <= capacity[l]``; each transfer may carry a cap of
its own (its uncontended speed, or a protocol's rate bound).

Max-min fair: no transfer can go faster without slowing another whose rate per flow is no larger, on a
link both cross. Computed by bottlenecks (`max_min_rates`): each round, every link offers its remaining
capacity per unit of weight still unfrozen there; a transfer's bound is the least offer among its links
(or its cap); a link whose offer is no larger than the bound of every transfer crossing it is the tightest
link of all of them, and since offers only grow as transfers freeze below them, those transfers freeze at
their bounds for good. Every round freezes at least the transfers of the globally tightest link (or the
lowest cap), so rounds follow the chain of bottlenecks, not the number of transfers.
"""

from __future__ import annotations

import numpy as np

_REL = 1e-12
"""Offers within this relative distance of a transfer's bound count as equal (rounding of the divisions)."""


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` (inverse flat) for non-negative integers such as link ids.

    Where the largest value is not far beyond the count, by a table indexed by value (linear) instead of a
    stable sort: the distinct links of a large cluster's collectives number thousands, their ids hundreds
    of thousands.
    """
    values = np.asarray(values, dtype=np.int64).reshape(-1)
    if not len(values):
        return values.copy(), np.zeros(0, dtype=np.int64)
    top = int(values.max())
    if int(values.min()) < 0 or top > 64 * len(values) + 4096:
        ids, inverse = np.unique(values, return_inverse=True)
        return ids, inverse.reshape(-1)
    present = np.zeros(top + 1, dtype=bool)
    present[values] = True
    ids = np.flatnonzero(present)
    index = np.empty(top + 1, dtype=np.int64)
    index[ids] = np.arange(len(ids), dtype=np.int64)
    return ids, index[values]


def max_min_rates(entries: np.ndarray, lengths: np.ndarray, capacity: np.ndarray, caps: np.ndarray | None = None,
                  weights: np.ndarray | None = None) -> np.ndarray:
    """Per-flow rates (bytes/s) of transfers sharing links max-min fairly.

    Transfer ``t`` crosses the ``lengths[t]`` links that follow transfer t-1's in ``entries`` (compact ids
    indexing ``capacity``, bytes/s), each with the weight in ``weights`` at the same position (its flows on
    that link; None: 1 each). ``caps``: per-transfer rate bounds (None or inf: none). A transfer crossing no
    link of positive weight gets its cap. An entry of weight 0 neither uses nor bounds its link.

    Cost: O(entries) numpy work per round; rounds <= the length of the longest chain of bottlenecks
    (each round freezes the transfers of every link that is the tightest of all its transfers), at most
    the number of distinct rates. Within a relative 1e-12 two offers are one (rounding).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    caps = np.full(n, np.inf) if caps is None else np.asarray(caps, dtype=float)
    rates = np.zeros(n)
    if n == 0:
        return rates
    entries = np.asarray(entries, dtype=np.int64)
    remaining = np.array(capacity, dtype=float)
    num_links = len(remaining)
    if weights is None:
        w = np.ones(len(entries))
        runs = lengths
    else:
        w = np.asarray(weights, dtype=float)
        used = w > 0
        if not used.all():
            entries, w = entries[used], w[used]
            runs = np.bincount(np.repeat(np.arange(n), lengths)[used], minlength=n)
        else:
            runs = lengths
    crossing = runs > 0
    rates[~crossing] = caps[~crossing]
    live = np.flatnonzero(crossing)  # transfers still unfrozen, in order; runs: their entries each
    runs = runs[live]
    caps = caps[live]
    with np.errstate(divide="ignore", invalid="ignore"):
        while live.size:
            offer = remaining / np.bincount(entries, weights=w, minlength=num_links)  # per unit of weight
            at = offer[entries]
            starts = np.cumsum(runs) - runs
            bound = np.minimum(np.minimum.reduceat(at, starts), caps)
            each = np.repeat(bound, runs)
            # a link is the tightest of every transfer crossing it unless one of them is bound lower elsewhere
            loose = np.zeros(num_links, dtype=bool)
            loose[entries[each < at * (1.0 - _REL)]] = True
            freeze = ~np.logical_and.reduceat(loose[entries], starts) | (caps <= bound)
            if freeze.all():
                rates[live] = bound
                break
            if not freeze.any():  # only where a capacity is NaN: end rather than loop
                freeze[:] = True
            rates[live[freeze]] = bound[freeze]
            hit = np.repeat(freeze, runs)
            remaining = np.maximum(remaining - np.bincount(entries[hit], weights=w[hit] * each[hit],
                                                           minlength=num_links), 0.0)
            keep = ~hit
            entries, w = entries[keep], w[keep]
            stay = ~freeze
            live, runs, caps = live[stay], runs[stay], caps[stay]
    return rates


SMALL_ENTRIES = 256
"""`SharedLinks` re-shares with `max_min_rates_small` up to this many (transfer, link) entries: below it numpy's
per-call overhead on tiny arrays costs more than the arithmetic."""


def max_min_rates_small(links: list[tuple[int, ...]], weights: list[tuple[float, ...] | None], caps: list[float],
                        capacity: dict[int, float]) -> list[float]:
    """`max_min_rates` in plain Python, for a few transfers: the same rounds and the same floating-point
    operations in the same order (sums of weights and of frozen loads accumulated link by link in transfer order,
    as ``np.bincount`` does), hence the same rates, bit for bit (tests/test_links.py checks it with hypothesis).

    Transfer ``t`` crosses ``links[t]`` (link ids, keys of ``capacity``, bytes/s, finite) with ``weights[t]``
    (None: 1 each; an entry of weight 0 neither uses nor bounds its link), at most ``caps[t]`` bytes/s.
    """
    n = len(links)
    rates = [0.0] * n
    live: list[tuple[int, list[tuple[int, float]], float]] = []  # (transfer, its (link, weight > 0), cap)
    for t in range(n):
        w = weights[t]
        if w is None:
            pairs = [(link, 1.0) for link in links[t]]
        else:
            pairs = [(link, x) for link, x in zip(links[t], w, strict=True) if x > 0]
        if pairs:
            live.append((t, pairs, caps[t]))
        else:
            rates[t] = caps[t]
    remaining: dict[int, float] = {}
    for _, pairs, _ in live:
        for link, _ in pairs:
            remaining[link] = capacity[link]
    cut = 1.0 - _REL
    while live:
        total = dict.fromkeys(remaining, 0.0)  # weights still unfrozen per link, summed in transfer order
        for _, pairs, _ in live:
            for link, x in pairs:
                total[link] += x
        offer = {link: remaining[link] / s for link, s in total.items() if s}
        loose: set[int] = set()
        bounds = []
        for _, pairs, cap in live:
            b = cap
            for link, _ in pairs:
                o = offer[link]
                if o < b:
                    b = o
            bounds.append(b)
            for link, _ in pairs:
                if b < offer[link] * cut:
                    loose.add(link)
        freeze = []
        for (_, pairs, cap), b in zip(live, bounds, strict=True):
            f = cap <= b
            if not f:
                for link, _ in pairs:
                    if link not in loose:
                        f = True
                        break
            freeze.append(f)
        if all(freeze) or not any(freeze):  # none: only where a capacity is NaN (as max_min_rates)
            for (t, _, _), b in zip(live, bounds, strict=True):
                rates[t] = b
            break
        used: dict[int, float] = {}
        stay = []
        for item, b, f in zip(live, bounds, freeze, strict=True):
            if not f:
                stay.append(item)
                continue
            rates[item[0]] = b
            for link, x in item[1]:
                used[link] = used.get(link, 0.0) + x * b
        for link, u in used.items():
            left = remaining[link] - u
            remaining[link] = left if left > 0.0 else 0.0
        live = stay
    return rates


def job_flows(nbytes: np.ndarray, flows: np.ndarray) -> tuple[float, np.ndarray]:
    """(size, weights) of a job that puts ``nbytes[i]`` bytes and ``flows[i]`` flows on its i-th link.

    # Assumption: a job's flows are coupled: they progress together, each moving the same fraction of its
    # bytes per second (a ring's hops move at its channel's bottleneck rate, and the collective ends when
    # its last flow does). The job's rate is then that of its heaviest flows, whose bytes are its size
    # (max over links of bytes / flows), and a flow carrying f times their bytes moves at f x that rate:
    # on link i the job uses nbytes[i] / size x rate, i.e. its weight there is nbytes[i] / size, which is
    # its flows on the link where they carry equal bytes (a fast ring's flows do). Fairness then compares
    # jobs by the rate of their flows, per flow: a 10 MB send (one flow) next to a 4 GB transfer of one flow
    # gets half the link, a collective of 8 channels next to one of 2 gets 80 %.
    A link without bytes gets weight 0 (it takes no bandwidth); size 0: no bytes anywhere.
    """
    nbytes = np.asarray(nbytes, dtype=float)
    flows = np.asarray(flows, dtype=float)
    loaded = (nbytes > 0) & (flows > 0)
    if not loaded.any():
        return 0.0, np.zeros(len(nbytes))
    size = float((nbytes[loaded] / flows[loaded]).max())
    return size, np.where(nbytes > 0, nbytes / size, 0.0)
