"""Execute an op graph: one SimPy process per (rank, stream) track, ops in program order.

An op starts when its track has finished the op before it and every op in its ``deps`` has finished; it
then holds the track for ``duration_s``. The engine reads durations and dependencies only.

Cost: each op is one timeout (none when it takes no time; a collective on the shared links its latency's and the
network's finish, its join re-shared without an event where it can be, `SharedLinks.settle`); finishing an op
decrements a counter per dependent (lists, no dicts) and starts, at the same instant and without a SimPy event,
the dependents whose tracks waited for it, so 10^5 ops run in well under a second. A dependency cycle, or two
tracks whose program orders contradict their dependencies, leaves tracks waiting for ops that never finish: SimPy
runs out of events and returns, and `simdist.engine.graph_checks.ScheduleDeadlock` names the stuck tracks.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import simpy

from simdist.engine.graph_checks import check_graph, deadlock_error
from simdist.engine.links import SharedLinks
from simdist.engine.private import Share, private_links
from simdist.engine.ticks import NORMAL, Tick
from simdist.plan.opgraph import Job, OpGraph

__all__ = ["GraphTrace", "run_graph"]

@dataclass(frozen=True, slots=True)
class GraphTrace:
    start_s: tuple[float, ...]
    """Per op id; NaN for an op that never ran."""
    end_s: tuple[float, ...]
    makespan_s: float


@dataclass(slots=True, eq=False)
class _Instance:
    """One collective: its member ops (one per rank, same sync id) start together once all are ready."""

    size: int
    job: Job
    share: Share
    members: list[tuple[int, int]] = field(default_factory=list)
    """(track, op) of the members that arrived: each finishes, and its track goes on, when the collective ends."""
    arrived: int = 0
    start: float = math.nan
    route: list | None = None
    """Its transfer's route on the shared links (`SharedLinks.route`; None: it moves no bytes there)."""


