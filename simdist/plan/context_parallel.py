"""Context parallelism's communication, as each ``cp_comm_type`` moves keys and values (Megatron-LM --cp-comm-type;
Transformer Engine's context-parallel attention, transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py; PyTorch's context_parallel, torch/distributed/tensor/experimental/_attention.py).

Per layer and micro-batch, on one rank holding s / cp of the sequence (2 x cp chunks, chunks r and 2cp - 1 - r:
DualChunkSwap / head-tail load balancing, so every rank does the same causal work: attention_cost.attention_parts):

- ``p2p`` (ring attention: TE AttnFuncWithCPAndKVP2P, Liu et al. 2023): the attention runs in cp steps, each on the KV
  block the rank holds while it sends that block to the next rank and receives the previous rank's (cp - 1 exchanges
  of b x s/cp x (k + v) elements, ``ring``: beside the steps' compute); each step's partial output is merged into the
  running one with its log-sum-exp. The backward passes K, V and their gradients around the ring the same way and
  accumulates dQ per step. Every rank sends to its neighbour at once, so the exchanges are the steps of a ring
  all-gather of K and V (backward: and a ring reduce-scatter of their gradients), priced as those.
- ``all_gather`` (TE AttnFuncWithCPAndKVAllGather, Llama 3, arXiv:2407.21783 sec. 3.3.2): K and V all-gathered before
  the attention ("not async, and cannot be overlapped": Megatron-LM's documentation), gathered again in backward, and
  their gradients reduce-scattered.
- ``a2a`` (Ulysses, Jacobs et al. 2023, arXiv:2309.14509; TE's a2a): all-to-alls of Q, K and V over the cp ranks trade
  the sequence split for a head split before the attention, and one of the output after it (the backward: the output
  gradient's, then Q's, K's and V's gradients'), in the layer's path; the attention itself runs over the whole
  sequence on heads / cp.

``a2a+p2p`` (a2a inside a group, p2p across: --hierarchical-context-parallel-sizes) is refused: its two groups are not
axes of simdist's mesh yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from simdist.errors import SpecError
from simdist.plan.kernel_work import CommWork, Kernel, elementwise

__all__ = ["CP_COMM_TYPES", "CpComm", "cp_comm"]

CP_COMM_TYPES = ("p2p", "all_gather", "a2a")


@dataclass(frozen=True, slots=True)
class CpComm:
    forward: tuple[CommWork, ...]
    """The forward's context-parallel collectives (``issued_after`` relative to the attention core: 0 before it,
    1 after it)."""
    backward: tuple[CommWork, ...]
    merge_forward: tuple[Kernel, ...]
    """The ring's per-step merges of partial outputs (p2p), after the core."""
    merge_backward: tuple[Kernel, ...]
    full_sequence: bool
    """The attention runs over the whole sequence on heads / cp (a2a) instead of the rank's s / cp queries."""


def cp_comm(comm_type: str, *, cp: int, tokens: int, q_width: int, kv_width: int, bpe: int, style: str) -> CpComm:
    """The context-parallel traffic of one layer's attention on one rank (``tokens``: b x s / cp; widths: this TP
    rank's Q and K (= V) columns)."""
    if cp < 2:
        return CpComm((), (), (), (), False)
    kv_block = float(tokens * 2 * kv_width * bpe)  # this rank's K and V
    if comm_type == "p2p":
        # The cp - 1 exchanges, every rank sending its block to the next at once, are the steps of a ring all-gather of
        # the whole K, V (and in backward, of the gradients' ring reduce-scatter): priced as those collectives.
        full = kv_block * cp
        fwd = (CommWork("all_gather", full, "forward", True, "cp", 1, ring=True),)
        bwd = (CommWork("all_gather", full, "backward", True, "cp", 0, ring=True),
               CommWork("reduce_scatter", full, "backward", True, "cp", 0, ring=True))
        # Each step's partial output merged with its log-sum-exp (TE: out = out * exp(lse - new) + block * ...; PyTorch
        # CP: _SDPAMerger in fp32): read the running output and the block's, write the running one.
        merge_bytes = 3 * bpe if style == "fused" else 12.0  # fp32 running output (4 + 4) and the 16-bit block (2+2)
        merges = tuple(elementwise("cp_ring_merge", tokens * q_width, merge_bytes, 4.0) for _ in range(cp - 1))
        dq = tuple(elementwise("cp_ring_dq_accumulate", tokens * q_width, merge_bytes, 1.0) for _ in range(cp - 1))
        return CpComm(fwd, bwd, merges, dq, False)
    if comm_type == "all_gather":
        full = kv_block * cp  # the nccl-tests size: the gathered output
        return CpComm((CommWork("all_gather", full, "forward", False, "cp", 0),),
                      (CommWork("all_gather", full, "backward", False, "cp", 0),
                       CommWork("reduce_scatter", full, "backward", False, "cp", 1)), (), (), False)
    if comm_type == "a2a":
        q_bytes, kv_bytes = float(tokens * q_width * bpe), float(tokens * kv_width * bpe)
        fwd = (CommWork("all_to_all", q_bytes, "forward", False, "cp", 0),
               CommWork("all_to_all", kv_bytes, "forward", False, "cp", 0),
               CommWork("all_to_all", kv_bytes, "forward", False, "cp", 0),
               CommWork("all_to_all", q_bytes, "forward", False, "cp", 1))
        bwd = (CommWork("all_to_all", q_bytes, "backward", False, "cp", 0),
               CommWork("all_to_all", q_bytes, "backward", False, "cp", 1),
               CommWork("all_to_all", kv_bytes, "backward", False, "cp", 1),
               CommWork("all_to_all", kv_bytes, "backward", False, "cp", 1))
        return CpComm(fwd, bwd, (), (), True)
    if comm_type == "a2a+p2p":
        raise SpecError("cp_comm_type a2a+p2p (a2a inside a group, p2p across) is not modelled: its two groups are not "
                        "axes of simdist's mesh", field="training.cp_comm_type",
                        fix="use p2p, all_gather or a2a")
    raise SpecError(f"unknown cp_comm_type {comm_type!r}", field="training.cp_comm_type",
                    fix=f"write one of {', '.join(CP_COMM_TYPES)}")
