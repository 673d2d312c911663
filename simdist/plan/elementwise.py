"""Element-wise and normalisation work between the GEMMs, as each framework runs it: the kernels one *region* (a
norm, a rotary embedding, an activation, a residual add, the loss) becomes under each kernel style.

Three styles (``LayerShape.style``, from ``training.kernel_fusion`` and ``training.compile``):

- ``fused``: Megatron-Core with Transformer Engine / Apex: each region one fused kernel reading its inputs and writing
  its outputs once (the kernels simdist's A100 constants are calibrated with: simdist.hardware.compute).
- ``eager``: one CUDA kernel per PyTorch op, each a pass over HBM, with the fp32 intermediates the modules' Python
  code creates (PyTorch FSDP, torchtitan, DeepSpeed and Composer models without torch.compile).
- ``compiled``: torch.compile (TorchInductor) fuses each chain of element-wise and reduction ops between two
  GEMM/attention kernels into one generated kernel (Ansel et al. 2024, "PyTorch 2", ASPLOS, sec. 5: pointwise and
  reduction fusion), so a region reads its inputs and writes its outputs once, as the fused style, with the
  weight-gradient reductions of norms a kernel of their own.

Each pass is (name, bytes read + written per element of the region, FLOPs per element); a pass of 0 bytes is a
per-row kernel (a mean's rsqrt over b x s values) that costs a launch and no traffic. ``a`` is the activation's bytes
(2 under bf16/fp16 and fp8 training), ``f`` = 4 (fp32 intermediates).

The eager op lists are the modules' own code: an RMSNorm upcasts to fp32 and runs pow, mean, add, rsqrt, mul, the cast
back and the weight's mul (Hugging Face LlamaRMSNorm, torchtitan's llama RMSNorm, ATen's composite rms_norm); a rotary
embedding as complex numbers casts to fp32, multiplies by the frequencies and casts back, per tensor (torchtitan
apply_rotary_emb); SwiGLU is silu then mul; a LayerNorm is ATen's native kernel pair (row moments, then normalise:
aten/src/ATen/native/cuda/layer_norm_kernel.cu); the loss upcasts the logits to fp32 and runs log_softmax and
nll_loss (torch.nn.functional.cross_entropy), whose CUDA softmax reads a row three times when it does not fit in
shared memory (max, sum of exponentials, write: aten/src/ATen/native/cuda/SoftMax.cu). The ops of the chains that
convert between 16-bit activations and fp32 (`CAST_CHAINS`: the norms' and the rotary embedding's) reach a measured
share of a streaming kernel's bandwidth (ComputeEfficiency.eager_cast_share). Checked against kernel-level
measurements of the same modules (tests/test_elementwise.py; Liger-Kernel benchmark data, linkedin/Liger-Kernel @
ead96b6 benchmark/data/all_benchmark_data.csv): an eager Llama RMSNorm on A100 at 2048 x 4096-32768 (forward +1 to
+12 %, backward -5 to -17 %), Llama 4's complex rotary embedding on H100 at 4096-16384 tokens (within 6 %), eager
nn.LayerNorm's forward 1.57-1.66x a fused one (rows rms_norm, llama4_rope and layer_norm).
"""

from __future__ import annotations

import dataclasses

from simdist.plan.kernel_work import Kernel, elementwise

__all__ = ["CAST_CHAINS", "NORMS", "PER_TENSOR", "STYLES", "ew", "kernel_style"]

