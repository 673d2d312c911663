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

from dataclasses import asdict, dataclass
from functools import lru_cache

from simdist.errors import LayoutError, SpecError
from simdist.plan.activations import (
    ELEMENT_BYTES,
    PRECISIONS,
    activation_bytes_per_layer,
    activation_kind,
    check_choice,
    check_positive,
    dispatcher_buffer_bytes,
    embedding_activation_bytes,
)
from simdist.plan.expert_parallel import ExpertParallel
from simdist.plan.layer_params import layer_param_shards
from simdist.plan.model import Model

GIB = 2**30


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


_STATE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def optimizer_state_bytes(precision: str, *, exp_avg: str = "fp32", exp_avg_sq: str = "fp32",
                          main_params: str = "fp32", master_copy: bool = True) -> float | None:
    """Adam's optimizer state per parameter: the master copy of 16-bit training's parameters (none for fp32/tf32
    training, nor where the parameters themselves are the fp32 master weights: ``master_copy`` False, PyTorch FSDP's
    mixed precision, `model_state_bytes`) and the two moments, each in its dtype (Megatron-LM
    --use-precision-aware-optimizer with --main-params-dtype, --exp-avg-dtype, --exp-avg-sq-dtype:
    megatron/core/optimizer/distrib_optimizer.py keeps them in Transformer Engine's FusedAdam of those dtypes; fp8
    moments are 1 byte, their per-tensor scale not counted); None where every dtype is the default
    (`model_state_bytes`' 12, or 8)."""
    if (exp_avg, exp_avg_sq, main_params) == ("fp32", "fp32", "fp32"):
        return None
    wide = ELEMENT_BYTES[precision] == 4
    master = 0 if wide or not master_copy else _STATE_BYTES[main_params]
    return float(master + _STATE_BYTES[exp_avg] + _STATE_BYTES[exp_avg_sq])


