"""Links shared by concurrent transfers, as a SimPy resource: transfers join, share bandwidth, and finish.

The engine's one link-sharing mechanism. Its users:
- the transfers of a collective's plan (`simdist.engine.executor.run_plan`, hence ``simdist collective``):
  a plain transfer is one flow on every link of its route (weight 1), its size its wire bytes, its cap a
  rate bound of its own (a ring hop's channel rate);
- the collectives of a training step (`simdist.engine.graph.run_graph`, hence ``simdist run``): a priced
  collective (`simdist.plan.opgraph.Job`) is one transfer driving the flows of its plan, see `job_flows`.

Whenever a transfer that shares a link with another joins or leaves, rates are re-shared max-min fairly in
bandwidth per flow (`simdist.engine.sharing.max_min_rates`, the one solver), once per instant, after every
transfer joining at that instant has joined (the first schedules the re-share, a zero-delay timeout whose
callback runs after them). A transfer sharing none
of its links is rated alone (its cap, or its tightest link's capacity per weight) without a re-share.

Alone, a transfer of size S and cap R on links of capacity C_l and weight w_l takes S / min(R, C_l / w_l):
a plain transfer of S bytes over a route of bottleneck B takes S / B after its latency (the alpha-beta model
of the closed forms), and a job, whose cap is its closed-form speed (`job_flows`), takes its bandwidth_s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat

import numpy as np
import simpy

from simdist.engine.sharing import SMALL_ENTRIES, max_min_rates, max_min_rates_small

MEMO_ENTRIES = 1 << 16
"""Re-shares a `SharedLinks` remembers at most (then it forgets them all and starts again)."""
DONE_FRACTION = 1e-12
"""A transfer whose remaining bytes fall below this fraction of its size at an event is complete (residue
of rate x time in floating point)."""


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
class _Transfer:
    links: tuple[int, ...]
    weights: tuple[float, ...] | None
    """Flows per link (None: one on each)."""
    size: float
    remaining: float
    cap: float
    done: simpy.Event | None
    """Fires when it completes (None: ``then`` is called instead)."""
    then: Callable[[], None] | None = None
    seq: int = 0
    """Order of joining (re-shares list transfers in this order)."""
    rate: float = 0.0
    sig: int = 0
    """Its (links, weights, cap), numbered: transfers alike have the same (re-shares are memoised by them)."""


class SharedLinks:
    """Directed links of given effective capacities (bytes/s), shared by the transfers crossing them."""

    def __init__(self, env: simpy.Environment, capacity_of: Callable[[int], float], *, record_load: bool = True
                 ) -> None:
        """``record_load``: sum the bytes every link carries in ``load`` (off: nothing recorded)."""
        self.env = env
        self._capacity_of = capacity_of  # link id -> effective bytes/s
        self._active: list[_Transfer] = []
        self._on: dict[int, list[_Transfer]] = {}
        """Active transfers per link: one whose links no other transfer uses is rated alone."""
        self._joined = 0
        self._capacity: dict[int, float] = {}
        """Capacities of the links seen so far."""
        self._table = np.zeros(0)
        """The same indexed by link id, for re-shares (NaN: not seen yet)."""
        self._finite = True
        """Every capacity seen and every cap is finite or inf, none NaN (else re-shares take numpy's path)."""
        self._entries = 0  # (transfer, link) entries of the active transfers
        self._weighted = 0  # active transfers with weights
        self._dirty: set[int] = set()
        """Links whose transfers changed since the last re-share (one joined, or one left beside others)."""
        self._last = 0.0
        self._woken = False
        """A re-share is scheduled at this instant (after the transfers joining at it)."""
        self._horizon = 0
        """Generation of the next-finish timeout: one set before the last re-share is stale."""
        self._horizon_at = math.inf
        """When the next-finish timeout fires."""
        self.load = LinkLoad()
        self._record = record_load
        self._sigs: dict[tuple, int] = {}
        """(links, weights, cap) -> its number (`_Transfer.sig`)."""
        self._memo: dict[tuple, list[float]] = {}
        """Re-shares done: the rates of a group of transfers, keyed by whether it took the small solver and
        their signatures in order. Rates are a function of those alone (capacities do not change), and a
        schedule's steady state meets the same groups again and again: a repeat costs a lookup."""

    def transfer(self, links: Sequence[int], size: float, cap: float = math.inf,
                 weights: Sequence[float] | None = None, then: Callable[[], None] | None = None
                 ) -> simpy.Event | None:
        """Start moving a transfer now: ``size`` bytes per flow (of its heaviest flows) over ``links``, each
        crossed by ``weights`` of its flows (None: one), at most ``cap`` bytes/s per flow. The event returned
        fires when it completes; with ``then``, no event: ``then()`` is called at that instant instead, once the
        links are re-shared (one SimPy event fewer per transfer, for the engine's callbacks)."""
        if size <= 0:
            done = self.env.event()
            if then is not None:
                done.callbacks.append(lambda _ev: then())
            done.succeed()
            return None if then is not None else done
        done = self.env.event() if then is None else None
        self._advance()
        links = tuple(links)
        weights = None if weights is None else tuple(weights)
        capacity = self._capacity
        on = self._on
        self._joined += 1
        sigs = self._sigs
        key = (links, weights, cap)
        sig = sigs.get(key)
        if sig is None:
            sig = sigs[key] = len(sigs)
        t = _Transfer(links, weights, size, size, cap, done, then, self._joined, 0.0, sig)
        shared = False
        for link in links:
            if link not in capacity:
                self._learn(link)
            there = on.get(link)
            if there:
                shared = True
                there.append(t)
            else:
                on[link] = [t]
        self._entries += len(links)
        if cap != cap:
            self._finite = False
        if weights is not None:
            self._weighted += 1
        if shared:
            self._dirty.update(links)
        else:
            t.rate = self._alone(t)
        if self._record:
            self.load.add(links, size, weights)
        self._active.append(t)
        if self._woken:
            return done
        if shared:
            self._woken = True
            self.env.timeout(0).callbacks.append(self._on_wake)
        elif t.rate > 0:
            # Alone, it changes no other rate: only the next finish may move earlier (no re-share, no wake-up).
            delay = t.remaining / t.rate
            if self.env.now + delay < self._horizon_at:
                self._schedule(delay)
        return done

    def in_flight(self) -> list[tuple[simpy.Event | Callable[[], None], float]]:
        """The transfers under way now, each as (its event, or its ``then``; the bytes per flow it has left)."""
        elapsed = self.env.now - self._last
        return [(t.done if t.then is None else t.then, t.remaining - t.rate * elapsed) for t in self._active]

    def _learn(self, link: int) -> None:
        """Record ``link``'s capacity (the table grown as needed)."""
        table = self._table
        if link >= len(table):
            grown = np.full(max(link + 1, 2 * len(table)), np.nan)
            grown[:len(table)] = table
            table = self._table = grown
        c = table[link] = self._capacity[link] = float(self._capacity_of(link))
        if not math.isfinite(c):
            self._finite = False

    def _alone(self, t: _Transfer) -> float:
        """Rate of a transfer sharing none of its links (the arithmetic of `max_min_rates` for it alone)."""
        rate = t.cap
        capacity = self._capacity
        if t.weights is None:
            for link in t.links:
                c = capacity[link]
                if c < rate:
                    rate = c
        else:
            for link, w in zip(t.links, t.weights, strict=True):
                if w > 0:
                    c = capacity[link] / w
                    if c < rate:
                        rate = c
        return rate

    def _advance(self) -> None:
        elapsed = self.env.now - self._last
        if elapsed > 0:
            for t in self._active:
                t.remaining -= t.rate * elapsed
        self._last = self.env.now

    def _reshare(self) -> None:
        active = self._active
        if not active:
            return
        if self._entries <= SMALL_ENTRIES and self._finite:
            # Few transfers: re-share only those linked (through links they share, transitively) to the links
            # that changed, in plain Python. Max-min rates are computed component by component: every round of
            # `max_min_rates` freezes a transfer, or lowers a link's remaining capacity, from the transfers that
            # share its links only, so a component's rates do not depend on the others, which keep theirs.
            # Listed in joining order, as in ``_active``: the same sums in the same order, the same rates.
            on = self._on
            todo = [link for link in self._dirty if link in on]
            seen_links = set(todo)
            part: dict[int, _Transfer] = {}
            while todo:
                for t in on[todo.pop()]:
                    if t.seq not in part:
                        part[t.seq] = t
                        for link in t.links:
                            if link not in seen_links:
                                seen_links.add(link)
                                todo.append(link)
            group = [part[k] for k in sorted(part)]
            key = (True, *(t.sig for t in group))
            rates = self._memo.get(key)
            if rates is None:
                rates = self._remember(key, max_min_rates_small([t.links for t in group], [t.weights for t in group],
                                                                [t.cap for t in group], self._capacity))
            for t, r in zip(group, rates, strict=True):
                t.rate = r
            return
        key = (False, *(t.sig for t in active))
        rates = self._memo.get(key)
        if rates is not None:
            for t, r in zip(active, rates, strict=True):
                t.rate = r
            return
        n = len(active)
        lengths = np.fromiter((len(t.links) for t in active), dtype=np.int64, count=n)
        total = int(lengths.sum())
        entries = np.fromiter(chain.from_iterable(t.links for t in active), dtype=np.int64, count=total)
        weights = None
        if self._weighted:
            weights = np.fromiter(chain.from_iterable(t.weights if t.weights is not None else repeat(1.0, len(t.links))
                                                      for t in active), dtype=float, count=total)
        caps = np.fromiter((t.cap for t in active), dtype=float, count=n)
        ids, compact = unique_inverse(entries)
        for t, r in zip(active, self._remember(key, max_min_rates(compact, lengths, self._table[ids], caps, weights)
                                               .tolist()), strict=True):
            t.rate = r

    def _remember(self, key: tuple, rates: list[float]) -> list[float]:
        memo = self._memo
        if len(memo) >= MEMO_ENTRIES:
            memo.clear()
        memo[key] = rates
        return rates

    def _on_wake(self, _event: simpy.Event) -> None:
        self._woken = False
        self._step()

    def _on_horizon(self, event: simpy.Event) -> None:
        if event.value == self._horizon:
            self._step()

    def _step(self) -> None:
        """At an event (a join, or the earliest finish): advance every transfer, retire the finished ones,
        re-share if needed, and set a timeout for the next finish (event callbacks, not a SimPy process)."""
        now = self.env.now
        elapsed = now - self._last
        self._last = now
        finished = []
        # `_advance` and the finish test in one pass (the same arithmetic)
        for t in self._active:
            rate = t.rate
            if elapsed > 0:
                t.remaining -= rate * elapsed
            left = t.remaining
            if left <= t.size * DONE_FRACTION or (rate > 0 and now + left / rate <= now):
                finished.append(t)
        if finished:
            gone = set(map(id, finished))
            self._active = [t for t in self._active if id(t) not in gone]
            on = self._on
            for t in finished:
                self._entries -= len(t.links)
                if t.weights is not None:
                    self._weighted -= 1
                for link in t.links:
                    there = on[link]
                    if len(there) > 1:
                        there.remove(t)
                        self._dirty.add(link)  # a transfer that shared this link may now go faster
                    else:
                        del on[link]
        if self._dirty:
            self._reshare()
            self._dirty.clear()
        for t in finished:
            if t.done is not None:
                t.done.succeed()
        horizon = math.inf
        for t in self._active:
            rate = t.rate
            if rate > 0:
                d = t.remaining / rate
                if d < horizon:
                    horizon = d
        if horizon < math.inf:
            self._schedule(horizon)
        else:
            self._horizon += 1
            self._horizon_at = math.inf
        for t in finished:  # last: what they call may start transfers (a join re-shares at its own wake-up)
            if t.then is not None:
                t.then()

    def _schedule(self, delay: float) -> None:
        """The next finish is ``delay`` from now (any timeout set before is stale)."""
        self._horizon += 1
        delay = max(delay, 0.0)
        self._horizon_at = self.env.now + delay
        self.env.timeout(delay, self._horizon).callbacks.append(self._on_horizon)
