"""Collectives of a training step sharing links: fluid jobs with demands, max-min fair in progress.

A job is one collective (simdist.plan.opgraph.Job): after its fixed latency it must move ``demand[l]`` bytes
over each link ``l`` it loads, in proportion (its flows progress together). Its progress rate x (fraction of
the transfer per second) is capped by ``1 / bandwidth_s`` (its uncontended speed) and, on every link, the
jobs crossing it may not use more than the link's effective capacity: sum_j x_j demand_jl <= C_l.

Sharing model: max-min fairness on progress rates, by progressive filling (Bertsekas & Gallager, "Data
Networks", sec. 6.5.2, with per-job link weights): every job's rate rises together until a link saturates or
a job reaches its cap; those jobs freeze and the rest continue.
# Assumption: collectives sharing a link progress at equal fractional rates. This equals per-flow max-min
# fairness (simdist.engine.sharing) when the collectives' flows on the shared link carry equal bytes per
# flow; a collective with more flows on a link would in reality take a larger share.

Alone, a job takes exactly latency_s + bandwidth_s (the closed form), so the engine equals the closed form
wherever nothing contends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import simpy

_REL = 1e-12


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


def weighted_max_min(demands: list[dict[int, float]], capacity: dict[int, float], caps: list[float]) -> list[float]:
    """Progress rates of jobs with per-link ``demands`` (bytes), link ``capacity`` (bytes/s) and rate caps."""
    arrays = [(np.fromiter(d.keys(), dtype=np.int64, count=len(d)), np.fromiter(d.values(), dtype=float, count=len(d)))
              for d in demands]
    top = max((int(a.max()) for a, _ in arrays if len(a)), default=-1)
    table = np.full(top + 1, np.nan)
    for link, c in capacity.items():
        if link <= top:
            table[link] = c
    return _weighted_max_min(arrays, table, np.asarray(caps, dtype=float)).tolist()


def _weighted_max_min(demands: list[tuple[np.ndarray, np.ndarray]], capacity: np.ndarray,
                      caps: np.ndarray) -> np.ndarray:
    """`weighted_max_min` on (link ids, bytes) arrays per job and a capacity table indexed by link id,
    sparse: each round costs O(entries)."""
    n = len(demands)
    rates = np.zeros(n)
    if n == 0:
        return rates
    rows = np.repeat(np.arange(n), [len(links) for links, _ in demands])
    link_ids = np.concatenate([links for links, _ in demands]) if n else np.zeros(0, dtype=np.int64)
    vals = np.concatenate([w for _, w in demands]) if n else np.zeros(0)
    ids, cols = np.unique(link_ids, return_inverse=True)
    cols = cols.reshape(-1)
    remaining = capacity[ids].astype(float)  # capacity: indexed by link id
    active = np.ones(n, dtype=bool)
    level = 0.0
    while active.any():
        live = active[rows]
        load = np.bincount(cols[live], weights=vals[live], minlength=len(ids))
        used = load > 0
        link_level = np.full(len(ids), np.inf)
        link_level[used] = level + remaining[used] / load[used]
        x = min(float(link_level.min()) if len(ids) else np.inf, float(caps[active].min()))
        if not np.isfinite(x):  # jobs with no links and no cap: unbounded (instantaneous)
            rates[active] = np.inf
            break
        remaining -= (x - level) * load
        level = x
        tight = used & (link_level <= x * (1 + _REL))
        on_tight = np.zeros(n, dtype=bool)
        hit = tight[cols] & live & (vals > 0)
        on_tight[rows[hit]] = True
        freeze = active & ((caps <= x * (1 + _REL)) | on_tight)
        rates[freeze] = x
        active &= ~freeze
    return rates


SMALL_SHARE = 512
"""Re-shares with at most this many (job, link) entries run `_weighted_max_min_small` (plain Python): a step's
re-shares are thousands of small problems, where numpy's per-call cost dominates."""


def _weighted_max_min_small(demands: list[dict[int, float]], capacity: dict[int, float],
                            caps: list[float]) -> list[float]:
    """`_weighted_max_min` in plain Python, with the same arithmetic in the same order (the same rates, bit for
    bit): each link's load sums its live entries job by job, and every comparison and update is the same.

    Each round visits the links the active jobs still load only: a link's load only falls as jobs freeze, and
    a link without load neither bounds the level nor changes its remaining capacity. Entries of 0 bytes add
    nothing and freeze nothing, so they are left out.
    """
    n = len(demands)
    rates = [0.0] * n
    remaining: dict[int, float] = {}
    entries: list[list[tuple[int, float]]] = []
    for demand in demands:
        row = []
        for link, b in demand.items():
            if b > 0:
                if link not in remaining:
                    remaining[link] = float(capacity[link])
                row.append((link, b))
        entries.append(row)
    active = list(range(n))
    level = 0.0
    while active:
        load: dict[int, float] = {}
        for j in active:
            for link, b in entries[j]:
                load[link] = load.get(link, 0.0) + b
        link_level = {link: level + remaining[link] / w for link, w in load.items()}
        x = min(min(link_level.values(), default=math.inf), min(caps[j] for j in active))
        if not math.isfinite(x):  # jobs with no links and no cap: unbounded (instantaneous)
            for j in active:
                rates[j] = math.inf
            break
        step = x - level
        for link, w in load.items():
            remaining[link] -= step * w
        level = x
        bound = x * (1 + _REL)
        tight = {link for link, t in link_level.items() if t <= bound}
        still = []
        for j in active:
            if caps[j] <= bound or any(link in tight for link, _ in entries[j]):
                rates[j] = x
            else:
                still.append(j)
        active = still
    return rates


