"""The lecture's three cuts of the MLP as full training steps (forward, backward, SGD), on an initialised group.

Each builder returns a `Cut`: this rank's parameters, for each the (layer, column slice) of the full weight it
holds (so a check can compare it with the single-process reference), and ``step()`` which runs one step.

- ``data_parallel``: every rank holds every weight and a slice of the batch; after backward each gradient is
  weighted by the rank's share of examples n_r / N and summed over ranks (one all_reduce per parameter, as
  the lecture's ``data_parallelism_main``). With equal slices this is the lecture's average; with unequal
  ones it is the global-batch gradient: per-example gradients [1, 3, 5, 7] split 1 | 3 give
  (1/4)(1) + (3/4)(5) = 4, not the naive (1 + 5) / 2 = 3.
- ``data_parallel_bucketed``: the same sum over flattened buckets of gradients (reverse layer order, as
  PyTorch DDP fills them, at most ``bucket_bytes`` each), one all_reduce per bucket.
- ``tensor_parallel``: column-parallel layers (Megatron-LM, Shoeybi et al. 2019 sec. 3): rank r holds columns
  [r w/P, (r+1) w/P) of every weight; the input of layer i+1 is the all_gather of the column shards of layer
  i (autograd function `GatherColumns`, whose backward is the adjoint reduce_scatter summing each rank's
  partial input gradient). The last layer stays sharded: each rank's loss is its shard's sum of squares
  over batch x width, so the ranks' losses add up to the global mean.
- ``pipeline_gpipe`` / ``pipeline_1f1b``: contiguous layers per rank, the batch cut into micro-batches that
  run in the order ``simdist.plan.schedule.schedule_order`` gives (the simulator's own schedules);
  activations go forward and their gradients backward by point-to-point send/recv (sends non-blocking,
  receives blocking, each message tagged with its micro-batch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simdist.plan.schedule import schedule_order
from validation.mlp.model import SGD, MLPConfig, full_loss_scale, init_weights, make_data, stage_forward
from validation.spawn import HarnessError

__all__ = ["CUT_BUILDERS", "Cut", "GatherColumns", "build_cut", "even_split", "weighted_gradient_sum_"]

DDP_BUCKET_BYTES = 25 * 2**20  # PyTorch DistributedDataParallel's default bucket_cap_mb=25


@dataclass(frozen=True, slots=True)
class Cut:
    name: str
    params: list[Any]
    shards: list[tuple[int, slice]]  # per param: (layer, columns of the full weight)
    step: Callable[[], None]
    num_microbatches: int = 1


def even_split(total: int, parts: int) -> list[int]:
    """``total`` items in ``parts`` near-equal parts, the first ones one larger (numpy.array_split's rule)."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def weighted_gradient_sum_(tensors: list[Any], local_count: int, total_count: int) -> None:
    """In place: t <- sum over ranks of (n_r / N) t_r, the global-batch mean of per-rank mean gradients."""
    import torch.distributed as dist

    for t in tensors:
        t.mul_(local_count / total_count)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)


def _bucketed_gradient_sum_(grads: list[Any], local_count: int, total_count: int, bucket_bytes: int) -> None:
    import torch
    import torch.distributed as dist

    buckets: list[list[Any]] = [[]]
    size = 0
    for g in reversed(grads):  # DDP fills buckets in reverse parameter order (gradients become ready last-first)
        if buckets[-1] and size + g.numel() * g.element_size() > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(g)
        size += g.numel() * g.element_size()
    for bucket in buckets:
        flat = torch.cat([g.reshape(-1) for g in bucket])
        flat.mul_(local_count / total_count)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def _data_parallel(cfg: MLPConfig, rank: int, world: int, device: Any, *, bucketed: bool,
                   batch_split: list[int] | None, bucket_bytes: int, **_: Any) -> Cut:

    split = batch_split or even_split(cfg.batch, world)
    if len(split) != world or sum(split) != cfg.batch or min(split) < 1:
        raise HarnessError(f"batch split {split} must give each of {world} ranks >= 1 of {cfg.batch} examples")
    lo = sum(split[:rank])
    x = make_data(cfg, device)[lo:lo + split[rank]]
    params = [w.requires_grad_() for w in init_weights(cfg, device)]
    opt = SGD(params, cfg.lr)

    def step() -> None:
        opt.zero_grad()
        stage_forward(params, x).square().mean().backward()  # the lecture: the local batch's mean
        grads = [p.grad for p in params]
        if bucketed:
            _bucketed_gradient_sum_(grads, split[rank], cfg.batch, bucket_bytes)
        else:
            weighted_gradient_sum_(grads, split[rank], cfg.batch)
        opt.step()

    name = "data_parallel_bucketed" if bucketed else "data_parallel"
    return Cut(name, params, [(i, slice(None)) for i in range(cfg.num_layers)], step)


def _gather_ops() -> tuple[Any, Any]:
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return gather, scatter


def _gather_columns_forward(local: Any) -> Any:
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    rows, cols = local.shape
    out = torch.empty(world * rows, cols, dtype=local.dtype, device=local.device)
    _gather_ops()[0](out, local.contiguous())
    return out.view(world, rows, cols).permute(1, 0, 2).reshape(rows, world * cols)


def _gather_columns_backward(grad: Any) -> Any:
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    rows, width = grad.shape
    cols = width // world
    stacked = grad.reshape(rows, world, cols).permute(1, 0, 2).contiguous().view(world * rows, cols)
    out = torch.empty(rows, cols, dtype=grad.dtype, device=grad.device)
    _gather_ops()[1](out, stacked)  # sum of every rank's partial gradient, rank r keeps its columns
    return out


