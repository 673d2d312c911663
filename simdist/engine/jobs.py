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

from dataclasses import dataclass, field

import numpy as np
import simpy

_REL = 1e-12


def weighted_max_min(demands: list[dict[int, float]], capacity: dict[int, float], caps: list[float]) -> list[float]:
    """Progress rates of jobs with per-link ``demands`` (bytes), link ``capacity`` (bytes/s) and rate caps."""
    n = len(demands)
    if n == 0:
        return []
    links = sorted({link for d in demands for link in d})
    index = {link: k for k, link in enumerate(links)}
    weights = np.zeros((n, len(links)))
    for j, d in enumerate(demands):
        for link, b in d.items():
            weights[j, index[link]] = b
    remaining = np.array([capacity[link] for link in links], dtype=float)
    cap = np.asarray(caps, dtype=float)
    rates = np.zeros(n)
    active = np.ones(n, dtype=bool)
    level = 0.0
    while active.any():
        load = weights[active].sum(axis=0)
        used = load > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            link_level = np.where(used, level + remaining / np.where(used, load, 1.0), np.inf)
        cap_level = np.where(active, cap, np.inf)
        x = min(float(link_level.min()) if len(link_level) else np.inf, float(cap_level.min()))
        if not np.isfinite(x):  # jobs with no links and no cap: unbounded (instantaneous)
            rates[active] = np.inf
            break
        remaining -= (x - level) * load
        level = x
        tight = used & (link_level <= x * (1 + _REL))
        freeze = active & ((cap <= x * (1 + _REL)) | (weights[:, tight] > 0).any(axis=1))
        rates[freeze] = x
        active &= ~freeze
    return rates.tolist()


@dataclass(slots=True, eq=False)
class _Active:
    demand: dict[int, float]
    cap: float
    done: simpy.Event
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
                self._capacity[link] = self.capacity_of(link)  # type: ignore[operator]
        self._advance()
        job = _Active(demand, 1.0 / bandwidth_s, done)
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
        rates = weighted_max_min([j.demand for j in self._jobs], self._capacity, [j.cap for j in self._jobs])
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