@dataclass(slots=True, eq=False)
class _Active:
    demand: dict[int, float]
    cap: float
    done: simpy.Event
    arrays: tuple[np.ndarray, np.ndarray] = (np.zeros(0, dtype=np.int64), np.zeros(0))
    remaining: float = 1.0
    rate: float = 0.0


@dataclass(slots=True)
class JobNetwork:
    """Links of given effective capacities (bytes/s) shared by the jobs running on them."""

    env: simpy.Environment
    capacity_of: object  # link id -> effective bytes/s
    _jobs: list[_Active] = field(default_factory=list)
    _last: float = 0.0
    _wakeup: simpy.Event | None = None
    _capacity: dict[int, float] = field(default_factory=dict)
    _users: dict[int, int] = field(default_factory=dict)
    """Active jobs per link: a job whose links no other job uses is rated alone, without a re-share."""
    _dirty: bool = False
    _table: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Capacities indexed by link id (NaN: not seen yet)."""

    def __post_init__(self) -> None:
        self._wakeup = self.env.event()
        self.env.process(self._run())

    def transfer(self, demand: dict[int, float], bandwidth_s: float) -> simpy.Event:
        """Start the transfer part of a job now; the event fires when it completes."""
        done = self.env.event()
        if bandwidth_s <= 0:
            done.succeed()
            return done
        for link in demand:
            if link not in self._capacity:
                self._capacity[link] = c = self.capacity_of(link)  # type: ignore[operator]
                if link >= len(self._table):
                    grown = np.full(max(link + 1, 2 * len(self._table)), np.nan)
                    grown[:len(self._table)] = self._table
                    self._table = grown
                self._table[link] = c
        self._advance()
        job = _Active(demand, 1.0 / bandwidth_s, done,
                      (np.fromiter(demand.keys(), dtype=np.int64, count=len(demand)),
                       np.fromiter(demand.values(), dtype=float, count=len(demand))))
        shared = False
        for link in demand:
            n = self._users.get(link, 0)
            shared |= n > 0
            self._users[link] = n + 1
        if shared:
            self._dirty = True
        else:
            job.rate = self._alone(job)
        self._jobs.append(job)
        if not self._wakeup.triggered:
            self._wakeup.succeed()
        return done

    def _alone(self, job: _Active) -> float:
        """Rate of a job sharing none of its links: its cap, or its most loaded link's capacity / demand."""
        rate = job.cap
        for link, b in job.demand.items():
            if b > 0:
                rate = min(rate, self._capacity[link] / b)
        return rate

    def _advance(self) -> None:
        elapsed = self.env.now - self._last
        if elapsed > 0:
            for j in self._jobs:
                j.remaining -= j.rate * elapsed
        self._last = self.env.now

    def _reshare(self) -> None:
        if not self._jobs:
            return
        if sum(len(j.demand) for j in self._jobs) <= SMALL_SHARE:
            rates = _weighted_max_min_small([j.demand for j in self._jobs], self._capacity,
                                            [j.cap for j in self._jobs])
        else:
            rates = _weighted_max_min([j.arrays for j in self._jobs], self._table,
                                      np.fromiter((j.cap for j in self._jobs), dtype=float,
                                                  count=len(self._jobs))).tolist()
        for j, r in zip(self._jobs, rates, strict=True):
            j.rate = r

    def _run(self):
        env = self.env
        while True:
            self._wakeup = env.event()
            if self._jobs and any(j.rate > 0 for j in self._jobs):
                horizon = min(j.remaining / j.rate for j in self._jobs if j.rate > 0)
                yield env.timeout(max(horizon, 0.0)) | self._wakeup
            else:
                yield self._wakeup
            self._advance()
            now = env.now
            finished = [j for j in self._jobs
                        if j.remaining <= _REL * 1e3 or (j.rate > 0 and now + j.remaining / j.rate <= now)]
            if finished:
                self._jobs = [j for j in self._jobs if j not in finished]
                for j in finished:
                    for link in j.demand:
                        n = self._users[link] - 1
                        if n:
                            self._users[link] = n
                            self._dirty = True  # a job that shared this link may now go faster
                        else:
                            del self._users[link]
            if self._dirty:
                self._reshare()
                self._dirty = False
            for j in finished:
                j.done.succeed()
