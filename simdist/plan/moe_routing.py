"""Routing load as a distribution: how much busier than the mean the busiest expert-parallel rank is, per micro-batch.

``training.moe_imbalance`` states the busiest rank's routed tokens over the mean directly. ``training.moe_routing``
derives it from a stated model of where tokens go instead, per MoE layer and micro-batch:

- ``balanced``: every expert gets exactly its share: 1 (an idealisation, as expert-choice routing would give; not
  Megatron-Core's force-balancing: see multinomial).
- ``multinomial``: each routed copy of a token picks an expert uniformly at random, independently: a router whose
  auxiliary loss has balanced the experts on average (per-micro-batch fluctuation only), and Megatron-Core's
  --moe-router-force-load-balancing, which NVIDIA's performance tables use: its router replaces the logits by random
  normal ones per token (megatron/core/transformer/moe/router.py, apply_random_logits: RandomSTE's
  ``logits.clone().normal_()``), so each token's top-k experts are a uniform random draw, not an exact balance.
- ``zipf``: expert popularity falls as a power law of its popularity rank, p_i proportional to i^-s
  (``moe_routing_skew`` s; s = 0 is ``multinomial``), the ranks shuffled over the experts at random.
- ``histogram``: each expert's share measured in a real run (``moe_routing_file``, simdist.spec.routing_histogram),
  kept on the expert it was measured on (no shuffle: the file knows which expert is which). A file with a histogram
  per MoE layer gives each layer its factor, and the step takes their mean.

The N = tokens x topk routed copies of one micro-batch of the expert-parallel group land on the experts by a
multinomial draw of those probabilities; rank r holds experts r x E/ep .. (r + 1) x E/ep - 1 (Megatron-Core's
contiguous local experts, moe_layer.py local_expert_indices), so its load is the sum of its experts'. Every rank waits
for the busiest at the combine (simdist.plan.moe_cost), so the factor is E[max over ranks of the load] / (N / ep),
estimated from ``DRAWS`` draws of a generator seeded with ``SEED`` (the same answer on every run and platform numpy
supports).
# Assumption: a token's topk copies are drawn independently (the router picks topk distinct experts; with E >> topk
# the difference is small); the popularity order is independent of which rank holds which expert.
# Assumption: with per-layer histograms the step uses the mean of the layers' factors: a layer's time is close to
# linear in its busiest rank's load (its expert GEMMs, permutations and all-to-all bytes), so the mean factor gives
# the layers' summed time up to the GEMM efficiency's small change with size.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from simdist.errors import LayoutError
from simdist.plan.model import Model
from simdist.spec.routing_histogram import RoutingHistogram, read_routing_histogram

__all__ = ["DISTRIBUTIONS", "DRAWS", "SEED", "checked_histogram", "routing_imbalance", "scenario_imbalance"]

DISTRIBUTIONS = ("balanced", "multinomial", "zipf", "histogram")
DRAWS = 512
"""Micro-batches drawn per estimate: the standard error of the mean of the maximum is its spread / sqrt(512)."""
SEED = 20261205


def routing_imbalance(distribution: str, *, num_experts: int, ep: int, tokens: int, topk: int,
                      skew: float = 1.0, shares: tuple[tuple[float, ...], ...] | None = None,
                      draws: int = DRAWS) -> float:
    """The busiest expert-parallel rank's routed copies / the mean rank's, expected per micro-batch: ``tokens`` are
    the tokens the whole ep group routes in one micro-batch (each sends ``topk`` copies); ``shares``: the measured
    histograms of ``histogram`` (simdist.spec.routing_histogram.RoutingHistogram.layers), one per MoE layer."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown routing distribution {distribution!r}")
    if distribution == "balanced" or ep == 1:
        return 1.0
    copies = tokens * topk
    if distribution == "histogram":
        if not shares or any(len(layer) != num_experts for layer in shares):
            raise ValueError(f"histogram routing needs shares of {num_experts} experts per layer")
        return float(np.mean([_busiest(layer, ep, copies, False, draws) for layer in shares]))
    skew = skew if distribution == "zipf" else 0.0
    popularity = np.arange(1, num_experts + 1, dtype=float) ** -skew
    popularity /= popularity.sum()
    return _busiest(tuple(popularity.tolist()), ep, copies, skew != 0.0, draws)


@lru_cache(maxsize=256)
def _busiest(shares: tuple[float, ...], ep: int, copies: int, shuffle: bool, draws: int) -> float:
    """E[max over ranks of a rank's copies] / (copies / ep), the copies drawn multinomially over the experts'
    ``shares`` (summing to 1; ``shuffle``: the shares permuted over the experts at random in each draw)."""
    rng = np.random.default_rng(SEED)
    popularity = np.asarray(shares, dtype=float)
    per_rank = len(shares) // ep
    busiest = np.empty(draws)
    for d in range(draws):
        p = rng.permutation(popularity) if shuffle else popularity
        loads = rng.multinomial(copies, p).reshape(ep, per_rank).sum(axis=1)
        busiest[d] = loads.max()
    return float(busiest.mean() / (copies / ep))


def scenario_imbalance(training: Any, parallel: Any, model: Model) -> float:
    """A scenario's training.moe_imbalance, or the one its training.moe_routing gives for the tokens the
    expert-parallel group routes per micro-batch: each ep rank its own micro-batch's tokens of its context-parallel
    slice (split over tp under sequence parallelism)."""
    t, p = training, parallel
    if t.moe_routing is None or not model.num_experts:
        return t.moe_imbalance
    local = model.seq_length * t.micro_batch_size // p.cp // (p.tp if p.sequence_parallel else 1)
    shares = checked_histogram(t.moe_routing_file, model).layers if t.moe_routing == "histogram" else None
    return routing_imbalance(t.moe_routing, num_experts=model.num_experts, ep=p.ep, tokens=local * p.ep,
                             topk=model.moe_router_topk, skew=t.moe_routing_skew, shares=shares)


def checked_histogram(path: Path, model: Model) -> RoutingHistogram:
    """training.moe_routing_file read, its experts and MoE layers checked against the model's (a LayoutError naming
    the field; simdist.plan.layout reports it under the ``experts`` rule). A relative path starts in the current
    folder: the scenario loader (simdist.api.scenario) makes it absolute."""
    hist = read_routing_histogram(path)
    field = "training.moe_routing_file"
    if hist.num_experts != model.num_experts:
        raise LayoutError(f"{hist.path} lists {hist.num_experts} experts, the model has {model.num_experts}",
                          field=field, fix="give the histogram of this model's experts")
    moe_layers = sum(model.moe_layer_flags())
    if len(hist.layers) > 1 and len(hist.layers) != moe_layers:
        raise LayoutError(f"{hist.path} holds {len(hist.layers)} layers' histograms, the model has {moe_layers} MoE "
                          "layers", field=field,
                          fix="give one histogram per MoE layer, or one (no layer column) for all")
    return hist
