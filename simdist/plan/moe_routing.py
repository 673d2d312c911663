"""Routing load as a distribution: how much busier than the mean the busiest expert-parallel rank is, per micro-batch.

``training.moe_imbalance`` states the busiest rank's routed tokens over the mean directly. ``training.moe_routing``
derives it from a stated model of where tokens go instead, per MoE layer and micro-batch:

- ``balanced``: every expert gets exactly its share (Megatron-Core --moe-router-force-load-balancing, which NVIDIA's
  performance tables use): 1.
- ``multinomial``: each routed copy of a token picks an expert uniformly at random, independently (a router whose
  auxiliary loss has balanced the experts on average, per-micro-batch fluctuation only).
- ``zipf``: expert popularity falls as a power law of its popularity rank, p_i proportional to i^-s
  (``moe_routing_skew`` s; s = 0 is ``multinomial``), the ranks shuffled over the experts at random.

The N = tokens x topk routed copies of one micro-batch of the expert-parallel group land on the experts by a
multinomial draw of those probabilities; rank r holds experts r x E/ep .. (r + 1) x E/ep - 1 (Megatron-Core's
contiguous local experts, moe_layer.py local_expert_indices), so its load is the sum of its experts'. Every rank waits
for the busiest at the combine (simdist.plan.moe_cost), so the factor is E[max over ranks of the load] / (N / ep),
estimated from ``DRAWS`` draws of a generator seeded with ``SEED`` (the same answer on every run and platform numpy
supports).
# Assumption: a token's topk copies are drawn independently (the router picks topk distinct experts; with E >> topk
# the difference is small); the popularity order is independent of which rank holds which expert.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = ["DISTRIBUTIONS", "DRAWS", "SEED", "routing_imbalance"]

DISTRIBUTIONS = ("balanced", "multinomial", "zipf")
DRAWS = 512
"""Micro-batches drawn per estimate: the standard error of the mean of the maximum is its spread / sqrt(512)."""
SEED = 20261205


def routing_imbalance(distribution: str, *, num_experts: int, ep: int, tokens: int, topk: int,
                      skew: float = 1.0, draws: int = DRAWS) -> float:
    """The busiest expert-parallel rank's routed copies / the mean rank's, expected per micro-batch: ``tokens`` are
    the tokens the whole ep group routes in one micro-batch (each sends ``topk`` copies)."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown routing distribution {distribution!r}")
    if distribution == "balanced" or ep == 1:
        return 1.0
    return _imbalance(num_experts, ep, tokens * topk, skew if distribution == "zipf" else 0.0, draws)


@lru_cache(maxsize=256)
def _imbalance(num_experts: int, ep: int, copies: int, skew: float, draws: int) -> float:
    rng = np.random.default_rng(SEED)
    popularity = np.arange(1, num_experts + 1, dtype=float) ** -skew
    popularity /= popularity.sum()
    per_rank = num_experts // ep
    busiest = np.empty(draws)
    for d in range(draws):
        p = rng.permutation(popularity) if skew else popularity
        loads = rng.multinomial(copies, p).reshape(ep, per_rank).sum(axis=1)
        busiest[d] = loads.max()
    return float(busiest.mean() / (copies / ep))
