"""One transfer under way on shared links (`simdist.engine.links.SharedLinks`): its bytes left, rate and projected
finish, updated lazily; and the bytes every link carries over a simulation (`LinkLoad`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import simpy

__all__ = ["DONE_FRACTION", "LinkLoad", "Transfer"]

DONE_FRACTION = 1e-12
"""A transfer whose remaining bytes fall below this fraction of its size at an event is complete (residue
of rate x time in floating point)."""


@dataclass(slots=True)
class LinkLoad:
    """Bytes carried per directed link over a simulation (for per-link load reports), in order of first use."""

    bytes_by_link: dict[int, float] = field(default_factory=dict)

    def add(self, links: Sequence[int], nbytes: float, weights: Sequence[float] | None = None) -> None:
        out = self.bytes_by_link
        if weights is None:
            for link in links:
                out[link] = out.get(link, 0.0) + nbytes
        else:
            for link, w in zip(links, weights, strict=True):
                out[link] = out.get(link, 0.0) + nbytes * w


@dataclass(slots=True, eq=False)
class Transfer:
    links: tuple[int, ...]
    weights: tuple[float, ...] | None
    """Flows per link (None: one on each)."""
    size: float
    left: float
    """Bytes per flow it had left at ``at`` (progress is lazy: a transfer is touched only when its rate changes)."""
    cap: float
    done: simpy.Event | None
    """Fires when it completes (None: ``then`` is called instead)."""
    then: Callable[[], None] | None = None
    seq: int = 0
    """Order of joining (re-shares list transfers in this order)."""
    rate: float = 0.0
    sig: int = 0
    """Its (links, weights, cap), numbered: transfers alike have the same (re-shares are memoised by them)."""
    at: float = 0.0
    """When its rate last changed (or it joined)."""
    end: float = math.inf
    """When it finishes at its rate: ``at + left / rate`` (inf: rate 0)."""
    live: bool = True
    """Not finished yet."""
    entry: int = -1
    """The push number of its entry in the heap of finishes (-1: none; others of its entries are stale)."""
    key: float = math.inf
    """That entry's finish: at most ``end`` (a finish moved later keeps its entry, fixed when it comes to the top)."""
    near: set[Transfer] = field(default_factory=set)
    """The transfers under way that share a link with it (re-shares walk these to find what a change reaches)."""

    def left_at(self, now: float) -> float:
        """Bytes per flow it has left at ``now`` (at its rate since ``at``)."""
        elapsed = now - self.at
        return self.left - self.rate * elapsed if elapsed > 0 else self.left

    def alone_rate(self, capacity: dict[int, float]) -> float:
        """Its rate sharing none of its links (the arithmetic of `max_min_rates` for it alone), from the links'
        ``capacity``."""
        rate = self.cap
        if self.weights is None:
            for link in self.links:
                c = capacity[link]
                if c < rate:
                    rate = c
        else:
            for link, w in zip(self.links, self.weights, strict=True):
                if w > 0:
                    c = capacity[link] / w
                    if c < rate:
                        rate = c
        return rate