def run_graph(graph: OpGraph, capacity_of: Callable[[int], float] | None = None,
              capacities: Callable[[np.ndarray], np.ndarray] | None = None, *, checked: bool = False,
              resume: tuple[GraphTrace, float] | tuple[GraphTrace, float, Mapping[int, float]] | None = None,
              private: tuple[list[float], dict[tuple[int, int, str], Share]] | None = None,
              record: dict[float, dict[int, float]] | None = None) -> GraphTrace:
    """Simulate ``graph``; start and end of every op, and the makespan (seconds from 0).

    Ops carrying a ``job`` (priced collectives) run on ``SharedLinks`` (simdist.engine.links) of capacity
    ``capacity_of(link)`` (bytes/s; required when a job has a demand); ops with the same ``sync`` id form one
    collective instance that starts when all its member ops are ready. ``capacities``: optionally the same
    for an array of link ids at once (the links only one track loads are thousands on a large cluster).
    ``checked``: the graph has been checked already (`simdist.engine.uncontended.uncontended` ran on it).
    ``resume``: (the uncontended trace, a time ``t`` of `simdist.engine.contention.first_divergence`, up to which
    the engine's timeline is that trace): the simulation starts at ``t`` from that state (ops ended by ``t`` keep
    their times, ops under way finish their remaining time, a transfer its remaining bytes), so only what follows
    ``t`` costs events. The same timeline as from 0, up to rounding. Or (a trace, ``t``, per op under way at ``t``
    whose collective is moving bytes on the shared links then, the bytes per flow it has left): the state at ``t``
    of another run that had executed the same ops up to ``t`` (`record`, simdist.engine.prefix). ``private``:
    `private_links` of these ops and capacities, if already found.
    ``record``: times (after the start) at which to take that state: each is filled with {op: bytes left}.
    """
    if not checked:
        check_graph(graph)
    ops = graph.ops
    n = len(ops)
    if n == 0:
        return GraphTrace((), (), 0.0)
    remaining = [len(op.deps) for op in ops]
    dependents: list[list[int]] = [[] for _ in range(n)]
    for i, op in enumerate(ops):
        for d in op.deps:
            dependents[d].append(i)
    waiting = [-1] * n  # per op: the track waiting for it to be released (-1: none)
    start = [math.nan] * n
    end = [math.nan] * n
    tracks = graph.tracks()
    position: dict[tuple[int, str], int] = dict.fromkeys(tracks, 0)
    cut = 0.0
    moving_left: Mapping[int, float] | None = None
    if resume is not None:
        alone, cut = resume[0], resume[1]
        if len(resume) > 2:
            moving_left = resume[2]  # type: ignore[misc]
        if cut == math.inf:
            return alone
        if cut > 0:
            # the ops ended by the cut keep their uncontended times (a prefix of each track: a track runs its ops
            # in order); their dependents wait for the others only
            for i in range(n):
                if alone.end_s[i] <= cut:
                    start[i], end[i] = alone.start_s[i], alone.end_s[i]
                    for j in dependents[i]:
                        remaining[j] -= 1
    env = simpy.Environment(initial_time=cut)
    net = (SharedLinks(env, capacity_of, record_load=False, caller_settles=True)  # type: ignore[arg-type]
           if any(op.job is not None and op.job.demand for op in ops) else None)  # (capacity_of checked below)
    # (every SimPy callback of run_graph below ends with ``settle()``; the network's own end with theirs)
    settle = net.settle if net is not None else _nothing
    if net is not None and capacity_of is None:
        raise ValueError("run_graph: jobs with link demands need capacity_of")
    # A job whose links only ops of its own track use can never share them (a track runs one op at a time):
    # it runs as a plain timeout of its uncontended duration, without the network (same time, fewer events).
    solo_duration, share_of = private if private is not None else private_links(ops, capacity_of, capacities)
    instances: dict[int, _Instance] = {}
    instance_of: list[_Instance | None] = [None] * n
    routes: dict[int, list | None] = {}  # id of a Share -> its route (the shares live as long as the run)

    def route_of(share: Share) -> list | None:
        r = routes.get(id(share), 0)
        if r == 0:
            r = routes[id(share)] = (net.route(share.links, share.size / share.bandwidth_s, share.weights)
                                     if share.bandwidth_s > 0 and share.links and net is not None else None)
        return r  # type: ignore[return-value]

    for i, op, solo in zip(range(n), ops, solo_duration, strict=True):
        if op.job is None or solo == solo:  # (not a collective on the shared links: not NaN)
            continue
        if op.sync >= 0:
            inst = instances.get(op.sync)
            if inst is None:
                share = share_of[(id(op.job), -1, "")]
                inst = instances[op.sync] = _Instance(0, op.job, share, route=route_of(share))
            inst.size += 1
        else:
            # Links only this track uses cannot be shared: they bound the job's own rate only, so they fold
            # into its uncontended transfer time and the network sees the shared links alone (same rates,
            # far fewer entries per re-share).
            share = share_of[(id(op.job), op.rank, op.stream)]
            inst = _Instance(1, op.job, share, route=route_of(share))
        instance_of[i] = inst

    # What happens at an instant without a SimPy event of its own (a track released by the op it waited for, a
    # collective that took no time) is queued here and done, in order, before the SimPy callback that caused it
    # returns (`drain`): the same instant, and no callback runs inside another.
    # (a track released: its current op's dependencies are done; or a collective that ended)
    later: deque[int | _Instance] = deque()

    def drain() -> None:
        while later:
            what = later.popleft()
            if what.__class__ is int:
                proceed(what)  # type: ignore[arg-type]
            else:
                instance_ended(what)  # type: ignore[arg-type]

    def instance_ended(inst: _Instance) -> None:
        for k, i in inst.members:
            start[i] = inst.start
            finish(k, i)
            proceed(k)

    def instance_done(inst: _Instance) -> None:
        instance_ended(inst)
        drain()

    # a transfer's ``then``: partial(instance_done, inst), not a closure naming itself (that would be a reference
    # cycle per transfer, 10^4 of them left to the cyclic collector); `record` reads the collective of a transfer
    # under way off its ``args``

    def ended_cb(inst: _Instance) -> Callable[[simpy.Event], None]:
        return lambda _ev: (instance_done(inst), settle())

    # A collective instance runs by event callbacks (no SimPy process of its own): its latency, then its transfer.
    def run_instance(inst: _Instance) -> None:
        inst.start = env.now
        if inst.job.latency_s > 0:
            env.schedule(Tick(env, [moved], inst), NORMAL, inst.job.latency_s)
        else:
            move(inst)

    def moved(ev: simpy.Event) -> None:
        """The latency of the collective instance ``ev.value`` is over: its bytes move."""
        move(ev.value)
        if later:
            drain()
        settle()

    def move(inst: _Instance) -> None:
        share = inst.share
        if share.bandwidth_s > 0:
            if inst.route is not None:
                # its flows move size bytes each, at most at its uncontended speed (alone: bandwidth_s): the route's
                # cap, share.size / share.bandwidth_s
                net.start(inst.route, share.size, partial(instance_done, inst))  # type: ignore[union-attr]
            else:
                env.timeout(share.bandwidth_s).callbacks.append(ended_cb(inst))
        else:
            later.append(inst)

    # Each (rank, stream) track runs by event callbacks, not as a SimPy process: where a process would yield an
    # event (a dependency's release, a collective's end, a compute op's timeout) the track appends its next
    # step to that event's callbacks. SimPy then processes the same events in the same order as it would
    # resume the processes (a process resumes by a callback on the event it yields; the tracks start in order
    # before anything else runs, as their URGENT initialisations would), so every time is the same, and each
    # op costs no generator switch.
    keys = list(tracks)
    track_ids = [tracks[key] for key in keys]
    pos = [0] * len(keys)
    duration = [op.duration_s if op.job is None else solo_duration[i] for i, op in enumerate(ops)]
    timeout = env.timeout
    schedule = env.schedule

    def track_ended(k: int) -> Callable[[simpy.Event], None]:
        # the op a track's timeout ends is its current one (a track runs one op at a time)
        ids = track_ids[k]
        return lambda _ev: ended(k, ids[pos[k]])

    on_end = [track_ended(k) for k in range(len(keys))]  # per track: its compute op's timeout ended

    def proceed(k: int) -> None:
        """Run track ``k`` from its current op until it has to wait: start each op whose dependencies are done (a
        collective's member, or a timeout), and finish at once those that take no time."""
        ids = track_ids[k]
        p = pos[k]
        last = len(ids)
        while p < last:
            i = ids[p]
            if remaining[i]:
                waiting[i] = k
                return
            inst = instance_of[i]
            if inst is not None:
                inst.arrived += 1
                inst.members.append((k, i))
                if inst.arrived == inst.size:
                    run_instance(inst)
                return
            start[i] = env.now
            d = duration[i]
            if d > 0:
                schedule(Tick(env, [on_end[k]]), NORMAL, d)  # (env.timeout(d).callbacks.append(on_end[k]))
                return
            finish(k, i)
            p += 1  # (finish moved the track on)

    def ended(k: int, i: int) -> None:
        finish(k, i)
        proceed(k)
        if later:
            drain()
        settle()  # (ended runs as a callback only: of a compute op's timeout, or `resumed`'s)

    def finish(k: int, i: int) -> None:
        end[i] = env.now
        for j in dependents[i]:
            left = remaining[j] - 1
            remaining[j] = left
            if not left and waiting[j] >= 0:
                later.append(waiting[j])
                waiting[j] = -1
        pos[k] += 1

    if cut > 0:
        def resumed(k: int, i: int) -> None:
            start[i] = alone.start_s[i]
            ended(k, i)

        def resume_instance(inst: _Instance, i: int) -> None:
            """Continue a collective under way at the cut as it runs alone there: its latency or its bytes."""
            inst.arrived = inst.size
            inst.start = alone.start_s[i]
            share = inst.share
            moving = inst.start + inst.job.latency_s  # when its bytes began to move (uncontended)
            if share.bandwidth_s <= 0 or not share.links or net is None:
                timeout(alone.end_s[i] - cut).callbacks.append(ended_cb(inst))
            elif cut <= moving:
                timeout(moving - cut).callbacks.append(lambda _ev: (move(inst), drain(), settle()))
            else:
                assert inst.route is not None
                if moving_left is not None:  # the state of the run that recorded it
                    if i not in moving_left:
                        raise ValueError(f"run_graph: resumed at {cut} s without the bytes left of op {i}, under way")
                    left = moving_left[i]
                else:
                    # alone, its bytes move at one rate from ``moving`` to its end: the share of them left is the
                    # share of that time left
                    left = share.size * (alone.end_s[i] - cut) / (alone.end_s[i] - moving)
                net.start(inst.route, left, partial(instance_done, inst))

        todo = []
        for k, ids in enumerate(track_ids):
            p = 0
            while p < len(ids) and not math.isnan(end[ids[p]]):
                p += 1
            pos[k] = p
            if p < len(ids) and alone.start_s[ids[p]] < cut:  # under way at the cut
                i = ids[p]
                inst = instance_of[i]
                if inst is None:  # a plain timeout
                    timeout(alone.end_s[i] - cut).callbacks.append(lambda _ev, k=k, i=i: resumed(k, i))
                    continue
                inst.members.append((k, i))
                if inst.arrived < inst.size:
                    resume_instance(inst, i)
            else:
                todo.append(k)
    else:
        todo = range(len(keys))
    try:
        for k in todo:
            proceed(k)
        drain()
        settle()
        for at in sorted(record or ()):
            if not at > cut:
                raise ValueError(f"run_graph: cannot record the state at {at} s, not after the start ({cut} s)")
            env.run(until=at)
            assert record is not None
            left_now = record[at]
            for then, left in (net.in_flight() if net is not None else ()):
                for _, i in then.args[0].members:  # type: ignore[union-attr]  # `move`'s partial
                    left_now[i] = left
        env.run()
        for k, key in enumerate(keys):
            position[key] = pos[k]
        stuck = [(key, ids[position[key]]) for key, ids in tracks.items() if position[key] < len(ids)]
        if stuck:
            raise deadlock_error(graph, stuck, end)
        return GraphTrace(tuple(start), tuple(end), max(end))
    finally:
        # The callbacks above name one another (proceed -> run_instance -> moved -> ...): a reference cycle that
        # holds every list of the run (dependents, starts, instances: 10^5 objects per sample) until the cyclic
        # collector finds it, which the engine pauses (simdist.predict.engine_step.collector_paused) and which
        # then scans them all at exit. Emptied here, they are freed on return by reference counting.
        drain = instance_ended = instance_done = route_of = None  # type: ignore[assignment]
        finish = proceed = ended = track_ended = on_end = None  # type: ignore[assignment]
        run_instance = move = moved = ended_cb = resumed = resume_instance = None  # type: ignore[assignment]


def _nothing() -> None:
    pass