STYLES = ("fused", "eager", "compiled")
CAST_CHAINS = frozenset({"rmsnorm", "rmsnorm_grad", "qk_norm", "qk_norm_grad", "rotary", "rotary_grad"})
"""Regions whose eager ops convert between the 16-bit activations and fp32 along the way (the upcast norms and the
rotary embedding as complex numbers): their kernels reach a share of a streaming kernel's bandwidth
(simdist.plan.kernel_work.Kernel.eager_cast, ComputeEfficiency.eager_cast_share: 0.63 on A100 from an eager RMSNorm,
0.79 on H100 from an eager complex rotary embedding, measured op by op). The other eager ops (a residual add, silu and
mul on the separate gate and up GEMMs' outputs, ATen's native LayerNorm and softmax) stream at full rate."""
PER_TENSOR = frozenset({"rotary_unfused", "rotary_unfused_grad"})
"""Regions that run op by op on each tensor in every style (Megatron-Core's unfused RoPE on Q, then on K)."""
NORMS = frozenset({"layernorm", "layernorm_grad", "rmsnorm", "rmsnorm_grad", "qk_norm", "qk_norm_grad"})
"""Normalisation regions: outside an eager cast chain their kernels reduce each row, then pass over it again
(simdist.plan.kernel_work.Kernel.norm, ComputeEfficiency.norm_share: on B200 they reach 0.51 of the streaming rate,
its element-wise kernels 0.89; one share on the other GPUs)."""
_F = 4.0


def kernel_style(kernel_fusion: str, compile: bool) -> str:
    """The style of a step's element-wise work: compiled under torch.compile, else the framework's fusion."""
    return "compiled" if compile and kernel_fusion == "eager" else kernel_fusion


def _rms_eager(a: float) -> list[tuple[str, float, float]]:
    f = _F
    return [("to_fp32", a + f, 0.0), ("pow", 2 * f, 1.0), ("mean", f, 1.0), ("add_eps", 0.0, 0.0),
            ("rsqrt", 0.0, 0.0), ("mul_rsqrt", 2 * f, 1.0), ("to_input_dtype", f + a, 0.0), ("mul_weight", 2 * a, 1.0)]


def _rms_grad_eager(a: float) -> list[tuple[str, float, float]]:
    # Autograd of the forward above, last op first: the weight's mul (input gradient, weight-gradient product and
    # its sum over tokens), the cast, the mul by rsqrt (its two gradients, the second summed over the row), rsqrt,
    # add and mean on the row statistics, pow (2x, times x), the sum of the two paths, the cast back.
    f = _F
    return [("mul_weight_grad", 2 * a, 1.0), ("weight_grad_mul", 2 * a + f, 1.0), ("weight_grad_sum", f, 1.0),
            ("to_input_dtype_grad", a + f, 0.0), ("mul_rsqrt_grad", 2 * f, 1.0), ("rsqrt_grad_mul", 3 * f, 1.0),
            ("rsqrt_grad_sum", f, 1.0), ("rsqrt_backward", 0.0, 0.0), ("mean_backward", 0.0, 0.0),
            ("pow_backward", 2 * f, 1.0), ("pow_backward_mul", 2 * f, 1.0), ("add_grads", 3 * f, 1.0),
            ("to_fp32_grad", f + a, 0.0)]


