"""Feasibility: why a candidate layout cannot run (one reason, the first rule it breaks), or None.

Rules, in the order they are checked (each names the constraint, for ``--explain-pruned`` and for the error
when nothing is left):
- heads / kv-heads / sequence: simdist.predict.step.check_layout (Megatron-LM's argument checks);
- batch: global batch divisible by micro-batch x dp (Megatron-LM's num-microbatches calculator);
- interleaving: layers per stage divisible by vpp, micro-batches a multiple of pp (Megatron-LM's
  interleaved schedule asserts both);
- zero-with-pp: ZeRO-2/3 with pipeline parallelism (DeepSpeed refuses ZeRO-2/3 with its pipeline engine;
  Megatron-LM's distributed optimizer is ZeRO-1);
- memory: the peak of stage 0 and the last stage (simdist.plan.memory.stage_memory with the schedule's
  in-flight micro-batches) exceeds the GPU's memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from simdist.plan.memory import in_flight_microbatches, stage_memory
from simdist.plan.model import Model
from simdist.search.space import Candidate
from simdist.spec.gpu import GpuSpec

GIB = 2**30

RULES = ("heads", "kv-heads", "sequence", "batch", "interleaving", "zero-with-pp", "memory")


@dataclass(frozen=True, slots=True)
class Pruned:
    candidate: Candidate
    rule: str
    reason: str


def peak_memory_bytes(c: Candidate, model: Model, *, global_batch_size: int, precision: str,
                      attention: str = "flash") -> float:
    """Peak bytes per GPU over the pipeline stages (stage 0 holds the most in flight, the last the logits)."""
    K = c.pp
    m = global_batch_size // (c.micro_batch_size * c.dp)
    per_stage = model.num_layers // K
    peak = 0.0
    for s in sorted({0, K - 1}):
        mem = stage_memory(
            model, layers_on_stage=per_stage, first_stage=s == 0, last_stage=s == K - 1, tp=c.tp, pp=K, dp=c.dp,
            cp=c.cp, vpp=c.vpp, sequence_parallel=c.sequence_parallel, zero_stage=c.zero_stage,
            micro_batch_size=c.micro_batch_size, recompute=c.recompute, precision=precision,
            in_flight_microbatches=in_flight_microbatches(c.schedule, num_stages=K, num_microbatches=m, vpp=c.vpp,
                                                          stage=s),
            attention=attention)
        peak = max(peak, mem.total_bytes)
    return peak


def why_pruned(c: Candidate, model: Model, gpu: GpuSpec, *, global_batch_size: int, precision: str
               ) -> Pruned | None:
    if model.kind == "decoder":
        if model.num_attention_heads % c.tp:
            return Pruned(c, "heads", f"{model.num_attention_heads} attention heads do not split over tp {c.tp}")
        if model.num_query_groups % c.tp and c.tp % model.num_query_groups:
            return Pruned(c, "kv-heads", f"{model.num_query_groups} key/value heads do not split over tp {c.tp}")
        if c.cp > 1 and model.seq_length % (2 * c.cp):
            return Pruned(c, "sequence", f"sequence {model.seq_length} does not split into 2 x cp {c.cp} chunks")
    elif c.cp > 1:
        return Pruned(c, "sequence", "context parallelism needs a sequence")
    if global_batch_size % (c.micro_batch_size * c.dp):
        return Pruned(c, "batch", f"global batch {global_batch_size} is not a multiple of micro-batch "
                                  f"{c.micro_batch_size} x dp {c.dp}")
    m = global_batch_size // (c.micro_batch_size * c.dp)
    if c.vpp > 1 and ((model.num_layers // c.pp) % c.vpp or m % c.pp):
        return Pruned(c, "interleaving", f"vpp {c.vpp} needs layers per stage ({model.num_layers // c.pp}) divisible "
                                         f"by vpp and micro-batches ({m}) a multiple of pp {c.pp}")
    if c.zero_stage >= 2 and c.pp > 1:
        return Pruned(c, "zero-with-pp", f"ZeRO-{c.zero_stage} does not combine with pipeline parallelism")
    peak = peak_memory_bytes(c, model, global_batch_size=global_batch_size, precision=precision)
    if peak > gpu.hbm_capacity:
        return Pruned(c, "memory", f"needs {peak / GIB:.1f} GiB per GPU, the GPU has {gpu.hbm_capacity / GIB:.0f} GiB")
    return None
