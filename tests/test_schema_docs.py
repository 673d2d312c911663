"""`simdist schema` documents itself: every field of every input file has a description."""

from __future__ import annotations

import json

import pytest

from simdist import api
from tests.cli_harness import run_cli


def _undocumented(schema: dict) -> list[str]:
    missing = []
    for model, node in [("(top)", schema), *schema.get("$defs", {}).items()]:
        props = node.get("properties", {})
        missing += [f"{model}.{name}" for name, prop in props.items() if not prop.get("description")]
    return missing


@pytest.mark.parametrize("kind", ["scenario", "topology", "calibration"])
def test_every_field_has_a_description(kind):
    schema = api.schema(kind)
    assert _undocumented(schema) == []
    assert sum(len(d.get("properties", {})) for d in schema.get("$defs", {}).values()) > 20


def test_a_field_without_a_description_would_be_found():
    assert _undocumented({"properties": {"a": {"type": "integer"}, "b": {"description": "b"}}}) == ["(top).a"]


def test_bounds_are_in_the_schema():
    topology = api.schema("topology")["$defs"]
    assert topology["InterNodeSpec"]["properties"]["switch_radix"]["minimum"] == 2
    assert topology["HostSpec"]["properties"]["cpu_sockets"]["maximum"] == 16
    assert topology["ScaleUpSpec"]["properties"]["bandwidth"]["x-bounds"] == "at least 1 MB/s, at most 1 PB/s"


def test_simdist_schema_prints_them():
    r = run_cli(["schema", "calibration"])
    assert r.code == 0 and "description" in json.loads(r.out)["properties"]["topology"]


def _models() -> list[type]:
    """Every pydantic model defined in simdist (each module imported; ``__main__`` would run the CLI)."""
    import importlib
    import inspect
    import pkgutil

    from pydantic import BaseModel

    import simdist

    found = {}
    for info in pkgutil.walk_packages(simdist.__path__, "simdist."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseModel) and cls.__module__ == module.__name__:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[k] for k in sorted(found)]


def _fields_without_description(models) -> list[str]:
    return [f"{m.__module__}.{m.__qualname__}.{name}" for m in models for name, info in m.model_fields.items()
            if not (info.description or "").strip()]


def test_every_field_of_every_spec_model_has_a_description():
    models = _models()
    specs = [m for m in models if m.__name__.endswith("Spec")]
    assert {"ScenarioSpec", "TopologySpec", "GpuSpec", "ModelSpec", "CalibrationSpec"} <= {m.__name__ for m in specs}
    assert _fields_without_description(models) == []


def test_a_model_field_without_a_description_is_named():
    from pydantic import Field

    from simdist.spec.base import Spec

    class ToySpec(Spec):
        documented: int = Field(description="a count")
        bare: int = 0
        blank: int = Field(default=0, description=" ")

    prefix = f"{__name__}.{ToySpec.__qualname__}"
    assert _fields_without_description([ToySpec]) == [f"{prefix}.bare", f"{prefix}.blank"]


def test_the_moe_contract_fields_are_documented_with_their_megatron_names():
    # issue 15's contract: each field in `simdist schema scenario`, its Megatron-LM flag or alias named
    defs = api.schema("scenario")["$defs"]
    model = defs["ModelSpec"]["properties"]
    for name, flag in [("num_experts", "--num-experts"), ("moe_router_topk", "--moe-router-topk"),
                       ("moe_ffn_hidden_size", "--moe-ffn-hidden-size"), ("moe_layer_freq", "--moe-layer-freq"),
                       ("moe_shared_expert_intermediate_size", "--moe-shared-expert-intermediate-size"),
                       ("q_lora_rank", "--q-lora-rank"), ("kv_lora_rank", "--kv-lora-rank"),
                       ("qk_head_dim", "--qk-head-dim"), ("qk_pos_emb_head_dim", "--qk-pos-emb-head-dim"),
                       ("v_head_dim", "--v-head-dim"), ("qk_layernorm", "--qk-layernorm"),
                       ("window_size", "--window-size"), ("window_attn_skip_freq", "--window-attn-skip-freq"),
                       ("mtp_num_layers", "--mtp-num-layers")]:
        assert flag in model[name]["description"], name
    assert "1: sliding window" in model["window_attn_skip_freq"]["description"]  # Megatron's list meaning
    assert "multi_latent_attention" in model and "kv_channels" in model
    parallel, training = defs["ParallelSpec"]["properties"], defs["TrainingSpec"]["properties"]
    assert "expert_model_parallel_size" in parallel["ep"]["description"]
    assert "expert_tensor_parallel_size" in parallel["etp"]["description"]
    for name in ("moe_token_dispatcher_type", "moe_expert_capacity_factor", "moe_imbalance", "moe_grouped_gemm"):
        assert training[name]["description"], name