def _regions(a: float) -> dict[str, dict[str, list[tuple[str, float, float]]]]:
    f = _F
    return {
        # GPT LayerNorm: fused Apex/TE kernel; ATen's native pair (row moments, normalise).
        "layernorm": {"fused": [("layernorm", 2 * a, 8.0)],
                      "eager": [("layernorm_moments", a, 3.0), ("layernorm", 2 * a, 5.0)],
                      "compiled": [("layernorm", 2 * a, 8.0)]},
        # ATen layer_norm_backward: the per-row gradient sums, the input gradient, the gamma/beta partial sums.
        "layernorm_grad": {"fused": [("layernorm_grad", 4 * a, 10.0)],
                           "eager": [("layernorm_grad_sums", 2 * a, 4.0), ("layernorm_grad", 3 * a, 6.0),
                                     ("layernorm_weight_grad", 2 * a, 2.0)],
                           "compiled": [("layernorm_grad", 3 * a, 8.0), ("layernorm_weight_grad", 2 * a, 2.0)]},
        "rmsnorm": {"fused": [("rmsnorm", 2 * a, 8.0)], "eager": _rms_eager(a),
                    "compiled": [("rmsnorm", 2 * a, 8.0)]},
        "rmsnorm_grad": {"fused": [("rmsnorm_grad", 4 * a, 10.0)], "eager": _rms_grad_eager(a),
                         "compiled": [("rmsnorm_grad", 3 * a, 8.0), ("rmsnorm_weight_grad", 2 * a, 2.0)]},
        # Q/K norms (Qwen3, OLMo 2): an RMSNorm over each head.
        "qk_norm": {"fused": [("qk_norm", 2 * a, 8.0)], "eager": _rms_eager(a),
                    "compiled": [("qk_norm", 2 * a, 8.0)]},
        "qk_norm_grad": {"fused": [("qk_norm_grad", 4 * a, 10.0)], "eager": _rms_grad_eager(a),
                         "compiled": [("qk_norm_grad", 3 * a, 8.0), ("qk_norm_weight_grad", 2 * a, 2.0)]},
        # Rotary embedding over Q and K (elements: both); eager per tensor (``per_tensor``): fp32 cast, complex mul,
        # cast back.
        "rotary": {"fused": [("rotary", 2 * a, 4.0)],
                   "eager": [("rotary_to_fp32", a + f, 0.0), ("rotary_complex_mul", 2 * f, 6.0),
                             ("rotary_to_input_dtype", f + a, 0.0)],
                   "compiled": [("rotary", 2 * a, 4.0)]},
        # Megatron-Core's unfused RoPE (rope_utils.py _apply_rotary_pos_emb_bshd), run where YaRN's attention factor
        # is not 1 (TE's fused RoPE takes none; Model.rotary_concentration), on Q and on K in the activations' dtype:
        # cos and sin of the [s, d] frequencies, scaled and cast (six small kernels), then t cos, -x2 of rotate_half
        # (half the elements), its cat, x sin, the add, and the cat with the empty pass-through part. Backward
        # (autograd, as torch 2.13 runs it on CPU: validation.rope_ops): x sin, neg, the chunk's cat, x cos, the
        # two paths summed, the empty slice's zeros and their sum into the input's gradient.
        "rotary_unfused": {s: [(f"rotary_{op}", 0.0, 0.0) for op in ("cos", "cos_scale", "cos_cast", "sin",
                                                                     "sin_scale", "sin_cast")]
                           + [("rotary_mul_cos", 2 * a, 1.0), ("rotary_neg", a, 0.5), ("rotary_rotate_cat", 2 * a, 0.0),
                              ("rotary_mul_sin", 2 * a, 1.0), ("rotary_add", 3 * a, 1.0), ("rotary_cat", 2 * a, 0.0)]
                           for s in STYLES},
        "rotary_unfused_grad": {s: [("rotary_mul_sin_grad", 2 * a, 1.0), ("rotary_neg_grad", a, 0.5),
                                    ("rotary_chunk_grad", 2 * a, 0.0), ("rotary_mul_cos_grad", 2 * a, 1.0),
                                    ("rotary_grads_add", 3 * a, 1.0), ("rotary_slice_grad_zeros", a, 0.0),
                                    ("rotary_slice_grads_add", 3 * a, 1.0)] for s in STYLES},
        "rotary_grad": {"fused": [("rotary_grad", 2 * a, 4.0)],
                        "eager": [("rotary_grad_to_fp32", a + f, 0.0), ("rotary_grad_complex_mul", 2 * f, 6.0),
                                  ("rotary_grad_to_input_dtype", f + a, 0.0)],
                        "compiled": [("rotary_grad", 2 * a, 4.0)]},
        # The residual add after each half of the layer (no dropout); its backward is the sum of the two gradients
        # reaching the branch point (the residual path's and the norm's), which autograd adds in a kernel of its own
        # in every style: Megatron-Core's fused bias-dropout-add passes the residual's gradient through and nothing
        # fuses the sum (megatron/core/transformer/transformer_layer.py @ 2edffadb: the residual and the norm's input
        # are the same tensor; autograd's InputBuffer accumulates them; docs/moe-kernel-inventory.md).
        "residual": {"fused": [("dropout_residual", 3 * a, 2.0)], "eager": [("residual_add", 3 * a, 1.0)],
                     "compiled": [("residual_add", 3 * a, 1.0)]},
        "residual_grad": {"fused": [("residual_grad_add", 3 * a, 1.0)], "eager": [("residual_grad_add", 3 * a, 1.0)],
                          "compiled": [("residual_grad_add", 3 * a, 1.0)]},
        # GPT: dropout on the branch, then the residual add (a 1-byte mask, Korthikanti sec. 4.1); backward, the
        # dropout's gradient and the residual stream's two gradients summed (as "residual_grad").
        "dropout_residual": {"fused": [("dropout_residual", 3 * a + 1, 2.0)],
                             "eager": [("dropout", 2 * a + 1, 2.0), ("residual_add", 3 * a, 1.0)],
                             "compiled": [("dropout_residual", 3 * a + 1, 2.0)]},
        "dropout_residual_grad": {"fused": [("dropout_residual_grad", 2 * a + 1, 1.0),
                                            ("residual_grad_add", 3 * a, 1.0)],
                                  "eager": [("dropout_grad", 2 * a + 1, 1.0), ("residual_grad_add", 3 * a, 1.0)],
                                  "compiled": [("dropout_residual_grad", 3 * a + 1, 2.0)]},
        # SwiGLU over the f-wide up projection (elements: b s f): silu(gate) * up.
        "swiglu": {"fused": [("swiglu", 3 * a, 6.0)], "eager": [("silu", 2 * a, 4.0), ("swiglu_mul", 3 * a, 1.0)],
                   "compiled": [("swiglu", 3 * a, 6.0)]},
        # mul's two gradients (each reads the output gradient and the other input), then silu's backward.
        "swiglu_grad": {"fused": [("swiglu_grad", 5 * a, 8.0)],
                        "eager": [("swiglu_mul_grad_gate", 3 * a, 1.0), ("swiglu_mul_grad_up", 3 * a, 1.0),
                                  ("silu_grad", 3 * a, 6.0)],
                        "compiled": [("swiglu_grad", 5 * a, 8.0)]},
        "gelu": {"fused": [("gelu", 2 * a, 8.0)], "eager": [("gelu", 2 * a, 8.0)], "compiled": [("gelu", 2 * a, 8.0)]},
        "gelu_grad": {"fused": [("gelu_grad", 3 * a, 10.0)], "eager": [("gelu_grad", 3 * a, 10.0)],
                      "compiled": [("gelu_grad", 3 * a, 10.0)]},
        # The attention output (b, heads, s, d) made contiguous as (b, s, heads x d) for the output projection, and
        # the output gradient made contiguous for the attention backward (eager and compiled; TE's kernels take and
        # give the (s, b, heads x d) layout the GEMMs use).
        "attention_layout": {"fused": [], "eager": [("transpose_contiguous", 2 * a, 0.0)],
                             "compiled": [("transpose_contiguous", 2 * a, 0.0)]},
        "attention_layout_grad": {"fused": [], "eager": [("transpose_contiguous_grad", 2 * a, 0.0)],
                                  "compiled": [("transpose_contiguous_grad", 2 * a, 0.0)]},
        # Softmax cross-entropy over the logits (elements: b s V / tp). fused: Megatron-LM's vocab-parallel loss as
        # simdist's A100 constants price it (one pass reading the 16-bit logits, the fp32 exponentials kept).
        "cross_entropy": {"fused": [("cross_entropy", a + 8, 5.0)],
                          "eager": [("logits_to_fp32", a + f, 0.0), ("log_softmax", 4 * f, 5.0),
                                    ("nll_loss", 0.0, 0.0)],
                          "compiled": [("cross_entropy", 2 * a, 5.0)]},
        # nll_loss's backward fills a zero fp32 gradient and scatters the targets' entries; log_softmax's backward
        # reads the gradient for its row sums, then the gradient and the output; the cast back to the logits' dtype.
        "cross_entropy_grad": {"fused": [("cross_entropy_grad", 4 + a, 2.0)],
                               "eager": [("nll_loss_grad_fill", f, 0.0), ("log_softmax_grad", 4 * f, 3.0),
                                         ("logits_grad_to_input_dtype", f + a, 0.0)],
                               "compiled": [("cross_entropy_grad", 2 * a, 3.0)]},
        # One fused softmax cross-entropy kernel per pass (Megatron-LM --cross-entropy-loss-fusion, flash-attn's
        # xentropy kernel): the forward reads the logits once (online max and sum), the backward reads them and
        # writes their gradient.
        "fused_cross_entropy": {s: [("fused_cross_entropy", a, 5.0)] for s in STYLES},
        "fused_cross_entropy_grad": {s: [("fused_cross_entropy_grad", 2 * a, 3.0)] for s in STYLES},
        # The z-loss (PaLM's softmax normaliser penalty, multiplier x logsumexp(logits)^2; OLMo-core's
        # z_loss_multiplier) on the logits the loss reads (elements: b s V / tp; eager: the fp32 logits of the loss's
        # upcast): eager ATen logsumexp is amax, the difference to the row maxima, exp in place and the row sums
        # (aten/src/ATen/native/ReduceOps.cpp logsumexp_out_impl; the log and add per row); its gradient
        # exp(x - lse) times the row's incoming gradient (derivatives.yaml logsumexp_backward: the difference, exp,
        # the product), then added to the cross-entropy's gradient of the same logits (autograd accumulates the
        # two). Compiled: one fused reduction, one fused gradient pass that adds into the loss's. fused: none of its
        # own (a fused loss computes lse^2 and its gradient in its pass: flash-attn's Triton cross_entropy
        # lse_square_scale, OLMo-core's fused_cross_entropy_loss).
        "z_loss": {"fused": [], "eager": [("z_loss_amax", f, 1.0), ("z_loss_sub_max", 2 * f, 1.0),
                                          ("z_loss_exp", 2 * f, 4.0), ("z_loss_sum", f, 1.0)],
                   "compiled": [("z_loss", a, 6.0)]},
        "z_loss_grad": {"fused": [], "eager": [("z_loss_grad_sub", 2 * f, 1.0), ("z_loss_grad_exp", 2 * f, 4.0),
                                               ("z_loss_grad_mul", 2 * f, 1.0), ("logits_grad_accumulate", 3 * f, 1.0)],
                        "compiled": [("z_loss_grad", 3 * a, 6.0)]},
    }


