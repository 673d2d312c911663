"""The op rows a step's builder records (simdist.plan.opgraph.OpRows) describe its ops exactly, and the step metrics
read from them equal those read op by op."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simdist.api import read_yaml, scenario_of
from simdist.plan.opgraph import Op
from simdist.plan.pipeline import UniformCosts, pipeline_graph
from simdist.plan.step import build_step
from simdist.predict.price import price_graph
from simdist.predict.step import resolve_model, step_config_of
from simdist.report.step_metrics import _columns

LAYOUTS = [
    # (scenario, --set overrides, build_step keywords)
    ("scenarios/llama3-405b-16k.yaml", ["parallel.dp=2", "cluster.num_nodes=32", "schedule=interleaved_1f1b",
                                        "parallel.vpp=7"], {"num_microbatches": 16}),
    ("scenarios/llama3-405b-16k.yaml", ["parallel.dp=2", "cluster.num_nodes=32", "schedule=zb_h1"],
     {"num_microbatches": 16}),
    ("scenarios/llama3-405b-16k.yaml", ["parallel.dp=2", "cluster.num_nodes=32", "schedule=1f1b"],
     {"num_microbatches": 16}),
]


def _plan(path: str, sets: list[str], kw: dict):
    sc = scenario_of(read_yaml(path), sets)
    cfg = step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
    return build_step(cfg, **kw)


class _Trace:
    """Op i runs [i / 3, i / 3 + 0.25) (overlaps on a rank, gaps: every accounting branch is reached)."""

    def __init__(self, n: int) -> None:
        self.start_s = tuple((np.arange(n) / 3).tolist())
        self.end_s = tuple((np.arange(n) / 3 + 0.25).tolist())
        self.makespan_s = n / 3 + 1.0


@pytest.mark.parametrize(("path", "sets", "kw"), LAYOUTS)
def test_rows_describe_every_op(path: str, sets: list[str], kw: dict) -> None:
    graph = _plan(path, sets, kw).graph
    rows = graph.op_rows()
    assert rows is not None and len(rows.row) == len(graph.ops)
    r = rows.row
    assert [rows.kind[i] for i in r] == [op.kind for op in graph.ops]
    assert all(rows.comm[i] is op.comm for i, op in zip(r.tolist(), graph.ops, strict=True))
    assert [rows.axis[i] for i in r] == [None if op.comm is None else op.comm.axis for op in graph.ops]
    # rows in order of their first op (price_graph reads the graph's collectives in that order)
    distinct, first_op = np.unique(r, return_index=True)
    assert distinct.tolist() == list(range(len(rows.kind))) and (np.diff(first_op) > 0).all()
    assert rows.rank[r].tolist() == [op.rank for op in graph.ops]
    assert rows.per_microbatch[r].tolist() == [op.microbatch >= 0 for op in graph.ops]
    assert rows.model_flops[r].tolist() == [op.model_flops for op in graph.ops]
    assert rows.hardware_flops[r].tolist() == [op.hardware_flops for op in graph.ops]


@pytest.mark.parametrize(("path", "sets", "kw"), LAYOUTS)
def test_columns_from_rows_equal_columns_op_by_op(path: str, sets: list[str], kw: dict) -> None:
    plan = _plan(path, sets, kw)
    graph = plan.graph
    trace = _Trace(len(graph.ops))
    ranks = plan.representative_ranks
    for chosen in (ranks, ranks[1:3]):
        fast = _columns(graph, trace, chosen)
        rows, graph.rows = graph.rows, None
        slow = _columns(graph, trace, chosen)
        graph.rows = rows
        assert fast[1:] == slow[1:] and fast[1] > 0
        assert len(fast[0]) == len(slow[0]) == len(chosen)
        for a, b in zip(fast[0], slow[0], strict=True):
            for x, y in zip(a, b, strict=True):
                assert x.dtype == y.dtype and np.array_equal(x, y)


def test_rows_are_dropped_once_ops_are_added() -> None:
    graph = _plan(*LAYOUTS[0]).graph
    assert graph.op_rows() is not None
    graph.add(Op("extra", 0, "compute", "forward", 1.0))
    assert graph.op_rows() is None


def test_a_graph_built_without_rows_has_none() -> None:
    graph = pipeline_graph("1f1b", num_stages=2, num_microbatches=4, costs=UniformCosts.uniform(2))
    assert graph.op_rows() is None
    assert len(_columns(graph, _Trace(len(graph.ops)), [0, 1])[0]) == 2


@pytest.mark.parametrize("with_links", [True, False])
def test_prices_from_rows_equal_prices_op_by_op(with_links: bool) -> None:
    path, sets, kw = LAYOUTS[0]
    sc = scenario_of(read_yaml(path), sets)
    cfg = step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
    fast, slow = build_step(cfg, **kw), build_step(cfg, **kw)
    slow.graph.rows = None
    got = [price_graph(p.graph, sc.topology, mesh=cfg.mesh, reduced_axes=p.reduced_axes, with_links=with_links)
           for p in (fast, slow)]
    assert list(got[0].items()) == list(got[1].items())  # the same collectives, in the same order
    a, b = fast.graph.ops, slow.graph.ops
    assert [op.duration_s for op in a] == [op.duration_s for op in b]
    assert not any(math.isnan(op.duration_s) for op in a)
    assert [op.job for op in a] == [op.job for op in b]
    assert any(op.job is not None for op in a) == with_links
