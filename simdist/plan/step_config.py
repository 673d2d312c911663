"""What a step plan is built from: the step's configuration and the layer split.

`StepConfig` is the plain, validated input of `simdist.plan.step.build_step` (simdist.predict builds it from a
scenario); `layer_kinds` names the layers of a model part, which simdist.plan.chunk_cost prices.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from simdist.collectives.ep_kernels import kernel_sms
from simdist.errors import LayoutError
from simdist.hardware.attention import kernel_family
from simdist.hardware.compute import ComputeEfficiency, compute_efficiency
from simdist.hardware.gemm import architecture
from simdist.hardware.host import HostOverhead, host_overhead, runs_on_host
from simdist.plan.execution import MEGATRON, Execution
from simdist.plan.expert_parallel import ExpertParallel
from simdist.plan.layer_split import choose_split, chunk_layers
from simdist.plan.mesh import Mesh
from simdist.plan.model import Model
from simdist.plan.recompute import op_saves_attention
from simdist.plan.schedule import TWO_CHUNK_SCHEDULES, chunks_per_stage, num_model_parts, part_table
from simdist.spec.gpu import GpuSpec

_PARTS_LAYERS: dict[tuple, tuple[LayerKinds, ...]] = {}
"""StepConfig.parts_layers by what decides them."""


@dataclass(frozen=True, slots=True)
class StepConfig:
    model: Model
    gpu: GpuSpec
    mesh: Mesh
    schedule: str
    micro_batch_size: int
    global_batch_size: int
    layers_per_stage: tuple[int, ...]
    """Decoder layers each stage holds, over its chunks (dualpipe: both copies, parts s and pp - 1 - s)."""
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
    beside the first micro-batch's forward of each chunk instead of after the optimizer (simdist.plan.data_parallel)."""
    zero3_fetch: str = "prefetch"
    """ZeRO-3 parameter traffic: ``prefetch`` or ``per_parameter`` (simdist.plan.data_parallel's module docstring)."""
    scatter_gather: bool = True
    """Megatron's pipeline scatter/gather (Narayanan et al. 2021 sec 4.1): each tp peer sends 1/tp."""
    dp_batch_split: tuple[int, ...] | None = None
    """Local batch of each data-parallel rank (sums to the global batch); None: equal shares."""
    compute_slowdown: tuple[tuple[int, float], ...] = ()
    """(rank, time factor) of straggler GPUs whose compute kernels take ``factor`` x as long (scenario
    ``faults.stragglers``); data-parallel replicas are then simulated one by one, as with ``dp_batch_split``."""
    gpu_variability: float = 1.0
    """The job's time factor from the spread of the GPUs' speeds: the slowest of its GPUs sets the pace
    (simdist.hardware.variability, cluster.gpu_speed_cv); 1: identical GPUs. What the step's compute pieces take is
    `paced_variability` (a pipeline of unequal stages is paced by its heaviest stage)."""
    gpu_speed_cv: float = 0.0
    """The spread (cluster.gpu_speed_cv) `gpu_variability` is of: what `paced_variability` paces."""
    capacity_bytes: float = math.inf
    compute_efficiency: ComputeEfficiency | None = None
    """Calibrated roofline constants (simdist calibrate); None: simdist/hardware/data/compute_efficiency.csv."""
    host: HostOverhead | None = None
    """Host-side costs per op and per pipeline step (simdist.hardware.host); None: its data file's defaults."""
    layers_per_part: tuple[int, ...] | None = None
    """Decoder layers of every model part in model order (part `part_of`(s, c) is chunk c of stage s: c * pp + s,
    or the schedule's V / bidirectional placement; simdist.plan.layer_split), summing per stage to
    layers_per_stage; None: each stage's layers over its chunks by layer_split.chunk_layers."""
    split_method: str = ""
    """How the layer split was chosen (reports)."""
    # Mixture of experts (scenario parallel.ep / etp and training.moe_*; simdist.plan.model for the model's side).
    expert_parallel: ExpertParallel = field(default_factory=ExpertParallel)
    """How this step's MoE layers run: ep, etp, the dispatcher and its kernel, routing imbalance and capacity, the
    router's dtype and padding (simdist.plan.expert_parallel; costed by simdist.plan.moe_cost)."""
    moe_overlap: bool = False
    """Megatron-LM --overlap-moe-expert-parallel-comm."""
    moe_overlap_share: float = 1.0
    """Of each all_to_all the overlap hides, the share that runs beside the compute (training.moe_a2a_overlap_share;
    simdist.plan.comm_overlap)."""
    delay_wgrad: bool = False
    """Megatron-LM --delay-wgrad-compute (training.delay_wgrad_compute): under moe_overlap, the MoE layers' weight
    gradients run beside the backward dispatch rather than before it (simdist.plan.moe_pairing.segments)."""
    tp_comm_overlap: bool = False
    """Megatron-LM --tp-comm-overlap: the tp collectives run beside the compute (simdist.plan.recipe), the GEMMs whose
    reduce-scatter overlaps them on fewer SMs (simdist.hardware.tp_overlap)."""
    grad_reduce_in_fp32: bool | None = None
    """Gradients of 16-bit training accumulated and reduced in fp32; None: Megatron-LM's default
    (`grad_bytes_per_element`)."""
    optimizer_state_bytes: float | None = None
    """Bytes of optimizer state per parameter (the master copy and Adam's moments:
    `simdist.plan.memory.optimizer_state_bytes`); None: mixed-precision Adam's 12 (fp32 training: 8)."""
    execution: Execution = MEGATRON
    """How the framework runs the work (simdist.plan.execution): kernel style, CUDA graphs, optimizer, FSDP,
    recompute policy, context-parallel communication, async TP."""

    def __post_init__(self) -> None:
        parts = self.layers_per_part
        if parts is not None:
            if not _parts_match(tuple(parts), tuple(self.layers_per_stage), self.mesh.pp, self.vpp, self.schedule):
                raise LayoutError(f"layers_per_part {list(parts)} does not match layers_per_stage "
                                  f"{list(self.layers_per_stage)} with vpp = {self.vpp}", field="parallel.vpp",
                                  fix=f"give {self.num_parts} part counts summing per stage to layers_per_stage")
        elif self.schedule in TWO_CHUNK_SCHEDULES:
            raise LayoutError(f"schedule {self.schedule} places the model's parts as a V or in two copies: its "
                              "StepConfig needs layers_per_part", field="schedule",
                              fix="build the StepConfig with simdist.plan.layout.step_config_of")

    @property
    def chunks(self) -> int:
        """Model chunks each stage runs: vpp, or 2 under zb_v, dualpipe and dualpipev
        (simdist.plan.schedule.chunks_per_stage)."""
        return chunks_per_stage(self.schedule, self.vpp)

    @property
    def num_parts(self) -> int:
        """Parts the model is cut into: pp x vpp (dualpipe: pp, each held by two stages)."""
        return num_model_parts(self.schedule, self.mesh.pp, self.vpp)

    def part_of(self, stage: int, chunk: int) -> int:
        """The model part that ``chunk`` of ``stage`` holds (simdist.plan.schedule.model_part)."""
        return part_table(self.mesh.pp, self.vpp, self.schedule)[stage][chunk]

    @property
    def part_table(self) -> tuple[tuple[int, ...], ...]:
        """Per stage, the model part each of its chunks holds (`part_of` of every stage and chunk)."""
        return part_table(self.mesh.pp, self.vpp, self.schedule)

    def stage_chunks(self, stage: int) -> tuple[int, ...]:
        """Decoder layers of each of ``stage``'s model chunks."""
        if self.layers_per_part is not None:
            parts = self.layers_per_part
            return tuple(parts[p] for p in part_table(self.mesh.pp, self.vpp, self.schedule)[stage])
        return tuple(chunk_layers(self.layers_per_stage[stage], self.vpp))

    def model_parts(self) -> tuple[int, ...]:
        """Decoder layers of every model part in model order."""
        return _parts(self.layers_per_part, self.layers_per_stage, self.mesh.pp, self.vpp)[0]

    def part_first_layers(self) -> tuple[int, ...]:
        """Index (0-based, in the model) of the first decoder layer of every model part, in model order."""
        return _parts(self.layers_per_part, self.layers_per_stage, self.mesh.pp, self.vpp)[1]

    def part_layers(self, part: int) -> LayerKinds:
        """The decoder layers of model ``part`` (in model order) as `layer_kinds`."""
        return self.parts_layers()[part]

    def parts_layers(self) -> tuple[LayerKinds, ...]:
        """`part_layers` of every model part, in model order, cached by what decides them (a search, the step bands
        and a pipeline's stage pace read them for many configurations of one split)."""
        key = (self.model, self.layers_per_part, self.layers_per_stage, self.mesh.pp, self.vpp, self.schedule)
        hit = _PARTS_LAYERS.get(key)
        if hit is None:
            if len(_PARTS_LAYERS) >= 4096:
                _PARTS_LAYERS.clear()
            firsts, counts = self.part_first_layers(), self.model_parts()
            hit = _PARTS_LAYERS[key] = tuple(layer_kinds(self.model, f, n) for f, n in zip(firsts, counts,
                                                                                              strict=True))
        return hit

    def stage_layers(self, stage: int) -> tuple[int, ...]:
        """Indices (0-based) of every decoder layer that pipeline ``stage`` holds, over its chunks (dualpipe: both
        copies' layers)."""
        return _stage_layers(self.layers_per_part, self.layers_per_stage, self.mesh.pp, self.vpp, stage,
                             self.schedule)

    @property
    def ep(self) -> int:
        """Expert-parallel size: each MoE layer's routed experts sharded over ep ranks carved out of dp x cp."""
        return self.expert_parallel.ep

    @property
    def etp(self) -> int:
        """Tensor parallelism inside each expert (Megatron-Core expert_tensor_parallel_size)."""
        return self.expert_parallel.etp

    @property
    def num_stages(self) -> int:
        return self.mesh.pp

    @property
    def host_overhead(self) -> HostOverhead:
        return self.host or host_overhead(self.gpu)

    @property
    def op_keeps_attention(self) -> bool:
        """Whether the attention's output is kept for the backward: always but under recompute op, where the policy's
        save list must name the attention kernel the GPU runs (training.op_sac_saved_attention,
        simdist.plan.recompute.op_saves_attention)."""
        return self.recompute != "op" or op_saves_attention(kernel_family(self.attention, self.gpu),
                                                             self.execution.op_sac_saved_attention)

    @property
    def interference(self) -> float:
        """How much longer compute takes beside collectives (simdist.plan.interference)."""
        return (self.compute_efficiency or compute_efficiency(self.gpu)).comm_interference

    @property
    def expert_interference(self) -> float:
        """`interference` of the compute beside the MoE all_to_alls (Megatron-Core's 1F1B A2A overlap): NCCL's the
        GPU's; the flex dispatcher's DeepEP / HybridEP kernels hold their SMs while they run (a persistent grid of
        moe_flex_dispatcher_num_sms blocks), so the compute beside them runs on the N - s others: N / (N - s) as
        long, x = s / (N - s) (N: the GPU's SMs, simdist.hardware.gemm.architecture).
        # Assumption: their HBM traffic slows the compute no further (the SMs they take bound it)."""
        kernel = self.expert_parallel.kernel
        if kernel == "nccl":
            return self.interference
        taken = kernel_sms(kernel)
        total = architecture(self.gpu).num_sms
        return taken / (total - taken) if taken < total else self.interference

    @property
    def copy_launch_s(self) -> float:
        """Host time of one copy a collective issues from C++ (a list collective's per-rank view, copied into or out
        of its flat buffer by ProcessGroupNCCL: no Python dispatch): one kernel launch, the host's ``launch_s``
        (simdist.hardware.host; a Grace host's scaled); on a CPU core standing in for a device, which runs each op on
        the host, its per-op launch overhead (simdist.hardware.compute)."""
        if runs_on_host(self.gpu):
            return (self.compute_efficiency or compute_efficiency(self.gpu)).launch_overhead_s
        return self.host_overhead.launch_s

    @property
    def replicas_differ(self) -> bool:
        """Data-parallel replicas do not all run the same timeline (unequal batches, a straggler)."""
        return self.dp_batch_split is not None or bool(self.compute_slowdown)

    @property
    def paced_variability(self) -> float:
        """Time factor of every compute piece of the step (forward, backward, weight gradient, recompute, optimizer:
        the pieces a straggler slows) from the spread of the GPUs' speeds: `gpu_variability` x the pipeline's stage
        pace (simdist.plan.stage_pace, found once per configuration, when first asked: a search builds configurations
        it prunes unpriced); `gpu_variability` itself without a pipeline or a spread."""
        if not self.gpu_speed_cv or self.mesh.pp == 1:
            return self.gpu_variability
        from simdist.plan.stage_pace import stage_pace  # the stages' costs (simdist.plan.chunk_cost) read this class

        return self.gpu_variability * stage_pace(self)

    def compute_factor(self, stage: int, dp_index: int) -> float:
        """Time factor of the compute kernels of the representative of ``stage`` in replica ``dp_index`` (1: every
        GPU healthy and alike): its slowest tensor/context-parallel peer's, at least `paced_variability`.

        # Assumption: a straggler slows its whole tensor/context-parallel group: the peers meet at a collective
        # after every forward and backward compute of a chunk (simdist.plan.recipe), so each waits for the slowest.
        # Assumption: a straggler's factor, stated against a typical GPU, replaces the spread of speeds'
        # (`paced_variability`) where it is larger: the group runs at the larger of the two, not their product.
        """
        f = self.paced_variability
        for rank, x in self.compute_slowdown:
            c = self.mesh.coords(rank)
            if c["pp"] == stage and c["dp"] == dp_index:
                f = max(f, x)
        return f

    def rank_factor(self, rank: int) -> float:
        """Time factor of the compute kernels of GPU ``rank`` itself (1: healthy, identical GPUs)."""
        return max([self.paced_variability, *(x for r, x in self.compute_slowdown if r == rank)])

    def microbatches(self, dp_index: int) -> int:
        if self.dp_batch_split is None:
            return self.global_batch_size // (self.micro_batch_size * self.mesh.dp)
        return self.dp_batch_split[dp_index] // self.micro_batch_size

    @property
    def no_sync_accumulates(self) -> bool:
        """Whether FSDP's no_sync (training.fsdp_no_sync) holds gradients unsharded across micro-batches: some replica
        runs more than one (a single micro-batch reduce-scatters as it goes)."""
        if self.execution.grad_sync != "last":
            return False
        replicas = range(self.mesh.dp) if self.dp_batch_split is not None else (0,)
        return max(self.microbatches(d) for d in replicas) > 1


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


