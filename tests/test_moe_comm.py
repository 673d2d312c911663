"""Expert-parallel communication: routing imbalance as an uneven all_to_all (simdist.collectives.uneven), priced
the same by the closed form (simdist.analytic.pricing) and the engine's pricing (simdist.predict.price)."""

from __future__ import annotations

import pytest

from simdist.analytic.pricing import CommPricer
from simdist.analytic.select import rank_choices
from simdist.collectives.group import Group
from simdist.collectives.request import Request
from simdist.collectives.uneven import imbalanced_matrix
from simdist.errors import SimdistError
from simdist.hardware import load_topology
from simdist.plan.opgraph import Comm
from simdist.predict.price import price_comm
from tests.conftest import TOY_TOPOLOGY

# tests/fixtures/toy-nvswitch.yaml: 4 GPUs per node on one 100 GB/s NVSwitch, efficiencies 1.0
TOY = load_topology(TOY_TOPOLOGY, num_nodes=2)
PORT_BPS = 100e9


def test_imbalanced_matrix_keeps_every_send_and_loads_the_busiest_receiver():
    m = imbalanced_matrix(4, 400.0, 2.5)
    assert [sum(row) for row in m] == pytest.approx([400.0] * 4)  # every rank sends its balanced buffer
    assert sum(row[0] for row in m) == pytest.approx(2.5 * 400.0)  # peer 0 receives 2.5 x the mean
    assert [sum(row[j] for row in m) for j in (1, 2, 3)] == pytest.approx([(4 * 400.0 - 1000.0) / 3] * 3)
    assert imbalanced_matrix(4, 400.0, 1.0) == tuple((100.0,) * 4 for _ in range(4))
    t = imbalanced_matrix(4, 400.0, 2.5, transpose=True)
    assert sum(t[0]) == pytest.approx(1000.0)  # combine: the busiest peer sends
    with pytest.raises(SimdistError, match="moe_imbalance"):
        imbalanced_matrix(4, 400.0, 4.5)  # more than every token on one peer


@pytest.mark.parametrize("x", [1.0, 1.5, 2.0, 4.0])
def test_uneven_all_to_all_on_one_node_takes_the_busiest_port_time(x):
    # One NVSwitch node, P = 4, S bytes per rank: the busiest peer's port receives (P - 1) x S / P, so the transfer
    # part is x times the even one's (P - 1) S / (P B) (simdist.analytic.direct's module docstring); the latency
    # part is the even all_to_all's.
    S, P = 64e6, 4
    ranks = tuple(range(P))
    even = CommPricer(TOY).time_s("all_to_all", ranks, S)
    latency = even - (P - 1) * S / (P * PORT_BPS)
    closed = CommPricer(TOY).time_s("all_to_all", ranks, S, x)
    assert closed == pytest.approx(latency + x * (P - 1) * S / (P * PORT_BPS), rel=1e-12)
    engine = price_comm(TOY, Comm("all_to_all", ranks, S, "ep", imbalance=x)).time_s
    assert engine == pytest.approx(closed, rel=1e-12)


def test_uneven_all_to_all_is_the_uneven_request_and_its_transpose_costs_the_same():
    # The imbalance is priced as the collectives layer's uneven all_to_all (Request.matrix), not a scaled even one;
    # on alike peers the combine (the busiest sends) costs what the dispatch (the busiest receives) does.
    ranks, S = tuple(range(8)), 8e6  # two nodes: the busiest peer's NIC is the bottleneck
    group = Group(TOY, ranks)
    dispatch = rank_choices(Request("all_to_all", group, S, matrix=imbalanced_matrix(8, S, 2.0)))[0].predicted_s
    combine = rank_choices(Request("all_to_all", group, S,
                                   matrix=imbalanced_matrix(8, S, 2.0, transpose=True)))[0].predicted_s
    assert CommPricer(TOY).time_s("all_to_all", ranks, S, 2.0) == pytest.approx(dispatch, rel=1e-12)
    assert combine == pytest.approx(dispatch, rel=1e-12)
    assert dispatch > 1.5 * CommPricer(TOY).time_s("all_to_all", ranks, S)
