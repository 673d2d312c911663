"""Activation memory: what one layer keeps for its backward pass under each recompute policy, what the embedding and
the loss keep, and how many micro-batches a pipeline stage holds at its peak (simdist.plan.memory adds model state).

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), sec. 4 and Table 2, generalised term by term (grouped-query attention, SwiGLU, fp32); the
recompute policies (simdist.plan.recompute) keep what their framework's checkpointing keeps; eager PyTorch modules keep
the intermediates autograd saves (`eager_saved_bytes`). How many micro-batches a stage holds follows the pipeline
schedules (Narayanan et al. 2021, arXiv:2104.04473, sec. 2.2; Qi et al. 2023, arXiv:2401.10241).
"""

from __future__ import annotations

import math

from simdist.errors import LayoutError, SpecError
from simdist.plan.expert_parallel import ExpertParallel, expected_destination_ranks
from simdist.plan.model import Model

RECOMPUTE = ("none", "selective", "full", "op")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v", "dualpipe", "dualpipev")

# Assumption: fp8 training (Transformer Engine) keeps bf16 activations, bf16 weights and fp32 master state;
# the fp8 copies are transient casts, so fp8 is costed as bf16.
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
MASK_BYTES = 1  # Korthikanti sec. 4.1: a dropout mask is one byte per element.
LOGITS_BYTES = 4  # Korthikanti sec. 4.3: the cross-entropy keeps the logits in 32-bit floating point.


def check_choice(value: str, valid: tuple[str, ...], field: str) -> None:
    if value not in valid:
        raise SpecError(f"unknown value '{value}'", field=field, fix=f"use one of: {', '.join(valid)}")


def check_positive(value: float, field: str) -> None:
    if not value >= 1:
        raise LayoutError(f"{field.rsplit('.', 1)[-1]} = {value} must be at least 1", field=field,
                          fix="use a positive integer")


def activation_kind(model: Model, layer: int) -> int:
    """The first layer whose activations equal layer ``layer``'s (same MLP kind: MoE or dense)."""
    if model.kind != "decoder":
        return 0
    flags = model.moe_layer_flags()
    return flags.index(flags[layer])


