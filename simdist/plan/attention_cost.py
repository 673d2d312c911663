"""The attention half of a decoder layer on one GPU: its input norm, the Q/K/V projections (multi-head or grouped-
query attention, or DeepSeek's multi-latent attention), QK-norm, rotary embeddings, the attention core (materialized
or a fused kernel; full, causal or sliding-window) and the output projection, with their tensor- and context-parallel
collectives, forward and backward.

Megatron-LM's layer (Shoeybi et al. 2019, arXiv:1909.08053 sec. 3; Korthikanti et al. 2022, arXiv:2205.05198 sec. 4):
column-parallel QKV, row-parallel projection, the f/g operators (forward all-reduce after the row-parallel GEMM,
backward all-reduce of the column-parallel GEMM's input gradient, overlapping the weight-gradient GEMM); sequence
parallelism replaces each all-reduce by an all-gather and a reduce-scatter of the same buffer (Korthikanti sec. 4.2.2).

Multi-latent attention (DeepSeek-V2, arXiv:2405.04434 sec. 2.1.2-2.1.3; DeepSeek-V3, arXiv:2412.19437 sec. 2.1.1;
Megatron-LM megatron/core/transformer/multi_latent_attention.py, MLASelfAttention): the down projections
h -> q_lora_rank and h -> kv_lora_rank + qk_pos_emb_head_dim are duplicated on every TP peer (TELinear
parallel_mode "duplicated") and run on the peer's own tokens (b s / tp under sequence parallelism); their latents are
RMS-normed (q_layernorm, kv_layernorm), all-gathered over the TP group under sequence parallelism, and projected up
column-parallel: Q to heads x (qk_head_dim + qk_pos_emb_head_dim), K's and V's no-position part to
heads x (qk_head_dim + v_head_dim); the rotary part of K is one head wide, shared by every head. Attention runs with
QK head dim qk_head_dim + qk_pos_emb_head_dim and V head dim v_head_dim.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simdist.plan.context_parallel import cp_comm
from simdist.plan.elementwise import ew
from simdist.plan.kernel_work import (
    AttentionShape,
    Kernel,
    LayerShape,
    Pass,
    elementwise,
    fp8_weight_cast,
    gemm,
    gemm_grads,
)
from simdist.plan.model import Model
from simdist.plan.tp_plan import column_projections, forward_gathers, input_reductions, layout_copy


@dataclass(frozen=True, slots=True)
class AttentionBlock:
    forward: Pass
    backward: Pass
    core: tuple[Kernel, ...]
    """The attention core's forward kernels (what selective recompute redoes)."""
    extra_hardware_flops: float
    """FLOPs the kernels execute beyond the model-FLOP convention's 2x forward in backward (a fused kernel's
    recomputed QK^T)."""
    kv_gather_bytes: float
    """The whole sequence's K and V on one TP rank (0 without context parallelism)."""


def attention_parts(causal: bool, cp: int, s_q: int) -> tuple[tuple[float, bool, float], ...]:
    """(share of the attention FLOPs, causal, sequence length) of one context-parallel rank's attention work.

    Megatron-LM's context parallelism splits the sequence into 2 x cp chunks and gives rank r chunks r and
    2cp - 1 - r (megatron/core/... get_batch_on_this_cp_rank; Transformer Engine's ring attention), so every rank
    does the same causal work: with chunk length c, query chunk j attends to c^2 (j + 1/2) keys, and ranks hold
    c^2 (r + 1/2 + 2cp - 1 - r + 1/2) = 2cp c^2 = s_q s / 2 each, exactly 1/cp of the causal total. Of its cp ring
    steps one is causal (its own two chunks, s_q x s_q / 2 = 1/cp of its work) and cp - 1 attend without a mask to
    half a block each (Transformer Engine's AttnFuncWithCPAndKVP2P).
    """
    if not causal:
        return ((1.0, False, float(s_q)),)
    if cp == 1:
        return ((1.0, True, float(s_q)),)
    return ((1.0 / cp, True, float(s_q)), ((cp - 1) / cp, False, float(s_q)))


def window_share(seq_length: int, window: int) -> float:
    """Share of the s x s score matrix a causal sliding window of ``window`` keys per query computes.

    Query i attends to the min(i, W) keys before it (Megatron-LM --window-size (W, 0), FlashAttention's
    window_size=(W, 0)); in the continuous form of the causal convention (s^2 / 2 for a full causal mask) the band
    is s W - W^2 / 2 scores, s^2 / 2 when W reaches s.
    """
    s, w = float(seq_length), float(min(window, seq_length))
    return (s * w - w * w / 2.0) / (s * s)


