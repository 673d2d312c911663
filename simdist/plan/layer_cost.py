"""FLOPs and HBM bytes of each kernel of one layer, on one GPU, for one micro-batch.

The decoder layer is Megatron-LM's (Shoeybi et al. 2019, arXiv:1909.08053 sec. 3; Narayanan et al. 2021,
arXiv:2104.04473 sec. 3.2; Korthikanti et al. 2022, arXiv:2205.05198 sec. 4): layer norm, QKV, attention
scores QK^T, softmax, dropout, attention over V, output projection, dropout + residual, layer norm, MLP
(GELU: h -> f -> h; SwiGLU: gate and up h -> 2f, down f -> h), dropout + residual. A GEMM of (m, n, k) costs
2mnk FLOPs (Narayanan et al. 2021 sec. 5.1 footnote), so a GPT layer's forward is 24bsh^2 + 4bs^2h
(the per-layer term of Narayanan eq. (3)); the backward computes input and weight gradients, twice the
forward GEMM FLOPs (ibid.). ``model_flops`` and ``hardware_flops`` count matmul FLOPs only, as eq. (3) and
the MFU/HFU of Korthikanti sec. 6.3 do; element-wise kernels carry their own (small) FLOPs for the roofline.

Tensor parallelism "megatron": column-parallel QKV and MLP-up, row-parallel projection and MLP-down, with
the f/g operators (Shoeybi sec. 3, Fig. 3): forward all-reduce after each row-parallel GEMM, backward
all-reduce of each column-parallel GEMM's input gradient, issued asynchronously so it overlaps the weight-
gradient GEMM (Megatron-LM megatron/core/tensor_parallel/layers.py,
LinearWithGradAccumulationAndAsyncCommunication, async_tensor_model_parallel_allreduce). Sequence parallelism
(Korthikanti sec. 4.2.2) replaces each all-reduce by an all-gather and a reduce-scatter of the same full
buffer and splits layer norm, dropout and residual work by t. "column" is the CS336 lecture's cut of its MLP.

Byte counts are what each kernel reads plus writes in HBM, element size ``bytes_per_element(precision)``;
dropout masks are 1 byte per element (Korthikanti sec. 4.1).

A layer is its attention half (simdist.plan.attention_cost: MHA/GQA or multi-latent attention, QK-norm, full, causal
or sliding-window attention) and its MLP half: the dense MLP of ffn_hidden_size here, or, in the MoE layers
(Model.moe_layer_flags), the router, dispatch, experts and combine of simdist.plan.moe_cost. The kernels and
collectives are the units of simdist.plan.kernel_work, re-exported here.
"""

from __future__ import annotations

from simdist.errors import LayoutError, SpecError
from simdist.plan.attention_cost import attention_block
from simdist.plan.attention_cost import attention_parts as _attention_parts  # noqa: F401  (kept for callers)
from simdist.plan.elementwise import ew
from simdist.plan.expert_parallel import ExpertParallel
from simdist.plan.kernel_work import (
    FP8_RECIPES,
    AttentionShape,
    CommWork,
    Kernel,
    LayerShape,
    Pass,
    Work,
    bytes_per_element,
    elementwise,
    fp8_weight_cast,
    gemm,
    gemm_grads,
    optimizer_kernels,
    work_of,
)
from simdist.plan.model import Model
from simdist.plan.model_ends import embedding_work, head_work, mtp_work
from simdist.plan.moe_cost import moe_mlp_block
from simdist.plan.recompute import POLICIES, recomputed
from simdist.plan.tp_plan import column_projections, forward_gathers, input_reductions, layout_copy

__all__ = ["ATTENTION_KERNELS", "FP8_RECIPES", "AttentionShape", "CommWork", "ExpertParallel", "Kernel", "Work",
           "bytes_per_element", "layer_work", "model_flops_per_sequence",
           "optimizer_kernels"]

ATTENTION_KERNELS = ("materialized", "flash", "flash2", "flash3", "flash4", "cudnn", "sdpa", "efficient", "triton",
                     "flex")