_CACHE: dict[float, dict] = {}


def passes(region: str, a: float, style: str) -> list[tuple[str, float, float]]:
    """(name, bytes per element, FLOPs per element) of each kernel ``region`` runs in ``style``."""
    table = _CACHE.get(a)
    if table is None:
        table = _CACHE[a] = _regions(a)
    return table[region][style]


def ew(region: str, elements: float, a: float, style: str, *, per_tensor: int = 1) -> list[Kernel]:
    """The kernels of ``region`` over ``elements`` (activation bytes ``a``) in ``style``. ``per_tensor``: the region
    covers that many equal tensors, which eager code runs one by one (Q and K of a rotary embedding), and which
    Megatron-Core's fused style runs one Transformer Engine call each (`_fused_launches`)."""
    n = per_tensor if style == "eager" or region in PER_TENSOR else 1
    cast = style == "eager" and region in CAST_CHAINS
    norm = region in NORMS and not cast
    kernels = [elementwise(name, elements / n, bytes_per, flops_per, eager_cast=cast, norm=norm)
               for _ in range(n) for name, bytes_per, flops_per in passes(region, a, style)]
    if style == "fused" and n == 1 and per_tensor > 1:
        kernels = [dataclasses.replace(k, **_fused_launches(region, per_tensor)) for k in kernels]
    return kernels


def _fused_launches(region: str, tensors: int) -> dict[str, int]:
    """`Kernel` launch fields of a fused-style region over ``tensors`` equal tensors: Megatron-Core calls Transformer
    Engine once per tensor (the q and k norms, their RoPEs: megatron/core/transformer/attention.py @ 2edffadb); a
    norm's backward launches a main and a finalize kernel (TE common/normalization rtc_dispatch) and its weight's
    gradient is added into main_grad by Megatron's hook, a call of its own (docs/moe-kernel-inventory.md)."""
    if region in NORMS and region.endswith("_grad"):
        return {"launches": 3 * tensors, "calls": 2 * tensors}
    return {"launches": tensors, "calls": tensors}
