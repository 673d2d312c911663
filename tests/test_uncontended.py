"""The uncontended timeline (simdist.engine.uncontended) follows the engine's execution rules exactly.

Hand-checked: a dependency on an op added later, a sync group whose members are ready at different times, a
cycle through a sync group (the same deadlock the engine reports). Then a property on random graphs (hypothesis):
with no link shared, every op's start and end are the engine's (simdist.engine.graph.run_graph).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist.engine.graph import run_graph
from simdist.engine.graph_checks import ScheduleDeadlock
from simdist.engine.uncontended import uncontended, uncontended_pair
from simdist.plan.opgraph import Job, Op, OpGraph


def compute(rank: int, duration_s: float, deps: list[int] | None = None) -> Op:
    return Op("f", rank, "compute", "forward", duration_s=duration_s, deps=deps or [])


def collective(rank: int, duration_s: float, sync: int, deps: list[int] | None = None) -> Op:
    """A member of collective ``sync`` that loads no link (its time is its latency alone)."""
    return Op("ar", rank, "tp", "comm", duration_s=duration_s, deps=deps or [], job=Job(duration_s, 0.0), sync=sync)


def test_sync_members_start_together_when_the_last_is_ready_and_later_ops_are_honoured():
    g = OpGraph([compute(0, 1.0, [3]),        # 0: waits for op 3, added later: 2.5..3.5
                 compute(1, 0.5),             # 1: 0..0.5
                 collective(0, 2.0, 7, [0]),  # 2: ready at 3.5
                 compute(1, 2.0),             # 3: after op 1 on rank 1: 0.5..2.5
                 collective(1, 2.0, 7, [3]),  # 4: ready at 2.5; the group starts at 3.5, when op 2 is ready
                 compute(1, 1.0)])            # 5: after op 3 on rank 1's compute stream: 2.5..3.5
    t = uncontended(g)
    assert t.start_s == (2.5, 0.0, 3.5, 0.5, 3.5, 2.5)
    assert t.end_s == (3.5, 0.5, 5.5, 2.5, 5.5, 3.5)
    assert t.makespan_s == 5.5
    engine = run_graph(g)
    assert engine.start_s == t.start_s and engine.end_s == t.end_s


@pytest.mark.parametrize("late_first", [True, False])
def test_a_sync_group_waits_for_its_latest_member_whichever_is_reached_last(late_first):
    # rank 0's member is ready at 5 s after one long op; rank 1's at 0.3 s after three short ones; either added first
    g = OpGraph()
    for rank in ((0, 1) if late_first else (1, 0)):
        if rank == 0:
            g.add(compute(rank, 5.0))
        else:
            for _ in range(3):
                g.add(compute(rank, 0.1))
        g.add(collective(rank, 1.0, 0, [len(g.ops) - 1]))
    t = uncontended(g)
    members = [i for i, op in enumerate(g.ops) if op.sync == 0]
    assert [t.start_s[i] for i in members] == [5.0, 5.0] and t.makespan_s == 6.0


def test_cycle_through_a_sync_group_is_the_engines_deadlock():
    # rank 1's member waits for rank 1's compute, which waits for rank 0's member: the group never starts
    g = OpGraph([collective(0, 1.0, 3), compute(1, 1.0, [0]), collective(1, 1.0, 3, [1]), compute(0, 1.0)])
    with pytest.raises(ScheduleDeadlock) as alone:
        uncontended(g)
    with pytest.raises(ScheduleDeadlock) as engine:
        run_graph(g)
    assert str(alone.value) == str(engine.value)
    assert "rank 0 stream tp stuck at op 0 'ar'" in str(alone.value)


@st.composite
def graphs(draw):
    """Up to 30 ops on 3 ranks and 2 streams, deps on any other op (earlier or later: cycles possible), some pairs
    of ops on two ranks members of one collective."""
    n = draw(st.integers(1, 30))
    ops = []
    for i in range(n):
        rank, stream = draw(st.integers(0, 2)), draw(st.sampled_from(["compute", "tp"]))
        duration = draw(st.sampled_from([0.0, 0.5, 1.0]) | st.floats(0.0, 4.0))
        deps = sorted(set(draw(st.lists(st.integers(0, n - 1).filter(lambda d, i=i: d != i), max_size=2))))
        ops.append(Op(f"op{i}", rank, stream, "forward", duration_s=duration, deps=deps))
    for group in range(draw(st.integers(0, 3)) if n >= 2 else 0):
        members = draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True))
        if len({ops[m].rank for m in members}) == 2 and all(ops[m].sync < 0 for m in members):
            for m in members:  # one collective: the same time on every member
                ops[m].sync = group
                ops[m].duration_s = ops[members[0]].duration_s
                ops[m].job = Job(ops[m].duration_s, 0.0)
    return OpGraph(ops)


@settings(max_examples=300, deadline=None)
@given(graphs())
def test_the_uncontended_timeline_is_the_engines_with_no_shared_link(graph):
    try:
        engine = run_graph(graph)
    except ScheduleDeadlock as err:
        with pytest.raises(ScheduleDeadlock) as alone:
            uncontended(graph)
        assert str(alone.value) == str(err)
        return
    t = uncontended(graph)
    assert t.start_s == pytest.approx(engine.start_s, rel=1e-12, abs=1e-12)
    assert t.end_s == pytest.approx(engine.end_s, rel=1e-12, abs=1e-12)
    durations = [2.0 * op.duration_s for op in graph.ops]
    doubled = uncontended(graph, checked=True, durations=durations)
    assert doubled.end_s == pytest.approx([2.0 * e for e in t.end_s], rel=1e-12, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(graphs(), st.data())
def test_the_pair_is_each_timeline_on_its_own(graph, data):
    # one walk, two duration sets: each timeline exactly (==) its own uncontended call, deadlocks the same
    other = [data.draw(st.floats(0.0, 4.0)) if op.sync < 0 else op.duration_s * 1.5 for op in graph.ops]
    try:
        alone = uncontended(graph)
    except ScheduleDeadlock as err:
        with pytest.raises(ScheduleDeadlock) as pair:
            uncontended_pair(graph, other)
        assert str(pair.value) == str(err)
        return
    first, second = uncontended_pair(graph, other)
    assert first == alone
    assert second == uncontended(graph, durations=other)
