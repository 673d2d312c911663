"""A fast-forward sample resumed from the largest sample's recorded state (simdist.engine.prefix) runs exactly as
when simulated on its own: every op's start and end, with the links contended across the cut."""

from __future__ import annotations

import gc
import itertools
import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist import api
from simdist.analytic.step import CommPricer, fast_forward_plan
from simdist.engine.graph import run_graph
from simdist.engine.prefix import resumed_trace, shared_prefix
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.plan.opgraph import Job, Op, OpGraph
from simdist.predict import engine_step as engine_module
from tests.test_contention import capacity, graphs_with_collectives, two_rank_graphs

BASE = """\
name: prefix
cluster: {{preset: dgx-h100, num_nodes: 4}}
model: {{num_layers: 8, hidden_size: 1152, num_attention_heads: 16, seq_length: 1024, vocab_size: 32000}}
parallel: {{tp: 8, pp: 2, dp: 2, vpp: {vpp}, zero_stage: 2}}
training: {{global_batch_size: 256, micro_batch_size: 1, host_overhead: {{dispatch: 3.3 us}}}}
schedule: {schedule}
"""
# ZeRO-2 reduce-scatters every micro-batch's gradients (simdist.plan.recipe): they meet the pipeline sends on the
# NICs from the first backward on, well before the smaller samples' cool-downs. The sizes are such that transfers are
# under way at both cases' cuts (the test asserts it: with hidden 1024 the interleaved case's cut fell between them)
# and at the host dispatch of 3.3 us an op the timeline was laid out with (simdist.hardware.host: the default is a
# Linear forward's 8.48 us, which moves the cuts off the transfers; what this file tests is the engine's resumption)
CASES = {"1f1b": dict(vpp=1, schedule="1f1b"), "interleaved": dict(vpp=2, schedule="interleaved_1f1b")}


def _step(tmp_path, name):
    """(step configuration, topology) of case ``name``."""
    path = tmp_path / "s.yaml"
    path.write_text(BASE.format(**CASES[name]))
    sc = api.load_scenario(path)
    return step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model)), sc.topology


def _samples(tmp_path, name):
    cfg, topology = _step(tmp_path, name)
    found = fast_forward_plan(cfg, CommPricer(topology, None), for_engine=True)
    assert found is not None
    plans, known = [], None
    for m in found[1:]:
        plan, priced = engine_module.priced_plan(cfg, topology, None, False, m, known)
        known = known or priced
        plans.append(plan)
    return topology, plans, [engine_module.alone_and_cut(p, topology, None) for p in plans]


@pytest.mark.parametrize("name", CASES)
def test_resumed_sample_equals_its_own_simulation(tmp_path, name):
    topology, plans, alones = _samples(tmp_path, name)
    one, many = engine_module.capacities(topology, None)
    big, (_, big_timeline, big_cut, big_engine) = plans[-1], alones[-1]
    for plan, (_, timeline, cut, engine) in zip(plans[:-1], alones[:-1], strict=True):
        pre = shared_prefix(plan.graph, timeline, engine, big.graph, big_timeline, big_engine)
        # the case exercises the resumption: SimPy would otherwise start earlier, and transfers are under way there
        assert cut < pre.cut_s < math.inf
        record = {pre.cut_s: {}}
        big_trace = run_graph(big.graph, capacity_of=one, capacities=many, resume=(big_timeline, big_cut),
                              record=record)
        assert record[pre.cut_s], "no transfer under way at the cut: the bytes-left path is not exercised"
        own = run_graph(plan.graph, capacity_of=one, capacities=many)  # from 0, nothing resumed
        resumed = run_graph(plan.graph, capacity_of=one, capacities=many,
                            resume=resumed_trace(pre, big_trace, record[pre.cut_s]))
        tol = 1e-9 * own.makespan_s
        assert resumed.makespan_s == pytest.approx(own.makespan_s, abs=tol)
        for a, b in zip(own.start_s, resumed.start_s, strict=True):
            assert abs(a - b) <= tol
        for a, b in zip(own.end_s, resumed.end_s, strict=True):
            assert abs(a - b) <= tol
        # the engine never starts a not-shared op before the cut
        first_other = min(own.start_s[i] for i, j in enumerate(pre.to_big) if j < 0)
        assert first_other >= pre.cut_s - tol


