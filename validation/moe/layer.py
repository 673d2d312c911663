"""A small mixture-of-experts layer, lecture style, in one process and expert-parallel over a process group.

The layer (GShard, Lepikhin et al. 2020, sec. 2.2; Switch, Fedus et al. 2021; Megatron-Core
megatron/core/transformer/moe/router.py and token_dispatcher.py for the names):

- **router**: logits = x W_r (h x E); each token takes the ``topk`` experts of largest logit + ``bias`` (the
  imbalance knob, added to selection only, as DeepSeek-V3's bias of auxiliary-loss-free balancing, Liu et al. 2024
  sec. 2.1.2, so it moves tokens without changing their weights); gate weights = softmax over the chosen experts'
  unbiased logits (Mixtral's top-k-then-softmax, Jiang et al. 2024 eq. (1));
- **experts**: E two-layer GELU MLPs, expert e: gelu(x W1_e) W2_e (h -> f -> h);
- output = sum over a token's chosen experts of gate x expert(x) (dropless: no capacity factor).

Expert-parallel (`moe_forward`, every rank of the group holds E / P consecutive experts and its own tokens; the
router is replicated): the (token, choice) pairs are sorted by expert (Megatron's permute); per-expert counts are
exchanged first by an all_to_all of E counts, so every rank knows how many rows it will receive from each peer;
then the rows go to their experts' ranks by ``all_to_all_single`` with unequal ``input_split_sizes`` /
``output_split_sizes`` (dispatch), are regrouped by local expert, run through the local experts, regrouped back
and returned by the transposed all_to_all (combine), un-permuted and summed with their gate weights. Both
all_to_alls are autograd functions (`all_to_all_autograd`) whose backward is the all_to_all with the splits
swapped (its adjoint), so gradients reach the input, the experts and, through the gate weights, the router; the
router's gradient is a sum over every rank's tokens (an all_reduce, as data parallelism's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from validation.spawn import HarnessError

__all__ = ["Dispatch", "MoEConfig", "Routing", "all_to_all_autograd", "expert_forward", "global_imbalance", "hot_bias",
           "init_params", "make_tokens", "moe_forward", "plan_dispatch", "reference_forward", "route", "solve_bias"]


@dataclass(frozen=True, slots=True)
class MoEConfig:
    num_experts: int = 8
    topk: int = 2
    hidden: int = 32
    ffn_hidden: int = 64
    tokens_per_rank: int = 32
    seed: int = 0


def init_params(cfg: MoEConfig, dtype: Any, device: Any = "cpu") -> tuple[Any, Any, Any]:
    """(router h x E, W1 E x h x f, W2 E x f x h), identical on every process (seeded CPU generator)."""
    import torch

    gen = torch.Generator().manual_seed(cfg.seed)
    h, f, e = cfg.hidden, cfg.ffn_hidden, cfg.num_experts
    router = torch.randn(h, e, generator=gen, dtype=torch.float64) / math.sqrt(h)
    w1 = torch.randn(e, h, f, generator=gen, dtype=torch.float64) / math.sqrt(h)
    w2 = torch.randn(e, f, h, generator=gen, dtype=torch.float64) / math.sqrt(f)
    return tuple(t.to(dtype=dtype, device=device) for t in (router, w1, w2))  # type: ignore[return-value]


def make_tokens(cfg: MoEConfig, world: int, dtype: Any, device: Any = "cpu") -> tuple[Any, Any]:
    """(tokens, probe), both (world x tokens_per_rank) x h: every rank's tokens in rank order, and the fixed
    tensor the loss is taken against (loss = sum(output * probe) / tokens)."""
    import torch

    gen = torch.Generator().manual_seed(cfg.seed + 1)
    n = world * cfg.tokens_per_rank
    x = torch.randn(n, cfg.hidden, generator=gen, dtype=torch.float64)
    probe = torch.randn(n, cfg.hidden, generator=gen, dtype=torch.float64)
    return x.to(dtype=dtype, device=device), probe.to(dtype=dtype, device=device)


def hot_bias(cfg: MoEConfig, world: int, value: float, dtype: Any, device: Any = "cpu") -> Any:
    """The selection bias: ``value`` on rank 0's experts (the first E / P), 0 elsewhere."""
    import torch

    bias = torch.zeros(cfg.num_experts, dtype=dtype, device=device)
    bias[: cfg.num_experts // world] = value
    return bias


@dataclass(frozen=True, slots=True)
class Routing:
    experts: Any  # tokens x topk expert ids
    gates: Any  # tokens x topk weights (differentiable w.r.t. x and the router)


def route(x: Any, router: Any, topk: int, bias: Any) -> Routing:
    """Top-k experts by biased logits; gate weights = softmax of the chosen experts' unbiased logits (module doc)."""
    import torch

    logits = x @ router
    experts = torch.topk(logits.detach() + bias, topk, dim=-1).indices
    gates = torch.softmax(torch.gather(logits, 1, experts), dim=-1)
    return Routing(experts, gates)


def solve_bias(cfg: MoEConfig, world: int, target: float, imbalance_of: Callable[[float], float]
               ) -> tuple[float, float]:
    """(bias, realised imbalance): the least selection bias on rank 0's experts at which the busiest rank receives
    at least ``target`` x the mean, ``imbalance_of(bias)`` measuring it (bisection: the share of rows rank 0
    receives never falls as its bias grows). Deterministic, so every rank that calls it in step agrees."""
    local = cfg.num_experts // world
    most = world * min(1.0, local / cfg.topk)
    if target > most * (1 + 1e-12):
        raise HarnessError(f"--imbalance {target:g} cannot be reached: with {cfg.num_experts} experts on {world} ranks "
                           f"and top-{cfg.topk}, one rank receives at most {most:g} x the mean "
                           f"(fix: --imbalance <= {most:g}, or more experts per rank)")
    base = imbalance_of(0.0)
    if base >= target:
        return 0.0, base
    lo, hi = 0.0, 1.0
    while imbalance_of(hi) < target:
        lo, hi = hi, 2.0 * hi
        if hi > 1e6:  # pragma: no cover - the bound above makes every reachable target reachable by then
            raise HarnessError(f"--imbalance {target:g} not reached by any bias")
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if imbalance_of(mid) < target else (lo, mid)
    return hi, imbalance_of(hi)


def global_imbalance(x: Any, router: Any, cfg: MoEConfig, world: int) -> Callable[[float], float]:
    """``bias -> imbalance`` of this rank's tokens ``x`` routed with the bias, counted over every rank (an
    all_reduce of the per-expert counts; every rank must call it in step)."""
    import torch
    import torch.distributed as dist

    def imbalance_of(bias: float) -> float:
        experts = route(x, router, cfg.topk, hot_bias(cfg, world, bias, x.dtype, x.device)).experts
        counts = torch.bincount(experts.reshape(-1), minlength=cfg.num_experts)
        dist.all_reduce(counts)
        per_rank = counts.view(world, -1).sum(1).double()
        return float(per_rank.max() / per_rank.mean())

    return imbalance_of


def expert_forward(x: Any, w1: Any, w2: Any) -> Any:
    """One expert: gelu(x W1) W2."""
    import torch.nn.functional as F

    return F.gelu(x @ w1) @ w2


def reference_forward(x: Any, params: tuple[Any, Any, Any], topk: int, bias: Any) -> Any:
    """The whole layer in one process: every token through its chosen experts, summed with its gate weights."""
    import torch

    router, w1, w2 = params
    r = route(x, router, topk, bias)
    out = torch.zeros_like(x)
    for e in range(w1.shape[0]):
        token, slot = torch.nonzero(r.experts == e, as_tuple=True)
        if len(token):
            y = expert_forward(x[token], w1[e], w2[e]) * r.gates[token, slot].unsqueeze(-1)
            out = out.index_add(0, token, y)
    return out


def _make_all_to_all() -> Any:
    import torch
    import torch.distributed as dist

    class AllToAllFn(torch.autograd.Function):
        """Rows to peers by unequal splits; backward: the same exchange with the splits swapped (the adjoint)."""

        @staticmethod
        def forward(ctx: Any, x: Any, out_splits: list[int], in_splits: list[int]) -> Any:
            ctx.splits = (out_splits, in_splits)
            out = x.new_empty((sum(out_splits), *x.shape[1:]))
            dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
            return out

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            out_splits, in_splits = ctx.splits
            back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
            dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
            return back, None, None

    return AllToAllFn


_FN: list[Any] = []


def all_to_all_autograd() -> Any:
    """The autograd all_to_all with unequal splits, ``.apply(x, out_splits, in_splits)`` (a class built once per
    process: torch is imported lazily)."""
    if not _FN:
        _FN.append(_make_all_to_all())
    return _FN[0]


@dataclass(frozen=True, slots=True)
class Dispatch:
    """What one rank's routing exchanges: the rows it sends in expert order and the splits both ways."""

    order: Any  # permutation of the (token, choice) rows into expert order
    in_splits: list[int]  # rows this rank sends to each peer
    out_splits: list[int]  # rows this rank receives from each peer
    recv_counts: Any  # peers x local experts: rows received per (source, local expert)


def plan_dispatch(experts: Any, num_experts: int, world: int) -> Dispatch:
    """Permute the rows into expert order and exchange the per-expert counts (one all_to_all of E integers)."""
    import torch
    import torch.distributed as dist

    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    recv = torch.empty_like(counts)
    dist.all_to_all_single(recv, counts)  # rank r receives, from each peer, the counts of r's E / P experts
    recv = recv.view(world, num_experts // world)
    return Dispatch(order, counts.view(world, -1).sum(1).tolist(), recv.sum(1).tolist(), recv)


def moe_forward(x: Any, router: Any, w1_local: Any, w2_local: Any, topk: int, bias: Any, world: int) -> Any:
    """The expert-parallel layer on this rank's tokens (module doc); ``w1_local``/``w2_local``: this rank's experts."""
    import torch

    a2a = all_to_all_autograd()
    local = w1_local.shape[0]
    r = route(x, router, topk, bias)
    d = plan_dispatch(r.experts, local * world, world)
    token = torch.arange(x.shape[0], device=x.device).repeat_interleave(topk)
    received = a2a.apply(x[token[d.order]], d.out_splits, d.in_splits)  # dispatch
    # Received rows come by source peer, each peer's in expert order: regroup them by local expert.
    local_id = torch.repeat_interleave(torch.arange(local, device=x.device).repeat(world), d.recv_counts.reshape(-1))
    group = torch.argsort(local_id, stable=True)
    sizes = torch.bincount(local_id, minlength=local).tolist()
    pieces = [expert_forward(rows, w1_local[e], w2_local[e]) for e, rows in enumerate(received[group].split(sizes))]
    grouped = torch.cat(pieces) if pieces else received[:0]
    back = a2a.apply(grouped[torch.argsort(group)], d.in_splits, d.out_splits)  # combine
    rows = back[torch.argsort(d.order)].view(x.shape[0], topk, -1)
    return (rows * r.gates.unsqueeze(-1)).sum(1)
