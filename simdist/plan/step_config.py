"""What a step plan is built from: the step's configuration, the layer split, and each model chunk's cost.

`StepConfig` is the plain, validated input of `simdist.plan.step.build_step` (simdist.predict builds it from a
scenario); `chunk_cost` turns the layers a pipeline stage runs for one model part into seconds on its GPU and the
collectives they need (simdist.plan.layer_cost kernels on the simdist.hardware.compute roofline).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from simdist.errors import LayoutError
from simdist.hardware.compute import ComputeEfficiency, compute_efficiency, kernel_time_s, kernels_time_s
from simdist.hardware.host import HostOverhead, host_overhead
from simdist.hardware.tp_overlap import gemm_slowdown
from simdist.plan.execution import MEGATRON, Execution
from simdist.plan.layer_cost import Work, embedding_work, head_work, layer_work, mtp_work
from simdist.plan.layer_split import choose_split, chunk_layers
from simdist.plan.memory import layer_param_shards, layer_tensors
from simdist.plan.mesh import Mesh
from simdist.plan.model import Model
from simdist.plan.moe_cost import ExpertParallel
from simdist.plan.recompute import full_layers
from simdist.spec.gpu import GpuSpec


@dataclass(frozen=True, slots=True)
class StepConfig:
    model: Model
    gpu: GpuSpec
    mesh: Mesh
    schedule: str
    micro_batch_size: int
    global_batch_size: int
    layers_per_stage: tuple[int, ...]
    vpp: int = 1
    recompute: str = "none"
    precision: str = "bf16"
    sequence_parallel: bool = False
    zero_stage: int = 0
    tp_style: str = "megatron"
    attention: str = "flash"
    attention_mask: str = "causal"
    """causal | full (simdist.plan.layer_cost.layer_work)."""
    fp8_recipe: str = "delayed"
    """Which ops run in fp8 and how they are scaled, under precision fp8 (simdist.plan.layer_cost.FP8_RECIPES)."""
    fp8_param_gather: bool = False
    """Megatron-LM --fp8-param-gather: the distributed optimizer's / ZeRO's parameter all-gather moves fp8 (1 B)."""
    grad_reduce: str = "bucketed"
    grad_bucket_bytes: float | None = None
    """None: one bucket per model chunk (Megatron-LM's contiguous gradient buffer, reduced at once)."""
    overlap_param_gather: bool = False
    """Megatron-LM --overlap-param-gather: the distributed optimizer's parameter all-gather runs bucket by bucket
    beside the first micro-batch's forward of each chunk instead of after the optimizer (simdist.plan.recipe)."""
    zero3_fetch: str = "prefetch"
    """ZeRO-3 parameter traffic: ``prefetch`` or ``per_parameter`` (simdist.plan.step's module docstring)."""
    scatter_gather: bool = True
    """Megatron's pipeline scatter/gather (Narayanan et al. 2021 sec 4.1): each tp peer sends 1/tp."""
    dp_batch_split: tuple[int, ...] | None = None
    """Local batch of each data-parallel rank (sums to the global batch); None: equal shares."""
    compute_slowdown: tuple[tuple[int, float], ...] = ()
    """(rank, time factor) of straggler GPUs whose compute kernels take ``factor`` x as long (scenario
    ``faults.stragglers``); data-parallel replicas are then simulated one by one, as with ``dp_batch_split``."""
    capacity_bytes: float = math.inf
    compute_efficiency: ComputeEfficiency | None = None
    """Calibrated roofline constants (simdist calibrate); None: simdist/hardware/data/compute_efficiency.csv."""
    host: HostOverhead | None = None
    """Host-side costs per op and per pipeline step (simdist.hardware.host); None: its data file's defaults."""
    layers_per_part: tuple[int, ...] | None = None
    """Decoder layers of every model part (part c * pp + s: chunk c of stage s; simdist.plan.layer_split), summing
    per stage to layers_per_stage; None: each stage's layers over its chunks by layer_split.chunk_layers."""
    split_method: str = ""
    """How the layer split was chosen (reports)."""
    # Mixture of experts (scenario parallel.ep / etp and training.moe_*; simdist.plan.model for the model's side).
    ep: int = 1
    """Expert-parallel size: each MoE layer's routed experts sharded over ep ranks carved out of dp x cp."""
    etp: int = 1
    """Tensor parallelism inside each expert (Megatron-Core expert_tensor_parallel_size)."""
    moe_dispatcher: str = "alltoall"
    """alltoall | allgather | flex (Megatron-LM --moe-token-dispatcher-type)."""
    moe_imbalance: float = 1.0
    """The busiest expert-parallel rank's routed tokens / the mean."""
    moe_capacity_factor: float | None = None
    """Tokens an expert takes / its balanced share; None: dropless."""
    moe_grouped_gemm: bool = True
    moe_overlap: bool = False
    """Megatron-LM --overlap-moe-expert-parallel-comm."""
    tp_comm_overlap: bool = False
    """Megatron-LM --tp-comm-overlap: the tp collectives run beside the compute (simdist.plan.recipe), the GEMMs whose
    reduce-scatter overlaps them on fewer SMs (simdist.hardware.tp_overlap)."""
    grad_reduce_in_fp32: bool | None = None
    """Gradients of 16-bit training accumulated and reduced in fp32; None: Megatron-LM's default
    (`grad_bytes_per_element`)."""
    execution: Execution = MEGATRON
    """How the framework runs the work (simdist.plan.execution): kernel style, CUDA graphs, optimizer, FSDP,
    recompute policy, context-parallel communication, async TP."""

    def __post_init__(self) -> None:
        parts = self.layers_per_part
        if parts is not None:
            K = self.mesh.pp
            if len(parts) != K * self.vpp or any(sum(parts[c * K + s] for c in range(self.vpp)) != n
                                                 for s, n in enumerate(self.layers_per_stage)):
                raise LayoutError(f"layers_per_part {list(parts)} does not match layers_per_stage "
                                  f"{list(self.layers_per_stage)} with vpp = {self.vpp}", field="parallel.vpp",
                                  fix="give pp x vpp part counts summing per stage to layers_per_stage")

    def stage_chunks(self, stage: int) -> tuple[int, ...]:
        """Decoder layers of each of ``stage``'s vpp model chunks."""
        if self.layers_per_part is not None:
            K = self.mesh.pp
            return tuple(self.layers_per_part[c * K + stage] for c in range(self.vpp))
        return tuple(chunk_layers(self.layers_per_stage[stage], self.vpp))

    def model_parts(self) -> tuple[int, ...]:
        """Decoder layers of every model part in model order (part c * pp + s: chunk c of stage s)."""
        K = self.mesh.pp
        return tuple(self.stage_chunks(p % K)[p // K] for p in range(K * self.vpp))

    def part_first_layers(self) -> tuple[int, ...]:
        """Index (0-based, in the model) of the first decoder layer of every model part, in model order."""
        firsts, n = [], 0
        for count in self.model_parts():
            firsts.append(n)
            n += count
        return tuple(firsts)

    def part_layers(self, part: int) -> LayerKinds:
        """The decoder layers of model ``part`` (c * pp + s: chunk c of stage s) as `layer_kinds`."""
        return layer_kinds(self.model, self.part_first_layers()[part], self.model_parts()[part])

    def stage_layers(self, stage: int) -> tuple[int, ...]:
        """Indices (0-based) of every decoder layer that pipeline ``stage`` holds, over its vpp chunks."""
        K, firsts, counts = self.mesh.pp, self.part_first_layers(), self.model_parts()
        return tuple(i for c in range(self.vpp) for i in range(firsts[c * K + stage],
                                                                 firsts[c * K + stage] + counts[c * K + stage]))

    @property
    def expert_parallel(self) -> ExpertParallel:
        """How this step's MoE layers run (simdist.plan.moe_cost)."""
        return ExpertParallel(self.ep, self.etp, self.moe_dispatcher, self.moe_imbalance, self.moe_capacity_factor,
                              self.moe_grouped_gemm)

    @property
    def num_stages(self) -> int:
        return self.mesh.pp

    @property
    def host_overhead(self) -> HostOverhead:
        return self.host or host_overhead(self.gpu)

    @property
    def interference(self) -> float:
        """How much longer compute takes beside collectives (simdist.plan.interference)."""
        return (self.compute_efficiency or compute_efficiency(self.gpu)).comm_interference

    @property
    def host_op_s(self) -> float:
        """Host time of one eager framework op (simdist.hardware.compute.ComputeEfficiency.host_op_s)."""
        return (self.compute_efficiency or compute_efficiency(self.gpu)).host_op_s

    @property
    def replicas_differ(self) -> bool:
        """Data-parallel replicas do not all run the same timeline (unequal batches, a straggler)."""
        return self.dp_batch_split is not None or bool(self.compute_slowdown)

    def compute_factor(self, stage: int, dp_index: int) -> float:
        """Time factor of the compute kernels of the representative of ``stage`` in replica ``dp_index`` (1: every
        GPU healthy): its slowest tensor/context-parallel peer's.

        # Assumption: a straggler slows its whole tensor/context-parallel group: the peers meet at a collective
        # after every forward and backward compute of a chunk (simdist.plan.recipe), so each waits for the slowest.
        """
        f = 1.0
        for rank, x in self.compute_slowdown:
            c = self.mesh.coords(rank)
            if c["pp"] == stage and c["dp"] == dp_index:
                f = max(f, x)
        return f

    def rank_factor(self, rank: int) -> float:
        """Time factor of the compute kernels of GPU ``rank`` itself (1: healthy)."""
        return max([1.0, *(x for r, x in self.compute_slowdown if r == rank)])

    def microbatches(self, dp_index: int) -> int:
        if self.dp_batch_split is None:
            return self.global_batch_size // (self.micro_batch_size * self.mesh.dp)
        return self.dp_batch_split[dp_index] // self.micro_batch_size


@dataclass(frozen=True, slots=True)
class ChunkCost:
    """Durations and collectives of one model chunk (the layers one stage runs for one model part)."""

    forward_s: float
    backward_s: float
    recompute_s: float
    forward_comm: tuple[tuple[str, float, str, int, float], ...]
    """(op, nbytes, axis, count, imbalance) run back to back after the forward compute; ``imbalance``: an
    all_to_all's busiest peer's bytes / the mean (simdist.plan.layer_cost.CommWork.imbalance; 1.0: even)."""
    recompute_comm: tuple[tuple[str, float, str, int, float], ...]
    backward_overlapped_comm: tuple[tuple[str, float, str, int, float], ...]
    backward_comm: tuple[tuple[str, float, str, int, float], ...]
    ring_forward_comm: tuple[tuple[str, float, str, int, float], ...]
    """Context-parallel ring exchanges (cp_comm_type p2p) of the forward, beside ``ring_forward_s`` of its compute."""
    ring_backward_comm: tuple[tuple[str, float, str, int, float], ...]
    ring_forward_s: float
    """Of forward_s, the ring steps' attention (the compute the ring exchanges overlap)."""
    ring_backward_s: float
    model_flops_forward: float
    model_flops_backward: float
    recompute_flops: float
    num_params: float
    """Parameters this chunk holds on one GPU (its tp shard)."""
    num_tensors: int
    """Parameter tensors (weights and biases), for per-parameter gradient reduction."""
    first_part: bool = False
    """The chunk is model part 0 (pipeline rank 0's first chunk): where Megatron-LM cuts gradients into buckets."""
    expert_params: float = 0.0
    """Of ``num_params``, the routed experts' parameters on one GPU (its ep x etp shard): their gradients reduce over
    the expert-data-parallel group, not dp (Megatron-Core expert_data_parallel group)."""
    num_layers: int = 0
    """Decoder layers in the chunk (and multi-token-prediction layers): its FSDP units (simdist.plan.fsdp)."""
    embedding_params: float = 0.0
    """Of ``num_params``, the word embedding's on one GPU (the first model part's)."""
    head_params: float = 0.0
    """Of ``num_params``, the output layer's on one GPU (the last model part's, untied)."""


# ----------------------------------------------------------------------------- layer split
def split_layers(num_layers: int, num_stages: int, how: str | tuple[int, ...] = "even", vpp: int = 1
                 ) -> tuple[int, ...]:
    """Layers per pipeline stage (simdist.plan.layer_split.choose_split with a per-stage list or a
    ``pipeline_split`` name: auto, even, lighter_ends).

    lighter_ends: as even as possible with the first and the last stage one layer lighter where the count does not
    divide, as Llama 3 405B ran 126 layers on 16 stages (Dubey et al. 2024, arXiv:2407.21783 sec 3.3.2: "we reduce
    one Transformer layer each from the first and the last stages"): 7 + 14 x 8 + 7.
    """
    model = Model(name="split", kind="mlp", num_layers=num_layers, hidden_size=1)
    if isinstance(how, tuple | list):
        split = choose_split(model, pp=num_stages, vpp=vpp, layers_per_stage=list(how))
    else:
        split = choose_split(model, pp=num_stages, vpp=vpp, pipeline_split=how)
    return split.layers_per_stage


# ----------------------------------------------------------------------------- costs
def _comm_groups(work_comm: tuple, phase: str, overlappable: bool | None, times: int, ring: bool = False) -> tuple:
    """(op, nbytes, axis, count, imbalance) of a Work's collectives of one phase (``overlappable`` None: either), alike
    ones counted together; ``ring``: the context-parallel ring exchanges instead of the others."""
    agg: dict[tuple[str, float, str, float], int] = {}
    for c in work_comm:
        if c.phase == phase and (overlappable is None or c.overlappable == overlappable) and c.ring == ring:
            key = (c.op, float(c.nbytes), c.axis, float(c.imbalance))
            agg[key] = agg.get(key, 0) + times
    return tuple((op, nbytes, axis, n, x) for (op, nbytes, axis, x), n in agg.items())


LayerKinds = tuple[tuple[int, int], ...]
"""A run of decoder layers as (representative layer index, count) per distinct kind of layer (MoE or dense MLP,
sliding or full attention): the representative is the model's first layer of that kind, so two runs with the same
mix compare (and cache) equal; a dense model's n layers are ((0, n),)."""


def layer_kinds(model: Model, first_layer: int, num_layers: int) -> LayerKinds:
    """Layers first_layer .. first_layer + num_layers - 1 of ``model`` as `LayerKinds`."""
    if first_layer < 0 or first_layer + num_layers > model.num_layers:
        raise LayoutError(f"layers {first_layer}..{first_layer + num_layers - 1} are outside the model's "
                          f"{model.num_layers}", field="model.num_layers", fix="split the model's own layers")
    if model.kind != "decoder":
        return ((0, num_layers),) if num_layers else ()
    keys = list(zip(model.moe_layer_flags(), model.window_layer_flags(), strict=True))
    first_of: dict[tuple[bool, bool], int] = {}
    for i, key in enumerate(keys):
        first_of.setdefault(key, i)
    count: dict[int, int] = {}
    for key in keys[first_layer:first_layer + num_layers]:
        count[first_of[key]] = count.get(first_of[key], 0) + 1
    return tuple(sorted(count.items()))


def chunk_cost(cfg: StepConfig, layers: LayerKinds | int, first_part: bool, last_part: bool) -> ChunkCost:
    """Cost of the decoder ``layers`` of one model part (`StepConfig.part_layers`; an int n: n layers of a model whose
    layers are all alike) + the embedding on the first model part, + the head (and the multi-token-prediction
    modules) on the last, per micro-batch."""
    m = cfg.model
    if isinstance(layers, int):
        if m.kind == "decoder" and len(set(zip(m.moe_layer_flags(), m.window_layer_flags(), strict=True))) > 1:
            raise LayoutError(f"model {m.name!r} mixes kinds of layers: a chunk's cost needs its layer indices",
                              field="model.moe_layer_freq", fix="pass StepConfig.part_layers(part)")
        layers = ((0, layers),) if layers else ()
    kw = dict(tp=cfg.mesh.tp, cp=cfg.mesh.cp, sequence_parallel=cfg.sequence_parallel,
              micro_batch_size=cfg.micro_batch_size, precision=cfg.precision)
    experts, ex = cfg.expert_parallel, cfg.execution

    def layer(i: int, recompute: str = cfg.recompute) -> Work:
        return layer_work(m, recompute=recompute, tp_style=cfg.tp_style, attention=cfg.attention,
                          attention_mask=cfg.attention_mask, fp8_recipe=cfg.fp8_recipe, layer=i, experts=experts,
                          style=ex.style, fp8_weight_cache=ex.fp8_weight_cache,
                          recompute_modules=ex.recompute_modules, cp_comm_type=ex.cp_comm_type, **kw)

    parts: list[tuple[Work, int]] = []
    if cfg.recompute == "full" and ex.recompute_method not in (None, "uniform"):
        # Full recompute of some of the chunk's layers (simdist.plan.recompute.full_layers), the others none.
        # Assumption: where the chunk mixes kinds of layers, the recomputed ones are spread over the kinds in
        # proportion.
        total = sum(n for _, n in layers)
        redo = full_layers(ex.recompute_method, ex.recompute_num_layers, total)
        left = redo
        for j, (i, n) in enumerate(layers):
            k = left if j == len(layers) - 1 else min(left, round(redo * n / total)) if total else 0
            left -= k
            parts += [(w, c) for w, c in ((layer(i, "full"), k), (layer(i, "none"), n - k)) if c]
    else:
        parts = [(layer(i), n) for i, n in layers]
    if first_part and m.kind == "decoder":
        parts.append((embedding_work(m, style=ex.style, **kw), 1))
    if last_part:
        parts.append((head_work(m, style=ex.style, loss_fusion=ex.loss_fusion, **kw), 1))
    mtp = m.mtp_num_layers if last_part and m.kind == "decoder" else 0
    if mtp:
        # DeepSeek-V3 sec. 2.2 / Megatron-LM: the MTP modules run on the last pipeline stage after the main model:
        # each an embedding lookup, its norms and projection, a layer built like the last one, the shared head.
        parts += [(layer(m.num_layers - 1), mtp), (mtp_work(m, **kw), mtp),
                  (embedding_work(m, style=ex.style, **kw), mtp),
                  (head_work(m, style=ex.style, loss_fusion=ex.loss_fusion, **kw), mtp)]

    host = cfg.host_overhead
    eff = cfg.compute_efficiency or compute_efficiency(cfg.gpu)
    if ex.cuda_graphs:
        # Kernels replayed from CUDA graphs: no host launch per kernel, and the graph's smaller gap between kernels
        # (simdist.hardware.compute.ComputeEfficiency.graph_launch_overhead_s).
        eff = dataclasses.replace(eff, launch_overhead_s=eff.graph_launch_overhead_s)

    def total(kernels_of) -> float:
        # Each part's kernels take their roofline time, or the host's time to issue them where that is longer
        # (simdist.hardware.host: one eager op per modelled kernel); under CUDA graphs the GPU's time alone.
        # Assumption: one framework op per kernel simdist models (fused kernels as Megatron-LM fuses them).
        if ex.cuda_graphs:
            return sum(kernels_time_s(cfg.gpu, kernels_of(w), cfg.precision, eff) * n for w, n in parts)
        return sum(host.kernels_time_s(kernels_time_s(cfg.gpu, kernels_of(w), cfg.precision, eff),
                                       len(kernels_of(w))) * n for w, n in parts)

    def comm(phase: str, overlappable: bool | None, ring: bool = False) -> tuple:
        out: dict[tuple[str, float, str, float], int] = {}
        for w, n in parts:
            for op, nbytes, axis, k, x in _comm_groups(w.comm, phase, overlappable, n, ring):
                out[(op, nbytes, axis, x)] = out.get((op, nbytes, axis, x), 0) + k
        return tuple((op, nb, ax, k, x) for (op, nb, ax, x), k in out.items())

    def ring_s(kernels_of) -> float:
        # Context-parallel ring attention (cp_comm_type p2p): the cp - 1 ring steps of each attention core run beside
        # the exchanges of KV blocks (simdist.plan.context_parallel); Assumption: the steps take (cp - 1) / cp of the
        # core's time (the first step, causal on the rank's own chunks, is 1 / cp of its work).
        if cfg.mesh.cp < 2 or ex.cp_comm_type != "p2p":
            return 0.0
        share = (cfg.mesh.cp - 1) / cfg.mesh.cp
        return share * sum(kernel_time_s(cfg.gpu, k, cfg.precision, eff) * n
                           for w, n in parts for k in kernels_of(w) if k.kind == "attention")

    # Model FLOPs per the causal convention (Kernel.model_flops: the masked half of the scores not counted; a
    # token's topk experts at the balanced share).
    # (matmul FLOPs only, as simdist.plan.kernel_work.work_of counts them: element-wise kernels carry FLOPs for the
    # roofline, not for the model-FLOP convention)
    fwd_model = sum(sum(k.model_flops for k in w.forward if k.kind != "memory") * n for w, n in parts)
    bwd_model = sum(sum(k.model_flops for k in w.backward if k.kind != "memory") * n for w, n in parts)
    rec = sum(sum(k.flops for k in w.recompute) * n for w, n in parts)
    # Parameters this chunk holds on one GPU: each layer's dense weights over tp and its routed experts over
    # ep x etp (simdist.plan.memory.layer_param_shards), the embedding on the first part and the output
    # projection on the last (each vocab x h / tp; Megatron's vocab-parallel embedding), the MTP modules there too.
    tp, experts_gpus = cfg.mesh.tp, cfg.ep * cfg.etp
    split = replicated = routed = tensors = 0
    for i, n in layers:
        s_i, r_i, e_i = layer_param_shards(m, i)
        split, replicated, routed = split + s_i * n, replicated + r_i * n, routed + e_i * n
        tensors += layer_tensors(m, i, ep=cfg.ep) * n
    if mtp:
        s_i, r_i, e_i = layer_param_shards(m, m.num_layers - 1)
        own = m.mtp_params // mtp - m.layer_params(m.num_layers - 1)  # its norms and eh_proj, split over tp
        split, replicated, routed = split + (s_i + own) * mtp, replicated + r_i * mtp, routed + e_i * mtp
        tensors += mtp * (layer_tensors(m, m.num_layers - 1, ep=cfg.ep) + 4)
    params = split / tp
    emb_params = head_params = 0.0
    if m.kind == "decoder":
        emb = m.vocab_size * m.hidden_size / tp
        emb_params = emb if first_part else 0.0
        head_params = emb if last_part and not m.tied_embeddings else 0.0
        params += emb_params + head_params
        tensors += (1 if first_part else 0) + (1 if last_part and not m.tied_embeddings else 0)
    expert_params = routed / experts_gpus
    if replicated or routed:
        params += replicated + expert_params
    tax = tax_backward = 0.0
    if ex.async_tp and cfg.mesh.tp > 1:
        # torchtitan's async TP splits each GEMM beside a sequence-parallel collective into tp GEMMs of m / tp rows
        # (torch/_inductor/fx_passes/micro_pipeline_tp.py: fused_all_gather_matmul / fused_matmul_reduce_scatter, one
        # matmul per shard), forward and backward; the copies run on the copy engines (symmetric memory), not the
        # SMs. Charged: the smaller GEMMs' lost efficiency (size and wave quantization: simdist.hardware.gemm).
        split = cfg.mesh.tp
        for w, n in parts:
            for k in (*w.forward, *w.backward):
                if k.kind == "gemm" and k.gemm_mnk and k.name.removesuffix("_input_grad") in _ASYNC_TP_GEMMS:
                    m_, n_, k_ = k.gemm_mnk
                    piece = dataclasses.replace(k, flops=k.flops / split, hbm_bytes=k.hbm_bytes / split,
                                                gemm_mnk=(max(1, m_ // split), n_, k_))
                    extra = n * (split * kernel_time_s(cfg.gpu, piece, cfg.precision, eff)
                                 - kernel_time_s(cfg.gpu, k, cfg.precision, eff))
                    if k.name.endswith("_input_grad"):
                        tax_backward += extra
                    else:
                        tax += extra
    if cfg.tp_comm_overlap and cfg.mesh.tp > 1:
        # the forward GEMMs whose reduce-scatter runs beside them lose the SMs its kernels take (tp_overlap)
        for w, n in parts:
            for k in w.forward:
                f = gemm_slowdown(cfg.gpu, cfg.precision, k.name) if k.kind == "gemm" else 1.0
                if f > 1.0:
                    tax += n * (f - 1.0) * kernel_time_s(cfg.gpu, k, cfg.precision, eff)
    return ChunkCost(
        forward_s=total(lambda w: w.forward) + tax,
        backward_s=total(lambda w: w.backward) + tax_backward,
        recompute_s=total(lambda w: w.recompute),
        forward_comm=comm("forward", False) + comm("forward", True),
        ring_forward_comm=comm("forward", None, ring=True),
        ring_backward_comm=comm("backward", None, ring=True),
        ring_forward_s=ring_s(lambda w: w.forward),
        ring_backward_s=ring_s(lambda w: w.backward),
        recompute_comm=comm("recompute", False) + comm("recompute", True),
        backward_overlapped_comm=comm("backward", True),
        backward_comm=comm("backward", False),
        model_flops_forward=fwd_model,
        model_flops_backward=bwd_model,
        recompute_flops=rec,
        num_params=params,
        num_tensors=tensors,
        first_part=first_part,
        expert_params=expert_params,
        num_layers=sum(n for _, n in layers) + mtp,
        embedding_params=emb_params,
        head_params=head_params,
    )


_ASYNC_TP_GEMMS = frozenset({"qkv", "mlp_up", "projection", "mlp_down"})
"""The GEMMs beside a sequence-parallel all-gather (qkv, mlp_up; in backward the projection's and mlp_down's input
gradients) or reduce-scatter (projection, mlp_down; in backward qkv's and mlp_up's input gradients)."""


def grad_bytes_per_element(precision: str, fp32: bool | None = None) -> int:
    """Bytes per gradient element the data-parallel reduction moves (and the gradient buffer holds).

    ``fp32`` (training.grad_reduce_in_fp32): accumulate and reduce 16-bit training's gradients in fp32 (True) or in
    the parameters' 16-bit dtype (False); None: Megatron-LM's default.
    # Assumption: as Megatron-LM's defaults: bf16 training accumulates and all-reduces gradients in fp32
    # (megatron/training/arguments.py: accumulate_allreduce_grads_in_fp32 is forced on for bf16); fp16
    # training reduces fp16 gradients (Narayanan et al. 2021); fp32/tf32 reduce fp32; fp8 as bf16.
    """
    if precision in ("fp32", "tf32"):
        return 4
    if fp32 is not None:
        return 4 if fp32 else 2
    return {"bf16": 4, "fp8": 4, "fp16": 2}[precision]
