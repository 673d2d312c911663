"""The units of a layer's cost: kernels (FLOPs and HBM bytes on one GPU), the collectives between them, and the
per-pass sequence that issues both (simdist.plan.layer_cost and its block modules build layers from these).

A GEMM of (m, n, k) costs 2mnk FLOPs (Narayanan et al. 2021, arXiv:2104.04473 sec. 5.1 footnote); its backward
computes the input and the weight gradient, twice the forward FLOPs (ibid.). Byte counts are what each kernel reads
plus writes in HBM.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from simdist.errors import SpecError


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
    eager_cast: bool = False
    """An eager PyTorch element-wise op of a chain that converts between the 16-bit activations and fp32 (an RMSNorm's
    or a rotary embedding's ATen ops): it reaches ``ComputeEfficiency.eager_cast_share`` of a streaming kernel's
    bandwidth (simdist.hardware.compute)."""
    norm: bool = False
    """A normalisation kernel (LayerNorm, RMSNorm, their gradients: a reduction over each row, then an element-wise
    pass over it): it reaches ``ComputeEfficiency.norm_share`` of a streaming kernel's bandwidth."""
    strided_copy: bool = False
    """An eager copy out of strided (non-contiguous) views, element by element (ATen's CatArrayBatchedCopy on inputs
    it cannot vectorise: simdist.plan.tp_plan.layout_copy): it reaches ``ComputeEfficiency.strided_copy_share`` of a
    streaming kernel's bandwidth."""
    launches: int = 1
    """CUDA kernels this entry stands for, each with its launch gap on the GPU and its launch on the host: one, or
    Transformer Engine's grouped GEMM (one cuBLASLt GEMM per local expert: `TE_GEMM_STREAMS`), or a chain of small
    kernels priced together (the router's auxiliary loss: simdist.plan.moe_router)."""
    streams: int = 1
    """Streams its launches run on side by side: the GPU pays ceil(launches / streams) launch gaps
    (simdist.hardware.compute.kernel_time_s)."""
    calls: int = 1
    """Framework ops (host dispatches) that issue its launches (simdist.hardware.host.HostOverhead.issue_s)."""

    @property
    def launch_gaps(self) -> int:
        """Launch gaps the GPU pays for this entry's kernels: ceil(launches / streams)."""
        return -(-self.launches // self.streams)

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
    dtype: str = "bf16"
    """bf16 | fp8 | mxfp8: the data type it runs in (fp8 ones: training.fp8_attention)."""
    window: int = 0
    """A causal sliding window's keys per query (0: none): the parts then run over the whole sequence, each query
    meeting ``window`` keys (simdist.hardware.attention.window_efficiency prices the band)."""


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
    ring: bool = False
    """A context-parallel ring exchange: runs beside the ring steps' attention (simdist.plan.context_parallel)."""
    kernel: str = "nccl"
    """all_to_all over ep: what moves the tokens (nccl, or the flex dispatcher's deepep / hybridep:
    simdist.collectives.ep_kernels)."""


@dataclass(frozen=True, slots=True)
class Work:
    forward: tuple[Kernel, ...]
    backward: tuple[Kernel, ...]
    recompute: tuple[Kernel, ...]
    comm: tuple[CommWork, ...]
    model_flops: float
    hardware_flops: float
    host_syncs: tuple[int, ...] = ()
    """Forward kernel counts after which the host waits for the device (a device-to-host copy the next kernels'
    launch needs: an MoE dispatcher's token counts), in order; the GPU's queue then runs dry
    (simdist.plan.chunk_cost)."""
    recompute_syncs: tuple[int, ...] = ()
    """The same for ``recompute``'s kernels (full recompute redoes the forward's synchronizations)."""
    forward_scopes: tuple[str, ...] = ()
    """The part of the layer each forward kernel belongs to, as Megatron-Core's CUDA graph scopes capture them
    (simdist.plan.graph_scope tags: attn, mlp, moe_router, moe_experts); empty: none (not a layer's work)."""
    backward_scopes: tuple[str, ...] = ()
    """The same for the backward's kernels."""
    graph_input: Kernel | None = None
    """The copy of the layer's hidden states into a CUDA graph's static buffer before each replay
    (simdist.plan.graph_scope)."""


ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 2}
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
        return ELEMENT_BYTES[precision]
    except KeyError:
        raise SpecError(f"unknown precision {precision!r}", field="training.precision",
                        fix=f"write one of {', '.join(ELEMENT_BYTES)}") from None


def optimizer_kernels(num_params: float, *, precision: str = "bf16") -> tuple[Kernel, ...]:
    """The Adam step on ``num_params`` parameters (one fused multi-tensor kernel), memory-bound."""
    if num_params < 0:
        raise SpecError("negative parameter count", field="model", fix="check the model size")
    copy = bytes_per_element(precision) if bytes_per_element(precision) < 4 else 0
    per_param = 4 * 4 + 3 * 4 + copy
    return (Kernel("adam", _ADAM_FLOPS_PER_PARAM * num_params, per_param * num_params, "memory"),)


TE_GEMM_STREAMS = 4
"""Side streams Transformer Engine's grouped GEMM spreads its GEMMs over: general_grouped_gemm runs
nvte_multi_tensor_gemm, which issues one cuBLASLt GEMM per group, GEMM i on compute stream i mod 4
(transformer_engine/common/gemm/cublaslt_gemm.cu multi_stream_cublas_gemm; util/multi_stream.cpp
get_num_compute_streams: 4 @ d0067d0), the main stream waiting for all of them (TE PR #853, "Grouped GEMM via
multi-stream cuBLAS"). Megatron-Core's TEGroupedMLP calls it for each linear of the local experts."""


def _launches(batch: int, grouped: bool) -> dict:
    """`Kernel` launch fields of one call of ``batch`` GEMMs: Transformer Engine's grouped GEMM (``grouped``) launches
    one GEMM a group over `TE_GEMM_STREAMS` side streams; a batched GEMM is one kernel."""
    if not grouped or batch <= 1:
        return {}
    return {"launches": batch, "streams": min(batch, TE_GEMM_STREAMS)}


def gemm(name: str, m: int, n: int, k: int, bpe: int, fp8: bool = False, *, batch: int = 1,
         useful: float | None = None, grouped: bool = False) -> Kernel:
    """C[m,n] = A[m,k] B[k,n]: 2mnk FLOPs, reads A and B, writes C (fp8: 1-byte operands, a bf16 output).

    ``batch``: one grouped call of ``batch`` such GEMMs, each with its own B (the local experts' weights; the roofline
    reads the batch back as flops / 2mnk for tile/wave quantization); ``grouped``: Transformer Engine's grouped GEMM,
    one launch per GEMM (`TE_GEMM_STREAMS`); ``useful``: model FLOPs where they differ from the executed ones
    (Kernel.useful_flops)."""
    ib = 1 if fp8 else bpe
    return Kernel(name, 2.0 * m * n * k * batch, float(m * k + k * n) * ib * batch + float(m * n) * bpe * batch,
                  "gemm", (m, n, k), dtype="fp8" if fp8 else None, useful_flops=useful, **_launches(batch, grouped))


def gemm_grads(name: str, m: int, n: int, k: int, bpe: int, fp8: bool = False, *, batch: int = 1,
               useful: float | None = None, grouped: bool = False) -> tuple[Kernel, Kernel]:
    """Input gradient dA = dC B^T (m, k, n) and weight gradient dB = A^T dC (k, n, m) (``batch``, ``useful``,
    ``grouped``: as `gemm`, ``useful`` for each of the two).

    # Assumption: the weight gradient accumulates into an fp32 buffer (Megatron-LM gradient_accumulation_fusion,
    # main_grad), read and written: 8 bytes per weight.
    """
    ib = 1 if fp8 else bpe
    dt = "fp8" if fp8 else None
    launches = _launches(batch, grouped)
    dgrad = Kernel(f"{name}_input_grad", 2.0 * m * n * k * batch,
                   (float(m * n + k * n) * ib + float(m * k) * bpe) * batch, "gemm", (m, k, n), dtype=dt,
                   useful_flops=useful, **launches)
    wgrad = Kernel(f"{name}_weight_grad", 2.0 * m * n * k * batch, (float(m * k + m * n) * ib + 8.0 * k * n) * batch,
                   "gemm", (k, n, m), dtype=dt, useful_flops=useful, **launches)
    return dgrad, wgrad


_SCALE_BYTES = 8.0
"""nvte_compute_scale_from_amax: reads the fp32 amax, writes the fp32 scale (its scale_inv beside it)."""


def fp8_cast(name: str, elements: float, recipe: str | None, *, transformer_engine: bool = True,
             parts: int = 1) -> list[Kernel]:
    """The fp8 cast of a GEMM operand (each input activation in forward, each output gradient in backward), as the
    kernels that run it; none without an FP8 recipe. ``parts``: the tensors the operand is quantized as (a grouped
    GEMM's local experts, each with scales of its own); ``transformer_engine``: Transformer Engine's
    quantizers (else torchao's: one cast kernel a tensor, `_CAST_BYTES` its traffic).

    Transformer Engine (transformer_engine/pytorch/csrc/quantizer.cpp and extensions/cast.cpp @ d0067d0):
    current scaling (tensorwise, Float8CurrentScalingQuantizer::quantize_impl) launches three kernels a tensor:
    nvte_compute_amax (a pass over the input), nvte_compute_scale_from_amax (one scale from the amax) and
    nvte_quantize_v2 (the cast and its transposed copy); the other recipes one (delayed: the amax recorded in the
    cast's own pass; MXFP8 and blockwise: the block scales computed in it). A grouped GEMM's operand is split per
    expert (split_quantize) and quantized tensor by tensor (multi_tensor_quantize_impl: "Currently only have fused
    kernel for FP8 delayed scaling"), except under delayed scaling, whose experts' casts run as one
    nvte_multi_cast_transpose kernel. Traffic per element is `_CAST_BYTES` however many kernels share it.

    # Assumption: weights are cast once per step, not per micro-batch (Megatron passes is_first_microbatch so TE
    # caches the fp8 weights across the micro-batches of a step), so their casts are not charged here; casts that
    # TE fuses into a preceding layer norm are charged as separate kernels (an upper bound on their traffic).
    # Assumption: torchao's casts (torch.compile fuses a tensor's amax reduction and cast) are one kernel a tensor.
    """
    if recipe is None:
        return []
    if not transformer_engine:
        return [elementwise(f"{name}_fp8_cast", elements, _CAST_BYTES[recipe], 3.0)]
    tensors = 1 if recipe == "delayed" else parts  # TE fuses only the delayed-scaling casts of several tensors
    each = elements / tensors
    if recipe == "tensorwise":
        kernels = [elementwise(f"{name}_fp8_amax", each, 2.0, 1.0),  # |x| reduced to one max: a read of the input
                   elementwise(f"{name}_fp8_scale", 1, _SCALE_BYTES, 1.0),  # one thread: the amax read, scale written
                   elementwise(f"{name}_fp8_cast", each, _CAST_BYTES[recipe] - 2.0, 2.0)]
    else:
        kernels = [elementwise(f"{name}_fp8_cast", each, _CAST_BYTES[recipe], 3.0)]
    return kernels * tensors


def fp8_weight_cast(name: str, elements: float, shape: LayerShape) -> list[Kernel]:
    """The fp8 cast of a linear layer's weight shard (``elements``) in every forward, where the framework does not
    keep the cast weights across a step's micro-batches: torchao's Float8Linear casts the (gathered) bf16 weight with
    its dynamic scale each call (torchao/float8/float8_linear.py), and the transposed copy its backward GEMMs read;
    Transformer Engine caches it (`fp8_cast`'s Assumption)."""
    if shape.recipe is None or shape.fp8_weight_cache:
        return []
    return [elementwise(f"{name}_weight_fp8_cast", elements, _CAST_BYTES[shape.recipe], 3.0)]


def elementwise(name: str, elements: float, bytes_per: float, flops_per: float = 1.0, *,
                useful_share: float | None = None, eager_cast: bool = False, norm: bool = False,
                strided_copy: bool = False) -> Kernel:
    """An element-wise (bandwidth-bound) kernel; ``useful_share``: the share of its FLOPs the model counts (the
    balanced rows of a kernel the busiest MoE rank runs on its extra rows); ``eager_cast``, ``norm``,
    ``strided_copy``: see `Kernel.eager_cast`, `Kernel.norm`, `Kernel.strided_copy`."""
    flops = flops_per * elements
    return Kernel(name, flops, bytes_per * elements, "memory",
                  useful_flops=None if useful_share is None else flops * useful_share, eager_cast=eager_cast,
                  norm=norm, strided_copy=strided_copy)


def work_of(fwd, bwd, redo, comm, extra_hardware: float = 0.0, host_syncs: tuple[int, ...] = (),
            recompute_syncs: tuple[int, ...] = (), scopes: tuple[tuple[str, ...], tuple[str, ...]] = ((), ()),
            graph_input: Kernel | None = None) -> Work:
    """Model FLOPs: the matmul FLOPs the convention counts (causal half, no recompute, a token's topk experts at the
    balanced share); hardware FLOPs: what the kernels execute, recompute included (Korthikanti et al. 2022,
    arXiv:2205.05198 sec. 6.3's MFU / HFU)."""
    def executed(ks) -> float:
        return sum(k.flops for k in ks if k.kind != "memory")

    def counted(ks) -> float:
        return sum(k.model_flops for k in ks if k.kind != "memory")

    model_flops = counted(fwd) + counted(bwd) - extra_hardware
    return Work(tuple(fwd), tuple(bwd), tuple(redo), tuple(comm), model_flops,
                executed(fwd) + executed(bwd) + executed(redo), tuple(host_syncs), tuple(recompute_syncs),
                tuple(scopes[0]), tuple(scopes[1]), graph_input)


@dataclass(slots=True)
class Pass:
    """The kernels of one pass (forward or backward) in issue order, and the collectives issued between them: a
    collective's ``issued_after`` is the number of kernels issued before it."""

    phase: str
    kernels: list[Kernel] = field(default_factory=list)
    comm: list[CommWork] = field(default_factory=list)
    syncs: list[int] = field(default_factory=list)
    """Kernel counts after which the host waits for the device (`Work.host_syncs`)."""

    def add(self, *kernels: Kernel) -> Pass:
        self.kernels.extend(kernels)
        return self

    def issue(self, op: str, nbytes: float, *, overlappable: bool = False, axis: str = "tp",
              imbalance: float = 1.0, kernel: str = "nccl") -> Pass:
        self.comm.append(CommWork(op, float(nbytes), self.phase, overlappable, axis, len(self.kernels),
                                  imbalance=imbalance, kernel=kernel))
        return self

    def sync(self) -> Pass:
        """The host waits here for the device to finish every kernel issued so far (a blocking device-to-host copy)."""
        self.syncs.append(len(self.kernels))
        return self

    def then(self, other: Pass) -> Pass:
        """Append ``other``'s kernels, collectives and synchronizations (shifted past this pass's kernels)."""
        n = len(self.kernels)
        self.syncs.extend(i + n for i in other.syncs)
        self.kernels.extend(other.kernels)
        self.comm.extend(dataclasses.replace(c, phase=self.phase, issued_after=c.issued_after + n)
                         for c in other.comm)
        return self


@dataclass(frozen=True, slots=True)
class LayerShape:
    """What every block of one decoder layer reads about its GPU's share of a micro-batch."""

    micro_batch_size: int
    seq_q: int
    """Queries (tokens) of this GPU's sequence slice: seq_length / cp."""
    seq_k: int
    """Keys each query may see: seq_length (Assumption: CP ranks see all keys, ring attention)."""
    tp: int
    cp: int
    sequence_parallel: bool
    bpe: int
    recipe: str | None
    """The FP8 recipe of the linear layers' GEMMs; None: they run in the step's precision."""
    dropout: bool
    style: str = "fused"
    """How element-wise work runs: fused | eager | compiled (simdist.plan.elementwise)."""
    norm: str = "layernorm"
    """layernorm (GPT) | rmsnorm (Llama-style models: SwiGLU ones here)."""
    fp8_weight_cache: bool = True
    """FP8 weights cast once per step (Transformer Engine) rather than in every forward (torchao)."""
    fp8_attention: bool = False
    """The fused attention runs in fp8 (Transformer Engine's FP8 DotProductAttention)."""
    tp_inputs: str = "module"
    """Where a module's input changes layout for its column-parallel projections (simdist.plan.tp_plan)."""
    async_tp: bool = False
    """torchtitan's async TP: the sequence-parallel collectives micro-pipelined with their GEMMs
    (simdist.plan.chunk_cost), which gather and scatter each shard in place (no layout copy: simdist.plan.tp_plan)."""

    def casts(self, name: str, elements: float, parts: int = 1) -> list[Kernel]:
        """The kernels that cast a GEMM operand of ``elements`` (``parts`` tensors) to fp8 under this shape's recipe
        (`fp8_cast`): Transformer Engine's quantizers where the framework keeps the cast weights across a step
        (``fp8_weight_cache``: it runs TE's modules), torchao's casts otherwise; none without a recipe."""
        return fp8_cast(name, elements, self.recipe, transformer_engine=self.fp8_weight_cache, parts=parts)

    @property
    def attention_dtype(self) -> str:
        """The data type the fused attention runs in: mxfp8 under the MXFP8 recipe, fp8 (per-tensor scales) under the
        delayed and tensorwise ones, where fp8_attention; bf16 otherwise (Transformer Engine FusedAttnFunc's qkv_type
        follows the recipe)."""
        if not (self.fp8_attention and self.recipe is not None):
            return "bf16"
        return "mxfp8" if self.recipe == "mxfp8" else "fp8"

    @property
    def tokens(self) -> int:
        """Tokens of this GPU's GEMMs (gathered over the TP group under sequence parallelism): b x s / cp."""
        return self.micro_batch_size * self.seq_q

    @property
    def local_tokens(self) -> int:
        """Tokens a TP peer holds between the column- and row-parallel regions: b s / (cp tp) under sequence
        parallelism (Korthikanti sec. 4.2.2), all of them otherwise."""
        return self.tokens // self.tp if self.sequence_parallel else self.tokens

    @property
    def fp8(self) -> bool:
        return self.recipe is not None

    @property
    def mask_bytes(self) -> int:
        return 1 if self.dropout else 0