def _story(extra: bool) -> OpGraph:
    """Two tracks send on one shared link (id 0): rank 0 sends 1 GB after a 0.25 s op, rank 1 sends 0.5 GB at 0 and
    computes 0.5 s meanwhile; ``extra``: rank 1 then computes 0.25 s more, the op the smaller graph lacks."""
    g = OpGraph()
    a = g.add(Op("a", 0, "compute", "forward", duration_s=0.25))
    send_a = g.add(Op("send a", 0, "pp", "comm", duration_s=2.0, job=Job(0.0, 2.0, ((0, 1e9, 1),))))
    g.depend(send_a, a)
    g.add(Op("send b", 1, "pp", "comm", duration_s=1.0, job=Job(0.0, 1.0, ((0, 5e8, 1),))))
    b = g.add(Op("b", 1, "compute", "forward", duration_s=0.5))
    if extra:
        c = g.add(Op("c", 1, "compute", "forward", duration_s=0.25))
        g.depend(c, b)
    return g


def test_story_resumed_across_a_shared_link():
    # Link 0.5 GB/s. Alone: send b [0, 1], send a [0.25, 2.25], b [0, 0.5], c [0.5, 0.75]. The cut is c's start on
    # that timeline, 0.5 s. In the engine send b moves 0.125 GB alone until 0.25 s, then both share the link at
    # 0.25 GB/s: at 0.5 s send b has 0.5 - 0.125 - 0.0625 = 0.3125 GB left and send a 1 - 0.0625 = 0.9375 GB; send b
    # ends at 0.25 + 0.375 / 0.25 = 1.75 s, send a (0.625 GB left then, alone) at 1.75 + 1.25 = 3 s.
    from simdist.engine.contention import engine_alone
    from simdist.engine.uncontended import uncontended

    cap = 0.5e9
    small, big = _story(False), _story(True)
    pre = shared_prefix(small, uncontended(small), engine_alone(small, lambda _l: cap),
                        big, uncontended(big), engine_alone(big, lambda _l: cap))
    assert pre.cut_s == pytest.approx(0.5, rel=1e-8) and pre.cut_s < 0.5
    assert pre.to_big == [0, 1, 2, 3]
    record = {pre.cut_s: {}}
    trace = run_graph(big, capacity_of=lambda _l: cap, record=record)
    assert record[pre.cut_s] == {1: pytest.approx(0.9375e9), 2: pytest.approx(0.3125e9)}  # at 0.5 s, to 1e-9
    resumed = run_graph(small, capacity_of=lambda _l: cap, resume=resumed_trace(pre, trace, record[pre.cut_s]))
    own = run_graph(small, capacity_of=lambda _l: cap)
    assert resumed.end_s == pytest.approx(own.end_s, abs=1e-12)
    assert resumed.end_s == pytest.approx((0.25, 3.0, 1.75, 0.5))
    assert resumed.start_s == pytest.approx((0.0, 0.25, 0.0, 0.0))


def test_no_shared_prefix_when_the_first_ops_differ():
    small, big = _story(False), _story(True)
    big.ops[0].duration_s = 0.3  # rank 0's first op differs: nothing before its start (0) is shared
    from simdist.engine.contention import engine_alone
    from simdist.engine.uncontended import uncontended

    pre = shared_prefix(small, uncontended(small), engine_alone(small, lambda _l: 1e9),
                        big, uncontended(big), engine_alone(big, lambda _l: 1e9))
    assert pre.cut_s == 0.0
    # past rank 0's compute prefix; rank 0's send sits at the same place with the same dependency places
    assert pre.to_big == [-1, 1, 2, 3]
    with pytest.raises(ValueError, match="not after the start"):
        run_graph(big, capacity_of=lambda _l: 1e9, record={0.0: {}})