def activation_bytes_per_layer(
    model: Model,
    *,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
    micro_batch_size: int = 1,
    recompute: str = "none",
    precision: str = "bf16",
    attention: str = "materialized",
    layer: int = 0,
    experts: ExpertParallel | None = None,
    modules: tuple[str, ...] = ("core_attn",),
    style: str = "fused",
    fp8_attention: bool = False,
    op_keeps_attention: bool = True,
) -> float:
    """Bytes one layer (``layer``, 0-based: MoE or dense, by Model.moe_layer_flags) keeps for its backward pass, for
    one micro-batch, on one GPU.

    ``recompute``: none; selective, whose ``modules`` (Megatron-Core recompute_modules: simdist.plan.recompute) are
    not kept: core_attn the score terms (Korthikanti's selective), layernorm the two norms' outputs (the QKV and first
    MLP matmuls' inputs), mlp the dense MLP's tensors after its input, moe the MoE MLP's, moe_act the experts'
    activation outputs, shared_experts the shared experts', mla_up_proj MLA's Q, K, V; full, the layer's input only;
    op (torchtitan's op-level policy): the block's input and the outputs of the matmuls it keeps (wq, wv, w1 and w2 of
    a Llama block: every second matmul is recomputed), of the attention (and its log-sum-exp; not where
    ``op_keeps_attention`` is False: its save list does not name the attention's op) and of the reduce-scatters.
    ``style`` eager: autograd also keeps the fp32 intermediates of the eager modules
    (`eager_saved_bytes`).

    An MoE layer keeps, in place of the dense MLP's tensors: the router's fp32 scores and routing map (T x experts),
    each local expert's fc1 input, fc1 output and fc2 input for the busiest rank's rows (simdist.plan.moe_cost:
    T x topk x etp x min(imbalance, capacity)) with each row's fp32 probability (the experts' activation weights the
    rows since Megatron-LM !2668, April 2025, so the unpermutation keeps nothing: before it, the expert outputs, T x
    topk x h, were kept for the probabilities' gradient), and the shared experts' tensors as a dense MLP of their
    width. Multi-latent attention keeps Q and K (heads x (qk_head_dim + qk_pos_emb_head_dim)), V and the projection
    input (heads x v_head_dim), and its two latents' norm and up-projection inputs.

    ``fp8_attention`` (under fp8): Transformer Engine's FP8 DotProductAttention keeps its Q, K and V for backward as
    the fp8 copies its kernel read, 1 byte an element (transformer_engine/pytorch/attention/dot_product_attention/
    backends.py, FusedAttnFunc.forward: fp8_tensors = (q_fp8, k_fp8, v_fp8, ...); the scales, 1 per tensor or per 32
    elements, not counted); the projection's input stays as the linear keeps it.

    A fused ``attention`` kernel (flash = flash2, flash3, cudnn; Dao et al. 2022, arXiv:2205.14135 sec. 3.1):
    the a x s x s scores are never stored; the backward recomputes them from Q, K, V and the per-row softmax
    statistics (fp32, a x s per sequence), so "none" keeps what selective recompute keeps plus those statistics.

    Korthikanti et al. 2022 (arXiv:2205.05198) sec. 4.1, eq. (1): sbh(34 + 5as/h) without parallelism;
    eq. (2) tensor parallel: sbh(10 + 24/t + 5as/(ht)); eq. (4) tensor + sequence parallel: sbh/t (34 + 5as/h);
    sec. 4.2.2 / Table 2: selective recompute drops the 5as/h term; full recompute keeps 2sbh (2sbh/t with SP).
    """
    check_choice(recompute, RECOMPUTE, "training.recompute")
    check_choice(precision, PRECISIONS, "training.precision")
    check_positive(tp, "parallel.tp")
    check_positive(cp, "parallel.cp")
    check_positive(micro_batch_size, "training.micro_batch_size")
    e = ELEMENT_BYTES[precision]  # Korthikanti's "2" is the 16-bit element; fp32 scales it to 4.
    s, b, h = model.seq_length, micro_batch_size, model.hidden_size
    sbh = s * b * h
    # Korthikanti sec. 4.2.2: sequence parallelism splits the layer norm/dropout regions over the tp ranks.
    replicated_div = tp if sequence_parallel else 1
    # Assumption: context parallelism (Megatron-LM ring attention) splits every sequence-dimension activation
    # over the cp ranks: each keeps s/cp tokens, and its queries against all s keys (a s^2/cp score block).
    if recompute == "full":
        # Korthikanti sec. 4.2.1 / Table 2: only the layer input is checkpointed, 2sbh (/t with SP).
        return e * sbh / replicated_div / cp
    if recompute == "op" and model.kind == "decoder" and not model.moe_layer_flags()[layer]:
        return _op_policy_bytes(model, e, s * b, tp, replicated_div, sequence_parallel, op_keeps_attention) / cp
    if model.kind == "mlp":
        # The CS336 lecture's MLP (simdist.plan.model): per layer x @ W then GELU. Autograd keeps the matmul
        # input (b x h, replicated under tp unless SP) and the GELU input (the column-sharded output, b x h/t).
        # No attention, so selective recompute keeps the same tensors as none.
        return e * sbh * (1 / replicated_div + 1 / tp) / cp
    dropout = not model.swiglu
    # Assumption: Llama-style (SwiGLU) models train without dropout (no dropout modules in Llama; its configs
    # set attention_dropout = 0), so their dropout masks and dropout outputs are absent.
    mask = MASK_BYTES if dropout else 0
    # Korthikanti sec. 4.1, terms not split by tensor parallelism ("10 sbh" in eq. (2)): the two layer-norm
    # inputs (2sbh each), the QKV matmul input (2sbh), the MLP first matmul input (2sbh), the two dropout
    # masks after attention and after the MLP (sbh each).
    # Assumption: under fp8 training Transformer Engine's linear modules save their input for the weight gradient as
    # the fp8 copy they cast it to (transformer_engine/pytorch/module/linear.py, layernorm_linear.py: the quantized
    # input is what ctx saves), 1 byte an element (plus 1 scale per 32 or 128 elements: not counted); norms,
    # attention and the activation functions keep their 16-bit inputs.
    lin = 1 if precision == "fp8" else e
    qkv = 1 if precision == "fp8" and fp8_attention else e  # what the attention keeps of Q, K and V an element
    replicated = (2 * e + 2 * lin + 2 * mask) * sbh
    # Terms split by tensor parallelism ("24 sbh / t"): attention Q and K (4sbh), V (2sbh), the output
    # projection input (2sbh); with GQA K and V have width kv = g x head_dim instead of h, and Q and the
    # projection input width q = a x head_dim (h unless kv_channels differs). When t > g each
    # rank still holds one whole K/V group (Megatron-LM replicates the groups), hence the max.
    kv_local = max(model.kv_hidden_size / tp, float(model.head_dim))
    attention_sharded = s * b * ((qkv + lin) * model.q_hidden_size / tp + 2 * qkv * kv_local)
    mla_core = 0.0
    if model.multi_latent_attention:
        a_l = model.num_attention_heads / tp
        d_qk, d_v = model.qk_head_dim + model.qk_pos_emb_head_dim, model.v_head_dim
        latents = model.q_lora_rank + model.kv_lora_rank
        mla_core = s * b * (qkv * (2 * a_l * d_qk + a_l * d_v) + e * a_l * d_v)  # Q, K, V; the projection's input
        attention_sharded = mla_core + 2 * e * s * b * latents / replicated_div
    if model.qk_layernorm and not model.multi_latent_attention:
        attention_sharded += e * s * b * (model.q_hidden_size / tp + kv_local)  # the QK-norms' inputs
    # SwiGLU: Megatron-LM's fused swiglu (megatron/core/fusions/fused_bias_swiglu.py) saves its 2f-wide input
    # (gate and up projections) and recomputes the activation; the down projection keeps its f-wide input:
    # 3 x e x sbf. GeLU (Korthikanti sec. 4.1): GeLU input 8sbh and second matmul input 8sbh for f = 4h,
    # i.e. 2 x e x sbf.
    mlp_bytes = (2 * e if model.swiglu else e) + lin  # activation input(s), 16-bit; the down projection's input
    moe = model.moe_layer_flags()[layer]
    dropped = set(modules) if recompute == "selective" else set()
    if "moe" in dropped:
        dropped |= {"moe_act", "shared_experts"}
    if "layernorm" in dropped:
        # the norms' outputs, the QKV and first MLP matmuls' inputs, are regenerated in backward
        replicated -= 2 * lin * sbh
    if "mla_up_proj" in dropped and model.multi_latent_attention:
        attention_sharded -= mla_core
    mlp_sharded = 0.0 if moe or "mlp" in dropped else mlp_bytes * s * b * model.ffn_hidden_size / tp
    total = replicated / replicated_div + attention_sharded + mlp_sharded
    if moe:
        if "shared_experts" not in dropped:
            total += mlp_bytes * s * b * model.moe_shared_expert_intermediate_size / tp
        if "moe" not in dropped:
            tokens = s * b // (cp * replicated_div)
            total += cp * _routed_activation_bytes(model, e, tokens, experts or ExpertParallel(),
                                                   act="moe_act" not in dropped, lin=lin)
    if style == "eager" and recompute == "none" and model.kind == "decoder":
        total += eager_saved_bytes(model, e, s * b, tp, replicated_div)
    core_kept = recompute == "none" or (recompute == "selective" and "core_attn" not in dropped)
    if core_kept and attention != "materialized":  # every fused kernel: flash, flash2/3, cudnn, sdpa
        total += 4 * model.num_attention_heads * s * b / tp  # logsumexp per row, fp32
    elif core_kept:
        # Korthikanti sec. 4.1: the a x s x s score terms, softmax output (2as^2b), dropout mask (as^2b) and
        # dropout output (2as^2b) = 5as^2b, split over the tp ranks. Without dropout the softmax output is
        # itself the input of the matmul with V and is kept once (2as^2b).
        a = model.num_attention_heads
        per_score = (2 * e + mask) if dropout else e
        total += per_score * a * s * s * b / tp
    return total / cp


