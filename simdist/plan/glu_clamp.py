"""A routed expert's clamped gated activation (GPT-OSS) as Megatron-Core runs it: the clamp in eager PyTorch before
the fused activation.

GPT-OSS clamps the two halves of each expert's fc1 output before its gated activation (OpenAI's reference
``swiglu(x, limit=7.0)``: the gate at most 7, the linear half within [-7, 7]; Hugging Face ``swiglu_limit``).
Megatron-Core takes the limit as ``activation_func_clamp_value`` (Megatron-LM ``--activation-func-clamp-value``;
Megatron-Bridge's GPT-OSS bridge sets 7.0, with ``bias_activation_fusion``, quick-GELU and ``glu_linear_offset``
1.0). Its grouped experts (TEGroupedMLP.bias_act_func) then call ``weighted_bias_quick_geglu_impl``, which clamps
before the fused (torch.compile'd) activation, outside it (Megatron-LM megatron/core/fusions/fused_bias_geglu.py,
added by 2e29a5e1 "Add quick geglu activation for gpt-oss", 2025-09-09; the same at 2edffadb, 2026-05-16, the
Megatron-LM of Megatron-Bridge v0.4.2, the release of the 26.04.01 performance table):

    x_glu, x_linear = input.chunk(2, -1)
    input = torch.cat((x_glu.clamp(min=None, max=v), x_linear.clamp(min=-v, max=v)), -1)

For rows x f elements a half (fc1's output [rows, 2f] in the activations' dtype, 2 bytes under bf16), forward, three
kernels (the chunk's halves are views):

    x_glu.clamp       a half read, its clamp written                  2 x 2 bytes an element of the half
    x_linear.clamp    the same                                        2 x 2
    cat               both clamped halves read and written            2 x (2 + 2)        16 bytes in all

and autograd's backward (PyTorch's clamp_backward, torch/csrc/autograd/FunctionsManual.cpp: ``where((self >= min)
.logical_and_(self <= max), grad, zero)`` with ``zero = at::scalar_tensor(0)``, which on a GPU is a one-element
fill; with only ``max``, ``where(self <= max, grad, zero)``; the cat's backward narrows its gradient, no kernel; the
chunk's concatenates the two halves' gradients):

    x_linear: fill, ge (input read, a bool written: 2 + 1), le (2 + 1), logical_and (1 + 1 + 1), where (1 + 2 + 2)
    x_glu:    fill, le (2 + 1), where (1 + 2 + 2)
    chunk's backward: cat of the two gradients (2 x (2 + 2))                            30 bytes in all, 9 kernels

``python -m validation.glu_clamp_ops`` lists the ATen kernels torch runs for it (tests/test_glu_clamp.py compares).
Under ``recompute_modules: [moe_act]`` the clamp reruns with the activation (Megatron-Core checkpoints
``bias_act_func`` whole); without it autograd keeps fc1's output for the clamps' backward beside the clamped copy the
activation saves (simdist.plan.activations).

# Assumption: the clamp's kernels run at the element-wise streaming rate of any other memory-bound kernel (their
# halves are strided views, each row's half contiguous: f elements); the one-element fills are priced as launches.
"""

from __future__ import annotations

from simdist.plan.kernel_work import Kernel, elementwise

__all__ = ["clamp_kernels"]


def clamp_kernels(elements: float, bpe: int, useful_share: float | None = None) -> tuple[list[Kernel], list[Kernel]]:
    """(forward, backward) kernels of the clamp on ``elements`` elements a half (rows x f), ``bpe`` bytes an element
    (the module docstring); the boolean masks are 1 byte an element."""
    def kernel(name: str, nbytes: float, count: float = elements, flops: float = 1.0) -> Kernel:
        return elementwise(f"expert_clamp_{name}", count, nbytes, flops, useful_share=useful_share)

    forward = [kernel("gate", 2 * bpe), kernel("linear", 2 * bpe), kernel("cat", 2 * bpe, 2 * elements, 0.0)]
    backward = [
        kernel("linear_zero", 0.0, 1.0, 0.0), kernel("linear_ge", bpe + 1), kernel("linear_le", bpe + 1),
        kernel("linear_and", 3.0), kernel("linear_where", 2 * bpe + 1),
        kernel("gate_zero", 0.0, 1.0, 0.0), kernel("gate_le", bpe + 1), kernel("gate_where", 2 * bpe + 1),
        kernel("split_grad", 2 * bpe, 2 * elements, 0.0),
    ]
    return forward, backward
