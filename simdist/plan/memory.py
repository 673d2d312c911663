"""Memory per GPU: parameters, gradients, optimizer state, activations and the rest, for one pipeline stage.

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), sec. 4 and Table 2, generalised term by term (grouped-query attention, SwiGLU, fp32).
Model state follows Rajbhandari et al. 2020, "ZeRO" (arXiv:1910.02054), sec. 3.1 and Figure 1; a mixture of
experts' routed experts are split over ep x etp and their state sharded over the expert-data-parallel group
(Megatron-Core parallel_state: expert_data_parallel_size = world / (etp x ep x pp)). How many
micro-batches a stage holds at its peak follows the pipeline schedules (Narayanan et al. 2021,
arXiv:2104.04473, sec. 2.2; Qi et al. 2023, arXiv:2401.10241).

All sizes are bytes (floats); a stage's numbers are those of one GPU of that stage.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

from simdist.errors import LayoutError, SpecError
from simdist.plan.model import Model
from simdist.plan.moe_cost import ExpertParallel, expected_destination_ranks

GIB = 2**30

RECOMPUTE = ("none", "selective", "full")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1")

# Assumption: fp8 training (Transformer Engine) keeps bf16 activations, bf16 weights and fp32 master state;
# the fp8 copies are transient casts, so fp8 is costed as bf16.
_ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
_MASK_BYTES = 1  # Korthikanti sec. 4.1: a dropout mask is one byte per element.
_LOGITS_BYTES = 4  # Korthikanti sec. 4.3: the cross-entropy keeps the logits in 32-bit floating point.

# Assumption: NCCL communicators and their buffers (NCCL_BUFFSIZE = 4 MiB per channel and peer connection,
# a few communicators for tp/cp/dp/pp) take about 0.5 GiB per GPU.
NCCL_BUFFERS_BYTES = 0.5 * GIB
# Assumption: the CUDA context, cuBLAS/cuDNN workspaces and allocator bookkeeping reserve about 1 GiB.
FRAMEWORK_RESERVE_BYTES = 1.0 * GIB
# Assumption: the PyTorch caching allocator fragments the memory that churns every micro-batch (activations)
# by about 5%; parameters, gradients and optimizer state live in long-lived contiguous buffers (Megatron's
# grad buffer and distributed optimizer) and are not counted.
ACTIVATION_FRAGMENTATION = 0.05


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    other_bytes: float
    """NCCL buffers, pipeline send/receive and all-gather staging buffers, the 16-bit logits during the loss,
    the framework reserve and allocator fragmentation (see stage_memory)."""
    capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes + self.other_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    def as_dict(self) -> dict[str, float]:
        out: dict[str, float] = asdict(self)
        out["total_bytes"] = self.total_bytes
        out["fits"] = self.fits
        return out


def _activation_kind(model: Model, layer: int) -> int:
    """The first layer whose activations equal layer ``layer``'s (same MLP kind: MoE or dense)."""
    if model.kind != "decoder":
        return 0
    flags = model.moe_layer_flags()
    return flags.index(flags[layer])


def _check_choice(value: str, valid: tuple[str, ...], field: str) -> None:
    if value not in valid:
        raise SpecError(f"unknown value '{value}'", field=field, fix=f"use one of: {', '.join(valid)}")