def _op_policy_bytes(model: Model, e: int, tokens: int, tp: int, replicated_div: int, sp: bool,
                     keeps_attention: bool = True) -> float:
    """What torchtitan's op-level selective checkpointing keeps of a dense decoder layer (module docstring of
    simdist.plan.recompute): the block's input, the kept matmuls' outputs (wq, wv, w1, w2 of a SwiGLU block; wq, wv,
    fc1 of a GELU one, fc2 being the 6th), the attention's output and fp32 log-sum-exp where its save list names the
    attention's op (``keeps_attention``; else the backward runs it again from wq's and wv's kept outputs and the
    recomputed wk's), the reduce-scatters' outputs."""
    q_l = model.q_hidden_size / tp
    kv_l = max(model.kv_hidden_size / tp, float(model.head_dim))
    f_l, h = model.ffn_hidden_size / tp, model.hidden_size
    # the block's input, wq, wv, the attention's output, w1 (fc1), w2 (a GELU block's fc2 is recomputed)
    kept = h / replicated_div + q_l + kv_l + (q_l if keeps_attention else 0.0) + f_l + (h if model.swiglu else 0)
    if sp and tp > 1:
        kept += 2 * h / tp  # the two reduce-scatters' outputs
    return e * tokens * kept + (4 * tokens * model.num_attention_heads / tp if keeps_attention else 0.0)


