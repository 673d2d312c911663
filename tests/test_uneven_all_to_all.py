"""all_to_all with uneven pieces through the public API (`api.collective(..., matrix=...)`): MoE token dispatch
under unbalanced routing."""

from __future__ import annotations

import pytest

from simdist import api
from simdist.errors import SpecError

P, PIECE = 8, 8e6


def _matrix(hot: float) -> list[list[float]]:
    """Every rank sends PIECE bytes to every other, and ``hot`` x PIECE to rank 0."""
    return [[0.0 if i == j else PIECE * (hot if j == 0 else 1.0) for j in range(P)] for i in range(P)]


def test_the_busiest_receiver_sets_the_time_on_one_nvswitch_node() -> None:
    # One DGX H100 node: every GPU has its own NVSwitch ports, so the all-to-all ends when the rank that receives
    # most has received it: (P - 1) x hot x PIECE bytes into rank 0. The time is affine in that: latency plus those
    # bytes over rank 0's port, so equal steps of ``hot`` add equal time, t(3) - t(2) = t(2) - t(1).
    t = [api.collective("dgx-h100", "all_to_all", P, [1.0], matrix=_matrix(h))[0] for h in (1.0, 2.0, 3.0)]
    assert t[0].max_bytes_received_per_rank == (P - 1) * PIECE
    assert t[1].max_bytes_received_per_rank == 2 * (P - 1) * PIECE
    assert t[2].time_s - t[1].time_s == pytest.approx(t[1].time_s - t[0].time_s, rel=1e-6)
    assert t[1].time_s > 1.8 * t[0].time_s  # the transfer dominates at 56 MB a rank
    # the balanced matrix is the plain all_to_all of the same bytes (nccl-tests size: P pieces a rank, own included)
    plain = api.collective("dgx-h100", "all_to_all", P, [P * PIECE])[0]
    assert t[0].time_s == pytest.approx(plain.time_s, rel=1e-6)


def test_a_bad_matrix_is_refused() -> None:
    with pytest.raises(SpecError, match="8 x 8"):
        api.collective("dgx-h100", "all_to_all", P, [1.0], matrix=[[0.0, 1.0], [1.0, 0.0]])
    with pytest.raises(SpecError, match="all_to_all"):
        api.collective("dgx-h100", "all_gather", P, [1.0], matrix=_matrix(1.0))
    with pytest.raises(SpecError, match=">= 0"):
        api.collective("dgx-h100", "all_to_all", P, [1.0], matrix=[[-1.0] * P] * P)
