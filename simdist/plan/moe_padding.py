"""The rows an FP8 grouped GEMM needs per expert, and the copies that pad them: Megatron-Core's TEGroupedMLP under
FP8 (Transformer Engine's Fp8Padding / Fp8Unpadding).

A quantized grouped GEMM takes each local expert's rows in blocks of ``align``: 32 under MXFP8, 16 under the other
FP8 recipes (Megatron-LM megatron/core/fp8_utils.py get_fp8_align_size, read by moe_utils.py
get_align_size_for_quantization; Transformer Engine's get_align_size_for_quantization). Dropless routing gives each
expert a count that is a multiple of it only by chance, so the rows are padded, in one of three places:

- **In a copy** (the alltoall and allgather dispatchers, Megatron-LM megatron/core/transformer/moe/experts.py
  TEGroupedMLP.forward at 2edffadb, the Megatron-LM of Megatron-Bridge v0.4.2): when any local expert's count is not
  a multiple, ``Fp8Padding`` copies the permuted rows into a padded buffer before fc1 (one
  ``tex.fused_multi_row_padding`` kernel: the rows read, the padded rows written, 2 x bytes an element; the rows'
  probabilities likewise, a [rows, 1] tensor) and ``Fp8Unpadding`` copies fc2's output back (after fc2's bias), one
  ``fused_multi_row_unpadding``; autograd runs each copy's inverse in backward (transformer_engine/pytorch/module/
  fp8_padding.py and fp8_unpadding.py at v2.14): four copies of rows x h a layer, two of the probabilities.
- **In the router** (``training.moe_router_padding_for_quantization``, Megatron-LM --moe-router-padding-for-
  quantization, formerly --moe-router-padding-for-fp8, with the alltoall dispatcher: token_dispatcher.py
  MoEAlltoAllTokenDispatcher.dispatch_preprocess, pad_routing_map): each rank routes extra copies of its tokens so
  that its count for every expert is a multiple; the padding rows travel in the all-to-alls and the copies are gone,
  but the rank's permuted output size is no longer static, so the host synchronizes before permutation 1.
- **In the flex dispatcher's permute** (DeepEP: permute(..., align_size), HybridEP: pad_multiple): the permuted rows
  come out padded, no copy.

Expected padding: a count that is a random multiple of nothing in particular is short of the next multiple of
``align`` by (align - 1) / 2 on average; a local expert's GEMM gets that many rows more (its own count padded), or,
padded in the router, ep x etp times that (every source rank's count padded, then gathered over expert-TP), and each
rank sends num_experts x (align - 1) / 2 rows more.

# Assumption: counts are uniform modulo align (dropless routing, force-balanced or learned); SequentialMLP
# (moe_grouped_gemm false), which pads expert by expert, is not given these rows; the padding rows' share of the
# saved activations (under 1 % of the rows here) is not counted in memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simdist.plan.kernel_work import Kernel, elementwise

if TYPE_CHECKING:  # expert_parallel reads this module's rules for its token counts
    from simdist.plan.expert_parallel import ExpertParallel

__all__ = ["align_rows", "copies_padding", "padding_kernels", "router_pads"]

DISPATCHERS_THAT_COPY = frozenset({"alltoall", "allgather"})
"""Dispatchers whose permuted rows reach TEGroupedMLP unpadded (the flex dispatcher's permute pads them)."""


def align_rows(recipe: str | None) -> int:
    """Rows a quantized grouped GEMM takes per expert in one block: 32 under MXFP8, 16 under the other FP8 recipes, 1
    without FP8 (no padding)."""
    if recipe is None:
        return 1
    return 32 if recipe == "mxfp8" else 16


def router_pads(recipe: str | None, experts: ExpertParallel) -> bool:
    """Whether the router pads each rank's routing map under ``recipe`` (the alltoall dispatcher's
    pad_routing_map, where ``experts.padding_for_quantization``)."""
    return recipe is not None and experts.padding_for_quantization and experts.dispatcher == "alltoall"


def copies_padding(recipe: str | None, experts: ExpertParallel) -> bool:
    """Whether TEGroupedMLP pads the rows in copies (Fp8Padding / Fp8Unpadding) under ``recipe``: FP8 grouped experts
    behind a dispatcher that leaves them unpadded, without the router's padding."""
    return (recipe is not None and experts.grouped_gemm and experts.dispatcher in DISPATCHERS_THAT_COPY
            and not router_pads(recipe, experts))


def padding_kernels(rows: float, h: int, bpe: int, prob_bytes: int, useful_share: float | None = None
                    ) -> tuple[list[Kernel], list[Kernel], list[Kernel], list[Kernel]]:
    """The copies of ``rows`` routed rows of ``h`` (``bpe`` bytes an element; probabilities of ``prob_bytes``):
    (before fc1, after fc2, their gradients at the start of the experts' backward, at its end), as the module
    docstring lists them."""
    def copy(name: str, elements: float, nbytes: float) -> Kernel:
        return elementwise(f"moe_fp8_{name}", elements, 2 * nbytes, 0.0, useful_share=useful_share)

    before = [copy("pad", rows * h, bpe), copy("pad_probs", rows, prob_bytes)]
    after = [copy("unpad", rows * h, bpe)]
    first_grads = [copy("unpad_grad", rows * h, bpe)]
    last_grads = [copy("pad_probs_grad", rows, prob_bytes), copy("pad_grad", rows * h, bpe)]
    return before, after, first_grads, last_grads