EAGER_NORM_EXTRA_BYTES = 4.0
"""Bytes an element an eager upcast RMSNorm keeps beyond a fused norm's input (`eager_saved_bytes`)."""


def eager_saved_bytes(model: Model, e: int, tokens: int, tp: int, replicated_div: int) -> float:
    """What autograd keeps of an eager decoder layer beyond a fused one's tensors (simdist.plan.elementwise's eager op
    lists), per layer and micro-batch, as `python -m validation.eager_saved` measures it (saved-tensor hooks on torch
    2.13; tests/test_eager_saved.py compares): each upcast RMSNorm keeps its fp32 upcast (its square and its product
    with the reciprocal square root save it) and its normalised 16-bit copy (the weight's multiply), 4 + e bytes an
    element where a fused norm keeps its e-byte input: 4 more (under fp32 training the upcast is the input itself and
    the normalised copy the 4 more); the complex rotary keeps nothing (its multiply saves only the constant
    frequencies); SiLU-and-multiply keeps the SiLU output besides both inputs (e bytes; the fused kernel recomputes
    it). LayerNorm's native kernel keeps only its row statistics (GeLU models: nothing extra). torch.compile's
    partitioner recomputes these pointwise results instead (compiled style: nothing extra)."""
    if not model.swiglu:
        return 0.0
    norms = 2 * EAGER_NORM_EXTRA_BYTES * model.hidden_size / replicated_div
    return tokens * (norms + e * model.ffn_hidden_size / tp)


