"""The op-graph engine: program order per track, dependencies across tracks, deadlocks, speed."""

import math

import pytest

from simdist.engine.graph import run_graph
from simdist.engine.graph_checks import ScheduleDeadlock
from simdist.errors import SimdistError
from simdist.plan.opgraph import Op, OpGraph
from simdist.plan.pipeline import UniformCosts, UniformEmitter, build_pipeline, pipeline_graph
from simdist.plan.schedule import Step


def op(name, rank, duration, deps=(), stream="compute"):
    return Op(name=name, rank=rank, stream=stream, kind="forward", duration_s=duration, deps=list(deps))


def test_program_order_and_cross_track_deps_hand_checked():
    g = OpGraph()
    a = g.add(op("a", 0, 2.0))
    b = g.add(op("b", 0, 1.0))                       # after a on its track: 2..3
    c = g.add(op("c", 1, 4.0, [a]))                  # waits for a: 2..6
    d = g.add(op("d", 0, 0.5, [c], stream="pp"))     # other stream of rank 0, waits for c: 6..6.5
    e = g.add(op("e", 1, 1.0, [b]))                  # after c on rank 1's compute: 6..7
    f = g.add(op("f", 2, 0.0, [d, e]))               # zero duration, at 7
    t = run_graph(g)
    assert [t.start_s[i] for i in (a, b, c, d, e, f)] == [0.0, 2.0, 2.0, 6.0, 6.0, 7.0]
    assert [t.end_s[i] for i in (a, b, c, d, e, f)] == [2.0, 3.0, 6.0, 6.5, 7.0, 7.0]
    assert t.makespan_s == 7.0


def test_dependency_on_a_later_op_is_honoured():
    g = OpGraph()
    first = g.add(op("consumer", 0, 1.0))
    producer = g.add(op("producer", 1, 3.0))
    g.depend(first, producer)
    t = run_graph(g)
    assert t.start_s[first] == 3.0 and t.makespan_s == 4.0


def test_empty_graph():
    assert run_graph(OpGraph()).makespan_s == 0.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_unpriced_op_is_an_error_naming_it(bad):
    g = OpGraph()
    g.add(op("ok", 0, 1.0))
    g.add(Op(name="allreduce dp", rank=3, stream="dp", kind="comm", duration_s=bad))
    with pytest.raises(SimdistError) as err:
        run_graph(g)
    assert "allreduce dp" in str(err.value) and "rank 3" in str(err.value) and err.value.field == "ops[1].duration_s"


def test_unknown_dependency_id_is_an_error():
    g = OpGraph()
    g.add(op("x", 0, 1.0, [5]))
    with pytest.raises(SimdistError, match="op 5"):
        run_graph(g)


@pytest.mark.parametrize("dep", [-1, 2, 1.0, "0"])
def test_a_dependency_that_is_no_op_id_is_an_error(dep):
    g = OpGraph()
    g.add(op("a", 0, 1.0))
    g.add(op("b", 0, 1.0, [dep]))
    with pytest.raises(SimdistError, match="op 1 'b' depends on") as err:
        run_graph(g)
    assert err.value.field == "ops[1].deps"


@pytest.mark.parametrize("bad", ["1", None, [1.0]])
def test_a_duration_that_is_no_number_is_an_error(bad):
    g = OpGraph()
    g.add(op("a", 0, 1.0))
    g.add(Op(name="b", rank=0, stream="compute", kind="forward", duration_s=bad))
    with pytest.raises(SimdistError, match="has no finite duration") as err:
        run_graph(g)
    assert err.value.field == "ops[1].duration_s"


def test_cycle_raises_deadlock_not_hang():
    g = OpGraph()
    g.add(op("p", 0, 1.0, [1]))
    g.add(op("q", 1, 1.0, [0]))
    with pytest.raises(ScheduleDeadlock) as err:
        run_graph(g)
    text = str(err.value)
    assert "rank 0 stream compute stuck at op 0 'p'" in text and "waits for op 1 'q' on rank 1" in text
    assert "\n" not in text


def test_hand_written_pipeline_order_that_deadlocks_names_the_ranks():
    # Stage 1 wants F1 before F0, but stage 0 only sends F1 after B0, which needs stage 1's F0 and B0.
    order = [
        [Step("F", 0), Step("B", 0), Step("F", 1), Step("B", 1)],
        [Step("F", 1), Step("F", 0), Step("B", 0), Step("B", 1)],
    ]
    g = OpGraph()
    build_pipeline(g, order, UniformEmitter(UniformCosts.uniform(2)))
    with pytest.raises(ScheduleDeadlock) as err:  # raised when SimPy runs out of events, never a hang
        run_graph(g)
    text = str(err.value)
    assert "2 tracks wait forever" in text
    assert "rank 0 stream compute stuck at op 1 'B0@s0'" in text
    assert "rank 1 stream compute stuck at op 4 'F1@s1', waits for op 2 'F1@s0' on rank 0" in text


def test_deadlock_message_names_at_most_four_tracks():
    g = OpGraph()
    for r in range(6):
        g.add(op(f"x{r}", r, 1.0, [(r + 1) % 6]))
    with pytest.raises(ScheduleDeadlock, match="and 2 more tracks") as err:
        run_graph(g)
    assert str(err.value).count("stuck at") == 4


def test_hundred_thousand_ops_keep_the_interleaved_makespan():
    # How fast this runs is benchmarks/step.py's business; here, that 10^5 ops give the exact formula.
    g = pipeline_graph("interleaved_1f1b", num_stages=16, num_microbatches=1600, vpp=2,
                       costs=UniformCosts.uniform(16))
    assert len(g.ops) == 102_400
    trace = run_graph(g)
    assert trace.makespan_s == pytest.approx(1600 * 3 + 15 * 3 / 2)  # M(tf+tb) + (K-1)(tf+tb)/V