def _check_positive(value: float, field: str) -> None:
    if not value >= 1:
        raise LayoutError(f"{field.rsplit('.', 1)[-1]} = {value} must be at least 1", field=field,
                          fix="use a positive integer")


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
) -> float:
    """Bytes one layer (``layer``, 0-based: MoE or dense, by Model.moe_layer_flags) keeps for its backward pass, for
    one micro-batch, on one GPU.

    An MoE layer keeps, in place of the dense MLP's tensors: the router's fp32 scores and routing map (T x experts),
    each local expert's fc1 input, fc1 output and fc2 input for the busiest rank's rows (simdist.plan.moe_cost:
    T x topk x etp x min(imbalance, capacity)), the expert outputs its unpermutation weights (T x topk x h, for the
    probabilities' gradient), and the shared experts' tensors as a dense MLP of their width. Multi-latent attention
    keeps Q and K (heads x (qk_head_dim + qk_pos_emb_head_dim)), V and the projection input (heads x v_head_dim), and
    its two latents' norm and up-projection inputs.

    A fused ``attention`` kernel (flash = flash2, flash3, cudnn; Dao et al. 2022, arXiv:2205.14135 sec. 3.1):
    the a x s x s scores are never stored; the backward recomputes them from Q, K, V and the per-row softmax
    statistics (fp32, a x s per sequence), so "none" keeps what selective recompute keeps plus those statistics.

    Korthikanti et al. 2022 (arXiv:2205.05198) sec. 4.1, eq. (1): sbh(34 + 5as/h) without parallelism;
    eq. (2) tensor parallel: sbh(10 + 24/t + 5as/(ht)); eq. (4) tensor + sequence parallel: sbh/t (34 + 5as/h);
    sec. 4.2.2 / Table 2: selective recompute drops the 5as/h term; full recompute keeps 2sbh (2sbh/t with SP).
    """
    _check_choice(recompute, RECOMPUTE, "training.recompute")
    _check_choice(precision, PRECISIONS, "training.precision")
    _check_positive(tp, "parallel.tp")
    _check_positive(cp, "parallel.cp")
    _check_positive(micro_batch_size, "training.micro_batch_size")
    e = _ELEMENT_BYTES[precision]  # Korthikanti's "2" is the 16-bit element; fp32 scales it to 4.
    s, b, h = model.seq_length, micro_batch_size, model.hidden_size
    sbh = s * b * h
    # Korthikanti sec. 4.2.2: sequence parallelism splits the layer norm/dropout regions over the tp ranks.
    replicated_div = tp if sequence_parallel else 1
    # Assumption: context parallelism (Megatron-LM ring attention) splits every sequence-dimension activation
    # over the cp ranks: each keeps s/cp tokens, and its queries against all s keys (a s^2/cp score block).
    if recompute == "full":
        # Korthikanti sec. 4.2.1 / Table 2: only the layer input is checkpointed, 2sbh (/t with SP).
        return e * sbh / replicated_div / cp
    if model.kind == "mlp":
        # The CS336 lecture's MLP (simdist.plan.model): per layer x @ W then GELU. Autograd keeps the matmul
        # input (b x h, replicated under tp unless SP) and the GELU input (the column-sharded output, b x h/t).
        # No attention, so selective recompute keeps the same tensors as none.
        return e * sbh * (1 / replicated_div + 1 / tp) / cp
    dropout = not model.swiglu
    # Assumption: Llama-style (SwiGLU) models train without dropout (no dropout modules in Llama; its configs
    # set attention_dropout = 0), so their dropout masks and dropout outputs are absent.
    mask = _MASK_BYTES if dropout else 0
    # Korthikanti sec. 4.1, terms not split by tensor parallelism ("10 sbh" in eq. (2)): the two layer-norm
    # inputs (2sbh each), the QKV matmul input (2sbh), the MLP first matmul input (2sbh), the two dropout
    # masks after attention and after the MLP (sbh each).
    # Assumption: under fp8 training Transformer Engine's linear modules save their input for the weight gradient as
    # the fp8 copy they cast it to (transformer_engine/pytorch/module/linear.py, layernorm_linear.py: the quantized
    # input is what ctx saves), 1 byte an element (plus 1 scale per 32 or 128 elements: not counted); norms,
    # attention and the activation functions keep their 16-bit inputs.
    lin = 1 if precision == "fp8" else e
    replicated = (2 * e + 2 * lin + 2 * mask) * sbh
    # Terms split by tensor parallelism ("24 sbh / t"): attention Q and K (4sbh), V (2sbh), the output
    # projection input (2sbh); with GQA K and V have width kv = g x head_dim instead of h, and Q and the
    # projection input width q = a x head_dim (h unless kv_channels differs). When t > g each
    # rank still holds one whole K/V group (Megatron-LM replicates the groups), hence the max.
    kv_local = max(model.kv_hidden_size / tp, float(model.head_dim))
    attention_sharded = s * b * ((e + lin) * model.q_hidden_size / tp + 2 * e * kv_local)
    if model.multi_latent_attention:
        a_l = model.num_attention_heads / tp
        d_qk, d_v = model.qk_head_dim + model.qk_pos_emb_head_dim, model.v_head_dim
        latents = model.q_lora_rank + model.kv_lora_rank
        attention_sharded = e * s * b * (2 * a_l * d_qk + 2 * a_l * d_v) + 2 * e * s * b * latents / replicated_div
    if model.qk_layernorm and not model.multi_latent_attention:
        attention_sharded += e * s * b * (model.q_hidden_size / tp + kv_local)  # the QK-norms' inputs
    # SwiGLU: Megatron-LM's fused swiglu (megatron/core/fusions/fused_bias_swiglu.py) saves its 2f-wide input
    # (gate and up projections) and recomputes the activation; the down projection keeps its f-wide input:
    # 3 x e x sbf. GeLU (Korthikanti sec. 4.1): GeLU input 8sbh and second matmul input 8sbh for f = 4h,
    # i.e. 2 x e x sbf.
    mlp_bytes = (2 * e if model.swiglu else e) + lin  # activation input(s), 16-bit; the down projection's input
    moe = model.moe_layer_flags()[layer]
    mlp_sharded = 0.0 if moe else mlp_bytes * s * b * model.ffn_hidden_size / tp
    total = replicated / replicated_div + attention_sharded + mlp_sharded
    if moe:
        total += mlp_bytes * s * b * model.moe_shared_expert_intermediate_size / tp
        total += cp * _routed_activation_bytes(model, e, s * b // (cp * replicated_div), experts or ExpertParallel())
    if recompute == "none" and attention != "materialized":  # every fused kernel: flash, flash2/3, cudnn
        total += 4 * model.num_attention_heads * s * b / tp  # logsumexp per row, fp32
    elif recompute == "none":
        # Korthikanti sec. 4.1: the a x s x s score terms, softmax output (2as^2b), dropout mask (as^2b) and
        # dropout output (2as^2b) = 5as^2b, split over the tp ranks. Without dropout the softmax output is
        # itself the input of the matmul with V and is kept once (2as^2b).
        a = model.num_attention_heads
        per_score = (2 * e + mask) if dropout else e
        total += per_score * a * s * s * b / tp
    return total / cp


def _routed_activation_bytes(model: Model, e: int, tokens: int, experts: ExpertParallel) -> float:
    """What an MoE layer's routing and routed experts keep for backward on the busiest rank (activation_bytes_per_layer;
    token counts as simdist.plan.moe_cost.routed_tokens)."""
    k, nl = model.moe_router_topk, model.num_experts // experts.ep
    rows = max(1, math.ceil(tokens * k * experts.etp * experts.busiest_share / nl - 1e-9)) * nl
    f_l = model.moe_ffn_hidden_size / experts.etp
    per_row = model.hidden_size + (3 if model.swiglu else 2) * f_l  # fc1 input; fc1 output (SwiGLU: 2f) + fc2 input
    router = tokens * model.num_experts * (4 + 1)  # fp32 scores and the routing map
    return e * rows * per_row + router + e * tokens * k * experts.kept_share * model.hidden_size


def dispatcher_buffer_bytes(model: Model, *, tokens: int, precision: str, experts: ExpertParallel) -> float:
    """The token dispatcher's transient buffers for one MoE layer at a time (``tokens``: a TP peer's own tokens):
    alltoall / flex: the permuted send rows and the busiest rank's received rows; allgather: every gathered token and
    the fp32 buffer its outputs are reduce-scattered from (simdist.plan.moe_cost)."""
    e = _ELEMENT_BYTES[precision]
    h, k = model.hidden_size, model.moe_router_topk
    nl = model.num_experts // experts.ep
    rows = max(1, math.ceil(tokens * k * experts.etp * experts.busiest_share / nl - 1e-9)) * nl
    if experts.dispatcher == "allgather":
        gathered = tokens * experts.etp * experts.ep
        return (e + 4) * gathered * h + e * rows * h
    sent_rows = expected_destination_ranks(model.num_experts, k, experts.ep) if experts.dispatcher == "flex" else k
    return e * h * (tokens * sent_rows * experts.kept_share + rows)


@lru_cache(maxsize=65536)
def layer_param_shards(model: Model, layer: int) -> tuple[int, int, int]:
    """(split over tp, replicated on every tp peer, routed experts) parameters of layer ``layer`` (0-based); together
    Model.layer_params(layer).

    Replicated: an MoE layer's router (Megatron-Core TopKRouter.weight is not tensor-parallel) and multi-latent
    attention's down projections and latent norms (TELinear parallel_mode "duplicated", MLASelfAttention); the routed
    experts are split over ep x etp instead of tp. Assumption: the small norm weights and biases are split over tp
    with the rest (as stage_params always did).
    """
    total = model.layer_params(layer)
    if model.kind != "decoder":
        return total, 0, 0
    replicated = routed = 0
    if model.moe_layer_flags()[layer]:
        replicated += model.router_params
        routed = model.num_experts * model.expert_params
    if model.multi_latent_attention:
        h, qr, kvr = model.hidden_size, model.q_lora_rank, model.kv_lora_rank
        replicated += h * (qr + kvr + model.qk_pos_emb_head_dim)
        if model.qk_layernorm:
            norm = 1 if model.swiglu else 2
            replicated += norm * ((qr if qr else 0) + kvr)
    return total - replicated - routed, replicated, routed


def layer_tensors(model: Model, layer: int, *, ep: int = 1) -> int:
    """Parameter tensors (weights and biases) of layer ``layer`` on one GPU, for per-parameter gradient reduction."""
    if model.kind == "mlp":
        return 2  # weight and bias
    # Llama: q/k/v (fused qkv counts 1), proj, gate+up, down, 2 norms; GPT: + biases of each linear and norm.
    per_linear, norm = (1, 1) if model.swiglu else (2, 2)
    if model.multi_latent_attention:
        linears = (2 if model.q_lora_rank else 1) + 2 + 1  # q (down, up), kv down, kv up, projection
        attention = linears * per_linear + norm * (1 + (2 if model.qk_layernorm else 0))
    else:
        attention = 2 * per_linear + norm * (3 if model.qk_layernorm else 1)
    if not model.moe_layer_flags()[layer]:
        return attention + 2 * per_linear + norm
    # Transformer Engine's GroupedLinear keeps one weight per local expert (weight0 ... weightN-1)
    shared = 2 * per_linear if model.moe_shared_expert_intermediate_size else 0
    return attention + norm + 1 + 2 * per_linear * (model.num_experts // ep) + shared


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
) -> float:
    """Activations outside the layers for one micro-batch, Korthikanti et al. 2022 sec. 4.3.

    First stage: the embedding dropout mask, sbh (sbh/t with SP; Korthikanti writes sbhp/t for p micro-batches).
    Last stage: the final layer-norm input 2sbh, the output-projection input 2sbh (both /t with SP) and the
    fp32 logits the cross-entropy keeps, 4sbv/t (vocabulary-parallel, always split); together 4sbh/t (1 + v/h).
    For the lecture MLP, the loss (mean of squares) keeps the final activation on the last stage.
    """
    e = _ELEMENT_BYTES[precision]
    s, b, h = model.seq_length, micro_batch_size, model.hidden_size
    sbh = s * b * h
    replicated_div = tp if sequence_parallel else 1
    total = 0.0
    if model.kind == "mlp":
        if last_stage:
            total += e * sbh / replicated_div  # the squared tensor's input (x ** 2 keeps x)
        return total / cp
    if first_stage and not model.swiglu:  # no embedding dropout in Llama-style models (Assumption above)
        total += _MASK_BYTES * sbh / replicated_div
    if last_stage:
        total += 2 * e * sbh / replicated_div + _LOGITS_BYTES * s * b * model.vocab_size / tp
    return total / cp


def in_flight_microbatches(
    schedule: str, *, num_stages: int, num_microbatches: int, vpp: int = 1, stage: int = 0
) -> float:
    """Micro-batches (each worth the whole stage's layers) whose activations a stage holds at its peak.

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
    """
    _check_choice(schedule, SCHEDULES, "schedule")
    _check_positive(num_stages, "parallel.pp")
    _check_positive(num_microbatches, "training.global_batch_size")
    _check_positive(vpp, "parallel.vpp")
    if not 0 <= stage < num_stages:
        raise LayoutError(f"stage {stage} is outside 0..{num_stages - 1}", field="parallel.pp",
                          fix=f"pass a stage index below {num_stages}")
    p, m, v = num_stages, num_microbatches, vpp
    if schedule == "gpipe":
        return float(m)
    if schedule in ("1f1b", "zb_h1") or v == 1:
        return float(min(p - stage, m))
    return min(v * p + p - 2 * stage - 1, m * v) / v


def model_state_bytes(
    num_params: float, *, dp: int = 1, zero_stage: int = 0, precision: str = "bf16",
    grad_reduce_in_fp32: bool | None = None,
) -> tuple[float, float, float]:
    """(parameter, gradient, optimizer-state) bytes on one GPU holding ``num_params`` parameters.

    Rajbhandari et al. 2020 (arXiv:1910.02054) sec. 3.1: mixed-precision Adam keeps 2 bytes of fp16/bf16
    parameters, 2 of gradients and K = 12 of optimizer state (fp32 master copy, momentum, variance) per
    parameter. Figure 1: ZeRO-1 (P_os) shards the optimizer state over N_d data-parallel ranks,
    (2 + 2 + K/N_d) Psi; ZeRO-2 (P_os+g) also the gradients, (2 + (2 + K)/N_d) Psi; ZeRO-3 (P_os+g+p) also the
    parameters, (2 + 2 + K) Psi / N_d. Megatron-LM's distributed optimizer is ZeRO-1.
    fp32/tf32 training: 4 bytes of parameters, 4 of gradients and 8 of Adam state (momentum, variance).
    bf16 (and fp8) training: Megatron-LM accumulates gradients in fp32 (main_grad; forced on for bf16 in
    megatron/training/arguments.py), 2 + 4 + 12 = 18 bytes per parameter as Megatron-LM's distributed-optimizer
    guide tabulates (docs/source/api-guide/dist_optimizer.md: "bf16 param, fp32 grads: 18"); fp16 keeps
    ZeRO's 2-byte gradients. ``grad_reduce_in_fp32`` (Megatron-LM --accumulate-allreduce-grads-in-fp32,
    Megatron-Bridge ddp.grad_reduce_in_fp32) overrides that default for 16-bit training. The data-parallel
    reduction moves the same gradient bytes (simdist.plan.step_config.grad_bytes_per_element).
    """
    _check_choice(precision, PRECISIONS, "training.precision")
    _check_positive(dp, "parallel.dp")
    if zero_stage not in (0, 1, 2, 3):
        raise SpecError(f"zero_stage = {zero_stage} is not a ZeRO stage", field="parallel.zero_stage",
                        fix="use 0, 1, 2 or 3")
    wide = _ELEMENT_BYTES[precision] == 4
    from simdist.plan.step_config import grad_bytes_per_element

    param_b, grad_b, optim_b = (4.0, 4.0, 8.0) if wide else (
        2.0, float(grad_bytes_per_element(precision, grad_reduce_in_fp32)), 12.0)
    params = num_params * param_b / (dp if zero_stage >= 3 else 1)
    grads = num_params * grad_b / (dp if zero_stage >= 2 else 1)
    optim = num_params * optim_b / (dp if zero_stage >= 1 else 1)
    return params, grads, optim


def stage_params(model: Model, *, layers_on_stage: int, first_stage: bool, last_stage: bool, tp: int = 1,
                 layers: tuple[int, ...] | None = None, ep: int = 1, etp: int = 1) -> float:
    """Parameters one GPU of a stage holds (before ZeRO sharding); context parallelism does not split them.

    The stage's layers / t (Narayanan et al. 2021 sec. 3: every weight matrix is split over the tensor-parallel
    ranks; Assumption: the small replicated norm weights and biases are split too), the word embedding
    (vocab x h / t, vocabulary-parallel) on the first stage, the output projection on the last. With tied
    embeddings Megatron-LM keeps a copy of the embedding on the last stage, kept in sync by an all-reduce
    (megatron/core/models/common/language_module/language_module.py), so it is counted once per end stage
    and once in all when one stage is both. ``layers``: the stage's layer indices (None: layers_on_stage layers of
    a model whose layers are all alike); an MoE layer's routed experts are split over ep x etp, its router and MLA's
    down projections replicated (layer_param_shards); the multi-token-prediction modules on the last stage.
    """
    return sum(_stage_param_split(model, layers_on_stage=layers_on_stage, first_stage=first_stage,
                                  last_stage=last_stage, tp=tp, layers=layers, ep=ep, etp=etp))


def _stage_param_split(model: Model, *, layers_on_stage: int, first_stage: bool, last_stage: bool, tp: int,
                       layers: tuple[int, ...] | None, ep: int, etp: int) -> tuple[float, float]:
    """(parameters reduced over the data-parallel group, routed-expert parameters) one GPU of a stage holds."""
    if layers is None:
        if len(set(model.layer_params(i) for i in range(model.num_layers))) > 1:
            raise LayoutError(f"model {model.name!r} has layers of different sizes: the stage's layer indices are "
                              "needed", field="model.moe_layer_freq", fix="pass the stage's layers")
        layers = (0,) * layers_on_stage
    split = replicated = routed = 0
    for i in layers:
        s_i, r_i, e_i = layer_param_shards(model, i)
        split, replicated, routed = split + s_i, replicated + r_i, routed + e_i
    mtp = model.mtp_num_layers if last_stage and model.kind == "decoder" else 0
    if mtp:
        s_i, r_i, e_i = layer_param_shards(model, model.num_layers - 1)
        own = model.mtp_params // mtp - model.layer_params(model.num_layers - 1)
        split, replicated, routed = split + (s_i + own) * mtp, replicated + r_i * mtp, routed + e_i * mtp
    n = split / tp
    if replicated:
        n += replicated
    experts = routed / (ep * etp)
    if model.kind != "decoder":
        return n, experts
    word = model.vocab_size * model.hidden_size / tp
    if first_stage:
        n += word
    if last_stage:
        if not (model.tied_embeddings and first_stage):
            n += word
        n += model.hidden_size if model.swiglu else 2 * model.hidden_size  # final norm (model.num_params)
    return n, experts


def stage_memory(
    model: Model,
    *,
    layers_on_stage: int,
    first_stage: bool,
    last_stage: bool,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    cp: int = 1,
    vpp: int = 1,
    sequence_parallel: bool = False,
    zero_stage: int = 0,
    micro_batch_size: int = 1,
    recompute: str = "none",
    precision: str = "bf16",
    in_flight_microbatches: float = 1.0,
    capacity_bytes: float = float("inf"),
    attention: str = "materialized",
    layers: tuple[int, ...] | None = None,
    experts: ExpertParallel | None = None,
    grad_reduce_in_fp32: bool | None = None,
) -> MemoryBreakdown:
    """Memory of one GPU of a pipeline stage at its activation peak.

    ``layers``: the stage's layer indices (simdist.plan.step_config.StepConfig.stage_layers; None: layers_on_stage
    layers of a model whose layers are all alike); ``experts``: how its MoE layers run (None: ep = etp = 1).

    ``layers_on_stage`` counts all the stage's layers (every chunk when interleaved, vpp > 1);
    ``in_flight_microbatches`` is in units of one micro-batch through all of them (see the function of
    that name), so the chunk-level count c of the interleaved schedule enters as c / vpp.
    """
    _check_positive(pp, "parallel.pp")
    _check_positive(vpp, "parallel.vpp")
    if layers_on_stage < 0:
        raise LayoutError(f"layers_on_stage = {layers_on_stage} is negative", field="model.num_layers",
                          fix="give each stage zero or more layers")
    if in_flight_microbatches < 0:
        raise LayoutError("in_flight_microbatches is negative", field="schedule", fix="pass a count >= 0")
    kw = {"tp": tp, "cp": cp, "sequence_parallel": sequence_parallel, "micro_batch_size": micro_batch_size,
          "precision": precision}
    experts = experts or ExpertParallel()
    if layers is None:
        stage_params(model, layers_on_stage=layers_on_stage, first_stage=first_stage, last_stage=last_stage, tp=tp)
        layers = (0,) * layers_on_stage
    kinds: dict[int, int] = {}
    for i in layers:
        key = _activation_kind(model, i)
        kinds[key] = kinds.get(key, 0) + 1
    layer_bytes = sum(n * activation_bytes_per_layer(model, recompute=recompute, attention=attention, layer=i,
                                                     experts=experts, **kw) for i, n in kinds.items())
    outside = embedding_activation_bytes(model, first_stage=first_stage, last_stage=last_stage, **kw)
    mtp = model.mtp_num_layers if last_stage and model.kind == "decoder" else 0
    if mtp:
        # each MTP module: a layer like the last one, its own logits (embedding_activation_bytes' last-stage terms)
        last = model.num_layers - 1
        layer_bytes += mtp * activation_bytes_per_layer(model, recompute=recompute, attention=attention, layer=last,
                                                        experts=experts, **kw)
        outside += mtp * embedding_activation_bytes(model, first_stage=False, last_stage=True, **kw)
    # Assumption: the embedding and output-layer activations are held for as many micro-batches as the stage's
    # layers (Korthikanti sec. 4.3 multiplies the embedding dropout by p on the first 1F1B stage).
    activations = (layer_bytes + outside) * in_flight_microbatches

    # ZeRO shards over the data-parallel group; Megatron-LM's distributed optimizer and gradient reduction use
    # the data-parallel group with context parallelism (parallel_state.get_data_parallel_group(
    # with_context_parallel=True)): cp ranks hold the same weights, so they share the shards too. The routed experts'
    # state is sharded over the expert-data-parallel group instead: world / (etp x ep x pp) = tp x cp x dp / (etp ep)
    # ranks hold the same experts (Megatron-Core parallel_state, expert_data_parallel_size; its distributed optimizer
    # keeps the expert parameters in buffers of their own over that group).
    n, n_experts = _stage_param_split(model, layers_on_stage=len(layers), first_stage=first_stage,
                                      last_stage=last_stage, tp=tp, layers=layers, ep=experts.ep, etp=experts.etp)
    params, grads, optim = model_state_bytes(n, dp=dp * cp, zero_stage=zero_stage, precision=precision,
                                             grad_reduce_in_fp32=grad_reduce_in_fp32)
    if n_experts:
        ranks = tp * cp * dp
        if ranks % (experts.ep * experts.etp):
            raise LayoutError(f"ep x etp = {experts.ep * experts.etp} does not divide tp x cp x dp = {ranks}",
                              field="parallel.ep", fix="choose ep and etp whose product divides tp x cp x dp")
        edp = ranks // (experts.ep * experts.etp)
        p_e, g_e, o_e = model_state_bytes(n_experts, dp=edp, zero_stage=zero_stage, precision=precision,
                                          grad_reduce_in_fp32=grad_reduce_in_fp32)
        params, grads, optim = params + p_e, grads + g_e, optim + o_e

    e = _ELEMENT_BYTES[precision]
    sbh = model.seq_length * micro_batch_size * model.hidden_size
    split = tp if sequence_parallel else 1
    other = NCCL_BUFFERS_BYTES + FRAMEWORK_RESERVE_BYTES + ACTIVATION_FRAGMENTATION * activations
    if pp > 1:
        # Pipeline send and receive buffers: one micro-batch's boundary activation (s/cp x b x h, /t with SP;
        # Megatron-LM p2p_communication) in each direction.
        other += 2 * e * sbh / split / cp
    if sequence_parallel and tp > 1:
        # The all-gathered full-sequence layer input before the QKV / first MLP matmul (Korthikanti sec. 4.2.2),
        # one at a time.
        other += e * sbh / cp
    if zero_stage >= 3:
        # ZeRO-3 gathers one layer's full parameters before using it and prefetches the next (Rajbhandari
        # sec. 5.3 "constant size buffers"; Assumption: two layers gathered at once).
        param_bytes = 4 if e == 4 else 2  # model_state_bytes: 16-bit parameters, or fp32 ones
        biggest = sorted((sum(layer_param_shards(model, i)[:2]) / tp + layer_param_shards(model, i)[2]
                          / (experts.ep * experts.etp) for i in set(layers)), reverse=True)
        other += sum((biggest * 2)[:min(len(layers), 2)]) * param_bytes
    moe_layers = [i for i in set(layers) if model.kind == "decoder" and model.moe_layer_flags()[i]]
    if moe_layers:
        # The token dispatcher's send / receive buffers, one MoE layer at a time (transient).
        other += dispatcher_buffer_bytes(model, tokens=model.seq_length * micro_batch_size // (cp * split),
                                         precision=precision, experts=experts)
    if last_stage and model.kind == "decoder":
        # The 16-bit logits the output projection returns coexist with their fp32 copy during the loss
        # (Megatron-LM tensor_parallel/cross_entropy.py upcasts them); transient, one micro-batch.
        other += e * model.seq_length * micro_batch_size * model.vocab_size / tp / cp
    return MemoryBreakdown(params, grads, optim, activations, other, capacity_bytes)