def _routed_activation_bytes(model: Model, e: int, tokens: int, experts: ExpertParallel, act: bool = True,
                             lin: float | None = None) -> float:
    """What an MoE layer's routing and routed experts keep for backward on the busiest rank (activation_bytes_per_layer;
    token counts as simdist.plan.expert_parallel.routed_tokens); ``act``: the experts' activation output (fc2's input)
    too; ``lin``: bytes an element of the two grouped linears' saved inputs (default ``e``).

    Under fp8 Transformer Engine's GroupedLinear saves each expert's input as the quantized copy its GEMM read
    (transformer_engine/pytorch/module/grouped_linear.py, _GroupedLinear.forward: the split-quantized ``inputmats``
    go to ctx.save_for_backward with their columnwise usage, unless save_original_input), as its dense linears do:
    fc1's input and fc2's input (the activation's output) at 1 byte an element (``lin``; the scales, 1 per 32 or 128
    elements, not counted); the activation keeps its 16-bit input (fc1's output). A clamped activation (GPT-OSS,
    simdist.plan.glu_clamp) keeps the clamped copy as that input and, unless moe_act is recomputed, fc1's output too
    for the clamps' backward."""
    lin = e if lin is None else lin
    k, nl = model.moe_router_topk, model.num_experts // experts.ep
    rows = max(1, math.ceil(tokens * k * experts.etp * experts.busiest_share / nl - 1e-9)) * nl
    f_l = model.moe_ffn_hidden_size / experts.etp
    # fc1 input (lin); fc1 output (SwiGLU: 2f, e) + fc2 input (f, lin)
    per_row = lin * model.hidden_size + e * (2 if model.swiglu else 1) * f_l + (lin * f_l if act else 0.0)
    if act and model.activation_func_clamp_value is not None:
        per_row += e * 2 * f_l  # fc1's output, which the clamps' backward reads (the clamped copy counted above)
    router = tokens * model.num_experts * (4 + 1)  # fp32 scores and the routing map
    # each row's probability (moe_router_dtype, else the activations' dtype), kept by the weighted activation
    return rows * per_row + router + experts.prob_bytes(e) * rows


def dispatcher_buffer_bytes(model: Model, *, tokens: int, precision: str, experts: ExpertParallel) -> float:
    """The token dispatcher's transient buffers for one MoE layer at a time (``tokens``: a TP peer's own tokens):
    alltoall / flex: the permuted send rows and the busiest rank's received rows; allgather: every gathered token and
    the fp32 buffer its outputs are reduce-scattered from (simdist.plan.moe_cost)."""
    e = ELEMENT_BYTES[precision]
    h, k = model.hidden_size, model.moe_router_topk
    nl = model.num_experts // experts.ep
    rows = max(1, math.ceil(tokens * k * experts.etp * experts.busiest_share / nl - 1e-9)) * nl
    if experts.dispatcher == "allgather":
        gathered = tokens * experts.etp * experts.ep
        return (e + 4) * gathered * h + e * rows * h
    sent_rows = expected_destination_ranks(model.num_experts, k, experts.ep) if experts.dispatcher == "flex" else k
    return e * h * (tokens * sent_rows * experts.kept_share + rows)


def embedding_activation_bytes(
    model: Model,
    *,
    first_stage: bool,
    last_stage: bool,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
    micro_batch_size: int = 1,
    precision: str = "bf16",
    loss_parallel: bool = True,
) -> float:
    """Activations outside the layers for one micro-batch, Korthikanti et al. 2022 sec. 4.3.

    First stage: the embedding dropout mask, sbh (sbh/t with SP; Korthikanti writes sbhp/t for p micro-batches).
    Last stage: the final layer-norm input 2sbh, the output-projection input 2sbh (both /t with SP) and the
    fp32 logits the cross-entropy keeps, 4sbv/t (vocabulary-parallel); together 4sbh/t (1 + v/h). Without loss
    parallelism (``loss_parallel`` False, training.loss_parallel) every rank keeps the logits of the whole
    vocabulary, 4sbv.
    For the lecture MLP, the loss (mean of squares) keeps the final activation on the last stage.
    """
    e = ELEMENT_BYTES[precision]
    s, b, h = model.seq_length, micro_batch_size, model.hidden_size
    sbh = s * b * h
    replicated_div = tp if sequence_parallel else 1
    total = 0.0
    if model.kind == "mlp":
        if last_stage:
            total += e * sbh / replicated_div  # the squared tensor's input (x ** 2 keeps x)
        return total / cp
    if first_stage and not model.swiglu:  # no embedding dropout in Llama-style models (Assumption above)
        total += MASK_BYTES * sbh / replicated_div
    if last_stage:
        total += 2 * e * sbh / replicated_div + LOGITS_BYTES * s * b * model.vocab_size / (tp if loss_parallel else 1)
    return total / cp


