"""The small kernels Megatron-Core's router launches beside its gating GEMM and top-k: the auxiliary load-balancing
loss (the scores it is computed on, the tokens per expert, the loss and its tracker) and their backward, priced as the
launches they are.

Megatron-Core's TopKRouter (megatron/core/transformer/moe/router.py, moe_utils.py @ 2edffadb) computes, besides the
logits GEMM and the top-k routing simdist prices as its own kernels (simdist.plan.moe_cost: ``router``,
``router_topk``, ``router_topk_grad``), the scores of the auxiliary loss (a softmax and top-k over all experts),
``routing_map.sum(0)``, the loss (switch_load_balancing_loss_func), ``aux_loss / coeff`` and the tracker's
``values[layer] += loss`` (save_to_aux_losses_tracker); its backward runs MoEAuxLossAutoScaler's two ops, the autograd
nodes of each of those and the accumulation of the logits' two gradients. Counted from that source for a softmax
router with top-k selection and the default ``aux_loss`` balancing, 4096 tokens x 128 experts, bf16 logits
(Qwen3-30B-A3B on H100; the inventory's rows, citations and bytes are in docs/moe-kernel-inventory.md):

| moe_router_fusion | pass | kernels beyond simdist's | framework calls | bytes per (token, expert) |
|---|---|---:|---:|---:|
| false (ATen ops)                    | forward  | 28 | 21 | 72 |
| false                               | backward | 15 | 12 | 28 |
| true (Transformer Engine's kernels) | forward  |  6 |  5 | 16 |
| true                                | backward |  6 |  6 | 19 |

``moe_router_fusion`` (Megatron-LM --moe-router-fusion) replaces the ATen chain by Transformer Engine's fused top-k,
score-for-aux-loss and aux-loss kernels (transformer_engine/pytorch/router.py @ d0067d0). Each row is one `Kernel`
that stands for that many launches (`Kernel.launches`, `Kernel.calls`): the GPU pays a launch gap for each, the host
issues each (simdist.hardware.host), its bytes stream at the memory-bound share.
# Assumption: the same counts for every score function and load-balancing type (sigmoid scores, group-limited
# routing, an expert bias, a sequence-level loss: DeepSeek-V3's, change a kernel or two); the bytes scale with tokens x
# experts as counted at bf16 logits; moe_router_force_load_balancing's random logits (a clone and a normal_ fill of
# the logits, Megatron-Bridge's benchmark runs) are left out.
"""

from __future__ import annotations

import dataclasses

from simdist.plan.kernel_work import Kernel, elementwise

__all__ = ["AUX_LOSS_KERNELS", "aux_loss_kernels"]

AUX_LOSS_KERNELS = {
    (False, "forward"): (28, 21, 72.0),
    (False, "backward"): (15, 12, 28.0),
    (True, "forward"): (6, 5, 16.0),
    (True, "backward"): (6, 6, 19.0),
}
"""(kernels, framework calls, bytes per token x expert) of the router's auxiliary-loss chain beyond the kernels
simdist.plan.moe_cost prices itself, by (moe_router_fusion, pass): the module doc's table."""


def aux_loss_kernels(tokens: int, experts: int, fusion: bool, phase: str) -> Kernel:
    """The auxiliary-loss chain of one MoE layer's router over ``tokens`` x ``experts`` logits in ``phase`` (forward |
    backward), as one `Kernel` standing for its launches."""
    launches, calls, bytes_per = AUX_LOSS_KERNELS[fusion, phase]
    name = "router_aux_loss" if phase == "forward" else "router_aux_loss_grad"
    return dataclasses.replace(elementwise(name, tokens * experts, bytes_per, 4.0), launches=launches, calls=calls)