"""``flash`` is FlashAttention-2 (the name earlier releases used); ``sdpa`` the backend PyTorch's
scaled_dot_product_attention picks for the GPU; the fused kernels are priced by simdist.hardware.attention."""


def _check(model: Model, tp: int, cp: int, sequence_parallel: bool, micro_batch_size: int, recompute: str,
           tp_style: str) -> None:
    if tp < 1 or cp < 1 or micro_batch_size < 1:
        raise LayoutError("tp, cp and micro_batch_size must be positive", field="parallel.tp", fix="use 1 or more")
    if recompute not in POLICIES:
        raise SpecError(f"unknown recompute mode {recompute!r}", field="training.recompute",
                        fix=f"write one of {', '.join(POLICIES)}")
    if tp_style not in ("megatron", "column"):
        raise LayoutError(f"unknown tp_style {tp_style!r}", field="parallel.tp_style", fix="megatron or column")
    h = model.hidden_size
    if model.kind == "mlp":
        if tp > 1 and tp_style != "column":
            raise LayoutError("the mlp model is cut column-wise (the CS336 lecture's tensor parallelism)",
                              field="parallel.tp_style", fix="use tp_style 'column' for kind mlp")
        if h % tp:
            raise LayoutError(f"hidden_size {h} is not divisible by tp {tp}", field="parallel.tp",
                              fix="choose a tp that divides hidden_size")
        if cp > 1 or sequence_parallel:
            raise LayoutError("the mlp model has no sequence to split", field="parallel.cp", fix="use cp 1")
        return
    if tp_style != "megatron":
        raise LayoutError("a decoder uses Megatron-LM's column/row tensor parallelism", field="parallel.tp_style",
                          fix="use tp_style 'megatron' for decoders")
    a, g, s = model.num_attention_heads, model.num_query_groups, model.seq_length
    f = model.ffn_hidden_size if not all(model.moe_layer_flags()) else 0  # only dense layers read ffn_hidden_size
    if model.multi_latent_attention:
        g = a  # MLA: every head has its own K and V
    # Megatron-LM (megatron/core/transformer/attention.py) divides heads, query groups and ffn by tp.
    if a % tp or f % tp or (g % tp and tp % g):
        raise LayoutError(f"tp {tp} must divide num_attention_heads {a}, ffn_hidden_size {f} and the query "
                          f"groups {g} (or be a multiple of them)", field="parallel.tp",
                          fix="choose a tp that divides the head count")
    if s % cp:
        raise LayoutError(f"cp {cp} does not divide seq_length {s}", field="parallel.cp", fix="choose a divisor")
    if sequence_parallel and (s // cp) % tp:
        raise LayoutError(f"sequence parallelism splits {s // cp} tokens by tp {tp}", field="parallel.tp",
                          fix="choose a tp dividing seq_length / cp")


def _mlp_layer(model: Model, tp: int, b: int, recompute: str, bpe: int) -> Work:
    """One of the lecture's layers, column-parallel: y = gelu(x W[:, slice]); all-gather y (CS336 lecture 8)."""
    h, n = model.hidden_size, model.hidden_size // tp
    fwd = (gemm("linear", b, n, h, bpe), elementwise("gelu", b * n, 2 * bpe, 8.0))
    dgrad, wgrad = gemm_grads("linear", b, n, h, bpe)
    bwd = (elementwise("gelu_grad", b * n, 3 * bpe, 8.0), dgrad, wgrad)
    comm: list[CommWork] = []
    if tp > 1:
        full = float(b * h * bpe)  # the gathered activation; each rank contributes full / tp
        comm.append(CommWork("all_gather", full, "forward", False, issued_after=2))
        # Its adjoint: the input gradient is a partial sum over ranks, reduce-scattered to each rank's slice;
        # issued after the input-gradient GEMM, it overlaps the weight-gradient GEMM.
        comm.append(CommWork("reduce_scatter", full, "backward", True, issued_after=2))
    redo = fwd if recompute == "full" else ()
    if redo and tp > 1:
        comm.append(CommWork("all_gather", float(b * h * bpe), "backward", False, issued_after=2, recompute=True))
    return work_of(fwd, bwd, redo, comm)


def layer_work(model: Model, *, tp: int = 1, cp: int = 1, sequence_parallel: bool = False,
               micro_batch_size: int = 1, recompute: str = "none", precision: str = "bf16",
               tp_style: str = "megatron", attention: str = "materialized", attention_mask: str = "causal",
               fp8_recipe: str = "delayed", layer: int = 0, experts: ExpertParallel | None = None,
               style: str = "fused", fp8_weight_cache: bool = True,
               recompute_modules: tuple[str, ...] = ("core_attn",), cp_comm_type: str = "p2p",
               fp8_attention: bool = False, tp_inputs: str = "module", early_stop: bool = False,
               op_keeps_attention: bool = True, async_tp: bool = False) -> Work:
    """One transformer layer (or one MLP layer) on one GPU for one micro-batch.

    ``attention``: "materialized" (default) is Megatron-LM's non-flash core attention, the kernel of the A100-era
    papers this is calibrated on (Korthikanti 2022 predates flash attention in Megatron): the b*a*s*s scores
    are written to HBM and softmax / dropout on them are memory-bound. "flash" (= "flash2") is FlashAttention-2
    (Dao 2023, arXiv:2307.08691), "flash3" FlashAttention-3 (Shah et al. 2024), "cudnn" cuDNN's fused attention:
    one fused kernel reading Q, K, V and writing O; its backward recomputes the scores (2.5x the forward matmul
    FLOPs, sec. 3.1.2 there), the extra 0.5x counted as hardware FLOPs only.

    ``attention_mask``: "causal" (decoder LMs) or "full". Model FLOPs follow the causal convention: the masked half
    of the scores is not counted (Megatron-LM's num_floating_point_operations, FlashAttention's benchmarks). A
    fused kernel skips the masked blocks, so it also executes half; the materialized path computes every score
    (batched GEMMs, then a masked softmax), so it executes the full count.

    ``precision: fp8``: the linear layers' GEMMs (QKV, projection, MLP; forward, input and weight gradients) run in
    fp8 under ``fp8_recipe`` (`FP8_RECIPES`), with a cast kernel per operand; attention, norms, the embedding and
    the logits GEMM stay bf16 (Megatron-LM's output layer is not a Transformer Engine module).

    ``layer``: the layer's index (0-based) in the model, which says whether its MLP is the routed experts
    (Model.moe_layer_flags) and whether it attends over a sliding window (Model.window_layer_flags); ``experts``: how
    the MoE layers run (ep, etp, dispatcher, imbalance, capacity, grouped GEMM; None: one GPU's defaults).

    ``style``: how element-wise work runs (simdist.plan.elementwise: fused, eager, compiled); ``fp8_weight_cache``:
    FP8 weights cast once per step (Transformer Engine) or in every forward (torchao); ``recompute_modules``: what
    ``recompute: selective`` redoes, and ``recompute: op`` torchtitan's op-level policy (simdist.plan.recompute);
    ``fp8_attention``: the fused attention runs in fp8 under ``precision: fp8`` (LayerShape.attention_dtype);
    ``tp_inputs``: where a module's input changes layout for its column-parallel projections (simdist.plan.tp_plan);
    ``early_stop``: eager full recompute stops at the last tensor the backward saved (simdist.plan.recompute);
    ``op_keeps_attention``: under ``recompute: op`` the policy saves the attention's output (else it is redone).
    """
    _check(model, tp, cp, sequence_parallel, micro_batch_size, recompute, tp_style)
    if attention not in ATTENTION_KERNELS:
        raise SpecError(f"unknown attention kernel {attention!r}", field="training.attention",
                        fix=f"write one of {', '.join(ATTENTION_KERNELS)}")
    if attention_mask not in ("causal", "full"):
        raise SpecError(f"unknown attention mask {attention_mask!r}", field="training.attention_mask",
                        fix="write causal or full")
    if fp8_recipe not in FP8_RECIPES:
        raise SpecError(f"unknown fp8 recipe {fp8_recipe!r}", field="training.fp8_recipe",
                        fix=f"write one of {', '.join(FP8_RECIPES)}")
    bpe = bytes_per_element(precision)
    recipe = fp8_recipe if precision == "fp8" else None
    if model.kind == "mlp":
        return _mlp_layer(model, tp, micro_batch_size, recompute, bpe)
    if not 0 <= layer < model.num_layers:
        raise LayoutError(f"layer {layer} is outside 0..{model.num_layers - 1}", field="model.num_layers",
                          fix="pass a layer index of the model")
    # Assumption: GPT-style (GELU) models train with Megatron-LM's default dropout 0.1 (hidden and attention);
    # Llama-style (SwiGLU) models without dropout (Dubey et al. 2024 use none), but with rotary embeddings.
    shape = LayerShape(micro_batch_size, model.seq_length // cp, model.seq_length, tp, cp, sequence_parallel, bpe,
                       recipe, dropout=not model.swiglu, style=style, norm="rmsnorm" if model.swiglu else "layernorm",
                       fp8_weight_cache=fp8_weight_cache, fp8_attention=fp8_attention, tp_inputs=tp_inputs,
                       async_tp=async_tp)
    h, m = model.hidden_size, shape.tokens
    resid = m * h // tp if sequence_parallel else m * h  # Korthikanti sec. 4.2.2: LN/dropout split by t
    attn = attention_block(model, shape, attention=attention, causal=attention_mask == "causal",
                           window=model.window_layer_flags()[layer], recompute=recompute, cp_comm_type=cp_comm_type)
    if model.moe_layer_flags()[layer]:
        mlp_fwd, mlp_bwd, router_fwd, router_bwd = moe_mlp_block(model, shape, experts or ExpertParallel())
    else:
        (mlp_fwd, mlp_bwd), router_fwd, router_bwd = _dense_mlp_block(model, shape), 0, 0

    # The residual add after each half (with GPT's dropout on the branch); in backward the two gradients reaching
    # each branch point are summed (simdist.plan.elementwise: the fused style leaves that to the GEMMs).
    add, add_grad = ("dropout_residual", "dropout_residual_grad") if shape.dropout else ("residual", "residual_grad")
    fwd = Pass("forward").then(attn.forward)
    fwd.add(*ew(add, resid, bpe, style))
    fwd.then(mlp_fwd).add(*ew(add, resid, bpe, style))
    bwd = Pass("backward")
    bwd.add(*ew(add_grad, resid, bpe, style))
    bwd.then(mlp_bwd)
    bwd.add(*ew(add_grad, resid, bpe, style))
    bwd.then(attn.backward)
    comm = fwd.comm + bwd.comm
    # The part each kernel belongs to, as Megatron-Core's CUDA graph scopes capture them (simdist.plan.graph_scope):
    # the attention half with its residual add, the MLP half (an MoE layer's router part, then its experts) with its.
    n_res, n_res_g = len(ew(add, 1.0, bpe, style)), len(ew(add_grad, 1.0, bpe, style))
    rest = "mlp" if not model.moe_layer_flags()[layer] else "moe_experts"
    head = "mlp" if rest == "mlp" else "moe_router"
    n_mf, n_mb = len(mlp_fwd.kernels), len(mlp_bwd.kernels)
    scopes = (("attn",) * (len(attn.forward.kernels) + n_res) + (head,) * router_fwd
              + (rest,) * (n_mf - router_fwd + n_res),
              (rest,) * (n_res_g + n_mb - router_bwd) + (head,) * router_bwd
              + ("attn",) * (n_res_g + len(attn.backward.kernels)))
    tags = _module_tags(fwd, attn, n_res, len(ew(shape.norm, 1.0, bpe, style)),
                        moe=model.moe_layer_flags()[layer])
    q_l, kv_l = model.q_hidden_size // tp, max(model.num_query_groups // tp, 1) * model.head_dim
    sub = {"qkv": (q_l, kv_l, kv_l)}
    if model.swiglu:
        sub["mlp_up"] = (1, 1)  # torchtitan's w1 and w3: two matmuls in simdist's one gate+up GEMM
    redo, redo_comm = recomputed(recompute, fwd, tags, recompute_modules, sub, compiled=style == "compiled",
                                 early_stop=early_stop, keep_attention=op_keeps_attention)
    comm += redo_comm
    # full recompute redoes the forward, its synchronizations too; Assumption: a selective or op-level redo of part of
    # an MoE block reuses the forward's token counts (no new synchronization)
    return work_of(fwd.kernels, bwd.kernels, redo, comm, attn.extra_hardware_flops, host_syncs=tuple(fwd.syncs),
                   recompute_syncs=tuple(fwd.syncs) if recompute == "full" else (), scopes=scopes,
                   graph_input=elementwise("cuda_graph_input_copy", resid, 2 * bpe, 0.0))


_MLA_UP = frozenset({"q_up", "q_proj", "kv_up", "mla_rope_concat",
                     *(f"{p}_fp8_{k}" for p in ("q_up", "kv_up") for k in ("amax", "scale", "cast"))})


def _module_tags(fwd: Pass, attn, residual_kernels: int, norm_kernels: int, *, moe: bool) -> list[str]:
    """The module of each forward kernel of a layer (simdist.plan.recompute): norm, attn, core_attn, mla_up_proj,
    residual, mlp, moe, moe_act, shared_experts. The layer's forward is the attention block, its residual add, the
    MLP block (its norm first) and the second residual add."""
    core = {id(k) for k in attn.core}
    n_attn, n = len(attn.forward.kernels), len(fwd.kernels)
    tags = []
    for i, k in enumerate(fwd.kernels):
        if i < n_attn:
            tags.append("norm" if i < norm_kernels else "core_attn" if id(k) in core else
                        "mla_up_proj" if k.name in _MLA_UP else "attn")
        elif i < n_attn + residual_kernels or i >= n - residual_kernels:
            tags.append("residual")
        elif i < n_attn + residual_kernels + norm_kernels:
            tags.append("norm")
        elif not moe:
            tags.append("mlp")
        elif k.name.startswith("shared"):
            tags.append("shared_experts")
        elif k.name.startswith("expert_clamp_") or (k.name.startswith("expert_") and
                                                    k.name.endswith(("_swiglu", "_gelu"))):
            tags.append("moe_act")
        else:
            tags.append("moe")
    return tags


def _dense_mlp_block(model: Model, shape: LayerShape) -> tuple[Pass, Pass]:
    """(forward, backward) of the dense MLP half: its norm, up (SwiGLU: gate and up, h -> 2f), activation, down,
    with the tensor-parallel collectives (Shoeybi sec. 3; Korthikanti sec. 4.2.2 under sequence parallelism)."""
    h, m, bpe, tp, fp8 = model.hidden_size, shape.tokens, shape.bpe, shape.tp, shape.fp8
    sp = shape.sequence_parallel
    resid = m * h // tp if sp else m * h
    f_l = model.ffn_hidden_size // tp
    up_n = 2 * f_l if model.swiglu else f_l
    full = m * h * bpe  # b x s x h activation (s / cp under context parallelism)
    style = shape.style
    fwd, bwd = Pass("forward"), Pass("backward")
    fwd.add(*ew(shape.norm, resid, bpe, style))
    projections = column_projections("mlp", swiglu=model.swiglu)
    if tp > 1 and sp:
        for _ in range(forward_gathers(shape.tp_inputs, projections, compiled=style == "compiled")):
            fwd.issue("all_gather", full).add(*layout_copy("all_gather", shape, full))
    fwd.add(*shape.casts("mlp_up", m * h), *fp8_weight_cast("mlp_up", h * up_n, shape),
            gemm("mlp_up", m, up_n, h, bpe, fp8))
    fwd.add(*ew("swiglu" if model.swiglu else "gelu", m * f_l, bpe, style))
    fwd.add(*shape.casts("mlp_down", m * f_l), *fp8_weight_cast("mlp_down", f_l * h, shape),
            gemm("mlp_down", m, h, f_l, bpe, fp8))
    if tp > 1:
        fwd.add(*layout_copy("reduce_scatter", shape, full))
        fwd.issue("reduce_scatter" if sp else "all_reduce", full)

    if tp > 1 and sp:
        # Korthikanti Fig. 5: in backward the adjoints swap (all-gather before the row-parallel GEMM's backward).
        bwd.issue("all_gather", full).add(*layout_copy("all_gather", shape, full))
    bwd.add(*shape.casts("mlp_down_grad", m * h), *gemm_grads("mlp_down", m, h, f_l, bpe, fp8))
    bwd.add(*ew("swiglu_grad" if model.swiglu else "gelu_grad", m * f_l, bpe, style))
    bwd.add(*shape.casts("mlp_up_grad", m * up_n))
    up_dgrad, up_wgrad = gemm_grads("mlp_up", m, up_n, h, bpe, fp8)
    bwd.add(up_dgrad)
    if tp > 1:
        # issued after the input-gradient GEMM, it overlaps the weight-gradient GEMM
        # Assumption: Megatron-LM also re-gathers each column-parallel GEMM's input in backward for its
        # weight gradient, overlapped with the input-gradient GEMM; that all-gather is not modelled.
        for _ in range(input_reductions(shape.tp_inputs, projections)):
            bwd.add(*layout_copy("reduce_scatter", shape, full))
            bwd.issue("reduce_scatter" if sp else "all_reduce", full, overlappable=True)
    bwd.add(up_wgrad, *ew(f"{shape.norm}_grad", resid, bpe, style))
    return fwd, bwd


def model_flops_per_sequence(model: Model, attention_mask: str = "causal") -> float:
    """Model FLOPs of one sequence through the whole model (forward and backward, no recompute) under the
    ``attention_mask`` convention: "causal" counts the unmasked half of the scores (Megatron-LM's
    num_floating_point_operations with a causal mask, FlashAttention's benchmarks), "full" every score
    (Narayanan et al. 2021 eq. (3), PaLM's 6N + 12 L H Q T, torchtitan). MoE layers count a token's topk routed
    experts (6 x the active parameters' matmul FLOPs, as Megatron-LM's num_floating_point_operations); a
    sliding-window layer its band of scores."""
    if model.kind == "mlp":
        layers = model.num_layers * layer_work(model, attention_mask=attention_mask).model_flops
    else:
        kinds: dict[tuple[bool, bool], int] = {}
        for i, key in enumerate(zip(model.moe_layer_flags(), model.window_layer_flags(), strict=True)):
            kinds.setdefault(key, i)
        count = dict.fromkeys(kinds, 0)
        for key in zip(model.moe_layer_flags(), model.window_layer_flags(), strict=True):
            count[key] += 1
        layers = sum(n * layer_work(model, attention_mask=attention_mask, layer=kinds[key]).model_flops
                     for key, n in count.items())
    if model.mtp_layers:
        # DeepSeek-V3 sec. 2.2: each MTP module adds a layer built like the last, its projection, an embedding
        # lookup and the shared output head (Megatron-LM's num_floating_point_operations counts them too).
        mtp = (layer_work(model, attention_mask=attention_mask, layer=model.num_layers - 1).model_flops
               + mtp_work(model, tp=1).model_flops + head_work(model, tp=1).model_flops)
        layers += model.mtp_layers * mtp
    return layers + embedding_work(model, tp=1).model_flops + head_work(model, tp=1).model_flops
