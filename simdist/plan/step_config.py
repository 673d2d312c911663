"""What a step plan is built from: the step's configuration, the layer split, and each model chunk's cost.

`StepConfig` is the plain, validated input of `simdist.plan.step.build_step` (simdist.predict builds it from a
scenario); `chunk_cost` turns the layers a pipeline stage runs for one model part into seconds on its GPU and the
collectives they need (simdist.plan.layer_cost kernels on the simdist.hardware.compute roofline).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simdist.errors import LayoutError
from simdist.hardware.compute import ComputeEfficiency, compute_efficiency, kernels_time_s
from simdist.hardware.host import HostOverhead, host_overhead
from simdist.plan.layer_cost import Work, embedding_work, head_work, layer_work
from simdist.plan.layer_split import choose_split, chunk_layers
from simdist.plan.mesh import Mesh
from simdist.plan.model import Model
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

    @property
    def num_stages(self) -> int:
        return self.mesh.pp

    @property
    def host_overhead(self) -> HostOverhead:
        return self.host or host_overhead(self.gpu)

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
def _comm_groups(work_comm: tuple, phase: str, overlappable: bool, times: int) -> tuple:
    """(op, nbytes, axis, count, imbalance) of a Work's collectives of one phase, alike ones counted together."""
    agg: dict[tuple[str, float, str, float], int] = {}
    for c in work_comm:
        if c.phase == phase and c.overlappable == overlappable:
            key = (c.op, float(c.nbytes), c.axis, float(c.imbalance))
            agg[key] = agg.get(key, 0) + times
    return tuple((op, nbytes, axis, n, x) for (op, nbytes, axis, x), n in agg.items())


def _tensors_per_layer(model: Model) -> int:
    if model.kind == "mlp":
        return 2  # weight and bias
    # Llama: q/k/v (fused qkv counts 1), proj, gate+up, down, 2 norms; GPT: + biases of each linear and norm.
    return 6 if model.swiglu else 12


def chunk_cost(cfg: StepConfig, num_layers: int, first_part: bool, last_part: bool) -> ChunkCost:
    """Cost of ``num_layers`` layers (+ embedding on the first model part, + head on the last) per micro-batch."""
    m = cfg.model
    kw = dict(tp=cfg.mesh.tp, cp=cfg.mesh.cp, sequence_parallel=cfg.sequence_parallel,
              micro_batch_size=cfg.micro_batch_size, precision=cfg.precision)
    parts: list[tuple[Work, int]] = [(layer_work(m, recompute=cfg.recompute, tp_style=cfg.tp_style,
                                                attention=cfg.attention, attention_mask=cfg.attention_mask,
                                                fp8_recipe=cfg.fp8_recipe, **kw), num_layers)]
    if first_part and m.kind == "decoder":
        parts.append((embedding_work(m, **kw), 1))
    if last_part:
        parts.append((head_work(m, **kw), 1))

    host = cfg.host_overhead

    def total(kernels_of) -> float:
        # Each part's kernels take their roofline time, or the host's time to issue them where that is longer
        # (simdist.hardware.host: one eager op per modelled kernel).
        # Assumption: one framework op per kernel simdist models (fused kernels as Megatron-LM fuses them).
        return sum(host.kernels_time_s(kernels_time_s(cfg.gpu, kernels_of(w), cfg.precision, cfg.compute_efficiency),
                                       len(kernels_of(w))) * n for w, n in parts)

    def comm(phase: str, overlappable: bool) -> tuple:
        out: dict[tuple[str, float, str, float], int] = {}
        for w, n in parts:
            for op, nbytes, axis, k, x in _comm_groups(w.comm, phase, overlappable, n):
                out[(op, nbytes, axis, x)] = out.get((op, nbytes, axis, x), 0) + k
        return tuple((op, nb, ax, k, x) for (op, nb, ax, x), k in out.items())

    # Model FLOPs per the causal convention (Kernel.model_flops: the masked half of the scores not counted).
    fwd_model = sum(sum(k.model_flops for k in w.forward) * n for w, n in parts)
    bwd_model = sum(sum(k.model_flops for k in w.backward) * n for w, n in parts)
    rec = sum(sum(k.flops for k in w.recompute) * n for w, n in parts)
    # Parameters this chunk holds on one GPU: its layers' share of tp, the embedding on the first part and
    # the output projection on the last (each vocab x h / tp; Megatron's vocab-parallel embedding).
    params = m.params_per_layer * num_layers / cfg.mesh.tp
    if m.kind == "decoder":
        emb = m.vocab_size * m.hidden_size / cfg.mesh.tp
        params += emb * (1 if first_part else 0) + emb * (1 if last_part and not m.tied_embeddings else 0)
    return ChunkCost(
        forward_s=total(lambda w: w.forward),
        backward_s=total(lambda w: w.backward),
        recompute_s=total(lambda w: w.recompute),
        forward_comm=comm("forward", False) + comm("forward", True),
        recompute_comm=comm("recompute", False) + comm("recompute", True),
        backward_overlapped_comm=comm("backward", True),
        backward_comm=comm("backward", False),
        model_flops_forward=fwd_model,
        model_flops_backward=bwd_model,
        recompute_flops=rec,
        num_params=params,
        num_tensors=_tensors_per_layer(m) * num_layers
        + ((1 if first_part else 0) + (1 if last_part and not m.tied_embeddings else 0) if m.kind == "decoder" else 0),
        first_part=first_part,
    )


def grad_bytes_per_element(precision: str) -> int:
    """Bytes per gradient element the data-parallel reduction moves.

    # Assumption: as Megatron-LM's defaults: bf16 training accumulates and all-reduces gradients in fp32
    # (megatron/training/arguments.py: accumulate_allreduce_grads_in_fp32 is forced on for bf16); fp16
    # training reduces fp16 gradients (Narayanan et al. 2021); fp32/tf32 reduce fp32; fp8 as bf16.
    """
    return {"bf16": 4, "fp8": 4, "fp16": 2, "fp32": 4, "tf32": 4}[precision]
