"""Scenario files (``scenarios/*.yaml``): the external contract of DESIGN.md.

Hardware, model and execution are separate inputs (as in Calculon): ``cluster`` names a topology preset
and overrides any of its fields, ``model`` names a model preset or describes one inline, ``parallel``,
``training`` and ``schedule`` describe the execution. Megatron-LM argument names are accepted as aliases
(``tensor_model_parallel_size`` for ``tp``, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, create_model, model_validator

from simdist.spec.base import ByteSize, Count, Spec
from simdist.spec.topology import TopologySpec


def _alias(*names: str) -> AliasChoices:
    return AliasChoices(*names)


# A cluster is a topology preset (or file) plus overrides of any topology field. The override fields
# mirror TopologySpec's own, so that a typo is refused here with the field named; their values are
# validated when merged into the preset (simdist.spec.load.resolve_cluster).
ClusterSpec = create_model(
    "ClusterSpec",
    __base__=Spec,
    __doc__="A topology preset or file, with any of its fields overridden (deep merge).",
    preset=(str | None, Field(default=None, description="a name from `simdist topo list`")),
    file=(Path | None, Field(default=None, description="a topology YAML file instead of a preset")),
    **{name: (Any, None) for name in TopologySpec.model_fields if name != "name"},
)


class ModelSpec(Spec):
    """A model preset, an inline description, or a Hugging Face config.json (exactly one)."""

    preset: str | None = None
    hf_config: Path | None = None
    num_layers: Count | None = None
    hidden_size: Count | None = None
    num_attention_heads: Count | None = None
    num_query_groups: Count | None = Field(default=None, validation_alias=_alias("num_query_groups", "num_kv_heads"))
    ffn_hidden_size: Count | None = None
    seq_length: Count | None = Field(default=None, validation_alias=_alias("seq_length", "seq_len"))
    vocab_size: Count | None = Field(default=None, validation_alias=_alias("vocab_size", "padded_vocab_size"))
    swiglu: bool | None = None
    kind: Literal["decoder", "mlp"] | None = Field(
        default=None, description="decoder (GPT/Llama transformer, the default) or mlp (the CS336 lecture's MLP)"
    )
    tied_embeddings: bool | None = Field(
        default=None, validation_alias=_alias("tied_embeddings", "tie_word_embeddings")
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        inline = [k for k in ("num_layers", "hidden_size", "num_attention_heads") if getattr(self, k) is not None]
        sources = [name for name, on in (("preset", self.preset), ("hf_config", self.hf_config), ("inline", inline))
                   if on]
        if not sources:
            raise ValueError("give one of: preset, hf_config, or num_layers/hidden_size/num_attention_heads")
        if len(sources) > 1 and not (sources == ["preset", "inline"]):
            raise ValueError(f"give only one model source, not {' and '.join(sources)}")
        if sources == ["inline"]:
            # A decoder needs its attention heads; an mlp (the lecture's MLP) only its depth and width.
            needed = ("num_layers", "hidden_size") if self.kind == "mlp" else (
                "num_layers", "hidden_size", "num_attention_heads")
            missing = [k for k in needed if getattr(self, k) is None]
            if missing:
                raise ValueError(f"an inline {self.kind or 'decoder'} model also needs {', '.join(missing)}")
        return self


class ParallelSpec(Spec):
    """Parallel layout; axis sizes multiply to the number of GPUs used (tp innermost)."""

    tp: Count = Field(default=1, validation_alias=_alias("tp", "tensor_model_parallel_size"))
    pp: Count = Field(default=1, validation_alias=_alias("pp", "pipeline_model_parallel_size"))
    dp: Count = Field(default=1, validation_alias=_alias("dp", "data_parallel_size"))
    vpp: Count = Field(default=1, validation_alias=_alias("vpp", "virtual_pipeline_model_parallel_size"))
    cp: Count = Field(default=1, validation_alias=_alias("cp", "context_parallel_size"))
    sequence_parallel: bool = False
    zero_stage: Literal[0, 1, 2, 3] = 0
    order: str = Field(default="tp-cp-dp-pp",
                       description="mesh axes innermost first (Megatron-LM's RankGenerator order); rank r runs on "
                                   "GPU r, so tp innermost keeps tensor-parallel groups inside a node")
    pipeline_split: Literal["even", "lighter_ends"] = Field(
        default="even", description="layers per stage: even, or one fewer on the first and last stage (Llama 3)")
    layers_per_stage: list[Count] | None = Field(default=None, description="explicit layers per pipeline stage")
    tp_style: Literal["megatron", "column"] = Field(
        default="megatron", description="megatron: column+row parallel pairs (all-reduce); column: the CS336 "
                                        "lecture's column-parallel layers (all-gather forward, reduce-scatter "
                                        "backward)")
    scatter_gather: bool = Field(default=True, description="Megatron's pipeline scatter/gather: each tp peer "
                                                           "sends 1/tp of the activation between stages")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp


class TrainingSpec(Spec):
    micro_batch_size: Count = 1
    global_batch_size: Count
    recompute: Literal["none", "selective", "full"] = Field(
        default="none", validation_alias=_alias("recompute", "recompute_granularity")
    )
    precision: Literal["fp32", "tf32", "bf16", "fp16", "fp8"] = "bf16"
    attention: Literal["flash", "materialized"] = Field(
        default="flash", description="attention kernel: flash (scores never stored, Dao et al. 2022) or "
                                     "materialized (the a x s x s scores in memory, as Megatron-LM in 2021-22)")
    grad_reduce: Literal["per_parameter", "bucketed", "overlapped"] = Field(
        default="bucketed", description="data-parallel gradient reduction: one all-reduce per parameter tensor "
                                        "(the lecture), buckets after the backward, or buckets overlapped with it")
    grad_bucket_size: ByteSize | None = Field(
        default=None, description="gradient bucket size; default one bucket per model chunk")
    zero3_fetch: Literal["prefetch", "per_parameter"] = Field(
        default="prefetch", description="ZeRO-3 parameter traffic: prefetch (one all-gather per model chunk, issued "
                                        "ahead of the compute, as PyTorch FSDP) or per_parameter (each tensor "
                                        "gathered before each use and its gradient reduce-scattered, blocking, "
                                        "through list collectives: DeepSpeed ZeRO-3 as of 2021)")
    dp_batch_split: list[Count] | None = Field(
        default=None, description="local batch of each data-parallel rank (sums to global_batch_size)")


Schedule = Literal["gpipe", "1f1b", "interleaved_1f1b", "zb_h1"]


class ScenarioSpec(Spec):
    """One training step to predict: cluster x model x layout x training settings x schedule."""

    name: str = ""
    cluster: ClusterSpec  # type: ignore[valid-type]
    model: ModelSpec
    parallel: ParallelSpec = ParallelSpec()
    training: TrainingSpec
    schedule: Schedule = "1f1b"
    calibration: Path | None = Field(
        default=None, description="a calibration file (simdist calibrate), relative to this scenario file")
