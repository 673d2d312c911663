"""Test oracle for the engine's solver (simdist.engine.sharing.max_min_rates): weighted max-min fairness by
textbook progressive filling, in plain Python.

Progressive filling (Bertsekas & Gallager, "Data Networks", sec. 6.5.2): every unfrozen transfer's rate
rises from 0 at the same speed; a transfer crossing a link with weight w uses w x its rate there. When a
link saturates, every unfrozen transfer crossing it freezes; when a transfer reaches its cap, it freezes.
Written for clarity, not speed, and independently of the production solver (which finds bottlenecks
instead of raising a common level).
"""

from __future__ import annotations

import math


def progressive_filling(links: list[list[int]], weights: list[list[float]], capacity: list[float],
                        caps: list[float]) -> list[float]:
    """Rates of transfers crossing ``links[t]`` with ``weights[t]`` (same positions) over ``capacity``."""
    n = len(links)
    rates = [0.0] * n
    frozen = [False] * n
    for t in range(n):
        if not any(w > 0 for w in weights[t]):
            rates[t], frozen[t] = caps[t], True
    used = [0.0] * len(capacity)
    level = 0.0
    while not all(frozen):
        # weight of the unfrozen transfers on each link
        load = [0.0] * len(capacity)
        for t in range(n):
            if not frozen[t]:
                for link, w in zip(links[t], weights[t], strict=True):
                    load[link] += w
        # how far the common level can rise before a link saturates or a cap is reached
        step = math.inf
        for link, w in enumerate(load):
            if w > 0:
                step = min(step, (capacity[link] - used[link]) / w)
        for t in range(n):
            if not frozen[t]:
                step = min(step, caps[t] - level)
        step = max(step, 0.0)
        level += step
        for link, w in enumerate(load):
            used[link] += step * w
        full = {link for link, w in enumerate(load) if w > 0 and used[link] >= capacity[link] * (1 - 1e-12)}
        for t in range(n):
            if frozen[t]:
                continue
            if level >= caps[t] * (1 - 1e-12) or any(link in full and w > 0
                                                     for link, w in zip(links[t], weights[t], strict=True)):
                rates[t], frozen[t] = level, True
    return rates