def attention_block(model: Model, shape: LayerShape, *, attention: str, causal: bool, window: bool,
                    recompute: str, cp_comm_type: str = "p2p") -> AttentionBlock:
    """The attention half of one layer (its norm, projections, core, output projection; no residual)."""
    b, s_q, s_k, tp, cp, bpe = shape.micro_batch_size, shape.seq_q, shape.seq_k, shape.tp, shape.cp, shape.bpe
    h, m = model.hidden_size, shape.tokens
    fp8 = shape.fp8
    a_l = model.num_attention_heads // tp
    sp = shape.sequence_parallel
    resid = m * h // tp if sp else m * h  # Korthikanti sec. 4.2.2: LN/dropout split by t
    scores = float(b * a_l * s_q * s_k)  # elements of QK^T on this GPU (the full count, as Narayanan eq. (3))
    # Model FLOPs count the unmasked half under a causal mask (zig-zag CP keeps every rank at exactly half); a
    # sliding window counts its band (Assumption: context parallelism splits the band evenly too).
    counted = (window_share(model.seq_length, model.window_size) if window and causal else 0.5) if causal else 1.0
    if model.multi_latent_attention:
        d_qk, d_v = model.qk_head_dim + model.qk_pos_emb_head_dim, model.v_head_dim
        q_l, k_l, v_l = a_l * d_qk, a_l * d_qk, a_l * d_v  # Q, K, V widths on this GPU (every head has its K, V)
        out_l = v_l
    else:
        d_qk = d_v = model.head_dim
        kv_l = max(model.num_query_groups // tp, 1) * d_qk  # KV heads replicated when tp exceeds them
        q_l, k_l, v_l = a_l * d_qk, kv_l, kv_l
        out_l = q_l

    style = shape.style
    fwd, bwd = Pass("forward"), Pass("backward")
    fwd.add(*ew(shape.norm, resid, bpe, style))
    bwd_qkv = Pass("backward")  # the projections' backward, run after the core's
    if model.multi_latent_attention:
        _mla_projections(model, shape, fwd, bwd_qkv, a_l)
    else:
        projections = column_projections("attention", swiglu=model.swiglu)
        if tp > 1 and sp:
            for _ in range(forward_gathers(shape.tp_inputs, projections, compiled=style == "compiled")):
                fwd.issue("all_gather", m * h * bpe).add(*layout_copy("all_gather", shape, m * h * bpe))
        fwd.add(*shape.casts("qkv", m * h), *fp8_weight_cast("qkv", h * (q_l + 2 * k_l), shape),
                gemm("qkv", m, q_l + 2 * k_l, h, bpe, fp8))
        # Megatron-Core's split of the QKV output under the QK-norm, with Transformer Engine's modules (fused style)
        split, split_grad = (_te_split(model, tp, m, q_l, k_l, bpe) if model.qk_layernorm and style == "fused"
                             else ([], []))
        if model.qk_layernorm:
            # Qwen3 / OLMo 2: RMSNorm over each head of Q and K (Megatron-LM q_layernorm / k_layernorm).
            fwd.add(*split, *ew("qk_norm", m * (q_l + k_l), bpe, style, per_tensor=2))
        # RoPE: Megatron-Core runs it unfused where YaRN scales cos and sin (GPT-OSS), else as its style does
        rope = "rotary_unfused" if style == "fused" and model.rotary_concentration != 1.0 else "rotary"
        if model.swiglu:
            fwd.add(*ew(rope, m * (q_l + k_l), bpe, style, per_tensor=2))
        if q_l > k_l and style != "fused":
            # Eager and compiled PyTorch attention materialise each K and V head for its query group before the
            # attention call (torchtitan's and Hugging Face's repeat_kv: expand + reshape, a copy q_l wide reading
            # k_l); the backward sums each group's copies. Transformer Engine's kernels read the groups directly.
            rep = k_l / q_l
            for t in ("k", "v"):
                fwd.add(elementwise(f"repeat_kv_{t}", m * q_l, bpe * (1 + rep), 0.0))
                bwd_qkv.add(elementwise(f"repeat_kv_{t}_grad", m * q_l, bpe * (1 + rep), 1.0))
        if model.swiglu:
            bwd_qkv.add(*ew(f"{rope}_grad", m * (q_l + k_l), bpe, style, per_tensor=2))
        if model.qk_layernorm:
            bwd_qkv.add(*ew("qk_norm_grad", m * (q_l + k_l), bpe, style, per_tensor=2), *split_grad)
        bwd_qkv.add(*shape.casts("qkv_grad", m * (q_l + 2 * k_l)))
        dgrad, wgrad = gemm_grads("qkv", m, q_l + 2 * k_l, h, bpe, fp8)
        bwd_qkv.add(dgrad)
        if tp > 1:
            for _ in range(input_reductions(shape.tp_inputs, projections)):
                bwd_qkv.add(*layout_copy("reduce_scatter", shape, m * h * bpe))
                bwd_qkv.issue("reduce_scatter" if sp else "all_reduce", m * h * bpe, overlappable=True)
        bwd_qkv.add(wgrad)
    cpc = cp_comm(cp_comm_type, cp=cp, tokens=m, q_width=q_l, kv_width=(k_l + v_l) // 2, bpe=bpe, style=style)
    core, core_bwd, extra = _core(shape, attention, causal, window, counted, scores, d_qk, d_v, q_l, k_l, v_l,
                                  model.window_size, cpc.full_sequence)
    # the context-parallel collectives before (issued_after 0) and after (1) the attention core, and the ring's
    # merges after it (simdist.plan.context_parallel)
    fwd.comm += [dataclasses.replace(c, issued_after=len(fwd.kernels)) for c in cpc.forward if c.issued_after == 0]
    fwd.add(*core, *cpc.merge_forward)
    fwd.comm += [dataclasses.replace(c, issued_after=len(fwd.kernels)) for c in cpc.forward if c.issued_after == 1]
    fwd.add(*ew("attention_layout", m * out_l, bpe, style))
    fwd.add(*shape.casts("projection", m * out_l), *fp8_weight_cast("projection", out_l * h, shape),
            gemm("projection", m, h, out_l, bpe, fp8))
    if tp > 1:
        fwd.add(*layout_copy("reduce_scatter", shape, m * h * bpe))
        fwd.issue("reduce_scatter" if sp else "all_reduce", m * h * bpe)

    if tp > 1 and sp:
        bwd.issue("all_gather", m * h * bpe).add(*layout_copy("all_gather", shape, m * h * bpe))
    bwd.add(*shape.casts("projection_grad", m * h), *gemm_grads("projection", m, h, out_l, bpe, fp8))
    bwd.add(*ew("attention_layout_grad", m * out_l, bpe, style))
    bwd.comm += [dataclasses.replace(c, issued_after=len(bwd.kernels)) for c in cpc.backward if c.issued_after == 0]
    bwd.add(*core_bwd, *cpc.merge_backward)
    bwd.comm += [dataclasses.replace(c, issued_after=len(bwd.kernels)) for c in cpc.backward if c.issued_after == 1]
    bwd.then(bwd_qkv)
    bwd.add(*ew(f"{shape.norm}_grad", resid, bpe, style))
    kv_full = float(b * s_k * (k_l + v_l) * bpe) if cp > 1 else 0.0
    return AttentionBlock(fwd, bwd, tuple(core), extra, kv_full)


def _te_split(model: Model, tp: int, m: int, q_l: int, k_l: int, bpe: int) -> tuple[list[Kernel], list[Kernel]]:
    """(forward, backward) kernels of Megatron-Core's split of the QKV GEMM's output where the QK-norm is on, with
    Transformer Engine's modules. Forward, the copies of Q, K and V: the query's reshape from [s, b, groups,
    heads/group x d] to [s, b, heads, d] copies wherever a rank holds several groups of several heads (its strided view
    cannot be reshaped), TE's RMSNorm makes K contiguous, and TE's attention, finding Q, K and V in no layout it takes,
    makes V contiguous; backward, dq, dk and dv concatenated into the QKV GEMM's output gradient
    (megatron/core/transformer/attention.py get_query_key_value_tensors @ 2edffadb; transformer_engine/pytorch/ops/
    basic/rmsnorm.py, attention/dot_product_attention/utils.py get_qkv_layout @ d0067d0; docs/moe-kernel-inventory.md).
    # Assumption: priced only where the QK-norm is on (the case counted); without it the A100 constants' fit on
    # Korthikanti et al.'s layer times holds what a split costs."""
    groups = max(model.num_query_groups // tp, 1)
    heads = model.num_attention_heads // tp
    q_copy = [elementwise("query_reshape_copy", m * q_l, 2 * bpe, 0.0)] if 1 < groups < heads else []
    return ([*q_copy, elementwise("key_contiguous", m * k_l, 2 * bpe, 0.0),
             elementwise("value_contiguous", m * k_l, 2 * bpe, 0.0)],
            [elementwise("qkv_split_grad_cat", m * (q_l + 2 * k_l), 2 * bpe, 0.0)])


def _core(shape: LayerShape, attention: str, causal: bool, window: bool, counted: float, scores: float,
          d_qk: int, d_v: int, q_l: int, k_l: int, v_l: int, window_size: int, full_sequence: bool = False
          ) -> tuple[list[Kernel], list[Kernel], float]:
    """The attention core's forward and backward kernels and the fused backward's extra (hardware-only) FLOPs.

    QK^T costs 2 x scores x d_qk, the product with V 2 x scores x d_v (equal head dims: 4 x scores x d, Narayanan
    eq. (3)); a fused kernel's backward computes dV = P^T dO and dP = dO V^T (2 x d_v each), dQ = dS K and
    dK = dS^T Q (2 x d_qk each) and recomputes QK^T (2 x d_qk): 2 x scores x (3 d_qk + 2 d_v), FlashAttention-2's
    2.5 x the forward when d_qk = d_v (Dao 2023, arXiv:2307.08691 sec. 3.1.2).
    """
    b, s_q, s_k, bpe, m = shape.micro_batch_size, shape.seq_q, shape.seq_k, shape.bpe, shape.tokens
    dropout = shape.dropout
    qk, pv = 2.0 * scores * d_qk, 2.0 * scores * d_v
    if attention == "materialized":
        # cuBLAS batched GEMMs compute every score; the mask is applied in the fused softmax.
        core = [
            Kernel("attention_scores", qk, (m * q_l + b * s_k * k_l + scores) * bpe, "attention",
                   (s_q, s_k, d_qk), useful_flops=qk * counted),
            # Megatron-LM's fused scale-mask-softmax: reads and writes the scores once.
            elementwise("softmax", scores, 2 * bpe, 5.0),
        ]
        if dropout:
            core.append(elementwise("dropout", scores, 2 * bpe + 1))
        core.append(Kernel("attention_over_values", pv, (scores + b * s_k * v_l + m * q_l) * bpe,
                           "attention", (s_q, d_v, s_k), useful_flops=pv * counted))
        core_bwd = [
            Kernel("attention_over_values_grad", 2.0 * pv, (2 * scores + 2 * b * s_k * v_l + 2 * m * q_l) * bpe,
                   "attention", (s_q, s_k, d_v), useful_flops=2.0 * pv * counted),
        ]
        if dropout:
            core_bwd.append(elementwise("dropout_grad", scores, 2 * bpe + 1))
        core_bwd += [
            elementwise("softmax_grad", scores, 3 * bpe, 4.0),
            Kernel("attention_scores_grad", 2.0 * qk, (2 * scores + 2 * m * q_l + 2 * b * s_k * k_l) * bpe,
                   "attention", (s_q, d_qk, s_k), useful_flops=2.0 * qk * counted),
        ]
        return core, core_bwd, 0.0
    family = "flash2" if attention == "flash" else attention
    band = 0
    if window and causal:
        # a band of min(W, s) keys per query over the whole sequence (simdist.hardware.attention.window_efficiency)
        band = min(window_size, s_k)
        parts: tuple[tuple[float, bool, float], ...] = ((1.0, True, float(s_k)),)
    elif full_sequence:
        # Ulysses (cp_comm_type a2a): the kernel runs over the whole sequence on heads / cp
        parts = ((1.0, causal, float(s_k)),)
    else:
        parts = attention_parts(causal, shape.cp, s_q)
    # Assumption: the fused kernel reads Q, K, V and writes O once (its re-reads of K, V per query block are
    # served from L2); a causal kernel skips the masked blocks, so it executes the counted FLOPs.
    a_l = q_l // d_qk
    io = (m * q_l + m * a_l * d_v + b * s_k * (k_l + v_l)) * bpe  # read Q, K, V; write O
    head_dim = max(d_qk, d_v)
    core = [Kernel("flash_attention", (qk + pv) * counted, io + 4.0 * m * a_l, "attention", (s_q, s_k, head_dim),
                   attention=AttentionShape(family, "forward", head_dim, parts, shape.attention_dtype, band))]
    core_bwd = [Kernel("flash_attention_grad", (3.0 * qk + 2.0 * pv) * counted, 2.0 * io + 4.0 * m * a_l,
                       "attention", (s_q, s_k, head_dim), attention=AttentionShape(family, "backward", head_dim,
                                                                                   parts, shape.attention_dtype,
                                                                                   band))]
    return core, core_bwd, qk * counted  # the backward's recomputed QK^T (and P): beyond 2x the forward


def _mla_projections(model: Model, shape: LayerShape, fwd: Pass, bwd: Pass, a_l: int) -> None:
    """MLA's projections after the input norm (forward, appended to ``fwd``) and their backward (``bwd``, in backward
    order: rotary, up projections, latent norms, down projections)."""
    h, m, bpe, tp, fp8 = model.hidden_size, shape.tokens, shape.bpe, shape.tp, shape.fp8
    sp = shape.sequence_parallel
    m_l = shape.local_tokens  # the duplicated down projections run on this peer's own tokens
    qr, kvr, r = model.q_lora_rank, model.kv_lora_rank, model.qk_pos_emb_head_dim
    d, dv = model.qk_head_dim, model.v_head_dim
    q_up, kv_up = a_l * (d + r), a_l * (d + dv)
    norms = model.qk_layernorm
    # forward: down projections (q: through its latent unless q_lora_rank is 0), latent norms, gathers, up projections
    # Assumption: the duplicated down projections' weight gradients, partial sums over the TP peers' tokens under
    # sequence parallelism, are all-reduced with the other sequence-parallel weights once per step (Megatron-LM
    # finalize_model_grads); that small all-reduce is not modelled.
    if qr:
        fwd.add(*shape.casts("q_down", m_l * h), gemm("q_down", m_l, qr, h, bpe, fp8))
        if norms:
            fwd.add(*ew("rmsnorm", m_l * qr, bpe, shape.style))
    fwd.add(*shape.casts("kv_down", m_l * h), gemm("kv_down", m_l, kvr + r, h, bpe, fp8))
    if norms:
        fwd.add(*ew("rmsnorm", m_l * kvr, bpe, shape.style))
    q_in = qr if qr else h  # what the (column-parallel) Q projection reads
    if tp > 1 and sp:
        # The column-parallel up projections gather their sequence-parallel inputs (Korthikanti sec. 4.2.2); the
        # KV latent and the rotary key are gathered as one buffer.
        # Assumption: Megatron gathers kv_compressed (by linear_kv_up_proj) and k_pos_emb separately; one gather of
        # the same bytes here.
        fwd.issue("all_gather", m * q_in * bpe)
        fwd.issue("all_gather", m * (kvr + r) * bpe)
    fwd.add(*shape.casts("q_up", m * q_in), gemm("q_up" if qr else "q_proj", m, q_up, q_in, bpe, fp8))
    fwd.add(*shape.casts("kv_up", m * kvr), gemm("kv_up", m, kv_up, kvr, bpe, fp8))
    # RoPE on the rotary parts of Q (every head) and K (one shared head), and the concatenation into the Q and K the
    # kernel reads (Megatron-LM: torch.cat of the no-position and rotary parts; k_pos_emb expanded over the heads).
    qk_elems = m * a_l * (d + r) * 2
    fwd.add(elementwise("mla_rope_concat", qk_elems, 2 * bpe, 1.0))

    bwd.add(elementwise("mla_rope_concat_grad", qk_elems, 2 * bpe, 1.0))
    for name, n, k in (("kv_up", kv_up, kvr), ("q_up" if qr else "q_proj", q_up, q_in)):
        bwd.add(*shape.casts(f"{name}_grad", m * n))
        dgrad, wgrad = gemm_grads(name, m, n, k, bpe, fp8)
        bwd.add(dgrad)
        if tp > 1:
            # the column-parallel up projection's input gradient is a partial sum over the TP peers
            bwd.issue("reduce_scatter" if sp else "all_reduce", m * k * bpe if name != "kv_up" else m * (kvr + r) * bpe,
                      overlappable=True)
        bwd.add(wgrad)
    if norms:
        bwd.add(*ew("rmsnorm_grad", m_l * kvr, bpe, shape.style))
    bwd.add(*shape.casts("kv_down_grad", m_l * (kvr + r)), *gemm_grads("kv_down", m_l, kvr + r, h, bpe, fp8))
    if qr:
        if norms:
            bwd.add(*ew("rmsnorm_grad", m_l * qr, bpe, shape.style))
        bwd.add(*shape.casts("q_down_grad", m_l * qr), *gemm_grads("q_down", m_l, qr, h, bpe, fp8))