def model_state_bytes(
    num_params: float, *, dp: int = 1, zero_stage: int = 0, precision: str = "bf16",
    grad_reduce_in_fp32: bool | None = None, optimizer_bytes: float | None = None, master_copy: bool = True,
    master_dtype: str = "fp32",
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
    ``optimizer_bytes`` replaces K (`optimizer_state_bytes`: the state kept in narrower dtypes).

    ``master_copy`` False: PyTorch FSDP's mixed precision (FSDP1 MixedPrecision, FSDP2 MixedPrecisionPolicy), whose
    parameters stay in their original fp32 and are the optimizer's master weights: "FSDP does not require any extra
    memory to keep a high-precision copy of the parameters for the optimizer step" and "the optimizer step uses the
    sharded parameter in the original dtype" (pytorch/pytorch torch/distributed/fsdp/_fully_shard/_fsdp_api.py,
    MixedPrecisionPolicy); the 16-bit copy exists only gathered, one unit at a time (`stage_memory`'s other). The
    reduced gradient is cast back to the parameter's dtype for the step (FSDP1: _runtime_utils.py
    _cast_grad_to_param_dtype; FSDP2: _fsdp_collectives.py foreach_reduce), so 4 + 4 + 8 = 16 bytes per parameter
    whatever the reduction's dtype (Megatron-LM's scheme: 2 + 4 + 12 = 18 with fp32 gradients). ``master_dtype``:
    the dtype of such a parameter, and so of its gradient (2 for a model built in bf16: KempnerForge's
    build_parallel_model casts the model to train.param_dtype, bf16, before fully_shard).
    """
    check_choice(precision, PRECISIONS, "training.precision")
    check_positive(dp, "parallel.dp")
    if zero_stage not in (0, 1, 2, 3):
        raise SpecError(f"zero_stage = {zero_stage} is not a ZeRO stage", field="parallel.zero_stage",
                        fix="use 0, 1, 2 or 3")
    wide = ELEMENT_BYTES[precision] == 4
    from simdist.plan.step_config import grad_bytes_per_element

    param_b, grad_b, optim_b = (4.0, 4.0, 8.0) if wide else (
        2.0, float(grad_bytes_per_element(precision, grad_reduce_in_fp32)), 12.0)
    if not wide and not master_copy:
        # the parameter is the master weight and the gradient is cast to its dtype; no 16-bit copy at rest
        param_b = grad_b = float(_STATE_BYTES[master_dtype])
        optim_b = 8.0
    if optimizer_bytes is not None:
        optim_b = optimizer_bytes
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
    _, split, replicated, routed = _layer_sums(model, layers)
    mtp = model.mtp_layers if last_stage else 0
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


@lru_cache(maxsize=4096)
def _layer_sums(model: Model, layers: tuple[int, ...]) -> tuple[tuple[tuple[int, int], ...], int, int, int]:
    """Of a stage's ``layers``: how many have each kind of activations (`activation_kind`: (first layer of the
    kind, count)), and their parameters split over tp, replicated and routed (`layer_param_shards`), summed. Cached:
    a search asks for the memory of thousands of layouts whose stages hold the same layers."""
    kinds: dict[int, int] = {}
    split = replicated = routed = 0
    for i in layers:
        key = activation_kind(model, i)
        kinds[key] = kinds.get(key, 0) + 1
        s_i, r_i, e_i = layer_param_shards(model, i)
        split, replicated, routed = split + s_i, replicated + r_i, routed + e_i
    return tuple(kinds.items()), split, replicated, routed


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
    modules: tuple[str, ...] = ("core_attn",),
    style: str = "fused",
    full_share: float = 1.0,
    unsharded: str = "",
    shard_group: int | None = None,
    optimizer_bytes: float | None = None,
    fp8_attention: bool = False,
    master_copy: bool = True,
    master_dtype: str = "fp32",
    loss_parallel: bool = True,
    op_keeps_attention: bool = True,
) -> MemoryBreakdown:
    """Memory of one GPU of a pipeline stage at its activation peak.

    ``modules``: what selective recompute redoes; ``style``: the element-wise kernels' style (activations.py);
    ``full_share``: under recompute full, the share of the layers recomputed (recompute_method block / every), the
    others keeping everything; ``unsharded``: ZeRO-3 kept gathered (``params``: FSDP reshard_after_forward false;
    ``params_grads``: also the gradients accumulated unsharded until one reduce-scatter per step, FSDP under PyTorch
    pipelining; ``grads``: the gradients alone, FSDP's no_sync with resharded parameters); ``shard_group``: the
    data-parallel ranks ZeRO shards over (hybrid sharding; None: dp);
    ``optimizer_bytes``: optimizer state per parameter (`optimizer_state_bytes`; None: `model_state_bytes`' default);
    ``fp8_attention``: the attention keeps its Q, K and V in fp8 (activations.py); ``master_copy`` False: the fp32
    parameters are the master weights (PyTorch FSDP, `model_state_bytes`), in ``master_dtype``; ``loss_parallel`` False:
    the last stage keeps the whole vocabulary's logits (training.loss_parallel); ``op_keeps_attention`` False: under
    recompute op the attention's output is not saved (training.op_sac_saved_attention, activations.py).

    ``layers``: the stage's layer indices (simdist.plan.step_config.StepConfig.stage_layers; None: layers_on_stage
    layers of a model whose layers are all alike); ``experts``: how its MoE layers run (None: ep = etp = 1).

    ``layers_on_stage`` counts all the stage's layers (every chunk when interleaved, vpp > 1);
    ``in_flight_microbatches`` is in units of one micro-batch through all of them (see the function of
    that name), so the chunk-level count c of the interleaved schedule enters as c / vpp.
    """
    check_positive(pp, "parallel.pp")
    check_positive(vpp, "parallel.vpp")
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
    kinds = dict(_layer_sums(model, layers)[0])
    def per_layer(i: int) -> float:
        own = activation_bytes_per_layer(model, recompute=recompute, attention=attention, layer=i, experts=experts,
                                         modules=modules, style=style, fp8_attention=fp8_attention,
                                         op_keeps_attention=op_keeps_attention, **kw)
        if recompute == "full" and full_share < 1.0:
            rest = activation_bytes_per_layer(model, recompute="none", attention=attention, layer=i, experts=experts,
                                              style=style, fp8_attention=fp8_attention, **kw)
            return full_share * own + (1.0 - full_share) * rest
        return own

    layer_bytes = sum(n * per_layer(i) for i, n in kinds.items())
    ends = {**kw, "loss_parallel": loss_parallel}  # (the embedding's and the head's activations)
    outside = embedding_activation_bytes(model, first_stage=first_stage, last_stage=last_stage, **ends)
    mtp = model.mtp_layers if last_stage else 0
    if mtp:
        # each MTP module: a layer like the last one, its own logits (embedding_activation_bytes' last-stage terms)
        last = model.num_layers - 1
        layer_bytes += mtp * per_layer(last)
        outside += mtp * embedding_activation_bytes(model, first_stage=False, last_stage=True, **ends)
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
    shards = (shard_group or dp) * cp
    params, grads, optim = model_state_bytes(n, dp=shards, zero_stage=zero_stage, precision=precision,
                                             grad_reduce_in_fp32=grad_reduce_in_fp32, optimizer_bytes=optimizer_bytes,
                                             master_copy=master_copy, master_dtype=master_dtype)
    if zero_stage == 3 and unsharded:
        # FSDP keeping the gathered 16-bit parameters through the step (and the gradients until the step's one
        # reduce-scatter), beside the sharded ones: ZeRO-2's (ZeRO-1's) memory plus the shards (the gathered copy
        # is the 16-bit one whoever keeps the master weights; the accumulated gradients are in the reduction's dtype:
        # FSDP2's FSDPParam.to_accumulated_grad_if_needed upcasts them to reduce_dtype)
        full_p, full_g, _ = model_state_bytes(n, dp=shards, zero_stage=2 if unsharded == "params" else 1,
                                              precision=precision, grad_reduce_in_fp32=grad_reduce_in_fp32)
        if unsharded != "grads":
            params += full_p
        if unsharded != "params":
            grads = full_g
    if n_experts:
        ranks = tp * cp * dp
        if ranks % (experts.ep * experts.etp):
            raise LayoutError(f"ep x etp = {experts.ep * experts.etp} does not divide tp x cp x dp = {ranks}",
                              field="parallel.ep", fix="choose ep and etp whose product divides tp x cp x dp")
        edp = ranks // (experts.ep * experts.etp)
        p_e, g_e, o_e = model_state_bytes(n_experts, dp=edp, zero_stage=zero_stage, precision=precision,
                                          grad_reduce_in_fp32=grad_reduce_in_fp32, optimizer_bytes=optimizer_bytes,
                                          master_copy=master_copy, master_dtype=master_dtype)
        params, grads, optim = params + p_e, grads + g_e, optim + o_e

    e = ELEMENT_BYTES[precision]
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
        # (a layer's shards follow its kind: `_layer_sums`' first layer of each kind stands for the others)
        biggest = sorted((sum(layer_param_shards(model, i)[:2]) / tp + layer_param_shards(model, i)[2]
                          / (experts.ep * experts.etp) for i in kinds), reverse=True)
        other += sum((biggest * 2)[:min(len(layers), 2)]) * param_bytes
    if model.kind == "decoder" and model.is_moe and any(model.moe_layer_flags()[i] for i in kinds):
        # The token dispatcher's send / receive buffers, one MoE layer at a time (transient).
        other += dispatcher_buffer_bytes(model, tokens=model.seq_length * micro_batch_size // (cp * split),
                                         precision=precision, experts=experts)
    if last_stage and model.kind == "decoder":
        # The 16-bit logits the output projection returns coexist with their fp32 copy during the loss
        # (Megatron-LM tensor_parallel/cross_entropy.py upcasts them); transient, one micro-batch.
        other += e * model.seq_length * micro_batch_size * model.vocab_size / tp / cp
    return MemoryBreakdown(params, grads, optim, activations, other, capacity_bytes)
