"""Count the kernels of Megatron-Core's clamp before a routed expert's gated activation (GPT-OSS), forward and
backward, as PyTorch runs them: what simdist.plan.glu_clamp says it launches.

The arithmetic is Megatron-LM's ``weighted_bias_quick_geglu_impl`` with a clamp value (megatron/core/fusions/
fused_bias_geglu.py): fc1's output split in two halves, the gate clamped to at most the value and the linear half to
within +/- it, the two concatenated again for the fused activation. One bf16 [rows, 2f] tensor that requires a
gradient runs it once forward and once backward under torch.profiler on this CPU; a kernel is an ATen op that
computes (``KERNEL_OPS``) outside another such op, or a scalar tensor made on the device (``aten::scalar_tensor``:
on a GPU an allocation and a one-element fill, on a CPU a host value).

    python -m validation.glu_clamp_ops      # prints the forward and backward kernels, in order

Needs torch (``pip install '.[validation]'``).
"""

from __future__ import annotations

import sys

from validation.aten_kernels import outer_kernels, print_kernels
from validation.harness_cli import cli_guard

KERNEL_OPS = frozenset({"aten::clamp", "aten::cat", "aten::ge", "aten::le", "aten::logical_and",
                        "aten::logical_and_", "aten::where", "aten::copy_", "aten::fill_", "aten::scalar_tensor",
                        "aten::mul", "aten::add"})
"""ATen ops that run a kernel of their own on a GPU (views and allocations are not kernels; a comparison's scalar
operand is its argument, not a kernel)."""
LIMIT = 7.0
"""GPT-OSS's clamp value (openai/gpt-oss-120b config.json swiglu_limit)."""


def _clamp(y, limit: float):
    """Megatron-Core's clamp of fc1's output (module docstring)."""
    import torch

    x_glu, x_linear = y.chunk(2, -1)
    return torch.cat((x_glu.clamp(min=None, max=limit), x_linear.clamp(min=-limit, max=limit)), -1)


def count(rows: int = 64, width: int = 32) -> tuple[list[str], list[str]]:
    """(forward kernels, backward kernels) of the clamp on a bf16 [rows, 2 x width] tensor."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    leaf = torch.randn(rows, 2 * width, dtype=torch.bfloat16, requires_grad=True)
    y = leaf * 1.0  # fc1's output: not a leaf
    with profile(activities=[ProfilerActivity.CPU]) as fwd:
        out = _clamp(y, LIMIT)
    grad = torch.randn_like(out)
    # the backward of ``y`` alone: stop at its producer
    with profile(activities=[ProfilerActivity.CPU]) as bwd:
        torch.autograd.grad(out, y, grad)
    return outer_kernels(fwd, KERNEL_OPS), outer_kernels(bwd, KERNEL_OPS)


def main(argv: list[str] | None = None) -> int:
    return print_kernels("python -m validation.glu_clamp_ops", __doc__.splitlines()[0], argv, count)


if __name__ == "__main__":
    sys.exit(cli_guard(main))
