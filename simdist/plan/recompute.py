"""Activation recompute: which of a layer's forward kernels and collectives the backward redoes, under each policy.

- ``full`` (Korthikanti et al. 2022, arXiv:2205.05198 sec. 5; Megatron-Core recompute_granularity full): the layer's
  input is kept and its whole forward redone, collectives included. Which layers: every one (``uniform``: Megatron-Core
  checkpoints groups of recompute_num_layers layers, the same work), the first recompute_num_layers of each model chunk
  (``block``: Megatron-Core transformer_block.py), or every recompute_num_layers-th one (``every``: torchtitan's
  selective_ac_option N, counted per rank's blocks, torchtitan/distributed/activation_checkpoint.py); `full_layers`.
- ``selective`` (Megatron-Core recompute_modules, megatron/core/transformer/transformer_config.py): the modules listed,
  by default the attention core (Korthikanti sec. 5); layernorm (both norms' outputs discarded and regenerated), mlp
  (the dense MLP after its norm; MoE layers ignore it), moe (the MoE MLP), moe_act (the experts' activation),
  shared_experts, mla_up_proj (MLA's up projections and rotary concatenation).
- ``op`` (torchtitan's op-level selective checkpointing, torchtitan/distributed/activation_checkpoint.py, _save_list):
  the outputs of matmuls, attention and reduce-scatters are kept and everything else redone, except that every
  second matmul of a block (counted in the order the block calls them, as torchtitan's policy counts aten.mm) is
  redone too: of Llama's wq, wk, wv, wo, w1, w3, w2 the backward recomputes wk, wo and w3. simdist's fused GEMMs stand
  for several of those matmuls (`SUB_MATMULS`), and the share of each one that is redone is its recomputed sub-matmuls'.
  The tensor-parallel all-gathers (not in the save list) are redone; reduce-scatters are not. An MoE block is redone
  whole but for its all-to-alls (Assumption: torchtitan's save list keeps all_to_all_single's outputs, not the grouped
  GEMMs'). Attention outputs are kept where the policy's save list names the kernel's op
  (training.op_sac_saved_attention, `op_saves_attention`): torchtitan's names SDPA's flash and efficient ops and flex
  attention, and SDPA's cuDNN op since pytorch/torchtitan PR #2095 (2025-12-01: "add all SDPA backends to
  op_sac_save_list ... to avoid recomputing attention during backward", issue #2091); before it a run whose SDPA
  picked cuDNN (torchtitan put cuDNN first on B200 from 2025-08, torchtitan/models/attention.py @ 6fc499f6, and on
  every GPU in v0.2.0) ran each attention forward again in the backward. FlashAttention-3/4, Triton and materialized
  attention are no op of such a list: redone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from simdist.errors import SpecError
from simdist.plan.kernel_work import CommWork, Kernel, Pass

__all__ = ["OP_SAC_SAVED_ATTENTION", "POLICIES", "full_layers", "op_saves_attention", "recomputed"]

POLICIES = ("none", "selective", "full", "op")

OP_SAC_SAVED_ATTENTION = ("flash", "efficient", "cudnn", "flex")
"""The attention kernels torchtitan's op-level policy saves (its op_sac_save_list since PR #2095, 2025-12-01:
aten._scaled_dot_product_{flash,efficient,cudnn}_attention and the flex_attention higher-order op, @ 29624e37 and
torchtitan/distributed/activation_checkpoint.py since #2357): training.op_sac_saved_attention's default."""


def op_saves_attention(family: str, saved: Sequence[str]) -> bool:
    """Whether the op policy keeps the output of attention kernel ``family`` (simdist.hardware.attention.kernel_family:
    flash2, cudnn, ...) given its save list ``saved`` (training.op_sac_saved_attention; flash is flash2)."""
    return family in {"flash2" if k == "flash" else k for k in saved}


def full_layers(method: str | None, num_layers: int | None, n: int) -> int:
    """How many of a model chunk's ``n`` layers full recompute redoes, under ``method`` with ``num_layers``."""
    if method in (None, "uniform"):
        return n
    if num_layers is None:
        raise SpecError(f"recompute_method {method} needs recompute_num_layers", field="training.recompute_num_layers",
                        fix="give recompute_num_layers")
    if method == "block":
        return min(num_layers, n)
    if method == "every":
        return n // num_layers
    raise SpecError(f"unknown recompute_method {method!r}", field="training.recompute_method",
                    fix="write uniform, block or every")


def _tag_of_comm(c: CommWork, tags: Sequence[str]) -> str:
    if c.axis == "cp":
        return "core_attn"
    i = min(c.issued_after, len(tags) - 1)
    return tags[i] if tags else ""


def _scaled(k: Kernel, share: float) -> Kernel:
    """``share`` of a GEMM kernel's columns (its recomputed sub-matmuls)."""
    m, n, kk = k.gemm_mnk or (1, 1, 1)
    return dataclasses.replace(k, name=f"{k.name}_part", flops=k.flops * share, hbm_bytes=k.hbm_bytes * share,
                               gemm_mnk=(m, max(1, round(n * share)), kk),
                               useful_flops=None if k.useful_flops is None else k.useful_flops * share)