@functools.lru_cache(maxsize=4096)
def _parts_match(parts: tuple[int, ...], layers_per_stage: tuple[int, ...], pp: int, vpp: int, schedule: str
                 ) -> bool:
    """Whether ``parts`` (decoder layers per model part) sum per stage to ``layers_per_stage``."""
    table = part_table(pp, vpp, schedule)
    return len(parts) == num_model_parts(schedule, pp, vpp) and len(layers_per_stage) == pp and all(
        sum(parts[p] for p in row) == n for row, n in zip(table, layers_per_stage, strict=True))


@functools.lru_cache(maxsize=4096)
def _parts(layers_per_part: tuple[int, ...] | None, layers_per_stage: tuple[int, ...], pp: int, vpp: int
           ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(`StepConfig.model_parts`, `StepConfig.part_first_layers`) of a layer split (cached: a search and the
    memory model ask for them per stage of thousands of layouts of a few splits)."""
    if layers_per_part is not None:
        parts = tuple(layers_per_part)
    else:
        chunks = [tuple(chunk_layers(n, vpp)) for n in layers_per_stage]
        parts = tuple(chunks[p % pp][p // pp] for p in range(pp * vpp))
    firsts, n = [], 0
    for count in parts:
        firsts.append(n)
        n += count
    return parts, tuple(firsts)


@functools.lru_cache(maxsize=4096)
def _stage_layers(layers_per_part: tuple[int, ...] | None, layers_per_stage: tuple[int, ...], pp: int, vpp: int,
                  stage: int, schedule: str = "1f1b") -> tuple[int, ...]:
    counts, firsts = _parts(layers_per_part, layers_per_stage, pp, vpp)
    return tuple(i for p in part_table(pp, vpp, schedule)[stage] for i in range(firsts[p], firsts[p] + counts[p]))
