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
(``aten::mm``) of one forward and backward after two warm-up steps, on rank 0, and the copies DTensor makes around
the collectives (simdist.plan.tp_plan.layout_copy): eager, the ``aten::cat`` inside a redistribution; compiled, the
calls of Inductor's concatenating kernels in the code of the compiled graphs.

    python -m validation.tp_plan_check            # eager and compiled, without and with checkpointing
    python -m validation.tp_plan_check --batch 1  # the same with a local batch of 1 (no copy after an all-gather)
    python -m validation.tp_plan_check --host-time  # host time of the eager block, plain and under DTensor

Prints one line per case: all-gathers, reduce-scatters, matmuls; with ``--host-time``, per case (eager, without
and with checkpointing) the host milliseconds of one forward and backward of the plain block and of the same block
under the DTensor plan on a one-rank mesh, and the ATen ops each runs (this machine's CPU: a host's own figure).
Needs torch (``pip install '.[validation]'``);
the compiled cases need a C++ compiler for Inductor's CPU kernels and take about 20 s each on 2 cores.
"""

from __future__ import annotations

import argparse
import re
import sys

from validation.harness_cli import cli_guard
from validation.spawn import launch

CASES = (("eager", False), ("eager", True), ("compiled", False), ("compiled", True))
HIDDEN = 64
"""Hidden size of the block (4 query heads' worth; K and V a quarter of it: grouped-query attention)."""


def _block(mesh=None):
    """The block (module doc), parallelised on ``mesh`` as KempnerForge plans it (None: left plain)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

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

    block = Block()
    if mesh is None:
        return block
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
    return block


def _wrapped(block, checkpointed: bool):
    """``block`` under full activation checkpointing (torch.utils.checkpoint, non-reentrant) or as it is."""
    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint

    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = block

        def forward(self, x):
            return checkpoint(self.block, x, use_reentrant=False) if checkpointed else self.block(x)

    return Wrapped()


COPY_KERNEL = re.compile(r"^\s+\w*fused\w*_cat\w*(\.run)?\(", re.MULTILINE)
"""A call of an Inductor kernel that concatenates (cpp_fused_cat_split_1(...), triton_poi_fused_cat_0.run(...)) in
the code a compiled graph runs."""


def _count(rank: int, world_size: int, mode: str, checkpointed: bool, batch: int = 2) -> dict[str, int]:
    import torch
    from torch._inductor.utils import run_and_get_code
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.profiler import profile

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world_size,))
    model = _wrapped(_block(mesh), checkpointed)
    if mode == "compiled":
        model = torch.compile(model)
    x = DTensor.from_local(torch.randn(batch, 16, HIDDEN), mesh, [Shard(1)])
    code: list[str] = []
    for step in range(3):
        if step == 2:
            prof = profile()
            prof.__enter__()
        if step == 0 and mode == "compiled":  # the first step compiles the forward and the backward graph
            code = run_and_get_code(lambda: model(x).to_local().sum().backward())[1]
        else:
            model(x).to_local().sum().backward()
    prof.__exit__(None, None, None)
    names = {"all_gather": "_c10d_functional::all_gather_into_tensor",
             "reduce_scatter": "_c10d_functional::reduce_scatter_tensor", "mm": "aten::mm"}
    counts = dict.fromkeys(names, 0)
    counts["copies"] = sum(len(COPY_KERNEL.findall(c)) for c in code)
    for event in prof.events():
        for key, name in names.items():
            if event.name == name:
                counts[key] += 1
        if mode == "eager" and event.name == "aten::cat" and _under_redistribute(event):
            counts["copies"] += 1
    return counts


def _under_redistribute(event) -> bool:
    """Whether a profiled op ran inside DTensor's redistribution (its own or the backward's): the concatenations
    around the collectives, not the block's own (the attention stand-in's repeat)."""
    while event is not None:
        if "Redistribute" in event.name:
            return True
        event = event.cpu_parent
    return False


def _host_time(rank: int, world_size: int, checkpointed: bool, repeats: int) -> dict[str, float]:
    """Host seconds of one eager forward and backward of the block, plain and under the DTensor plan on a mesh of
    this one rank (its redistributions move nothing: what is left over the plain block is DTensor's own dispatch,
    sharding propagation and wrapping), and the ATen ops each runs (one profiled forward and backward). The
    tensors are tiny, so the times are the host's: Python, the dispatcher and DTensor, no arithmetic to speak of."""
    import time

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.profiler import profile

    torch.manual_seed(0)
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world_size,))
    out: dict[str, float] = {}
    for name, model, x in (("plain", _wrapped(_block(), checkpointed), torch.randn(2, 16, HIDDEN)),
                           ("dtensor", _wrapped(_block(mesh), checkpointed),
                            DTensor.from_local(torch.randn(2, 16, HIDDEN), mesh, [Shard(1)]))):
        def step(model=model, x=x) -> None:
            y = model(x)
            (y.to_local() if isinstance(y, DTensor) else y).sum().backward()

        for _ in range(5):  # warm-up: sharding propagation's caches, the allocator
            step()
        start = time.perf_counter()
        for _ in range(repeats):
            step()
        out[f"{name}_s"] = (time.perf_counter() - start) / repeats
        with profile() as prof:
            step()
        out[f"{name}_aten_ops"] = sum(1 for e in prof.events() if e.name.startswith("aten::"))
    return out