def _op_policy(fwd: Pass, tags: Sequence[str], sub_matmuls: dict[str, tuple[int, ...]], keep_attention: bool = True
               ) -> tuple[list[Kernel], list[CommWork]]:
    redo: list[Kernel] = []
    count = 0
    for k, tag in zip(fwd.kernels, tags, strict=True):
        if tag in ("moe", "moe_act", "shared_experts"):
            redo.append(k)  # the MoE block: redone whole (module docstring)
        elif k.kind == "gemm":
            widths = sub_matmuls.get(k.name, (1,))
            again = 0
            for w in widths:
                count += 1
                if count % 2 == 0:
                    again += w
            if again:
                redo.append(k if again == sum(widths) else _scaled(k, again / sum(widths)))
        elif k.kind == "memory" or (k.kind == "attention" and not keep_attention):
            redo.append(k)
        # attention kernels in the save list: their outputs (and log-sum-exp) are kept
    comm = [c for c in fwd.comm if c.op == "all_gather" and c.axis in ("tp", "etp")]
    return redo, comm


def _read_by_backward(fwd: Pass, tags: Sequence[str]) -> int:
    """The index of a layer's dense MLP's last GEMM (its down projection), whose output, reduce-scatter and residual add
    no gradient reads (`recomputed`); the count of its forward kernels where it does not end in a dense MLP."""
    last = max((i for i, (k, tag) in enumerate(zip(fwd.kernels, tags, strict=True))
                if tag == "mlp" and k.kind == "gemm"), default=None)
    if last is None or any(tag not in ("mlp", "residual") for tag in tags[last:]):
        return len(fwd.kernels)
    return last


def recomputed(mode: str, fwd: Pass, tags: Sequence[str], modules: Sequence[str],
               sub_matmuls: dict[str, tuple[int, ...]], compiled: bool = False, early_stop: bool = False,
               keep_attention: bool = True) -> tuple[tuple[Kernel, ...], list[CommWork]]:
    """(the kernels the backward redoes, the collectives it redoes, marked recompute) of a layer whose forward is
    ``fwd``, each kernel tagged with its module (``tags``: norm, attn, core_attn, mla_up_proj, residual, mlp, moe,
    moe_act, shared_experts); ``compiled``: the layer runs under torch.compile (full recompute redoes only what the
    backward reads); ``early_stop``: eager full recompute stops once every tensor the backward saved is back;
    ``keep_attention``: the op policy saves the attention kernel's output (`op_saves_attention`)."""
    if mode == "none":
        return (), []
    if mode == "full":
        # Checkpointed layer input, whole forward redone before the backward (Korthikanti sec. 5), including its
        # collectives (the expert all-to-alls with their imbalance).
        if compiled or early_stop:
            # Under torch.compile the checkpointed block is one graph whose backward the partitioner builds from what
            # the gradients read: the dense MLP's down-projection GEMM, the reduce-scatter of its output and the
            # residual add are not redone (measured: torch 2.13 Inductor, a two-rank gloo DTensor block with full
            # activation checkpointing runs 6 of its 7 projections' matmuls again and 1 of its 2 reduce-scatters;
            # validation/tp_plan_check.py). Eagerly, torch.utils.checkpoint's non-reentrant recompute with early
            # stop (torch's default) runs the forward again until the last tensor the backward saved is packed, the
            # down projection's input, which that GEMM packs as it runs: the GEMM is redone, its reduce-scatter and
            # the residual add are not (measured: 12 all-gathers and 8 reduce-scatters, the same script).
            # Assumption: the fp8 casts before that GEMM are still redone (a few per cent of it).
            cut = _read_by_backward(fwd, tags)
            return (tuple(fwd.kernels[:cut if compiled else cut + 1]),
                    [dataclasses.replace(c, phase="backward", recompute=True) for c in fwd.comm
                     if c.issued_after <= cut])
        return tuple(fwd.kernels), [dataclasses.replace(c, phase="backward", recompute=True) for c in fwd.comm]
    if mode == "op":
        redo, comm = _op_policy(fwd, tags, sub_matmuls, keep_attention)
        return tuple(redo), [dataclasses.replace(c, phase="backward", recompute=True, issued_after=0) for c in comm]
    if mode != "selective":
        raise SpecError(f"unknown recompute mode {mode!r}", field="training.recompute",
                        fix=f"write one of {', '.join(POLICIES)}")
    wanted = {"layernorm" if m == "layernorm" else m for m in modules}
    want_tag = {"core_attn": "core_attn", "layernorm": "norm", "mlp": "mlp", "moe": "moe", "moe_act": "moe_act",
                "shared_experts": "shared_experts", "mla_up_proj": "mla_up_proj"}
    keep_tags = {want_tag[m] for m in wanted}
    if "moe" in wanted:
        keep_tags |= {"moe_act", "shared_experts"}
    kept = [tag in keep_tags for tag in tags]
    redo = tuple(k for k, keep in zip(fwd.kernels, kept, strict=True) if keep)
    comm = []
    for c in fwd.comm:
        tag = _tag_of_comm(c, tags)
        if tag in keep_tags:
            if tag == "core_attn":
                # Korthikanti sec. 5 with context parallelism: the attention core gathers K and V again.
                comm.append(dataclasses.replace(c, phase="backward", recompute=True, overlappable=True,
                                                issued_after=0))
            else:  # issued after as many of the redone kernels as preceded it in the forward
                comm.append(dataclasses.replace(c, phase="backward", recompute=True,
                                                issued_after=sum(kept[:c.issued_after])))
    return redo, comm
