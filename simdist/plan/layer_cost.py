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
"""

from __future__ import annotations

from dataclasses import dataclass

from simdist.errors import LayoutError, SpecError
from simdist.plan.model import Model


@dataclass(frozen=True, slots=True)
class Kernel:
    name: str
    flops: float
    hbm_bytes: float
    """Bytes read + written in HBM."""
    kind: str
    """gemm | attention | memory (bandwidth-bound element-wise)."""
    gemm_mnk: tuple[int, int, int] | None = None
    """(m, n, k) of one GEMM (per head for batched attention GEMMs), for size-dependent efficiency."""
    dtype: str | None = None
    """``fp8``: a GEMM the FP8 recipe casts; None: the step's compute dtype (bf16 under fp8 training)."""
    attention: AttentionShape | None = None
    """A fused attention kernel's family and shape (simdist.hardware.attention prices it from measured curves)."""
    useful_flops: float | None = None
    """Model FLOPs of the kernel where they differ from ``flops`` (what it executes): a materialized attention
    GEMM computes the masked half of the scores too, which the causal convention does not count."""

    @property
    def model_flops(self) -> float:
        return self.flops if self.useful_flops is None else self.useful_flops


@dataclass(frozen=True, slots=True)
class AttentionShape:
    kernel: str
    """flash2 | flash3 | cudnn."""
    direction: str
    """forward | backward."""
    head_dim: int
    parts: tuple[tuple[float, bool, float], ...]
    """(share of the kernel's FLOPs, causal, sequence length) of each piece of work it does."""


@dataclass(frozen=True, slots=True)
class CommWork:
    op: str
    """all_reduce | all_gather | reduce_scatter | all_to_all."""
    nbytes: float
    """The nccl-tests size: the full (gathered / unreduced) buffer."""
    phase: str
    """forward | backward (the recompute's collectives are backward)."""
    overlappable: bool
    """True: can run concurrently with the phase's remaining compute; False: the next kernel waits for it."""
    axis: str = "tp"
    issued_after: int = 0
    """Issued once this many kernels of its tuple (forward, backward, or recompute) have run."""
    recompute: bool = False
    """True: repeated by the recompute; ``issued_after`` then indexes ``Work.recompute``."""
    imbalance: float = 1.0
    """all_to_all over ep: the busiest peer's bytes / the mean peer's (routing imbalance); ``nbytes`` is a balanced
    rank's send buffer (the nccl-tests alltoall size)."""


@dataclass(frozen=True, slots=True)
class Work:
    forward: tuple[Kernel, ...]
    backward: tuple[Kernel, ...]
    recompute: tuple[Kernel, ...]
    comm: tuple[CommWork, ...]
    model_flops: float
    hardware_flops: float


_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
# fp8 training (Transformer Engine / Megatron-LM --fp8-format) keeps activations, their collectives (TP all-reduce /
# all-gather / reduce-scatter) and pipeline messages in bf16: only the linear layers' GEMM operands are cast to
# 1-byte fp8 (their casts are kernels of their own, `_cast`), and the GEMMs write bf16.
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise")
"""Megatron-LM --fp8-recipe names (megatron/training/arguments.py): delayed = TE DelayedScaling, tensorwise = TE
Float8CurrentScaling, mxfp8 = TE MXFP8BlockScaling (Blackwell), blockwise = TE Float8BlockScaling (1x128 / 128x128
blocks, DeepSeek-V3 style)."""
# Bytes per element one cast kernel moves: reads the bf16 tensor (2 B) and writes the fp8 copy the GEMM reads plus
# the transposed fp8 copy the backward GEMM reads (Transformer Engine's cast_transpose: 2 x 1 B), with its scales.
_CAST_BYTES = {
    "delayed": 2 + 2 * 1.0,  # amax recorded in the same pass; the scale comes from the amax history
    "tensorwise": 2 + 2 + 2 * 1.0,  # current scaling: an amax pass over the input before the cast
    "mxfp8": 2 + 2 * (1 + 1 / 32),  # OCP MX: one E8M0 scale per 32 elements, row-wise and column-wise copies
    "blockwise": 2 + 2 * (1 + 4 / 128),  # one fp32 scale per 128 elements (1x128 activations)
}

