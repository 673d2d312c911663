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
callback runs after them; or, for a caller that settles its callbacks, `SharedLinks.settle` at the end of the
callback where nothing else is queued at that instant, the same order). A transfer sharing none of its links
is rated alone (its cap, or its tightest link's capacity per weight) without a re-share.

Alone, a transfer of size S and cap R on links of capacity C_l and weight w_l takes S / min(R, C_l / w_l):
a plain transfer of S bytes over a route of bottleneck B takes S / B after its latency (the alpha-beta model
of the closed forms), and a job, whose cap is its closed-form speed (`job_flows`), takes its bandwidth_s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from heapq import heappop, heappush
from itertools import chain, count, repeat
from operator import attrgetter

import numpy as np
import simpy

from simdist.engine.sharing import SMALL_ENTRIES, max_min_rates, max_min_rates_small, unique_inverse
from simdist.engine.ticks import NORMAL, Tick
from simdist.engine.transfer import DONE_FRACTION, LinkLoad, Transfer

MEMO_ENTRIES = 1 << 16
"""Re-shares a `SharedLinks` remembers at most (then it forgets them all and starts again)."""
_seq = attrgetter("seq")
"""A transfer's order of joining (a sort key)."""


class SharedLinks:
    """Directed links of given effective capacities (bytes/s), shared by the transfers crossing them.

    Progress is lazy: a transfer keeps its bytes left at its last rate change, that time, its rate and its
    projected finish; a re-share touches only the transfers whose rate changes, and the next finish comes
    from a heap of projected finishes (one entry per transfer, at or before its finish: one whose finish moved
    later keeps its entry, which is fixed when it comes to the top; entries of transfers finished, or re-rated
    to an earlier finish, are skipped when met).
    Horizon timeouts are not superseded: one pending at or before the next finish is kept, and when a
    timeout fires with nothing finished it re-arms for the next finish (no step).
    """

    def __init__(self, env: simpy.Environment, capacity_of: Callable[[int], float], *, record_load: bool = True,
                 caller_settles: bool = False) -> None:
        """``record_load``: sum the bytes every link carries in ``load`` (off: nothing recorded).
        ``caller_settles``: the caller calls `settle` at the end of every event callback of its own that may start
        transfers, and runs no SimPy process (nothing URGENT is scheduled during a callback); then a join at an
        instant with no other event queued re-shares at that callback's end, without a wake-up event."""
        self.env = env
        self._caller_settles = caller_settles
        self._owed = False
        """A re-share is due at the end of the current callback (`settle`), in place of a wake-up event."""
        self._capacity_of = capacity_of  # link id -> effective bytes/s
        self._active: dict[int, Transfer] = {}
        """Transfers under way by ``seq``, in joining order."""
        self._on: dict[int, list[Transfer]] = {}
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
        self._touched: set[Transfer] = set()
        """Since the last re-share: the transfers that joined beside others, and those a leaving one shared a link
        with (a re-share reaches those of them under way and every transfer linked to them through shared links;
        empty: nothing to re-share)."""
        self._woken = False
        """A re-share is scheduled at this instant (after the transfers joining at it)."""
        self._ends: list[tuple[float, int, int, Transfer]] = []
        """Heap of (projected finish, seq, push number, transfer): per transfer under way with a finite finish, one
        entry (its ``entry``) at or before it (the finish it had when pushed; a later finish does not push, the
        entry is moved to it when it comes to the top, `_top`); others are stale (skipped when at the top). The
        exact entries come to the top in the order of (finish, seq) of the transfers, as if each re-rate pushed."""
        self._push = count().__next__
        """The next push number (ties of finish and seq in ``_ends`` break by it, never by the transfer)."""
        self._pending: list[float] = []
        """Heap of the times at which horizon timeouts are pending (the earliest is at or before the next finish)."""
        self.load = LinkLoad()
        self._record = record_load
        self._sigs: dict[tuple, int] = {}
        """(links, weights, cap) -> its number (`Transfer.sig`)."""
        self._memo: dict[tuple, list[float]] = {}
        """Re-shares done: the rates of a group of transfers, keyed by their signatures in order (after None where
        all of them took numpy's solver). Rates are a function of those alone (capacities do not change), and a
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
        links = tuple(links)
        weights = None if weights is None else tuple(weights)
        self._joined += 1
        self._join(Transfer(links, weights, size, size, cap, done, then, self._joined, 0.0,
                             self._sig(links, weights, cap), self.env.now))
        return done

    def route(self, links: Sequence[int], cap: float = math.inf, weights: Sequence[float] | None = None) -> list:
        """The fixed part of transfers that `start` moves again and again: their ``links``, ``cap`` and ``weights``
        as `transfer` takes them (its key, numbered at the first start)."""
        return [tuple(links), None if weights is None else tuple(weights), cap, -1]

    def start(self, route: list, size: float, then: Callable[[], None]) -> None:
        """`transfer` (``route``'s links, cap and weights; ``size``; ``then``) without its per-call conversions and
        key look-up: the engine's collectives move over the same few routes thousands of times."""
        if size <= 0:
            self.transfer(route[0], size, route[2], route[1], then)
            return
        links, weights, cap, sig = route
        if sig < 0:
            sig = route[3] = self._sig(links, weights, cap)
        self._joined += 1
        self._join(Transfer(links, weights, size, size, cap, None, then, self._joined, 0.0, sig, self.env.now))

    def _sig(self, links: tuple[int, ...], weights: tuple[float, ...] | None, cap: float) -> int:
        """The number of (links, weights, cap) (`Transfer.sig`); the capacities of links not seen before learnt."""
        sigs = self._sigs
        key = (links, weights, cap)
        sig = sigs.get(key)
        if sig is None:  # (links not seen before come only with a new signature)
            sig = sigs[key] = len(sigs)
            capacity = self._capacity
            for link in links:
                if link not in capacity:
                    self._learn(link)
        return sig

    def _join(self, t: Transfer) -> None:
        """Put ``t`` under way now: rated alone where it shares no link, else re-shared at this instant's end."""
        now = t.at
        links = t.links
        on = self._on
        near = t.near
        for link in links:
            there = on.get(link)
            if there:
                near.update(there)
                there.append(t)
            else:
                on[link] = [t]
        for u in near:
            u.near.add(t)
        self._entries += len(links)
        if t.cap != t.cap:
            self._finite = False
        if t.weights is not None:
            self._weighted += 1
        if near:
            self._touched.add(t)
        else:
            self._rerate((t,), (t.alone_rate(self._capacity),), now)
        if self._record:
            self.load.add(links, t.size, t.weights)
        self._active[t.seq] = t
        if self._woken:
            return
        if near:
            self._woken = True
            if self._caller_settles and self.env.peek() > now:
                # Nothing else is queued at this instant: the wake-up would be the next event after this callback
                # (events scheduled later at this instant come after it, and none is URGENT), so it runs at the
                # callback's end instead (`settle`): the same order of everything.
                self._owed = True
            else:
                self.env.schedule(Tick(self.env, [self._on_wake]), NORMAL, 0)
        elif t.end < math.inf:
            # Alone, it changes no other rate: only the next finish may move earlier (no re-share, no wake-up).
            self._arm(t.end)

    def in_flight(self) -> list[tuple[simpy.Event | Callable[[], None], float]]:
        """The transfers under way now, each as (its event, or its ``then``; the bytes per flow it has left)."""
        now = self.env.now
        return [(t.done if t.then is None else t.then, t.left_at(now)) for t in self._active.values()]

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

    def _rerate(self, group: Sequence[Transfer], rates: Sequence[float], now: float) -> None:
        """Give each transfer of ``group`` its rate in ``rates`` from ``now`` (its progress so far at its old
        rate) and project its finish; one whose rate is unchanged keeps its projection."""
        ends = self._ends
        push = self._push
        inf = math.inf
        for t, rate in zip(group, rates, strict=True):
            old = t.rate
            if rate == old:
                continue
            elapsed = now - t.at
            if elapsed > 0:
                t.left -= old * elapsed
            t.at = now
            t.rate = rate
            if rate > 0:
                end = now + t.left / rate
                if end != t.end:
                    t.end = end
                    if end < t.key:  # (else its entry is at or before it; NaN: never finishes, as a NaN rate)
                        n = t.entry = push()
                        t.key = end
                        heappush(ends, (end, t.seq, n, t))
            else:
                t.end = inf

    def _reshare(self, now: float) -> None:
        active = self._active
        if not active:
            return
        if self._entries <= SMALL_ENTRIES and self._finite:
            # Few transfers: re-share only those linked (through links they share, transitively) to the links
            # that changed, in plain Python. Max-min rates are computed component by component: every round of
            # `max_min_rates` freezes a transfer, or lowers a link's remaining capacity, from the transfers that
            # share its links only, so a component's rates do not depend on the others, which keep theirs.
            # Listed in joining order, as in ``_active``: the same sums in the same order, the same rates.
            # (Walked through ``near``: the transfers on the changed links still in use are the touched ones still
            # under way, the same component.)
            todo = [t for t in self._touched if t.live]
            near = todo[0].near if len(todo) == 1 else None
            if near is not None and len(near) < 2 and (not near or len(next(iter(near)).near) == 1):
                # the commonest components, found without the walk: one transfer alone now, or two sharing links
                # with each other only
                t = todo[0]
                if near:
                    u = next(iter(near))
                    group = [u, t] if u.seq < t.seq else [t, u]
                else:
                    group = todo
            else:
                part = set(todo)
                while todo:
                    for u in todo.pop().near:
                        if u not in part:
                            part.add(u)
                            todo.append(u)
                group = sorted(part, key=_seq)
            key = tuple([t.sig for t in group])
            rates = self._memo.get(key)
            if rates is None:
                rates = self._remember(key, max_min_rates_small([t.links for t in group], [t.weights for t in group],
                                                                [t.cap for t in group], self._capacity))
            self._rerate(group, rates, now)
            return
        group = list(active.values())
        key = (None, *(t.sig for t in group))  # (None: not a small path's key, a tuple of ints)
        rates = self._memo.get(key)
        if rates is None:
            n = len(group)
            lengths = np.fromiter((len(t.links) for t in group), dtype=np.int64, count=n)
            total = int(lengths.sum())
            entries = np.fromiter(chain.from_iterable(t.links for t in group), dtype=np.int64, count=total)
            weights = None
            if self._weighted:
                weights = np.fromiter(chain.from_iterable(t.weights if t.weights is not None
                                                          else repeat(1.0, len(t.links)) for t in group),
                                      dtype=float, count=total)
            caps = np.fromiter((t.cap for t in group), dtype=float, count=n)
            ids, compact = unique_inverse(entries)
            rates = self._remember(key, max_min_rates(compact, lengths, self._table[ids], caps, weights).tolist())
        self._rerate(group, rates, now)

    def _remember(self, key: tuple, rates: list[float]) -> list[float]:
        memo = self._memo
        if len(memo) >= MEMO_ENTRIES:
            memo.clear()
        memo[key] = rates
        return rates

    def _arm(self, at: float) -> None:
        """Make sure a horizon timeout fires at or before ``at`` (one pending that early is kept)."""
        pending = self._pending
        if pending and pending[0] <= at:
            return
        now = self.env.now
        delay = max(at - now, 0.0)
        while now + delay < at:  # SimPy fires at now + delay: not before the finish
            delay = math.nextafter(delay, math.inf)
        heappush(pending, now + delay)
        self.env.schedule(Tick(self.env, [self._on_horizon]), NORMAL, delay)

    def settle(self) -> None:
        """At the end of a callback (``caller_settles``): the re-share its joins owe, as their wake-up would."""
        while self._owed:
            self._owed = False
            self._woken = False
            self._step()

    def _on_wake(self, _event: simpy.Event) -> None:
        self._woken = False
        self._step()
        if self._owed:
            self.settle()

    def _on_horizon(self, _event: simpy.Event) -> None:
        heappop(self._pending)  # this one: the earliest pending (SimPy fires timeouts in time order)
        self._step()  # (nothing finished: the next finish moved later since it was set, and is re-armed)
        if self._owed:
            self.settle()

    def _top(self) -> None:
        """The heap's top entry is stale, or its transfer's finish moved later: pop it; in the second case push its
        transfer's finish (if finite; NaN: never finishes)."""
        ends = self._ends
        _, _, n, t = heappop(ends)
        if n == t.entry and t.live:
            end = t.end
            if end < math.inf:
                n = t.entry = self._push()
                t.key = end
                heappush(ends, (end, t.seq, n, t))
            else:
                t.entry = -1
                t.key = math.inf

    def _step(self) -> None:
        """At an event (a join, or the earliest finish): retire the finished transfers, re-share if needed,
        and make sure a timeout fires at the next finish (event callbacks, not a SimPy process).

        A transfer is complete at ``now`` when at or past its projected finish, or so close that what it has
        left is a residue (below `DONE_FRACTION` of its size, or less time than ``now`` resolves); those
        are taken from the heap's top, in order of projected finish, then retired in joining order."""
        now = self.env.now
        finished = []
        ends = self._ends
        pop = heappop
        while ends:
            end, _, n, t = ends[0]
            if n != t.entry or not t.live or end != t.end:
                self._top()
                continue
            if end > now:
                rate = t.rate
                elapsed = now - t.at
                left = t.left - rate * elapsed if elapsed > 0 else t.left
                if not (left <= t.size * DONE_FRACTION or (rate > 0 and now + left / rate <= now)):
                    break
            pop(ends)
            t.live = False
            finished.append(t)
        touched = self._touched
        if finished:
            if len(finished) > 1:
                finished.sort(key=_seq)  # joining order, as every pass over the transfers under way
            active = self._active
            on = self._on
            entries = 0
            for t in finished:
                del active[t.seq]
                links = t.links
                entries += len(links)
                if t.weights is not None:
                    self._weighted -= 1
                for link in links:
                    there = on[link]
                    if len(there) > 1:
                        there.remove(t)
                    else:
                        del on[link]
                near = t.near
                if near:  # the transfers that shared a link with it may now go faster
                    touched.update(near)
                    for u in near:
                        u.near.discard(t)
            self._entries -= entries
        if touched:
            self._reshare(now)
            touched.clear()
        for t in finished:
            if t.done is not None:
                t.done.succeed()
        top = self._top
        while ends:
            end, _, n, t = ends[0]
            if n == t.entry and t.live and end == t.end:
                pending = self._pending
                if not pending or pending[0] > end:
                    self._arm(end)
                break
            top()
        for t in finished:  # last: what they call may start transfers (a join re-shares at its own wake-up)
            then = t.then
            if then is not None:
                then()