def host_time(checkpointed: bool, *, repeats: int = 200, timeout_s: float = 300.0) -> dict[str, float]:
    """{plain_s, dtensor_s, plain_aten_ops, dtensor_aten_ops}: `_host_time` on one gloo rank."""
    return launch(_host_time, world_size=1, backend="gloo", args=(checkpointed, repeats), timeout_s=timeout_s)


def count_collectives(mode: str, checkpointed: bool, *, batch: int = 2, timeout_s: float = 300.0) -> dict[str, int]:
    """{all_gather, reduce_scatter, mm: events in one forward and backward of the block on rank 0 of two; copies: the
    concatenations DTensor makes around its collectives (eager: aten::cat inside a redistribution; compiled: the
    calls of Inductor's concatenating kernels in the compiled graphs' code)}, for a local batch of ``batch``."""
    return launch(_count, world_size=2, backend="gloo", args=(mode, checkpointed, batch), timeout_s=timeout_s)


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.tp_plan_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--eager-only", action="store_true", help="skip the compiled cases")
    parser.add_argument("--batch", type=int, default=2, help="local batch of the block's input (default 2)")
    parser.add_argument("--host-time", action="store_true",
                        help="instead: host time of one eager forward and backward, plain and under the DTensor plan")
    args = parser.parse_args(argv)
    if args.host_time:
        for checkpointed in (False, True):
            t = host_time(checkpointed)
            print(f"eager    {'full checkpointing' if checkpointed else 'no checkpointing  '}: plain "
                  f"{t['plain_s'] * 1e3:.2f} ms ({t['plain_aten_ops']:.0f} ATen ops), DTensor plan "
                  f"{t['dtensor_s'] * 1e3:.2f} ms ({t['dtensor_aten_ops']:.0f} ATen ops): "
                  f"{(t['dtensor_s'] - t['plain_s']) * 1e3:.2f} ms more per forward and backward", flush=True)
        return 0
    for mode, checkpointed in CASES:
        if args.eager_only and mode == "compiled":
            continue
        c = count_collectives(mode, checkpointed, batch=args.batch)
        print(f"{mode:8s} {'full checkpointing' if checkpointed else 'no checkpointing  '}: "
              f"{c['all_gather']} all-gathers, {c['reduce_scatter']} reduce-scatters, {c['mm']} matmul events, "
              f"{c['copies']} copies around them", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_guard(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