# Assumption: Adam keeps fp32 master weights, m and v and reads an fp32 gradient (Megatron-LM's main_grad);
# per parameter it reads master, m, v, grad (4 x 4 B) and writes master, m, v (3 x 4 B) plus the 16-bit copy
# (2 B). ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054) sec. 3.1 counts the same 4+4+4 B of optimizer state.
_ADAM_FLOPS_PER_PARAM = 12.0  # Kingma & Ba 2015 Algorithm 1: two moment updates, bias corrections, the step.


def bytes_per_element(precision: str) -> int:
    try:
        return _BYTES[precision]
    except KeyError:
        raise SpecError(f"unknown precision {precision!r}", field="training.precision",
                        fix=f"write one of {', '.join(_BYTES)}") from None


def optimizer_kernels(num_params: float, *, precision: str = "bf16") -> tuple[Kernel, ...]:
    """The Adam step on ``num_params`` parameters (one fused multi-tensor kernel), memory-bound."""
    if num_params < 0:
        raise SpecError("negative parameter count", field="model", fix="check the model size")
    copy = bytes_per_element(precision) if bytes_per_element(precision) < 4 else 0
    per_param = 4 * 4 + 3 * 4 + copy
    return (Kernel("adam", _ADAM_FLOPS_PER_PARAM * num_params, per_param * num_params, "memory"),)


def _gemm(name: str, m: int, n: int, k: int, bpe: int, fp8: bool = False) -> Kernel:
    """C[m,n] = A[m,k] B[k,n]: 2mnk FLOPs, reads A and B, writes C (fp8: 1-byte operands, a bf16 output)."""
    ib = 1 if fp8 else bpe
    return Kernel(name, 2.0 * m * n * k, float(m * k + k * n) * ib + float(m * n) * bpe, "gemm", (m, n, k),
                  dtype="fp8" if fp8 else None)


def _gemm_grads(name: str, m: int, n: int, k: int, bpe: int, fp8: bool = False) -> tuple[Kernel, Kernel]:
    """Input gradient dA = dC B^T (m, k, n) and weight gradient dB = A^T dC (k, n, m).

    # Assumption: the weight gradient accumulates into an fp32 buffer (Megatron-LM gradient_accumulation_fusion,
    # main_grad), read and written: 8 bytes per weight.
    """
    ib = 1 if fp8 else bpe
    dt = "fp8" if fp8 else None
    dgrad = Kernel(f"{name}_input_grad", 2.0 * m * n * k, float(m * n + k * n) * ib + float(m * k) * bpe, "gemm",
                   (m, k, n), dtype=dt)
    wgrad = Kernel(f"{name}_weight_grad", 2.0 * m * n * k, float(m * k + m * n) * ib + 8.0 * k * n, "gemm",
                   (k, n, m), dtype=dt)
    return dgrad, wgrad


def _cast(name: str, elements: float, recipe: str | None) -> list[Kernel]:
    """The fp8 cast of a GEMM operand (Transformer Engine casts each input activation in forward and each output
    gradient in backward); none without an FP8 recipe.

    # Assumption: weights are cast once per step, not per micro-batch (Megatron passes is_first_microbatch so TE
    # caches the fp8 weights across the micro-batches of a step), so their casts are not charged here; casts that
    # TE fuses into a preceding layer norm are charged as separate kernels (an upper bound on their traffic).
    """
    if recipe is None:
        return []
    return [_mem(f"{name}_fp8_cast", elements, _CAST_BYTES[recipe], 3.0)]


def _mem(name: str, elements: float, bytes_per: float, flops_per: float = 1.0) -> Kernel:
    return Kernel(name, flops_per * elements, bytes_per * elements, "memory")


def _check(model: Model, tp: int, cp: int, sequence_parallel: bool, micro_batch_size: int, recompute: str,
           tp_style: str) -> None:
    if tp < 1 or cp < 1 or micro_batch_size < 1:
        raise LayoutError("tp, cp and micro_batch_size must be positive", field="parallel.tp", fix="use 1 or more")
    if recompute not in ("none", "selective", "full"):
        raise SpecError(f"unknown recompute mode {recompute!r}", field="training.recompute",
                        fix="write none, selective or full")
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
    a, g, f, s = model.num_attention_heads, model.num_query_groups, model.ffn_hidden_size, model.seq_length
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
    fwd = (_gemm("linear", b, n, h, bpe), _mem("gelu", b * n, 2 * bpe, 8.0))
    dgrad, wgrad = _gemm_grads("linear", b, n, h, bpe)
    bwd = (_mem("gelu_grad", b * n, 3 * bpe, 8.0), dgrad, wgrad)
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
    return _work(fwd, bwd, redo, comm)