def _make_gather_function() -> Any:
    import torch

    class GatherColumnsFn(torch.autograd.Function):
        """Forward: all_gather column shards (batch x w/P) into batch x w. Backward: reduce_scatter (adjoint)."""

        @staticmethod
        def forward(ctx: Any, local: Any) -> Any:
            return _gather_columns_forward(local)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return _gather_columns_backward(grad)

    return GatherColumnsFn


_GATHER: list[Any] = []


def GatherColumns(local: Any) -> Any:
    """Apply the all_gather / reduce_scatter autograd function (built once, on first use: torch is optional)."""
    if not _GATHER:
        _GATHER.append(_make_gather_function())
    return _GATHER[0].apply(local)


def _tensor_parallel(cfg: MLPConfig, rank: int, world: int, device: Any, **_: Any) -> Cut:
    import torch.nn.functional as F

    if cfg.width % world:
        raise HarnessError(f"tensor parallel needs --width ({cfg.width}) divisible by --ranks ({world})")
    cols = slice(rank * cfg.width // world, (rank + 1) * cfg.width // world)
    params = [w[:, cols].contiguous().requires_grad_() for w in init_weights(cfg, device)]
    x = make_data(cfg, device)
    opt = SGD(params, cfg.lr)

    def step() -> None:
        opt.zero_grad()
        h = x
        for i, w in enumerate(params):
            y = F.gelu(h @ w)
            h = GatherColumns(y) if i < len(params) - 1 else y
        (h.square().sum() * full_loss_scale(cfg)).backward()
        opt.step()  # no gradient sync: each rank owns its columns and sees the same (gathered) inputs

    return Cut("tensor_parallel", params, [(i, cols) for i in range(cfg.num_layers)], step)


def _pipeline(cfg: MLPConfig, rank: int, world: int, device: Any, *, schedule: str, num_microbatches: int,
              **_: Any) -> Cut:
    import torch
    import torch.distributed as dist

    if cfg.num_layers < world:
        raise HarnessError(f"pipeline needs --layers ({cfg.num_layers}) >= --ranks ({world})")
    if cfg.batch < num_microbatches:
        raise HarnessError(f"--batch ({cfg.batch}) must be >= the micro-batches ({num_microbatches})")
    per_stage = even_split(cfg.num_layers, world)
    first_layer = sum(per_stage[:rank])
    layers = list(range(first_layer, first_layer + per_stage[rank]))
    weights = init_weights(cfg, device)
    params = [weights[i].requires_grad_() for i in layers]
    rows = even_split(cfg.batch, num_microbatches)
    data = make_data(cfg, device).split(rows) if rank == 0 else None
    order = schedule_order(schedule, num_stages=world, num_microbatches=num_microbatches)[rank]
    opt = SGD(params, cfg.lr)
    first, last = rank == 0, rank == world - 1

    def step() -> None:
        opt.zero_grad()
        inputs: dict[int, Any] = {}
        outputs: dict[int, Any] = {}
        sends: list[tuple[Any, Any]] = []  # (request, tensor): the tensor stays alive until the send completes
        for st in order:
            mb = st.microbatch
            if st.kind == "F":
                if first:
                    x = data[mb]
                else:
                    x = torch.empty(rows[mb], cfg.width, device=device)
                    dist.recv(x, src=rank - 1, tag=mb)
                    x.requires_grad_()
                y = stage_forward(params, x)
                if last:
                    y = y.square().sum() * full_loss_scale(cfg)
                else:
                    out = y.detach()
                    sends.append((dist.isend(out, dst=rank + 1, tag=mb), out))
                inputs[mb], outputs[mb] = x, y
            else:
                x, y = inputs.pop(mb), outputs.pop(mb)
                if last:
                    y.backward()
                else:
                    grad = torch.empty_like(y)
                    dist.recv(grad, src=rank + 1, tag=num_microbatches + mb)
                    y.backward(grad)
                if not first:
                    sends.append((dist.isend(x.grad, dst=rank - 1, tag=num_microbatches + mb), x.grad))
        for request, _tensor in sends:
            request.wait()
        opt.step()

    return Cut(f"pipeline_{schedule}", params, [(i, slice(None)) for i in layers], step, num_microbatches)


CUT_BUILDERS: dict[str, Callable[..., Cut]] = {
    "data_parallel": lambda *a, **k: _data_parallel(*a, bucketed=False, **k),
    "data_parallel_bucketed": lambda *a, **k: _data_parallel(*a, bucketed=True, **k),
    "tensor_parallel": _tensor_parallel,
    "pipeline_gpipe": lambda *a, **k: _pipeline(*a, schedule="gpipe", **k),
    "pipeline_1f1b": lambda *a, **k: _pipeline(*a, schedule="1f1b", **k),
}


def build_cut(name: str, cfg: MLPConfig, rank: int, world: int, device: Any, *, num_microbatches: int = 4,
              batch_split: list[int] | None = None, bucket_bytes: int = DDP_BUCKET_BYTES) -> Cut:
    """This rank's part of cut ``name`` (a key of `CUT_BUILDERS`), with fresh seeded weights."""
    if name == "single":

        params = [w.requires_grad_() for w in init_weights(cfg, device)]
        x = make_data(cfg, device)
        opt = SGD(params, cfg.lr)

        def step() -> None:
            opt.zero_grad()
            stage_forward(params, x).square().mean().backward()
            opt.step()

        return Cut("single", params, [(i, slice(None)) for i in range(cfg.num_layers)], step)
    if name not in CUT_BUILDERS:
        raise HarnessError(f"unknown cut '{name}' (fix: use one of single, {', '.join(CUT_BUILDERS)})")
    return CUT_BUILDERS[name](cfg, rank, world, device, num_microbatches=num_microbatches, batch_split=batch_split,
                              bucket_bytes=bucket_bytes)