@pytest.mark.parametrize("name", CASES)
def test_fast_forward_through_resumed_samples_equals_every_micro_batch(tmp_path, monkeypatch, name):
    cfg, topology = _step(tmp_path, name)
    monkeypatch.setattr(engine_module, "FAST_FORWARD_MIN_OPS", 0)
    monkeypatch.setenv("SIMDIST_PROCESSES", "1")  # the smaller samples in this process, where the spy sees them
    resumed = []
    real = engine_module.resumed_trace
    monkeypatch.setattr(engine_module, "resumed_trace", lambda *a: resumed.append(1) or real(*a))
    fast = engine_module.engine_step(cfg, topology, None, False, True)
    full = engine_module.engine_step(cfg, topology, None, False, False)
    assert len(resumed) == 2  # both smaller samples resumed from the largest one's state
    assert fast.micro_batches.startswith("fast-forward") and full.micro_batches == "all"
    assert full.observables["step_s"] - full.uncontended_step_s > 1e-6 * full.observables["step_s"]  # contended
    for key, value in full.observables.items():
        assert fast.observables[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_resumption_refused_when_the_larger_run_passed_the_prefix():
    # a cut past c's start (0.5 s): the larger run had an op of its own under way there, so its state is not the
    # smaller's; resumed_trace refuses it (the caller then simulates the smaller graph on its own)
    from simdist.engine.prefix import Prefix

    cap = 0.5e9
    big = _story(True)
    record = {0.6: {}}
    trace = run_graph(big, capacity_of=lambda _l: cap, record=record)
    assert resumed_trace(Prefix(0.6, [0, 1, 2, 3]), trace, record[0.6]) is None
    assert resumed_trace(Prefix(0.4, [0, 1, 2, 3]), trace, {2: 1.0, 4: 1.0}) is None  # a transfer not shared


@settings(max_examples=300, deadline=None)
@given(two_rank_graphs() | graphs_with_collectives(), st.data())
def test_a_truncated_graph_resumed_from_the_whole_one_equals_its_own_run(big, data):
    # The smaller graph is the first k ops of the larger (ids and track places the same), whole collectives only:
    # what they share runs the same up to the cut, wherever it falls (a send under way, in its latency, a collective
    # waiting for a member), and the smaller resumed there from the larger's recorded state is its own run.
    from simdist.engine.contention import engine_alone
    from simdist.engine.uncontended import uncontended

    cuts = [k for k in range(1, len(big.ops) + 1)
            if k == len(big.ops) or big.ops[k].sync < 0 or big.ops[k].sync != big.ops[k - 1].sync]
    k = data.draw(st.sampled_from(cuts))
    small = OpGraph([Op(op.name, op.rank, op.stream, op.kind, duration_s=op.duration_s, deps=list(op.deps),
                        job=op.job, sync=op.sync) for op in big.ops[:k]])
    timelines = []
    for g in (small, big):
        alone = engine_alone(g, capacity)
        timelines.append((uncontended(g, durations=alone.durations), alone))
    pre = shared_prefix(small, *timelines[0], big, *timelines[1])
    own = run_graph(small, capacity)
    if not 0 < pre.cut_s < math.inf:
        return
    record = {pre.cut_s: {}}
    trace = run_graph(big, capacity, record=record)
    resume = resumed_trace(pre, trace, record[pre.cut_s])
    assert resume is not None
    resumed = run_graph(small, capacity, resume=resume)
    assert resumed.start_s == pytest.approx(own.start_s, rel=1e-9, abs=1e-12)
    assert resumed.end_s == pytest.approx(own.end_s, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("name", CASES)
def test_a_slid_sample_resumed_from_the_last_run_equals_its_own_run(tmp_path, monkeypatch, name):
    # The first three samples are declared not collinear (as when contention lengthens the transient): the engine
    # slides on by a cycle, and the new largest sample resumes from the state the previous largest recorded, at the
    # latest time before their cut (simdist.predict.engine_step._slid; the records past the cut are not used).
    cfg, topology = _step(tmp_path, name)
    monkeypatch.setattr(engine_module, "FAST_FORWARD_MIN_OPS", 0)
    real_extrapolate, first = engine_module.extrapolate, []
    monkeypatch.setattr(engine_module, "extrapolate",
                        lambda samples, m: None if not first and not first.append(1) else real_extrapolate(samples, m))
    real_slid, slid = engine_module._slid, []

    def spy(*args):
        out = real_slid(*args)
        slid.append(out)
        return out

    monkeypatch.setattr(engine_module, "_slid", spy)
    fast = engine_module.engine_step(cfg, topology, None, False, True)
    assert "(after" in fast.micro_batches and len(slid) == 1
    (plan, _, trace, _, _), recorded = slid[0]
    assert recorded is not None, "the slid sample was simulated alone, not resumed"
    one, many = engine_module.capacities(topology, None)
    own = run_graph(plan.graph, capacity_of=one, capacities=many)  # from 0, nothing resumed
    tol = 1e-9 * own.makespan_s
    assert max(abs(a - b) for a, b in zip(own.start_s, trace.start_s, strict=True)) <= tol
    assert max(abs(a - b) for a, b in zip(own.end_s, trace.end_s, strict=True)) <= tol
    monkeypatch.setattr(engine_module, "extrapolate", real_extrapolate)
    full = engine_module.engine_step(cfg, topology, None, False, False)
    for key, value in full.observables.items():
        assert fast.observables[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_a_run_records_its_state_on_an_even_grid_up_to_its_uncontended_end():
    # from 2 s (where SimPy starts) to 10 s: RECORD_POINTS times 8 / RECORD_POINTS s apart, the last at 10 s
    grid = engine_module._grid(2.0, 10.0)
    n = engine_module.RECORD_POINTS
    assert len(grid) == n and grid[-1] == pytest.approx(10.0) and grid[0] == pytest.approx(2.0 + 8.0 / n)
    assert all(b - a == pytest.approx(8.0 / n) for a, b in itertools.pairwise(grid))
    assert engine_module._grid(2.0, 2.0) == [] and engine_module._grid(math.inf, 10.0) == []


def test_a_failure_beside_the_child_stops_and_reaps_it(tmp_path, monkeypatch):
    # The parent raises while the child is simulating the smaller samples: the child is killed and reaped (no
    # orphan left working, no zombie), and the error is the caller's.
    from simdist.predict import beside

    cfg, topology = _step(tmp_path, "interleaved")
    monkeypatch.setattr(engine_module, "FAST_FORWARD_MIN_OPS", 0)
    for module in (beside, engine_module):
        monkeypatch.setattr(module, "can_fork", lambda: True)
    pids = []
    real = beside.Beside._start
    monkeypatch.setattr(beside.Beside, "_start", lambda self: (real(self), pids.append(self._pid)))

    def refuse(plan, priced):
        raise RuntimeError("the caller changed its mind")

    with pytest.raises(RuntimeError, match="changed its mind"):
        engine_module.engine_step(cfg, topology, None, False, True, rather=refuse)
    assert len(pids) == 1
    with pytest.raises(ChildProcessError):
        os.waitpid(pids[0], os.WNOHANG)


@pytest.mark.parametrize("name", CASES)
def test_smaller_samples_beside_the_largest_give_the_answer_of_one_process(tmp_path, monkeypatch, name):
    # A child process builds and simulates the smaller samples on their own while this one runs the largest
    # (simdist.predict.beside); in one process they are resumed from the largest's states instead. The same runs up
    # to ties at the cut in the last bits: the same answer within 1e-9, the largest's trace the same floats.
    from simdist.predict import beside

    cfg, topology = _step(tmp_path, name)
    monkeypatch.setattr(engine_module, "FAST_FORWARD_MIN_OPS", 0)
    forked = []
    real = beside.Beside._start
    monkeypatch.setattr(beside.Beside, "_start", lambda self: forked.append(1) or real(self))
    for module in (beside, engine_module):
        monkeypatch.setattr(module, "can_fork", lambda: True)
    fast = engine_module.engine_step(cfg, topology, None, False, True)
    assert forked == [1]
    for module in (beside, engine_module):
        monkeypatch.setattr(module, "can_fork", lambda: False)
    alone = engine_module.engine_step(cfg, topology, None, False, True)
    assert forked == [1] and fast.micro_batches == alone.micro_batches
    assert fast.trace == alone.trace
    for key, value in alone.observables.items():
        assert fast.observables[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_a_run_leaves_nothing_for_the_cyclic_collector(tmp_path):
    """run_graph's callbacks name one another and a transfer's end names its collective: the run empties them on
    return, so its lists, collective instances and callbacks (about 4 objects per op) are freed by reference
    counting, not left in reference cycles while the engine pauses the collector (simdist.predict.engine_step)."""
    topology, plans, alones = _samples(tmp_path, "interleaved")
    one, many = engine_module.capacities(topology, None)
    big, (_, timeline, cut, _) = plans[-1], alones[-1]
    assert cut < math.inf
    gc.collect()
    gc.disable()
    try:
        record = {cut + f * (timeline.makespan_s - cut): {} for f in (0.3, 0.6)}
        run_graph(big.graph, capacity_of=one, capacities=many, resume=(timeline, cut), record=record)
        assert any(record.values()), "no transfer under way at a recorded time: the record path is not exercised"
        left = gc.collect()
    finally:
        gc.enable()
    # a SimPy Environment is a cycle of its own (8 objects: its bound event constructors); without the emptying a
    # run leaves about 700 for these 284 ops
    assert left < 30