def _work(fwd, bwd, redo, comm, extra_hardware: float = 0.0) -> Work:
    """Model FLOPs: the matmul FLOPs the convention counts (causal half, no recompute); hardware FLOPs: what the
    kernels execute, recompute included (Korthikanti sec. 6.3's MFU / HFU)."""
    def executed(ks) -> float:
        return sum(k.flops for k in ks if k.kind != "memory")

    def counted(ks) -> float:
        return sum(k.model_flops for k in ks if k.kind != "memory")

    model_flops = counted(fwd) + counted(bwd) - extra_hardware
    return Work(tuple(fwd), tuple(bwd), tuple(redo), tuple(comm), model_flops,
                executed(fwd) + executed(bwd) + executed(redo))


ATTENTION_KERNELS = ("materialized", "flash", "flash2", "flash3", "cudnn")
"""``flash`` is FlashAttention-2 (the name earlier releases used); ``cudnn`` the fused attention Transformer Engine
runs on Hopper (its figures from the FlashAttention-3 paper's comparison)."""


def _attention_parts(causal: bool, cp: int, s_q: int) -> tuple[tuple[float, bool, float], ...]:
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


def layer_work(model: Model, *, tp: int = 1, cp: int = 1, sequence_parallel: bool = False,
               micro_batch_size: int = 1, recompute: str = "none", precision: str = "bf16",
               tp_style: str = "megatron", attention: str = "materialized", attention_mask: str = "causal",
               fp8_recipe: str = "delayed") -> Work:
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
    fp8 = recipe is not None
    b = micro_batch_size
    if model.kind == "mlp":
        return _mlp_layer(model, tp, b, recompute, bpe)

    h, f, d = model.hidden_size, model.ffn_hidden_size, model.head_dim
    s_q, s_k = model.seq_length // cp, model.seq_length  # Assumption: CP ranks see all keys (ring attention)
    m = b * s_q  # tokens of this GPU's GEMMs (gathered over the TP group under sequence parallelism)
    a_l = model.num_attention_heads // tp
    kv_l = max(model.num_query_groups // tp, 1) * d  # KV heads replicated when tp exceeds them
    q_l = a_l * d
    resid = m * h // tp if sequence_parallel else m * h  # Korthikanti sec. 4.2.2: LN/dropout split by t
    # Assumption: GPT-style (GELU) models train with Megatron-LM's default dropout 0.1 (hidden and attention);
    # Llama-style (SwiGLU) models without dropout (Dubey et al. 2024 use none), but with rotary embeddings.
    dropout = not model.swiglu
    mask = 1 if dropout else 0
    causal = attention_mask == "causal"
    scores = float(b * a_l * s_q * s_k)  # elements of QK^T on this GPU (the full count, as Narayanan eq. (3))
    # Model FLOPs count the unmasked half under a causal mask (zig-zag CP keeps every rank at exactly half).
    counted = 0.5 if causal else 1.0
    f_l = f // tp

    fwd: list[Kernel] = [_mem("layernorm", resid, 2 * bpe, 8.0), *_cast("qkv", m * h, recipe),
                         _gemm("qkv", m, q_l + 2 * kv_l, h, bpe, fp8)]
    if model.swiglu:
        fwd.append(_mem("rotary", m * (q_l + kv_l), 2 * bpe, 4.0))
    qkv_done = len(fwd)
    core: list[Kernel]
    extra = 0.0
    if attention == "materialized":
        # cuBLAS batched GEMMs compute every score; the mask is applied in the fused softmax.
        core = [
            Kernel("attention_scores", 2.0 * scores * d, (m * q_l + b * s_k * kv_l + scores) * bpe, "attention",
                   (s_q, s_k, d), useful_flops=2.0 * scores * d * counted),
            # Megatron-LM's fused scale-mask-softmax: reads and writes the scores once.
            _mem("softmax", scores, 2 * bpe, 5.0),
        ]
        if dropout:
            core.append(_mem("dropout", scores, 2 * bpe + 1))
        core.append(Kernel("attention_over_values", 2.0 * scores * d, (scores + b * s_k * kv_l + m * q_l) * bpe,
                           "attention", (s_q, d, s_k), useful_flops=2.0 * scores * d * counted))
        core_bwd = [
            Kernel("attention_over_values_grad", 4.0 * scores * d,
                   (2 * scores + 2 * b * s_k * kv_l + 2 * m * q_l) * bpe, "attention", (s_q, s_k, d),
                   useful_flops=4.0 * scores * d * counted),
        ]
        if dropout:
            core_bwd.append(_mem("dropout_grad", scores, 2 * bpe + 1))
        core_bwd += [
            _mem("softmax_grad", scores, 3 * bpe, 4.0),
            Kernel("attention_scores_grad", 4.0 * scores * d,
                   (2 * scores + 2 * m * q_l + 2 * b * s_k * kv_l) * bpe, "attention", (s_q, d, s_k),
                   useful_flops=4.0 * scores * d * counted),
        ]
    else:
        family = "flash2" if attention == "flash" else attention
        parts = _attention_parts(causal, cp, s_q)
        # Assumption: the fused kernel reads Q, K, V and writes O once (its re-reads of K, V per query block are
        # served from L2); a causal kernel skips the masked blocks, so it executes the counted FLOPs.
        io = (2 * m * q_l + 2 * b * s_k * kv_l) * bpe  # read Q, K, V; write O
        core = [Kernel("flash_attention", 4.0 * scores * d * counted, io + 4.0 * m * a_l, "attention", (s_q, s_k, d),
                       attention=AttentionShape(family, "forward", d, parts))]
        core_bwd = [Kernel("flash_attention_grad", 10.0 * scores * d * counted, 2.0 * io + 4.0 * m * a_l, "attention",
                           (s_q, s_k, d), attention=AttentionShape(family, "backward", d, parts))]
        extra = 2.0 * scores * d * counted  # the backward's recomputed QK^T (and P): beyond 2x the forward
    fwd += core
    fwd += _cast("projection", m * q_l, recipe)
    fwd.append(_gemm("projection", m, h, q_l, bpe, fp8))
    proj_done = len(fwd)
    fwd += [_mem("dropout_residual", resid, 3 * bpe + mask, 2.0), _mem("layernorm", resid, 2 * bpe, 8.0)]
    ln2_done = len(fwd)
    up_n = 2 * f_l if model.swiglu else f_l
    fwd += _cast("mlp_up", m * h, recipe)
    fwd.append(_gemm("mlp_up", m, up_n, h, bpe, fp8))
    fwd.append(_mem("swiglu", m * f_l, 3 * bpe, 6.0) if model.swiglu else _mem("gelu", m * f_l, 2 * bpe, 8.0))
    fwd += _cast("mlp_down", m * f_l, recipe)
    fwd.append(_gemm("mlp_down", m, h, f_l, bpe, fp8))
    down_done = len(fwd)
    fwd.append(_mem("dropout_residual", resid, 3 * bpe + mask, 2.0))

    bwd: list[Kernel] = []
    if dropout:
        bwd.append(_mem("dropout_residual_grad", resid, 2 * bpe + 1))
    top = len(bwd)  # the row-parallel MLP-down backward starts here (SP: after its all-gather)
    bwd += _cast("mlp_down_grad", m * h, recipe)
    bwd += _gemm_grads("mlp_down", m, h, f_l, bpe, fp8)
    bwd.append(_mem("swiglu_grad", m * f_l, 5 * bpe, 8.0) if model.swiglu else _mem("gelu_grad", m * f_l, 3 * bpe,
                                                                                     10.0))
    bwd += _cast("mlp_up_grad", m * up_n, recipe)
    up_dgrad, up_wgrad = _gemm_grads("mlp_up", m, up_n, h, bpe, fp8)
    bwd.append(up_dgrad)
    up_dgrad_done = len(bwd)
    bwd += [up_wgrad, _mem("layernorm_grad", resid, 4 * bpe, 10.0)]
    if dropout:
        bwd.append(_mem("dropout_residual_grad", resid, 2 * bpe + 1))
    attn_top = len(bwd)
    bwd += _cast("projection_grad", m * h, recipe)
    bwd += _gemm_grads("projection", m, h, q_l, bpe, fp8)
    bwd += core_bwd
    if model.swiglu:
        bwd.append(_mem("rotary_grad", m * (q_l + kv_l), 2 * bpe, 4.0))
    bwd += _cast("qkv_grad", m * (q_l + 2 * kv_l), recipe)
    qkv_dgrad, qkv_wgrad = _gemm_grads("qkv", m, q_l + 2 * kv_l, h, bpe, fp8)
    bwd.append(qkv_dgrad)
    qkv_dgrad_done = len(bwd)
    bwd += [qkv_wgrad, _mem("layernorm_grad", resid, 4 * bpe, 10.0)]

    comm: list[CommWork] = []
    if tp > 1:
        full = float(m * h * bpe)  # b x s x h activation (s / cp under context parallelism)
        if sequence_parallel:
            # Korthikanti sec. 4.2.2, Fig. 5: g = all-gather before each column-parallel GEMM, g-bar =
            # reduce-scatter after each row-parallel GEMM; in backward their adjoints swap.
            comm += [CommWork("all_gather", full, "forward", False, issued_after=1),
                     CommWork("reduce_scatter", full, "forward", False, issued_after=proj_done),
                     CommWork("all_gather", full, "forward", False, issued_after=ln2_done),
                     CommWork("reduce_scatter", full, "forward", False, issued_after=down_done),
                     CommWork("all_gather", full, "backward", False, issued_after=top),
                     CommWork("reduce_scatter", full, "backward", True, issued_after=up_dgrad_done),
                     CommWork("all_gather", full, "backward", False, issued_after=attn_top),
                     CommWork("reduce_scatter", full, "backward", True, issued_after=qkv_dgrad_done)]
            # Assumption: Megatron-LM also re-gathers each column-parallel GEMM's input in backward for its
            # weight gradient, overlapped with the input-gradient GEMM; that all-gather is not modelled.
        else:
            comm += [CommWork("all_reduce", full, "forward", False, issued_after=proj_done),
                     CommWork("all_reduce", full, "forward", False, issued_after=down_done),
                     CommWork("all_reduce", full, "backward", True, issued_after=up_dgrad_done),
                     CommWork("all_reduce", full, "backward", True, issued_after=qkv_dgrad_done)]
    if cp > 1:
        # Assumption: context parallelism exchanges K and V around the CP ring while attention runs (Megatron-LM
        # context parallelism, Liu et al. 2023 Ring Attention); priced as an all-gather of the full K, V
        # buffer, overlappable, and its adjoint reduce-scatter of dK, dV in backward.
        kv_full = float(b * s_k * 2 * kv_l * bpe)
        comm += [CommWork("all_gather", kv_full, "forward", True, axis="cp", issued_after=qkv_done),
                 CommWork("reduce_scatter", kv_full, "backward", True, axis="cp", issued_after=qkv_dgrad_done - 1)]

    redo: tuple[Kernel, ...] = ()
    if recompute == "full":
        # Checkpointed layer input, whole forward redone before the backward (Korthikanti sec. 5), including
        # its collectives.
        redo = tuple(fwd)
        comm += [CommWork(c.op, c.nbytes, "backward", c.overlappable, c.axis, c.issued_after, True)
                 for c in comm if c.phase == "forward"]
    elif recompute == "selective":
        # Korthikanti sec. 5: only the attention core (QK^T, softmax, dropout, attention over V) is redone.
        redo = tuple(core)
        if cp > 1:
            comm.append(CommWork("all_gather", float(b * s_k * 2 * kv_l * bpe), "backward", True, axis="cp",
                                 issued_after=0, recompute=True))
    return _work(fwd, bwd, redo, comm, extra)


def embedding_work(model: Model, *, tp: int, cp: int = 1, sequence_parallel: bool = False,
                   micro_batch_size: int = 1, precision: str = "bf16") -> Work:
    """The word-embedding lookup (vocab-parallel over tp, Megatron-LM VocabParallelEmbedding)."""
    if model.kind == "mlp":
        return Work((), (), (), (), 0.0, 0.0)
    bpe = bytes_per_element(precision)
    m = micro_batch_size * model.seq_length // cp
    h = model.hidden_size
    # Read each token's row (masked outside this rank's vocabulary slice) and write b x s x h; GPT adds learned
    # positions and embedding dropout (read + write again, mask).
    gpt = not model.swiglu
    fwd = [_mem("embedding", m * h, 2 * bpe + (3 * bpe + 1 if gpt else 0))]
    # Backward: scatter-add of the output gradient into the fp32 embedding gradient (read + write 4 B).
    bwd = [_mem("embedding_grad", m * h, bpe + 8 + (2 * bpe + 1 if gpt else 0))]
    comm: list[CommWork] = []
    if tp > 1:
        full = float(m * h * bpe)
        # VocabParallelEmbedding reduces its partial lookups: all-reduce (reduce-scatter under sequence
        # parallelism, Korthikanti sec. 4.2.2); the backward of the all-reduce is the identity, of the
        # reduce-scatter an all-gather.
        comm.append(CommWork("reduce_scatter" if sequence_parallel else "all_reduce", full, "forward", False,
                             issued_after=1))
        if sequence_parallel:
            comm.append(CommWork("all_gather", full, "backward", False, issued_after=0))
    return _work(fwd, bwd, (), comm)


def head_work(model: Model, *, tp: int, cp: int = 1, sequence_parallel: bool = False,
              micro_batch_size: int = 1, precision: str = "bf16") -> Work:
    """Final norm + logits GEMM + vocab-parallel softmax cross-entropy (decoder); squared-mean loss (mlp)."""
    bpe = bytes_per_element(precision)
    b = micro_batch_size
    h = model.hidden_size
    if model.kind == "mlp":
        # The lecture's loss: x.square().mean() over the (gathered) final activation b x h, and its gradient 2x/N.
        return _work([_mem("loss", b * h, bpe, 2.0)], [_mem("loss_grad", b * h, 2 * bpe, 2.0)], (), [])
    m = b * model.seq_length // cp
    v_l = -(-model.vocab_size // tp)  # vocabulary rows per rank (Megatron pads V to a multiple of tp)
    resid = m * h // tp if sequence_parallel else m * h
    fwd = [_mem("layernorm", resid, 2 * bpe, 8.0), _gemm("logits", m, v_l, h, bpe),
           # Megatron-LM vocab_parallel_cross_entropy: reads the logits, keeps exp(logits) in fp32 for backward.
           _mem("cross_entropy", m * v_l, bpe + 8, 5.0)]
    dgrad, wgrad = _gemm_grads("logits", m, v_l, h, bpe)
    bwd = [_mem("cross_entropy_grad", m * v_l, 4 + bpe, 2.0), dgrad, wgrad, _mem("layernorm_grad", resid, 4 * bpe,
                                                                                 10.0)]
    comm: list[CommWork] = []
    if tp > 1:
        full = float(m * h * bpe)
        if sequence_parallel:
            comm.append(CommWork("all_gather", full, "forward", False, issued_after=1))
            comm.append(CommWork("reduce_scatter", full, "backward", True, issued_after=2))
        else:
            comm.append(CommWork("all_reduce", full, "backward", True, issued_after=2))
        # The cross-entropy's all-reduces of per-token max, sum of exps and target logit (fp32, b x s each).
        comm += [CommWork("all_reduce", 4.0 * m, "forward", False, issued_after=2) for _ in range(3)]
    return _work(fwd, bwd, (), comm)


def model_flops_per_sequence(model: Model, attention_mask: str = "causal") -> float:
    """Model FLOPs of one sequence through the whole model (forward and backward, no recompute) under the
    ``attention_mask`` convention: "causal" counts the unmasked half of the scores (Megatron-LM's
    num_floating_point_operations with a causal mask, FlashAttention's benchmarks), "full" every score
    (Narayanan et al. 2021 eq. (3), PaLM's 6N + 12 L H Q T, torchtitan)."""
    layers = model.num_layers * layer_work(model, attention_mask=attention_mask).model_flops
    return layers + embedding_work(model, tp=1).model_flops + head_work(model, tp=1).model_flops
