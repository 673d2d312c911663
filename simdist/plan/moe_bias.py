"""A routed expert's fc2 bias as Megatron-Core adds it: per local expert, in eager PyTorch, weighted by each row's
router probability.

With biases on the linear layers (model.add_bias_linear; GPT-OSS) Megatron-Core's grouped experts (TEGroupedMLP)
let Transformer Engine's GroupedLinear add fc1's bias in its GEMMs' epilogue (skip_bias_add False; its gradient comes
out of the grouped weight-gradient GEMM, transformer_engine/pytorch/module/grouped_linear.py), but take fc2's bias
back (skip_bias_add True) and add it after the GEMM, scaled by the row's probability, in ``_apply_bias``
(Megatron-LM megatron/core/transformer/moe/experts.py, added by a329dd6d "Enable bias in expert mlp [gpt-oss 5/5]",
2025-09-22; the same code at 09cce75b, the last change before 2026-04-01, what Megatron-Bridge's 26.04 containers
run):

    torch.cat([t + b * p for t, b, p in zip(split(out, tokens_per_expert), biases, split(probs, tokens_per_expert))])
        .view(shape).to(out.dtype)

For the n_i rows of local expert i (h wide; out in the activations' dtype, 2 bytes under bf16; p of the router's
dtype, q bytes: training.moe_router_dtype, the hidden states' bf16 by default), forward:

    b * p          a [n_i, h] tensor of the promoted dtype (w = max(2, q) bytes) written         w bytes an element
    t + (b * p)    t read, the product read, the sum written (w)                                  2 + 2w
    cat            every expert's sum read and written once                                       2w   (one kernel)
    .to(out.dtype) a copy back to 2 bytes where w > 2, nothing where w = 2                        w + 2 (one kernel)

and autograd's backward: the cast's gradient back to w bytes (w + 2, where w > 2); per expert the sum's gradient for
t cast to t's dtype (w + 2, where w > 2), the product's for b (grad x p: 2w, then summed over the rows to b's shape:
w; its [h] sum cast to b's dtype where w > 2, one tiny kernel) and for p (grad x b: 2w, then summed over h to p's
[n_i, 1]: w); split's gradient, the t gradients concatenated (4 bytes an element, one kernel) and the p
gradients (n_i values each, one tiny kernel). Under bf16 with fp32 probabilities (w = 4): 28 bytes an element
forward and 40 backward, 2 x experts + 2 and 6 x experts + 3 kernels; with bf16 probabilities (w = 2): 12 and 16
bytes, 2 x experts + 1 and 4 x experts + 2 kernels.

Where the probabilities are wider than the outputs, the ops between the two dtypes are eager casts
(Kernel.eager_cast: simdist.hardware.compute prices them at ComputeEfficiency.eager_cast_share).

# Assumption: the per-expert kernels' rows are the busiest rank's per expert (RoutedTokens.per_expert), as the
# grouped GEMMs' are; the bias gradient's accumulation into the parameter's main_grad (one tiny add an expert,
# Megatron's DDP hook) is not priced; SequentialMLP (moe_grouped_gemm false) is not given this chain.
"""

from __future__ import annotations

from simdist.plan.kernel_work import Kernel, elementwise

__all__ = ["fc2_bias_kernels"]


def fc2_bias_kernels(per_expert: int, num_local_experts: int, h: int, bpe: int, prob_bytes: int,
                     useful_share: float | None = None) -> tuple[list[Kernel], list[Kernel]]:
    """(forward, backward) kernels of the fc2 bias on ``num_local_experts`` experts of ``per_expert`` rows each,
    ``h`` wide, outputs of ``bpe`` bytes and probabilities of ``prob_bytes`` (the module docstring)."""
    w = max(bpe, prob_bytes)  # the promoted dtype of b * p and of the sum
    n, rows = num_local_experts, per_expert * num_local_experts
    per = per_expert * h
    cast = w > bpe

    def kernel(name: str, elements: float, nbytes: float, flops: float = 0.0, mixed: bool = False) -> Kernel:
        # mixed: an op between the 16-bit outputs and the wider dtype (Kernel.eager_cast, where they differ)
        return elementwise(f"expert_fc2_bias_{name}", elements, nbytes, flops, useful_share=useful_share,
                           eager_cast=mixed and cast)

    forward = [kernel("scale", per, w + prob_bytes / h, 1.0, True), kernel("add", per, bpe + 2 * w, 1.0, True)] * n
    forward.append(kernel("cat", rows * h, 2 * w))
    if cast:
        forward.append(kernel("cast", rows * h, w + bpe, mixed=True))
    # per expert, in autograd's order: t's gradient cast to t's dtype (where wider), d(b p) x p, its sum over the rows
    # (b's gradient), that [h] sum cast to b's dtype (where wider), d(b p) x b and its sum over h (p's gradient)
    per_expert_grads = [
        *([kernel("add_grad", per, w + bpe, mixed=True)] if cast else []),
        kernel("scale_grad", per, 2 * w + prob_bytes / h, 1.0),
        kernel("bias_reduce", per, w, 1.0),
        *([kernel("bias_cast", h, w + bpe, mixed=True)] if cast else []),
        kernel("prob_grad", per, 2 * w, 1.0),
        kernel("prob_reduce", per, w, 1.0),
    ]
    backward = [kernel("cast_grad", rows * h, bpe + w, mixed=True)] if cast else []
    backward += per_expert_grads * n
    backward += [kernel("split_grad", rows * h, 2 * bpe), kernel("prob_split_grad", rows, 2 * prob_bytes)]
    return forward, backward
