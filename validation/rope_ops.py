"""Count the kernels of Megatron-Core's unfused rotary embedding, forward and backward, as PyTorch runs them: what
simdist.plan.elementwise's ``rotary_unfused`` regions say it launches (the RoPE Megatron-Core runs where YaRN's
attention factor scales cos and sin, GPT-OSS: Model.rotary_concentration).

The arithmetic is Megatron-LM's ``_apply_rotary_pos_emb_bshd`` (megatron/core/models/common/embeddings/rope_utils.py,
non-interleaved, rotary over the whole head): split off the pass-through part (empty here), cos and sin of the
frequencies times the factor cast to the activations' dtype, t cos + rotate_half(t) sin with rotate_half the
concatenation of the negated second half and the first, then the concatenation with the pass-through part. One bf16
tensor of [seq, batch, heads, head dim] that requires a gradient runs it once forward and once backward under
torch.profiler on this CPU; a kernel is an ATen op that computes (``KERNEL_OPS``) outside another such op (the
scalar a multiply wraps is its argument, not a kernel) and touches at least one element (a copy of the empty
pass-through part launches nothing on a GPU).

    python -m validation.rope_ops      # prints the forward and backward kernels, in order

Needs torch (``pip install '.[validation]'``).
"""

from __future__ import annotations

import sys

from validation.aten_kernels import outer_kernels, print_kernels
from validation.harness_cli import cli_guard

KERNEL_OPS = frozenset({"aten::cos", "aten::sin", "aten::mul", "aten::neg", "aten::cat", "aten::add", "aten::add_",
                        "aten::copy_", "aten::zero_", "aten::fill_"})
"""ATen ops that run a kernel of their own on a GPU (views, allocations and composite ops like ``to``, ``zeros`` and
``slice_backward`` are counted through the ops they call)."""
FACTOR = 1.3466
"""GPT-OSS's YaRN attention factor: 0.1 ln(32) + 1 (simdist.plan.model.Model.rotary_concentration)."""


def _rope(t, freqs, factor: float):
    """Megatron-Core's unfused RoPE (module docstring)."""
    import torch

    width = freqs.shape[-1]
    rotated, passed = t[..., :width], t[..., width:]
    cos = (torch.cos(freqs) * factor).to(t.dtype)
    sin = (torch.sin(freqs) * factor).to(t.dtype)
    scaled = rotated * cos
    first, second = torch.chunk(rotated, 2, dim=-1)
    return torch.cat((scaled + torch.cat((-second, first), dim=-1) * sin, passed), dim=-1)


def count(seq: int = 64, batch: int = 2, heads: int = 4, head_dim: int = 16) -> tuple[list[str], list[str]]:
    """(forward kernels, backward kernels) of one unfused RoPE on a bf16 [seq, batch, heads, head_dim] tensor."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    leaf = torch.randn(seq, batch, heads, head_dim, dtype=torch.bfloat16, requires_grad=True)
    t = leaf * 1.0  # a projection's output: not a leaf
    freqs = torch.randn(seq, 1, 1, head_dim)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as fwd:
        out = _rope(t, freqs, FACTOR)
    grad = torch.randn_like(out)
    # the backward of ``t`` alone: stop at its producer
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as bwd:
        torch.autograd.grad(out, t, grad)
    return outer_kernels(fwd, KERNEL_OPS), outer_kernels(bwd, KERNEL_OPS)


def main(argv: list[str] | None = None) -> int:
    return print_kernels("python -m validation.rope_ops", __doc__.splitlines()[0], argv, count)


if __name__ == "__main__":
    sys.exit(cli_guard(main))
