"""Count the tensor-parallel collectives of one transformer block planned as KempnerForge plans it, eager and under
torch.compile, with and without full activation checkpointing, on gloo ranks of this machine: what
simdist.plan.tp_plan and simdist.plan.recompute say the block issues (training.tp_input_layouts: per_projection).

The block is a pre-norm Llama block (RMSNorm, q/k/v/o projections with grouped K and V, SwiGLU gate/up/down) whose
attention core is replaced by an element-wise mix of q, k and v (the collectives do not depend on it), parallelised
with DTensor exactly as kempnerforge/distributed/tensor_parallel.py @ 5666d0d does: SequenceParallel norms,
ColwiseParallel(input_layouts=Shard(1)) on each of q_proj, k_proj, v_proj, gate_proj, up_proj, RowwiseParallel(
output_layouts=Shard(1)) on o_proj and down_proj, the attention and MLP outputs re-wrapped as Shard(1) DTensors.
Activation checkpointing wraps the block in torch.utils.checkpoint (non-reentrant). torch.profiler counts the
functional collectives (``_c10d_functional::all_gather_into_tensor`` / ``reduce_scatter_tensor``) and matmuls
(``aten::mm``) of one forward and backward after two warm-up steps, on rank 0.

    python -m validation.tp_plan_check            # eager and compiled, without and with checkpointing

Prints one line per case: all-gathers, reduce-scatters, matmuls. Needs torch (``pip install '.[validation]'``);
the compiled cases need a C++ compiler for Inductor's CPU kernels and take about 20 s each on 2 cores.
"""

from __future__ import annotations

import argparse
import sys

from validation.spawn import cli_guard, launch

CASES = (("eager", False), ("eager", True), ("compiled", False), ("compiled", True))
HIDDEN = 64
"""Hidden size of the block (4 query heads' worth; K and V a quarter of it: grouped-query attention)."""


def _count(rank: int, world_size: int, mode: str, checkpointed: bool) -> dict[str, int]:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )
    from torch.profiler import profile
    from torch.utils.checkpoint import checkpoint

    h = HIDDEN

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj, self.o_proj = nn.Linear(h, h, bias=False), nn.Linear(h, h, bias=False)
            self.k_proj, self.v_proj = nn.Linear(h, h // 4, bias=False), nn.Linear(h, h // 4, bias=False)

        def forward(self, x):
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            return self.o_proj(q * torch.sigmoid(k.repeat(1, 1, 4)) + v.repeat(1, 1, 4))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(h, 2 * h, bias=False), nn.Linear(h, 2 * h, bias=False)
            self.down_proj = nn.Linear(2 * h, h, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention_norm, self.attention = nn.RMSNorm(h), Attention()
            self.mlp_norm, self.mlp = nn.RMSNorm(h), MLP()

        def forward(self, x):
            x = x + self.attention(self.attention_norm(x))
            return x + self.mlp(self.mlp_norm(x))

    class Wrapped(nn.Module):
        def __init__(self, block: nn.Module) -> None:
            super().__init__()
            self.block = block

        def forward(self, x):
            return checkpoint(self.block, x, use_reentrant=False) if checkpointed else self.block(x)

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world_size,))
    block = Block()
    col, row = {"input_layouts": Shard(1)}, {"output_layouts": Shard(1)}
    parallelize_module(block, mesh, {
        "attention_norm": SequenceParallel(), "mlp_norm": SequenceParallel(),
        "attention.q_proj": ColwiseParallel(**col), "attention.k_proj": ColwiseParallel(**col),
        "attention.v_proj": ColwiseParallel(**col), "attention.o_proj": RowwiseParallel(**row),
        "mlp.gate_proj": ColwiseParallel(**col), "mlp.up_proj": ColwiseParallel(**col),
        "mlp.down_proj": RowwiseParallel(**row)})

    def rewrap(module, args, out):
        return out if isinstance(out, DTensor) else DTensor.from_local(out, device_mesh=mesh, placements=[Shard(1)])

    block.attention.register_forward_hook(rewrap)
    block.mlp.register_forward_hook(rewrap)
    model = Wrapped(block)
    if mode == "compiled":
        model = torch.compile(model)
    x = DTensor.from_local(torch.randn(2, 16, h), mesh, [Shard(1)])
    for step in range(3):
        if step == 2:
            prof = profile()
            prof.__enter__()
        model(x).to_local().sum().backward()
    prof.__exit__(None, None, None)
    names = {"all_gather": "_c10d_functional::all_gather_into_tensor",
             "reduce_scatter": "_c10d_functional::reduce_scatter_tensor", "mm": "aten::mm"}
    counts = dict.fromkeys(names, 0)
    for event in prof.events():
        for key, name in names.items():
            if event.name == name:
                counts[key] += 1
    return counts


def count_collectives(mode: str, checkpointed: bool, *, timeout_s: float = 300.0) -> dict[str, int]:
    """{all_gather, reduce_scatter, mm: events in one forward and backward of the block on rank 0 of two}."""
    return launch(_count, world_size=2, backend="gloo", args=(mode, checkpointed), timeout_s=timeout_s)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.tp_plan_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--eager-only", action="store_true", help="skip the compiled cases")
    args = parser.parse_args(argv)
    for mode, checkpointed in CASES:
        if args.eager_only and mode == "compiled":
            continue
        c = count_collectives(mode, checkpointed)
        print(f"{mode:8s} {'full checkpointing' if checkpointed else 'no checkpointing  '}: "
              f"{c['all_gather']} all-gathers, {c['reduce_scatter']} reduce-scatters, {c['mm']} matmul events",
              flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_guard(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
