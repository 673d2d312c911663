"""The compute that collectives running beside it slow: NCCL's kernels share the SMs and HBM of the GPU with the
compute kernels they overlap (one thread block per channel, each on an SM the compute's waves then lack), so a GPU
computes more slowly while its collectives run.

    compute time while overlapped = (1 + x) x its time alone,   x = ComputeEfficiency.comm_interference

per GPU in simdist/hardware/data/compute_efficiency.csv: 0.40 on Hopper (H100, H200), from a kernel-level
microbenchmark of an 8192^3 matmul beside an NVLink all-gather on 8 H100 (pytorch/pytorch PR #172714; reproduced in
tests/test_interference.py), and 0.189 elsewhere (Lee et al. 2025, arXiv:2507.03114: 18.9 % on average over training
workloads on A100, H100, MI250, MI210). Beside the MoE flex dispatcher's DeepEP / HybridEP kernels x is instead the
share of SMs they hold, s / (N - s) (simdist.plan.step_config.StepConfig.expert_interference).

A step's recipe (simdist.plan.recipe, simdist.plan.data_parallel, simdist.plan.fsdp) adds after the compute that
collectives overlap a *tax* piece: the work left undone while they ran, x / (1 + x) of the time they overlap it,
min(their priced time, that compute's time) (`tax_s`). Both fidelities price it once they have priced its collectives
(simdist.analytic.pricing.price_pieces; simdist.plan.opgraph.OpGraph.apply_taxes for the engine). Beside the 1F1B A2A
overlap's all-to-alls the tax piece also carries what Megatron's layer-by-layer pairing leaves exposed
(simdist.plan.moe_pairing; `taxed_s`, the one formula every pricer calls).
# Assumption: the collectives overlap the compute from its start (a tax of their whole time where shorter than it); the
# tensor-parallel collectives Megatron overlaps with the weight gradients are left out (simdist's A100 constants were
# fitted on layer times that include them), as are Transformer Engine's userbuffers (simdist.hardware.tp_overlap
# prices their SMs) and async TP (copy engines).
"""

from __future__ import annotations

from collections.abc import Iterable

from simdist.plan.moe_pairing import exposure_s, scaled
from simdist.plan.pieces import SLOWED_KINDS, Builder, Piece

__all__ = ["tax", "tax_s", "tax_terms", "taxed_s"]


def taxed_s(share: float, comm_s: float, cap_s: float, pairing: tuple[float, ...] = ()) -> float:
    """The seconds of a tax piece whose collectives took ``comm_s`` beside ``cap_s`` of compute: ``share`` x
    min(comm_s, cap_s), plus, where it carries a ``pairing``, what the 1F1B A2A overlap's layer-by-layer pairing
    leaves exposed (simdist.plan.moe_pairing.exposure_s). Every pricer of tax pieces (both fidelities) calls this."""
    return share * min(comm_s, cap_s) + (exposure_s(comm_s, pairing) if pairing else 0.0)


def tax_terms(piece: Piece, factor: float = 1.0) -> tuple[float, float, tuple[float, ...]]:
    """(share, cap_s, pairing) of tax piece ``piece`` on a GPU whose compute takes ``factor`` x as long (a straggler:
    its cap and its pairing's segments stretched as simdist.plan.step_emitter slows its kind), for `taxed_s`."""
    f = factor if piece.kind in SLOWED_KINDS else 1.0
    return piece.tax_share, piece.duration_s * f, scaled(piece.pairing, f)


def tax_s(piece: Piece, comm_durations: Iterable[float]) -> float:
    """The seconds of a tax piece, given its collectives' priced durations."""
    return taxed_s(piece.tax_share, sum(comm_durations), piece.duration_s, piece.pairing)


def tax(b: Builder, after: int, comms: list[int], overlapped_s: float, interference: float, kind: str,
        pairing: tuple[float, ...] = ()) -> int:
    """Add after compute piece ``after`` the tax of ``comms`` running beside ``overlapped_s`` of compute (and the
    exposure of their ``pairing``, simdist.plan.moe_pairing); returns the piece that ends the compute (``after``
    itself where there is nothing to tax)."""
    share = interference / (1.0 + interference) if overlapped_s > 0 and interference > 0 else 0.0
    if not comms or (share <= 0 and not pairing):
        return after
    return b.add(Piece("compute", kind, "/collectives beside it", overlapped_s, deps=(after,), tax_of=tuple(comms),
                       tax_share=share, pairing=pairing))