def in_flight_microbatches(
    schedule: str, *, num_stages: int, num_microbatches: int, vpp: int = 1, stage: int = 0, extra_warmup: int = 0
) -> float:
    """Micro-batches (each worth the whole stage's layers) whose activations a stage holds at its peak.

    ``extra_warmup``: chunk forwards run before the first backward beyond the schedule's own warm-up (interleaved
    only): Megatron-Core's 1F1B A2A overlap (--overlap-moe-expert-parallel-comm) schedules one more micro-batch
    forward "before the 1f1b stages. This is needed to ensure the forward and backward computations are independent
    in all 1f1b steps" (megatron/core/pipeline_parallel/schedules.py, get_pp_rank_microbatches).

    - gpipe: all M forward passes run before any backward (Huang et al. 2019, arXiv:1811.06965 sec. 2.2).
    - 1f1b (PipeDream-Flush, Narayanan et al. 2021 sec. 2.2.1): stage k runs p - k - 1 warm-up forwards, then
      one more before its first backward: min(p - k, M).
    - zb_h1: Qi et al. 2023 (arXiv:2401.10241) sec. 3: ZB-H1 keeps 1F1B's peak activation memory: min(p - k, M).
    - interleaved_1f1b (Narayanan et al. 2021 sec. 2.2.2): each stage holds v chunks of L/(pv) layers. Megatron-LM
      (megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving) runs
      2(p - k - 1) + (v - 1)p warm-up chunk forwards and one more before the first backward, capped by the M v
      chunk micro-batches: min(vp + p - 2k - 1, M v) chunk-micro-batches, each 1/v of a stage micro-batch.
      Stage 0: p + (p - 1)/v = p (1 + (p - 1)/(p v)), Korthikanti et al. 2022 sec. 4.2.3's factor over L layers.
      (Megatron runs every micro-batch as warm-up when M = p; the count then is p on every stage; not modelled.)
    - zb_v (Qi et al. 2023 sec. 6): 1F1B's peak on every stage: 2p half-size chunks (F done, W not), min(p, M).
    - dualpipe (DeepSeek-V3, arXiv:2412.19437 Table 2): PP+1 micro-batches of one part on every stage; the stage
      holds two parts (two copies), so (p + 1)/2 of the stage's layers; with M < 2p not allowed.
    - dualpipev (deepseek-ai/DualPipe README): PP+1 = 2p+1 half-size chunks: p + 1/2.
    The three counts are those of simdist.plan.schedule_v's orders (tests/test_schedules_zb_v_dualpipe.py).
    """
    check_choice(schedule, SCHEDULES, "schedule")
    check_positive(num_stages, "parallel.pp")
    check_positive(num_microbatches, "training.global_batch_size")
    check_positive(vpp, "parallel.vpp")
    if not 0 <= stage < num_stages:
        raise LayoutError(f"stage {stage} is outside 0..{num_stages - 1}", field="parallel.pp",
                          fix=f"pass a stage index below {num_stages}")
    p, m, v = num_stages, num_microbatches, vpp
    if schedule == "gpipe":
        return float(m)
    if schedule == "zb_v":
        return float(min(p, m))
    if schedule == "dualpipe":
        return (p + 1) / 2
    if schedule == "dualpipev":
        return p + 0.5
    if schedule in ("1f1b", "zb_h1") or v == 1:
        return float(min(p - stage, m))
    return min(v * p + p - 2 * stage - 1 + extra_warmup, m * v) / v


